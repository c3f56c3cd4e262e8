"""The runtime's pure decisions (nomadtf.runtime.policy and the role table), exhaustively."""

from __future__ import annotations

import itertools

import pytest

from nomadtf import roles, wire
from nomadtf.job import outcome
from nomadtf.runtime import policy
from nomadtf.runtime.child import STOP_GRACE_S
from nomadtf.runtime.policy import Act, Debounce, ExitClass, HangClock, RestartBudget
from nomadtf.tfconfig import Member

ADDRESSES = {"chief": "10.0.0.1", "worker": "10.0.0.2", "ps": "10.0.0.4", "evaluator": "10.0.0.5"}


def cluster_of(strategy: str) -> list[Member]:
    counts = {"parameter_server": {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
              "multi_worker_mirrored": {"chief": 1, "worker": 2, "evaluator": 1},
              "legacy_server": {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
              "jax": {"worker": 2, "evaluator": 1}}[strategy]
    return sorted(Member(r, i, f"{ADDRESSES[r]}:{100 + i}", f"{r}{i}/1") for r, n in counts.items() for i in range(n))


def changed(members: list[Member], role: str, index: int, kind: str) -> list[Member]:
    out = []
    for m in members:
        if (m.role, m.index) == (role, index):
            m = Member(role, index, "10.9.9.9:999", "new/1") if kind == roles.MOVED else Member(role, index, m.address, m.alloc_id + "x")
        out.append(m)
    return out


# Every (strategy, our role, peer role, kind) -> does our child restart? The expectation is
# written out by hand (the recovery table of docs/guide/recovery.md), not derived from roles.TABLE.
EXPECTED_RESTARTS = {
    ("parameter_server", "chief"): {("ps", "moved"), ("ps", "restarted"), ("worker", "moved")},
    ("multi_worker_mirrored", "chief"): {("worker", "moved"), ("worker", "restarted")},
    ("multi_worker_mirrored", "worker"): {("chief", "moved"), ("chief", "restarted"), ("worker", "moved"), ("worker", "restarted")},
    ("legacy_server", "chief"): {("ps", "moved"), ("ps", "restarted"), ("worker", "moved")},
    ("legacy_server", "worker"): {("ps", "moved"), ("ps", "restarted"), ("chief", "moved"), ("worker", "moved")},
    # JAX cannot take a process back into a running computation: every peer change restarts all.
    ("jax", "worker"): {("worker", "moved"), ("worker", "restarted")},
}

CASES = [
    (strategy, me, peer, kind)
    for strategy in roles.STRATEGIES
    for me in ("chief", "worker", "ps", "evaluator", "tensorboard")
    for peer in ("chief", "worker", "ps", "evaluator")
    for kind in (roles.MOVED, roles.RESTARTED)
    if roles.rule(strategy, me).allowed and roles.rule(strategy, peer).allowed
]


@pytest.mark.parametrize(("strategy", "me", "peer", "kind"), CASES)
def test_who_restarts_for_which_peer_change(strategy, me, peer, kind):
    old = cluster_of(strategy)
    peer_index = 1 if peer == "worker" else 0  # never ourselves (we are index 0)
    new = changed(old, peer, peer_index, kind)
    expected = (peer, kind) in EXPECTED_RESTARTS.get((strategy, me), set())
    assert policy.must_restart(strategy, me, 0, old, new) is expected


@pytest.mark.parametrize("strategy", roles.STRATEGIES)
def test_nobody_restarts_for_their_own_change_or_for_nothing(strategy):
    old = cluster_of(strategy)
    for m in old:
        assert not policy.must_restart(strategy, m.role, m.index, old, list(old))
        for kind in (roles.MOVED, roles.RESTARTED):
            assert not policy.must_restart(strategy, m.role, m.index, old, changed(old, m.role, m.index, kind))


def test_soft_roles_never_disturb_training():
    for strategy in roles.STRATEGIES:
        old = cluster_of(strategy)
        for kind in (roles.MOVED, roles.RESTARTED):
            new = changed(old, "evaluator", 0, kind)
            assert not any(policy.must_restart(strategy, m.role, m.index, old, new) for m in old)
        assert "evaluator" not in roles.rendezvous_roles(strategy, "chief")
        assert roles.rendezvous_roles(strategy, "tensorboard") == ()


def test_peer_changes_name_the_kind():
    old = cluster_of("parameter_server")
    assert policy.peer_changes(old, changed(old, "ps", 0, roles.MOVED)) == [policy.PeerChange("ps", 0, roles.MOVED)]
    assert policy.peer_changes(old, changed(old, "worker", 1, roles.RESTARTED)) == [policy.PeerChange("worker", 1, roles.RESTARTED)]
    assert policy.peer_changes(old, old) == []


@pytest.mark.parametrize(
    ("code", "kind"),
    [(0, ExitClass.OK), (1, ExitClass.PERMANENT), (2, ExitClass.PERMANENT), (3, ExitClass.RETRYABLE),
     (127, ExitClass.RETRYABLE), (128, ExitClass.RETRYABLE), (137, ExitClass.RETRYABLE),
     (-9, ExitClass.RETRYABLE), (-15, ExitClass.RETRYABLE)],
)
def test_exit_classes(code, kind):
    assert policy.exit_class(code, [1, 2]) is kind


# (code, job state, completes the job) -> first decision
@pytest.mark.parametrize(
    ("code", "state", "completes", "act"),
    [
        (0, None, True, Act.SUCCEED_JOB),
        (0, None, False, Act.EXIT_OK),
        (0, "succeeded", True, Act.EXIT_OK),
        (1, "succeeded", False, Act.EXIT_OK),
        (-9, "succeeded", False, Act.EXIT_OK),
        (-9, None, True, Act.RECOVER),
        (-15, None, False, Act.RECOVER),
        (137, None, True, Act.CHECK_PEERS),
        (1, None, True, Act.CHECK_PEERS),
        (3, None, False, Act.CHECK_PEERS),
    ],
)
def test_first_decision_after_the_child_exits(code, state, completes, act):
    assert policy.on_child_exit(code, [1, 2], state, completes) is act


@pytest.mark.parametrize("code", [1, 2, 3, 137, -9])
def test_a_side_roles_failure_is_restarted_on_its_own_never_checked_against_peers(code):
    """An evaluator's or TensorBoard's exit, a permanent code included, never reaches the
    peer check that can fail the job."""
    assert policy.on_child_exit(code, [1, 2], None, False, soft=True) is Act.RECOVER
    assert policy.on_child_exit(0, [1, 2], None, False, soft=True) is Act.EXIT_OK


@pytest.mark.parametrize(
    ("code", "peer_changed", "act"),
    [(1, True, Act.RECOVER_WITH_CLUSTER), (1, False, Act.FAIL_JOB), (2, False, Act.FAIL_JOB),
     (3, False, Act.RECOVER), (137, False, Act.RECOVER), (137, True, Act.RECOVER_WITH_CLUSTER)],
)
def test_decision_once_peers_were_checked(code, peer_changed, act):
    assert policy.after_peer_check(code, [1, 2], peer_changed) is act


@pytest.mark.parametrize(
    ("state", "strategy", "role", "completes", "since", "act"),
    [
        (None, "parameter_server", "ps", False, 0, Act.NOTHING),
        ("succeeded", "parameter_server", "ps", False, 0, Act.STOP_NOW),
        ("succeeded", "parameter_server", "worker", False, 0, Act.STOP_NOW),
        ("succeeded", "parameter_server", "tensorboard", False, 0, Act.STOP_NOW),
        ("succeeded", "parameter_server", "evaluator", False, 0, Act.STOP_AFTER_GRACE),
        ("succeeded", "parameter_server", "evaluator", False, policy.STRAGGLER_GRACE_S + 1, Act.STOP_NOW),
        ("succeeded", "multi_worker_mirrored", "worker", False, 5, Act.STOP_AFTER_GRACE),
        ("succeeded", "parameter_server", "chief", True, 0, Act.NOTHING),
        ("failed: chief[0] exited 2", "parameter_server", "ps", False, 0, Act.STOP_JOB_FAILED),
        ("failed: chief[0] exited 2", "multi_worker_mirrored", "worker", False, 0, Act.STOP_JOB_FAILED),
    ],
)
def test_what_the_job_state_means_for_a_running_task(state, strategy, role, completes, since, act):
    assert policy.on_job_state(state, strategy, role, completes, since) is act


def test_a_supervisor_starting_after_the_end_starts_nothing():
    failed = outcome.failed_state("chief", 0, 2, "a permanent exit code")
    assert outcome.failed_slot(failed) == ("chief", 0)
    assert policy.on_start("succeeded", "ps", 0) is Act.EXIT_OK
    assert policy.on_start(failed, "chief", 0) is Act.EXIT_FAILED  # the slot that failed stays failed
    assert policy.on_start(failed, "ps", 0) is Act.EXIT_OK  # its peers did nothing wrong
    assert policy.on_start(failed, "worker", 0) is Act.EXIT_OK
    assert policy.on_start(None, "chief", 0) is Act.NOTHING


def test_who_completes_the_job():
    ps = {"chief": 1, "worker": 2, "ps": 1}
    assert roles.completes_job("parameter_server", "chief", 0, ps)
    assert not roles.completes_job("parameter_server", "worker", 0, ps)
    assert roles.completes_job("multi_worker_mirrored", "worker", 0, {"worker": 2})
    assert not roles.completes_job("multi_worker_mirrored", "worker", 1, {"worker": 2})
    assert roles.completes_job("multi_worker_mirrored", "chief", 0, {"chief": 1, "worker": 2})
    assert not roles.completes_job("multi_worker_mirrored", "worker", 0, {"chief": 1, "worker": 2})


def test_restart_budget_is_a_sliding_window():
    budget = RestartBudget(attempts=2, window_s=10)
    assert budget.spend(0) and budget.spend(1)
    assert not budget.spend(2)  # a third within 10 s
    assert budget.spend(11.5)  # the first two left the window
    assert not RestartBudget(attempts=0, window_s=10).spend(0)


def test_debounce_waits_for_a_change_to_hold():
    d = Debounce(1.5)
    assert not d.observe("x", 0.0)
    assert not d.observe("x", 1.0)
    assert not d.observe("y", 1.2)  # flapped: the clock starts again
    assert d.due() == pytest.approx(2.7)
    assert not d.observe("y", 2.0)
    assert d.observe("y", 2.8)


def test_debounce_forgets_a_value_after_acting_or_an_interruption():
    d = Debounce(1.5)
    d.observe("x", 0.0)
    d.reset()  # e.g. the cluster became incomplete, or we acted on "x"
    assert not d.observe("x", 10.0)  # the same fingerprint again must hold again
    assert d.observe("x", 11.6)
    assert Debounce(0).observe("z", 0.0)  # no debounce at all


def test_hang_clock_only_judges_code_that_reports_and_restarts_with_the_child():
    h = HangClock(timeout_s=60)
    h.restart(0)
    assert not h.hung(1000)  # silent from the start: not judged
    h.observe(1, 10)
    assert not h.hung(69) and h.hung(71)
    h.observe(1, 65)  # the same step again is no progress
    assert h.hung(71)
    h.observe(2, 70)
    assert not h.hung(129) and h.due() == 130
    h.restart(200)
    assert not h.hung(10_000)


def test_fingerprint_ignores_order_and_sees_incarnations():
    a = cluster_of("parameter_server")
    assert policy.fingerprint(a) == policy.fingerprint(list(reversed(a)))
    assert policy.fingerprint(a) != policy.fingerprint(changed(a, "ps", 0, roles.RESTARTED))


def test_the_table_covers_every_strategy_and_role():
    for strategy, role in itertools.product(roles.STRATEGIES, roles.ROLES):
        rule = roles.rule(strategy, role)
        assert not (rule.required and not rule.allowed)
        assert not (rule.in_cluster and role in ("evaluator", "tensorboard"))


# ---- scaling (nomadtf scale) ------------------------------------------------------------------

def _cluster(workers: int) -> list[Member]:
    base = [Member("chief", 0, "10.0.0.1:1", "c/1"), Member("ps", 0, "10.0.0.2:1", "p/1")]
    return base + [Member("worker", i, f"10.0.1.{i}:1", f"w{i}/1") for i in range(workers)]


@pytest.mark.parametrize("before, after", [(2, 3), (3, 1)])
def test_a_scaled_worker_role_restarts_the_ps_chief_once_and_nobody_else(before, after):
    old, new = _cluster(before), _cluster(after)
    joined_or_left = {(c.role, c.index) for c in policy.peer_changes(old, new)}
    assert joined_or_left == {("worker", i) for i in range(min(before, after), max(before, after))}
    assert policy.must_restart("parameter_server", "chief", 0, old, new)
    assert not policy.must_restart("parameter_server", "worker", 0, old, new)
    assert not policy.must_restart("parameter_server", "ps", 0, old, new)


def test_scale_targets_are_parsed_or_named_with_the_fix():
    from nomadtf.client.run import parse_scale
    from nomadtf.errors import UsageError

    assert parse_scale(["worker=3"]) == {"worker": 3}
    for bad in (["ps=2"], ["worker=three"], ["worker"], []):
        with pytest.raises(UsageError, match="worker=3") as raised:
            parse_scale(bad)
        assert raised.value.exit_code == 2  # a usage error, not a failed job (1)


# ---- success policies (job.json `success`) ----------------------------------------------------

@pytest.mark.parametrize(
    "strategy, counts, success, deciders",
    [
        ("parameter_server", {"chief": 1, "worker": 2, "ps": 1}, "auto", {("chief", 0)}),
        ("multi_worker_mirrored", {"worker": 3}, "auto", {("worker", 0)}),
        ("multi_worker_mirrored", {"chief": 1, "worker": 2}, "auto", {("chief", 0)}),
        ("multi_worker_mirrored", {"chief": 1, "worker": 2}, "worker0", {("worker", 0)}),
        ("multi_worker_mirrored", {"worker": 3}, "all_workers", {("worker", 0), ("worker", 1), ("worker", 2)}),
        ("legacy_server", {"worker": 2, "ps": 1}, "all_workers", {("worker", 0), ("worker", 1)}),
        ("parameter_server", {"chief": 1, "worker": 2, "ps": 1}, "all_workers", set()),  # refused by spec
    ],
)
def test_whose_exit_decides_the_job(strategy, counts, success, deciders):
    every = {(role, i) for role, n in counts.items() for i in range(n)}
    assert {slot for slot in every if roles.completes_job(strategy, *slot, counts, success)} == deciders


@pytest.mark.parametrize(
    ("holder_alloc", "holder_session", "state"),
    [
        ("mine", "s1", policy.SlotState.HELD),
        (None, None, policy.SlotState.LOST),  # the key went with our lapsed session
        ("mine", "s0", policy.SlotState.LOST),  # ours, under a session Consul forgot (it restarted)
        ("mine", None, policy.SlotState.LOST),
        ("replacement", "s9", policy.SlotState.TAKEN),  # Nomad replaced us while we were cut off
    ],
)
def test_what_our_slot_says_about_us(holder_alloc, holder_session, state):
    assert policy.slot_state(holder_alloc, holder_session, "mine", "s1") is state


@pytest.mark.parametrize(
    ("renewed_at", "now", "fence"),
    [
        (None, 1000.0, False),  # no session yet: nothing of ours to lose
        (100.0, 100.0 + policy.FENCE_AFTER_S - 0.1, False),  # a short Consul restart: two renewals failed, no more
        (100.0, 100.0 + policy.FENCE_AFTER_S, True),  # one TTL without a renewal: stop our code
        (100.0, 100.0 + 3 * policy.FENCE_AFTER_S, True),
    ],
)
def test_a_task_fences_after_one_ttl_without_a_session_renewal(renewed_at, now, fence):
    assert policy.must_fence(renewed_at, now) is fence


def test_the_fence_is_one_ttl_and_its_stop_ends_before_consul_lets_the_session_go():
    assert policy.FENCE_AFTER_S == wire.TASK_SESSION_TTL_S
    # SIGTERM at one TTL, SIGKILL after the grace, reaped within a second: before Consul's 2 x TTL.
    assert policy.FENCE_AFTER_S + STOP_GRACE_S + 1 < 2 * wire.TASK_SESSION_TTL_S

"""The soak's fault-by-fault check of role-aware recovery (tests/chaos.py): which processes a
fault may replace. The soak itself runs on the real stack (tests/stack/test_soak.py)."""

from __future__ import annotations

import pytest

from nomadtf import roles
from tests import chaos
from tests.chaos import CONSUL, HANG, KILL_CHILD, KILL_TASK, Fault

PS = {"chief": 1, "worker": 2, "ps": 1}
MWMS = {"worker": 2}


def test_a_parameter_servers_crash_may_replace_it_and_the_chiefs_code_only():
    assert chaos.may_replace("parameter_server", PS, Fault(KILL_CHILD, "ps", 0)) == {("child", "ps", 0), ("child", "chief", 0)}


@pytest.mark.parametrize("role, index", [("worker", 1), ("chief", 0)])
def test_a_workers_or_the_chiefs_crash_or_hang_replaces_nobody_else(role, index):
    for kind in (KILL_CHILD, HANG):
        assert chaos.may_replace("parameter_server", PS, Fault(kind, role, index)) == {("child", role, index)}


def test_a_killed_nomadtf_task_is_replaced_with_its_child():
    assert chaos.may_replace("parameter_server", PS, Fault(KILL_TASK, "worker", 0)) == {("task", "worker", 0), ("child", "worker", 0)}
    assert chaos.may_replace("parameter_server", PS, Fault(KILL_TASK, "ps", 0)) == {("task", "ps", 0), ("child", "ps", 0), ("child", "chief", 0)}


def test_a_consul_restart_may_replace_nothing():
    assert chaos.may_replace("parameter_server", PS, Fault(CONSUL)) == set()


def test_under_mirrored_any_workers_crash_may_replace_every_workers_code_but_no_other_task():
    assert chaos.may_replace("multi_worker_mirrored", MWMS, Fault(KILL_TASK, "worker", 1)) == {
        ("task", "worker", 1), ("child", "worker", 0), ("child", "worker", 1)}


@pytest.mark.parametrize("strategy", sorted(chaos.RESTART_WITH))
def test_the_soaks_written_expectation_is_the_role_tables(strategy):
    """Written out in the test, not read from nomadtf.roles: if the table changes, this says
    the soak's expectation (and docs/guide/recovery.md) must change with it."""
    for failed, restarting in chaos.RESTART_WITH[strategy].items():
        by_table = {role for role in ("chief", "worker", "ps")
                    if role != failed and roles.rule(strategy, role).restarts_for(failed, roles.RESTARTED)}
        assert by_table == restarting - {failed}, (strategy, failed)


def test_replaced_names_every_slot_whose_process_changed_or_went():
    before = {("child", "chief", 0): 10, ("child", "ps", 0): 11, ("task", "ps", 0): 12}
    after = {("child", "chief", 0): 10, ("child", "ps", 0): 21}
    assert chaos.replaced(before, after) == {("child", "ps", 0), ("task", "ps", 0)}

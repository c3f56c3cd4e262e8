"""The strategy x role table: the one place that says what each role is under each strategy.

    strategy               role         user code  in TF cluster  restarts its child when a peer...
    parameter_server       chief        yes        yes            ps moved/restarted, worker moved
                           worker       no (server) yes           never
                           ps           no (server) yes           never
                           evaluator    yes        no             never (reads checkpoints)
                           tensorboard  no         no             never
    multi_worker_mirrored  chief/worker yes        yes            chief/worker moved/restarted
                           evaluator    yes        no             never
    legacy_server          chief/worker yes        yes            ps moved/restarted, chief/worker moved
                           ps           no (server) yes           never
                           evaluator    yes        no             never
    jax                    worker       yes        yes            worker moved/restarted
                           evaluator    yes        no             never
                           tensorboard  no         no             never

"jax" is Keras 3 (or any JAX code) across processes: it forms like multi_worker_mirrored,
but its code gets KERAS_DISTRIBUTION_* and JAX_* (jaxenv.py) instead of TF_CONFIG; "in TF
cluster" there means one of JAX's processes, worker i being process i.

"moved": the peer's address changed (a new allocation elsewhere). "restarted": same
address, new TensorFlow process (a parameter server that restarts has lost its variables;
a restarted worker is simply reconnected by TensorFlow's coordinator under
parameter_server). Soft roles (evaluator, tensorboard) are never waited for and never
cause a restart: training is not disturbed by them.
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("chief", "worker", "ps", "evaluator", "tensorboard")
SINGLETON_ROLES = ("chief", "evaluator", "tensorboard")
# Side roles: never waited for, never restart or fail training; the job's outcome does not
# depend on them (their failures are warnings).
SOFT_ROLES = ("evaluator", "tensorboard")
# Roles whose count may change while a run runs (`nomadtf scale`, an elastic count).
SCALABLE_ROLES = ("worker",)
STRATEGIES = ("parameter_server", "multi_worker_mirrored", "legacy_server", "jax")
# Strategies whose code gets JAX's processes (jaxenv.py) instead of TF_CONFIG.
JAX_STRATEGIES = ("jax",)

MOVED = "moved"
RESTARTED = "restarted"
BOTH = frozenset({MOVED, RESTARTED})


@dataclass(frozen=True)
class RoleRule:
    allowed: bool
    required: bool = False
    runs_user_code: bool = False
    in_cluster: bool = False  # listed in TF_CONFIG's cluster
    # peer role -> the kinds of change of that peer that restart this role's child
    restart_on: tuple[tuple[str, frozenset[str]], ...] = ()

    def restarts_for(self, peer_role: str, kind: str) -> bool:
        return any(role == peer_role and kind in kinds for role, kinds in self.restart_on)


_NOT_ALLOWED = RoleRule(allowed=False)
_EVALUATOR = RoleRule(allowed=True, runs_user_code=True)
_TENSORBOARD = RoleRule(allowed=True)
_SERVER = RoleRule(allowed=True, in_cluster=True)

TABLE: dict[str, dict[str, RoleRule]] = {
    "parameter_server": {
        "chief": RoleRule(True, True, True, True, (("ps", BOTH), ("worker", frozenset({MOVED})))),
        "worker": RoleRule(True, True, False, True),
        "ps": RoleRule(True, True, False, True),
        "evaluator": _EVALUATOR,
        "tensorboard": _TENSORBOARD,
    },
    "multi_worker_mirrored": {
        "chief": RoleRule(True, False, True, True, (("chief", BOTH), ("worker", BOTH))),
        "worker": RoleRule(True, True, True, True, (("chief", BOTH), ("worker", BOTH))),
        "ps": _NOT_ALLOWED,
        "evaluator": _EVALUATOR,
        "tensorboard": _TENSORBOARD,
    },
    "legacy_server": {
        "chief": RoleRule(True, False, True, True, (("ps", BOTH), ("chief", frozenset({MOVED})), ("worker", frozenset({MOVED})))),
        "worker": RoleRule(True, True, True, True, (("ps", BOTH), ("chief", frozenset({MOVED})), ("worker", frozenset({MOVED})))),
        "ps": _SERVER,
        "evaluator": _EVALUATOR,
        "tensorboard": _TENSORBOARD,
    },
    # Workers only: JAX's processes are peers (process 0 also hosts the coordinator), so a
    # chief would be one more worker. Every process restarts when any moves or restarts:
    # jax.distributed cannot take a process back into a running computation.
    "jax": {
        "chief": _NOT_ALLOWED,
        "worker": RoleRule(True, True, True, True, (("worker", BOTH),)),
        "ps": _NOT_ALLOWED,
        "evaluator": _EVALUATOR,
        "tensorboard": _TENSORBOARD,
    },
}


def rule(strategy: str, role: str) -> RoleRule:
    return TABLE[strategy][role]


def runs_user_code(strategy: str, role: str) -> bool:
    return rule(strategy, role).runs_user_code


def is_soft(role: str) -> bool:
    """A side role (evaluator, TensorBoard): its failure never fails, stops or restarts training."""
    return role in SOFT_ROLES


def uses_tf_config(strategy: str) -> bool:
    """Whether the code gets TF_CONFIG (every TensorFlow strategy) or JAX's processes (jax)."""
    return strategy not in JAX_STRATEGIES


def cluster_roles(strategy: str) -> tuple[str, ...]:
    """The roles listed in TF_CONFIG's cluster, in TensorFlow's order."""
    return tuple(role for role in ("chief", "worker", "ps") if rule(strategy, role).in_cluster)


def rendezvous_roles(strategy: str, role: str) -> tuple[str, ...]:
    """Whom a task of `role` waits for before its child starts: the training cluster.
    Soft roles wait for the cluster too (the evaluator needs its addresses); nobody waits
    for a soft role."""
    if role == "tensorboard":
        return ()
    return cluster_roles(strategy)


SUCCESS_POLICIES = ("auto", "chief", "worker0", "all_workers")


def completes_job(strategy: str, role: str, index: int, counts: dict[str, int], success: str = "auto") -> bool:
    """Whose clean exit decides that the training is done (job.json `success`): the chief
    (auto with a chief), worker 0 (auto without one), or under `all_workers` every worker,
    the job succeeding once the last of them has."""
    if success == "auto":
        success = "chief" if counts.get("chief") else "worker0"
    if success == "chief":
        return role == "chief"
    if strategy == "parameter_server":
        return False  # workers run a bare server: their exit decides nothing
    return role == "worker" and (index == 0 or success == "all_workers")


def required_roles(strategy: str) -> set[str]:
    return {role for role, r in TABLE[strategy].items() if r.required}


def allowed_roles(strategy: str) -> set[str]:
    return {role for role, r in TABLE[strategy].items() if r.allowed}

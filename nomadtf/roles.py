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
parameter_server). Soft roles (evaluator, tensorboard, the data roles) never cause a
restart, and only the data dispatcher is waited for: training is not disturbed by them.

Any TensorFlow strategy (not jax) may add the tf.data service roles (`_with_data_service`):
                           data_dispatcher no       no             never (its journal survives it)
                           data_worker  no          no             data_dispatcher moved
    and every role that runs user code also restarts when the data_dispatcher moved.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# The tf.data service (any strategy may add it): one dispatcher, n data workers that run
# the input pipelines the training code sends them (nomadtf.usercode.dataservice).
DATA_ROLES = ("data_dispatcher", "data_worker")
ROLES = ("chief", "worker", "ps", "evaluator", "tensorboard", *DATA_ROLES)
SINGLETON_ROLES = ("chief", "evaluator", "tensorboard", "data_dispatcher")
# Side roles: never restart or fail training; the job's outcome does not depend on them
# (their failures are warnings). Nobody waits for them, but for the dispatcher: the code
# that reads through the service needs its address before it starts.
SOFT_ROLES = ("evaluator", "tensorboard", *DATA_ROLES)
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


def _with_data_service(table: dict[str, dict[str, RoleRule]]) -> None:
    """Every TensorFlow strategy may add the tf.data service roles (jax may not: the service
    feeds TensorFlow's input pipelines). The code of a role that runs user
    code got the dispatcher's address at its start: a dispatcher that moved restarts it (a
    dispatcher restarted in place keeps its address and its journal: nothing to do), as it
    restarts the data workers, which registered with the old address."""
    on_move = (("data_dispatcher", frozenset({MOVED})),)
    for strategy, rules in table.items():
        if strategy in JAX_STRATEGIES:  # a tf.data service feeds TensorFlow, not JAX's processes
            rules["data_dispatcher"] = rules["data_worker"] = _NOT_ALLOWED
            continue
        for role, r in rules.items():
            if r.runs_user_code:
                rules[role] = dataclasses.replace(r, restart_on=r.restart_on + on_move)
        rules["data_dispatcher"] = RoleRule(allowed=True)
        rules["data_worker"] = RoleRule(allowed=True, restart_on=on_move)


_with_data_service(TABLE)


def rule(strategy: str, role: str) -> RoleRule:
    return TABLE[strategy][role]


def runs_user_code(strategy: str, role: str) -> bool:
    return rule(strategy, role).runs_user_code


def is_soft(role: str) -> bool:
    """A side role (evaluator, TensorBoard, the data roles): its failure never fails, stops or restarts training."""
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
    for a soft role but for the data dispatcher, which the code (and each data worker)
    needs the address of; the data workers wait for it alone."""
    if role in ("tensorboard", "data_dispatcher"):
        return ()
    if role == "data_worker":
        return ("data_dispatcher",)  # it registers with the dispatcher; training is none of its business
    if runs_user_code(strategy, role):
        # The code's NOMADTF_DATA_SERVICE (a job without a dispatcher waits for none).
        return (*cluster_roles(strategy), "data_dispatcher")
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

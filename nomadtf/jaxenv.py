"""Members -> the environment of JAX's processes (strategy "jax"). Pure functions, no I/O.

TF_CONFIG's neighbour for Keras 3 on JAX. What the code reads (keras 3.15, jax 0.10):
- `keras.distribution.initialize()` reads KERAS_DISTRIBUTION_JOB_ADDRESSES (comma-separated
  host:port of every process), KERAS_DISTRIBUTION_NUM_PROCESSES and
  KERAS_DISTRIBUTION_PROCESS_ID; on the JAX backend it takes the first address as the
  coordinator and calls `jax.distributed.initialize(coordinator, num_processes, process_id)`.
  So the addresses are in process-id order, and process 0's is the coordinator's.
- `jax.distributed.initialize()` with no arguments reads only JAX_COORDINATOR_ADDRESS;
  JAX_NUM_PROCESSES and JAX_PROCESS_ID are nomadtf's, for code that passes them on
  (`jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]), ...)`).
- Process 0's coordinator binds every interface at its address's port (`[::]:port`): the
  task's own port, which Nomad reserved for it (the `tf` port of every rendered task).

Process i is worker i: the workers' indices are unique and dense (their slots), so the order
is the same in every process.
"""

from __future__ import annotations

from nomadtf import tfconfig, wire
from nomadtf.tfconfig import Member

BACKEND = "jax"
# JAX's multi-process collectives on CPU: gloo over TCP (jax's default from 0.5; none before,
# when a CPU computation across processes fails). Only the CPU backend reads it.
CPU_COLLECTIVES = "gloo"


def process_addresses(strategy: str, counts: dict[str, int], members: list[Member]) -> list[str]:
    """host:port of every process, process 0 first. Raises ValueError when one is missing."""
    cluster = tfconfig.build_cluster_spec(strategy, counts, members)
    return [address for role in cluster for address in cluster[role]]


def waiting_env(environ: dict[str, str]) -> dict[str, str]:
    """What every task of the strategy gets before its cluster is known (the evaluator and
    TensorBoard too): the backend, and the CPU collectives unless the job chose its own."""
    return {
        wire.ENV_KERAS_BACKEND: environ.get(wire.ENV_KERAS_BACKEND) or BACKEND,
        wire.ENV_JAX_CPU_COLLECTIVES: environ.get(wire.ENV_JAX_CPU_COLLECTIVES) or CPU_COLLECTIVES,
    }


def process_env(addresses: list[str], process_id: int) -> dict[str, str]:
    """The names Keras 3 and JAX read, for process `process_id` of `addresses`."""
    if not 0 <= process_id < len(addresses):
        raise ValueError(f"process {process_id} is not one of {len(addresses)}")
    count = str(len(addresses))
    return {
        wire.ENV_KERAS_JOB_ADDRESSES: ",".join(addresses),
        wire.ENV_KERAS_NUM_PROCESSES: count,
        wire.ENV_KERAS_PROCESS_ID: str(process_id),
        wire.ENV_JAX_COORDINATOR: addresses[0],
        wire.ENV_JAX_NUM_PROCESSES: count,
        wire.ENV_JAX_PROCESS_ID: str(process_id),
    }


def all_process_envs(job_id: str, strategy: str, counts: dict[str, int]) -> dict[str, dict[str, str]]:
    """"worker[i]" -> its process's names, with placeholder addresses (`nomadtf render --tf-config`)."""
    addresses = process_addresses(strategy, counts, tfconfig.placeholder_members(job_id, counts))
    return {f"worker[{i}]": process_env(addresses, i) for i in range(len(addresses))}

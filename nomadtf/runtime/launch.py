"""Pure: what the child process runs and the environment it gets."""

from __future__ import annotations

import json
import os
import sys

from nomadtf import jaxenv, roles, tfconfig, wire
from nomadtf.job.spec import JobSpec
from nomadtf.tfconfig import Member


def child_argv(spec: JobSpec, role: str, tf_port: int, python: str = sys.executable, host: str = "") -> list[str]:
    """`host`: the task's own address (NOMAD_IP_tf), where TensorBoard listens; all
    interfaces only when Nomad gave none. (TensorFlow's gRPC server always binds every
    interface: it takes only a port.)"""
    entry = spec.entrypoint
    if role == "tensorboard":
        bind = ["--host", host] if host else ["--bind_all"]
        return [python, "-m", "tensorboard.main", "--logdir", spec.model_dir, "--port", str(tf_port), *bind]
    if role in roles.DATA_ROLES:
        return [python, "-m", DATA_SERVICE_MODULE, *data_service_args(spec, role, tf_port, host)]
    if spec.strategy == "legacy_server":
        return [python, "-m", "nomadtf.usercode.tfserver", "legacy", entry.target]
    if not roles.runs_user_code(spec.strategy, role):
        return [python, "-m", "nomadtf.usercode.tfserver", "server"]
    code = ["-m", entry.target, *entry.args] if entry.kind == "module" else [entry.target, *entry.args]
    if (spec.gpus.get(role) or {}).get("memory_limit_mib"):
        return [python, "-u", "-m", "nomadtf.usercode.gpulimit", *code]  # caps TF's GPU memory, then runs the code
    return [python, "-u", *code]


DATA_SERVICE_MODULE = "nomadtf.usercode.dataservice"


def data_service_args(spec: JobSpec, role: str, port: int, host: str) -> list[str]:
    """What nomadtf.usercode.dataservice is told: the dispatcher its port and its journal
    (the run's own folder, so a restart in place reads back its workers and jobs); a data
    worker its port and the address it is reached at (Nomad's, never localhost: the
    training tasks run elsewhere). The dispatcher's address comes in NOMADTF_DATA_SERVICE."""
    if role == "data_dispatcher":
        return ["dispatcher", "--port", str(port), "--work-dir", os.path.join(spec.model_dir, wire.DATA_SERVICE_DIR)]
    return ["worker", "--port", str(port), "--address", f"{host or 'localhost'}:{port}"]


def data_service_env(strategy: str, role: str, members: list[Member]) -> dict[str, str]:
    """NOMADTF_DATA_SERVICE (grpc://host:port of the dispatcher) for the code of the roles
    that run it and for the data workers; nothing when the job has no dispatcher."""
    if role != "data_worker" and not roles.runs_user_code(strategy, role):
        return {}
    dispatcher = next((m for m in members if m.role == "data_dispatcher"), None)
    return {wire.ENV_DATA_SERVICE: f"grpc://{dispatcher.address}"} if dispatcher else {}


def assigned_gpus(environ: dict[str, str]) -> list[str]:
    """The GPU ids Nomad's device plugin reserved for this task (NVIDIA_VISIBLE_DEVICES)."""
    value = environ.get(wire.ENV_NVIDIA_VISIBLE, "")
    return [d.strip() for d in value.split(",") if d.strip() and d.strip() not in ("all", "none", "void")]


def gpu_env(request: dict | None, environ: dict[str, str]) -> dict[str, str]:
    """What CUDA and TensorFlow must see: exactly the GPUs Nomad assigned to this task (CUDA
    takes the UUIDs; under raw_exec/exec every device of the node would be visible
    otherwise), none for a role that asked for none, memory growth on, and the optional cap."""
    if not request:
        return {wire.ENV_CUDA_VISIBLE: ""}
    env = {wire.ENV_CUDA_VISIBLE: ",".join(assigned_gpus(environ)), wire.ENV_TF_GPU_GROWTH: "true"}
    if request.get("memory_limit_mib"):
        env[wire.ENV_GPU_MEMORY_LIMIT_MIB] = str(request["memory_limit_mib"])
        env.pop(wire.ENV_TF_GPU_GROWTH)  # TensorFlow refuses growth together with a logical device size
    return env


def waiting_env(spec: JobSpec, role: str, index: int, environ: dict[str, str], progress_file: str) -> dict[str, str]:
    """The child's environment as far as it is known before the cluster is complete (what a
    child started ahead of it gets, warm.py): the task's environment minus nomadtf's
    credentials and plumbing, the NOMADTF_* names that do not depend on the cluster and the
    GPUs. No TF_CONFIG, no generation, no secret."""
    env = {k: v for k, v in environ.items() if k not in wire.CHILD_ENV_DROPPED}
    if spec.vault.token_for_code and environ.get("VAULT_TOKEN"):
        env["VAULT_TOKEN"] = environ["VAULT_TOKEN"]  # the job asked to hand it to its code
    extra_path = [p for p in [spec.entrypoint.workdir, *spec.entrypoint.pythonpath] if p]
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([*extra_path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        {
            wire.ENV_ROLE: role,
            wire.ENV_INDEX: str(index),
            wire.ENV_JOB_ID: spec.name,
            wire.ENV_NAMESPACE: spec.namespace,
            wire.ENV_RUN_ID: spec.run_id,
            wire.ENV_MODEL_DIR: spec.model_dir,
            wire.ENV_CONTEXT: json.dumps(spec.context, sort_keys=True),
            wire.ENV_PROGRESS_FILE: progress_file,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(gpu_env(spec.gpus.get(role), environ))
    if not roles.uses_tf_config(spec.strategy):
        env.update(jaxenv.waiting_env(environ))
    return env


def child_env(
    spec: JobSpec,
    role: str,
    index: int,
    members: list[Member],
    generation: int,
    environ: dict[str, str],
    progress_file: str,
    secret_env: dict[str, str],
) -> dict[str, str]:
    """The task's environment minus nomadtf's credentials and plumbing, plus TF_CONFIG (or
    under jax, a process's KERAS_DISTRIBUTION_* and JAX_* names: jaxenv.py), the NOMADTF_*
    names (wire.py) and the secrets under the names the job chose."""
    env = waiting_env(spec, role, index, environ, progress_file)
    if not roles.uses_tf_config(spec.strategy):
        # Only JAX's processes: the evaluator and TensorBoard are no part of its computation.
        if roles.rule(spec.strategy, role).in_cluster:
            env.update(jaxenv.process_env(jaxenv.process_addresses(spec.strategy, spec.counts, members), index))
    elif role not in ("tensorboard", *roles.DATA_ROLES):
        tf_config = tfconfig.build_tf_config(tfconfig.build_cluster_spec(spec.strategy, spec.counts, members), role, index)
        env[wire.ENV_TF_CONFIG] = tfconfig.tf_config_json(tf_config)
    env.update(data_service_env(spec.strategy, role, members))
    env[wire.ENV_GENERATION] = str(generation)
    env.update(secret_env)
    return env

"""Pure: what the child process runs and the environment it gets."""

from __future__ import annotations

import json
import os
import sys

from nomadtf import cluster, roles, wire
from nomadtf.cluster import Member
from nomadtf.spec import JobSpec


def child_argv(spec: JobSpec, role: str, tf_port: int, python: str = sys.executable) -> list[str]:
    entry = spec.entrypoint
    if role == "tensorboard":
        return [python, "-m", "tensorboard.main", "--logdir", spec.model_dir, "--port", str(tf_port), "--bind_all"]
    if spec.strategy == "legacy_server":
        return [python, "-m", "nomadtf.tfserver", "legacy", entry.target]
    if not roles.runs_user_code(spec.strategy, role):
        return [python, "-m", "nomadtf.tfserver", "server"]
    if entry.kind == "module":
        return [python, "-u", "-m", entry.target, *entry.args]
    return [python, "-u", entry.target, *entry.args]


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
    """The task's environment minus nomadtf's credentials and plumbing, plus TF_CONFIG, the
    NOMADTF_* names (wire.py) and the secrets under the names the job chose."""
    env = {k: v for k, v in environ.items() if k not in wire.CHILD_ENV_DROPPED}
    extra_path = [p for p in [spec.entrypoint.workdir, *spec.entrypoint.pythonpath] if p]
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([*extra_path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if role != "tensorboard":
        tf_config = cluster.build_tf_config(cluster.build_cluster_spec(spec.strategy, spec.counts, members), role, index)
        env[wire.ENV_TF_CONFIG] = cluster.tf_config_json(tf_config)
    env.update(
        {
            wire.ENV_ROLE: role,
            wire.ENV_INDEX: str(index),
            wire.ENV_JOB_ID: spec.name,
            wire.ENV_NAMESPACE: spec.namespace,
            wire.ENV_RUN_ID: spec.run_id,
            wire.ENV_MODEL_DIR: spec.model_dir,
            wire.ENV_CONTEXT: json.dumps(spec.context, sort_keys=True),
            wire.ENV_GENERATION: str(generation),
            wire.ENV_PROGRESS_FILE: progress_file,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(secret_env)
    return env

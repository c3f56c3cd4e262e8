"""How our child is started: its command line and environment (launch, pure), in the job's
own interpreter when job.json has an `environment` (jobenv), handed to a process started
ahead of the cluster when one waits (warm), else started cold (child).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from nomadtf import roles, wire
from nomadtf.job.spec import JobSpec
from nomadtf.runtime import jobenv, launch, versions, warm
from nomadtf.runtime.alloc import AllocInfo
from nomadtf.runtime.child import Child
from nomadtf.runtime.codeuser import CodeUser
from nomadtf.tfconfig import Member

log = logging.getLogger("nomadtf.task")


class ChildStarter:
    """Usage (the supervisor's loop, one thread; `spec` each time: `nomadtf scale` changes counts):
    starter = ChildStarter(role, alloc, progress_file, on_exit, on_versions=publish)
    starter.missing_script(spec)                   # None, or why the child cannot start
    starter.job_env = jobenv.reuse_or_build(...)   # only for a job with an `environment`
    starter.start_ahead(spec, index)               # while we wait for the cluster
    child = starter.start(spec, index, members, generation, secret_env)
    starter.died(pid, code)   # on a child's exit: True when it was the one waiting (replaced)
    starter.close()
    """

    def __init__(
        self,
        role: str,
        alloc: AllocInfo,
        progress_file: Path,
        on_exit: Callable[[int, int], None],
        on_versions: Callable[[str], None] | None = None,
        user: CodeUser | None = None,
        capture: Callable | None = None,
    ):
        self.role = role
        self.alloc = alloc
        self.progress_file = progress_file
        self.on_exit = on_exit
        self.job_env: jobenv.Ready | None = None  # job.json `environment`, held until we exit
        self.user = user  # who the child runs as (codeuser.py; None: as we do)
        self.capture = capture  # the child's output, teed to the run's archive (archive.py; None: none)
        self.warm = warm.WarmStart(user, capture)  # the child started while we wait for the cluster
        self.said_versions = False  # the child's Python and TensorFlow, logged at its first start
        self.on_versions = on_versions  # ... and handed on (the supervisor publishes it for `run` and `status`)
        self._versions: threading.Thread | None = None

    def missing_script(self, spec: JobSpec) -> str | None:
        """Why our child cannot start: its entrypoint script is not there (a mistake no restart
        fixes); None when it is, or when we run no script of the job's."""
        entry = spec.entrypoint
        if entry.kind != "script" or self.role == "tensorboard" or not roles.runs_user_code(spec.strategy, self.role):
            return None
        workdir = Path(entry.workdir or self.alloc.task_dir)
        if (workdir / entry.target).is_file():
            return None
        return f"its code: entrypoint.script {entry.target} not found in {workdir} (entrypoint.workdir)"

    def start_ahead(self, spec: JobSpec, index: int) -> None:
        """Start the child now, while we wait for the cluster: its interpreter and TensorFlow
        load meanwhile; TF_CONFIG and the secrets follow in the handoff (warm.py)."""
        env = launch.waiting_env(spec, self.role, index, dict(os.environ), str(self.progress_file))
        self.warm.start_ahead(self.role, *self._command(spec, env), self.on_exit)

    def start(self, spec: JobSpec, index: int, members: list[Member], generation: int, secret_env: dict[str, str]) -> Child:
        """Our child for this generation of the cluster: the one waiting, or a new one."""
        if self.user is not None:
            self.user.make_dirs(Path(spec.model_dir))
        else:
            Path(spec.model_dir).mkdir(parents=True, exist_ok=True)
        env = launch.child_env(spec, self.role, index, members, generation, dict(os.environ), str(self.progress_file), secret_env)
        argv, env, cwd = self._command(spec, env)
        if not self.said_versions:
            # Beside the start, not before it: reading the interpreter is a process of its own.
            self.said_versions = True
            self._versions = threading.Thread(target=self._say_versions, args=(argv[0], env), name="versions", daemon=True)
            self._versions.start()
        if wire.ENV_KERAS_JOB_ADDRESSES in env:  # strategy jax: JAX's processes, no TF_CONFIG
            log.info("generation %d: starting %s as JAX process %s of %s (%s)", generation, " ".join(argv[1:4]),
                     env[wire.ENV_JAX_PROCESS_ID], env[wire.ENV_JAX_NUM_PROCESSES], env[wire.ENV_KERAS_JOB_ADDRESSES])
        else:
            log.info("generation %d: starting %s with TF_CONFIG %s", generation, " ".join(argv[1:4]), env.get(wire.ENV_TF_CONFIG, "(none)"))
        return self.warm.take(argv, env, cwd) or Child(argv, env, cwd, self.on_exit, user=self.user, capture=self.capture)

    def died(self, pid: int, code: int) -> bool:
        return self.warm.died(pid, code)

    def close(self) -> None:
        self.warm.close()
        if self._versions is not None:
            self._versions.join(timeout=versions.TIMEOUT_S + 5)  # said and published before we exit

    def _say_versions(self, python: str, env: dict[str, str]) -> None:
        line = versions.describe(python, env)
        log.info("our child runs %s", line)
        if self.on_versions:
            self.on_versions(line)

    def _command(self, spec: JobSpec, env: dict[str, str]) -> tuple[list[str], dict[str, str], str]:
        """argv, environment and working directory of our child, from its environment."""
        if self.job_env is not None:
            env.update(self.job_env.child_environ(env))
        python = self.job_env.python if self.job_env is not None else sys.executable
        argv = launch.child_argv(spec, self.role, self.alloc.tf_port, python, host=os.environ.get("NOMAD_IP_tf", ""))
        return argv, env, spec.entrypoint.workdir or str(self.alloc.task_dir)

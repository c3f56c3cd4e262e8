"""What Nomad tells a task about itself through its environment: the allocation
(`AllocInfo`) and where the spec file Nomad's template wrote is (`spec_path`). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nomadtf import wire
from nomadtf.errors import TaskError


@dataclass
class AllocInfo:
    """The allocation as NOMAD_* variables describe it."""

    job_id: str
    alloc_id: str
    alloc_index: int
    tf_port: int
    health_port: int
    task_dir: Path
    secrets_dir: Path

    @classmethod
    def from_environ(cls, env: dict[str, str]) -> AllocInfo:
        try:
            return cls(
                job_id=env["NOMAD_JOB_ID"],
                alloc_id=env["NOMAD_ALLOC_ID"],
                alloc_index=int(env.get("NOMAD_ALLOC_INDEX", "0")),
                tf_port=int(env["NOMAD_PORT_tf"]),
                health_port=int(env["NOMAD_PORT_health"]),
                task_dir=Path(env.get("NOMAD_TASK_DIR", ".")),
                secrets_dir=Path(env.get("NOMAD_SECRETS_DIR", ".")),
            )
        except KeyError as exc:
            raise TaskError(f"{exc.args[0]} is not set: `nomadtf task` runs inside a Nomad allocation of a rendered job") from None


def spec_path(environ: dict[str, str]) -> Path:
    """NOMADTF_SPEC_FILE when set (tests, a hand-run task), else the task directory's spec file."""
    explicit = environ.get(wire.ENV_SPEC_FILE)
    if explicit:
        return Path(explicit)
    return Path(environ.get("NOMAD_TASK_DIR", ".")) / wire.SPEC_FILE

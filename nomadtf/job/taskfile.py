"""The spec file every task reads (wire.SPEC_FILE): the normalised document with its run,
written by Nomad into the task directory, never in an environment variable; read back, and
the task's own `${NOMAD_...}` values expanded in it.

Usage:
    text = spec_file_text(spec, run)
    spec = for_task(read_spec_file(path), os.environ)
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from nomadtf import wire
from nomadtf.errors import SpecError
from nomadtf.job.spec import JobSpec, RunInfo
from nomadtf.job.validate import fill_defaults, schema

_TASK_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_task_vars(text: str, environ: dict[str, str]) -> str:
    """`${NOMAD_JOB_ID}` and other variables of the task's environment, expanded as Nomad
    would (the spec reaches the task as a file, which Nomad does not interpolate). An
    unknown name is left as written."""
    return _TASK_VAR.sub(lambda m: environ.get(m[1], m[0]), text)


NO_RUN = "0"  # the run id of a job that was rendered without one (`nomadtf render`)


def for_task(spec: JobSpec, environ: dict[str, str]) -> JobSpec:
    """The paths and arguments of `spec` with the task's variables expanded, the run id
    (NOMADTF_RUN_ID) among them."""
    entry = spec.entrypoint
    variables = {**environ, "NOMADTF_RUN_ID": spec.run_id or NO_RUN}

    def expand(text: str) -> str:
        return expand_task_vars(text, variables)

    # A resumed run keeps training in the directory of the run it continues.
    model_dir = expand_task_vars(spec.model_dir, {**variables, "NOMADTF_RUN_ID": spec.model_run or spec.run_id or NO_RUN})

    workdir = expand(entry.workdir) if entry.workdir else None
    if workdir is None and spec.source and environ.get("NOMAD_TASK_DIR"):
        # Code from `source.url`: Nomad unpacked it relative to the task's directory (the
        # parent of NOMAD_TASK_DIR, which is <task>/local); the entry point lives there.
        workdir = str(Path(environ["NOMAD_TASK_DIR"]).parent / spec.source.destination)
    return dataclasses.replace(
        spec,
        model_dir=model_dir,
        entrypoint=dataclasses.replace(
            entry,
            target=expand(entry.target),
            args=tuple(expand(a) for a in entry.args),
            workdir=workdir,
            pythonpath=tuple(expand(p) for p in entry.pythonpath),
        ),
    )


def spec_file_text(spec: JobSpec, run: RunInfo | None = None) -> str:
    """The normalised spec as the file every task reads (wire.SPEC_FILE), with the run. The
    training code can read that file: credentials set in `env` (wire.CREDENTIAL_ENV, e.g.
    AppRole ids) are left out; they reach the supervisor through the task's environment only."""
    data = without_credentials(spec.document)
    if run:
        data["run"] = run.as_dict()
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def without_credentials(document: dict[str, Any]) -> dict[str, Any]:
    """`document` without the credential names of its `env` and `roles.<role>.env`. Pure."""
    def scrub(env: Any) -> Any:
        return {k: v for k, v in env.items() if k not in wire.CREDENTIAL_ENV} if isinstance(env, dict) else env

    data = {**document}
    if "env" in data:
        data["env"] = scrub(data["env"])
    if isinstance(data.get("roles"), dict):
        data["roles"] = {role: {**cfg, "env": scrub(cfg["env"])} if isinstance(cfg, dict) and "env" in cfg else cfg
                         for role, cfg in data["roles"].items()}
    return data


def read_spec_file(path: Path) -> JobSpec:
    """The task's spec (wire.SPEC_FILE), validated when it was submitted. A file written by
    an older nomadtf lacks the keys added since: the schema's defaults fill them."""
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the job's spec ({exc.strerror}); `nomadtf task` runs in a job rendered by nomadtf") from exc
    return JobSpec.from_normalized(fill_defaults(document, schema(), schema()))

"""The options file: load JSON or YAML, apply `--var` overrides, validate, fill defaults,
and the one typed `JobSpec` every command and every task works from.

Pure: no network, no client libraries. The raw mapping exists in one step only
(`load_options`: the file, its `--var` overrides, the namespace); validation fills the
schema's defaults once (`normalize`), and `JobSpec.from_normalized` types the result once,
durations parsed (nomadtf.durations). The normalised document reaches every task as a file
Nomad writes into the task directory (wire.SPEC_FILE, `spec_file_text`), never as an
environment variable; the task reads it back into a JobSpec (`read_spec_file`).

Usage:
    spec = load_spec(Path("job.json"), overrides=["roles.worker.count=4"])
    spec.roles["worker"].count             # 4, every default filled in
    spec.recovery.hang_timeout_s           # 600.0
    spec.recovery.restart_interval_ns      # 300000000000, what Nomad takes
    parse_spec({"name": "j", ...})         # the same from a mapping
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomadtf import roles as role_table
from nomadtf import wire
from nomadtf.durations import parse_ns, parse_seconds
from nomadtf.job.options import load_options
from nomadtf.job.validate import _gpu_request, normalize, schema


def load_spec(path: Path, overrides: list[str] | None = None) -> JobSpec:
    """The job file, validated and typed: what every client-side command works from."""
    return parse_spec(load_options(path, overrides))


def parse_spec(data: dict[str, Any]) -> JobSpec:
    """A job.json mapping validated (every problem at once), its defaults filled, typed."""
    return JobSpec.from_normalized(normalize(data))


# ---- the typed spec every command and every task works from ---------------------------------


@dataclass(frozen=True)
class RunInfo:
    """One submission of a job: `nomadtf run` makes one, the job's Meta and the tasks'
    spec file carry it."""

    id: str
    submitted_at: float  # unix time; recovery.deadline counts from here
    # The run whose default model_dir this run uses: itself, or with `--resume` the run it
    # continues (and that run's own model run, so a chain of resumes shares one directory).
    model_run: str = ""

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "submitted_at": self.submitted_at}
        if self.model_run and self.model_run != self.id:
            data["model_run"] = self.model_run
        return data


@dataclass(frozen=True)
class Entrypoint:
    kind: str  # "script", "module" or "function"
    target: str
    args: tuple[str, ...]
    workdir: str | None
    pythonpath: tuple[str, ...]


@dataclass(frozen=True)
class Role:
    """One role of job.json `roles` that runs (count > 0)."""

    count: int  # as submitted (an elastic role's max); in a task `JobSpec.counts` follows `nomadtf scale`
    cpu: int  # MHz
    memory: int  # MB
    memory_max: int | None  # None: no oversubscription
    port: int  # 0: a dynamic port
    gpus: dict[str, Any] | None  # {"count", "vendor", ...} as the schema has it; None: no GPU
    constraints: tuple[dict[str, Any], ...]  # the schema's placement objects (render turns them into Nomad's)
    affinities: tuple[dict[str, Any], ...]
    spread: tuple[dict[str, Any], ...]
    distinct_hosts: bool
    node_class: str | None
    env: dict[str, str]
    count_min: int | None = None  # elastic: the fewest tasks it is admitted with or shrunk to

    @classmethod
    def from_normalized(cls, cfg: dict[str, Any]) -> Role:
        return cls(
            count_min=cfg.get("count_min"),
            count=cfg["count"],
            cpu=cfg["cpu"],
            memory=cfg["memory"],
            memory_max=cfg.get("memory_max"),
            port=cfg["port"],
            gpus=_gpu_request(cfg["gpus"]),
            constraints=tuple(cfg["constraints"]),
            affinities=tuple(cfg["affinities"]),
            spread=tuple(cfg["spread"]),
            distinct_hosts=cfg["distinct_hosts"],
            node_class=cfg.get("node_class"),
            env=dict(cfg["env"]),
        )


@dataclass(frozen=True)
class Driver:
    name: str  # "raw_exec", "exec" or "docker"
    python: str  # the interpreter raw_exec and exec tasks start
    image: str | None  # docker
    gpu_image: str | None  # docker, for the roles with GPUs; None: `image`
    volumes: tuple[str, ...] = ()  # docker: more HOST:CONTAINER[:ro] mounts
    code_user: str | None = None  # "uid:gid" the code runs as (runtime/codeuser.py); None: the task's user


@dataclass(frozen=True)
class Source:
    """job.json `source`: code Nomad fetches (go-getter) into each task before it starts."""

    url: str
    destination: str  # relative to the task's directory
    options: dict[str, str]


@dataclass(frozen=True)
class Recovery:
    """Durations in nanoseconds, exactly (what Nomad takes); the runtime reads seconds."""

    restart_attempts: int
    restart_interval_ns: int
    restart_delay_ns: int
    reschedule_attempts: int
    reschedule_interval_ns: int
    reschedule_delay_ns: int
    deadline_ns: int
    hang_timeout_ns: int
    permanent_exit_codes: frozenset[int]

    @property
    def restart_interval_s(self) -> float:
        return self.restart_interval_ns / 1e9

    @property
    def deadline_s(self) -> float:
        return self.deadline_ns / 1e9

    @property
    def hang_timeout_s(self) -> float:
        return self.hang_timeout_ns / 1e9


@dataclass(frozen=True)
class VaultSettings:
    """job.json `vault`: how a task gets its Vault token and where Vault answers. `document`
    is the schema's object as normalised: what vault.py logs in with (`login`, VaultSession)."""

    auth: str  # "nomad" (the token Nomad gives the task), "approle", "jwt" (nomadtf logs in)
    policies: tuple[str, ...]  # Nomad 1.6's token workflow; on 1.7+ the job's JWT role grants them
    role: str | None  # auth nomad on 1.7+: the JWT auth role (None: the job's own); approle/jwt: theirs
    workflow: str | None  # "identity", "token"; None: the target Nomad's own way
    mount: str | None
    address: str | None  # as the tasks see it
    ca_file: str | None
    token_for_code: bool
    document: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_normalized(cls, section: dict[str, Any]) -> VaultSettings:
        return cls(
            auth=section.get("auth", "nomad"),
            policies=tuple(section.get("policies", ())),
            role=section.get("role"),
            workflow=section.get("workflow"),
            mount=section.get("mount"),
            address=section.get("address"),
            ca_file=section.get("ca_file"),
            token_for_code=bool(section.get("token_for_code", False)),
            document=section,
        )


@dataclass(frozen=True)
class Discovery:
    provider: str  # "consul"
    consul_address: str  # as the tasks see it (their CONSUL_HTTP_ADDR)
    consul_ca_file: str | None
    reconfigure: str  # "watch" or "template"
    rendezvous_timeout_s: float
    debounce_s: float
    consul_token_path: str  # a Vault path holding the tasks' Consul token; "" = CONSUL_HTTP_TOKEN or none


READY_SHARE = 0.8  # admission.ready_timeout's default, of discovery.rendezvous_timeout


@dataclass(frozen=True)
class Admission:
    """job.json `admission`: how `nomadtf run` admits the job on a shared cluster."""

    gang_timeout_s: float  # a job placed only in part this long is stopped and queued again
    ready_timeout_s: float = 0.0  # a placed run whose cluster has not formed this long is queued again (0: never)
    requeue_limit: int = 3  # how often; then it fails
    duration_s: float | None = None  # how long it is expected to take once started (start estimates)

    @classmethod
    def from_normalized(cls, section: dict[str, Any] | None, rendezvous_timeout_s: float = 300.0) -> Admission:
        """`ready_timeout` left out: READY_SHARE of the rendezvous timeout (the tasks' own limit)."""
        properties = schema()["properties"]["admission"]["properties"]
        given = {k: v["default"] for k, v in properties.items() if "default" in v} | (section or {})
        ready = parse_seconds(given["ready_timeout"]) if "ready_timeout" in given else READY_SHARE * rendezvous_timeout_s
        duration = parse_seconds(given["duration"]) if "duration" in given else None
        return cls(parse_seconds(given["gang_timeout"]), ready, int(given["requeue_limit"]), duration)


@dataclass(frozen=True)
class JobEnvironment:
    """job.json `environment`: the Python environment the code runs in (nomadtf.venvs)."""

    requirements: tuple[str, ...]
    python: str | None  # None: the minor version of the Python that runs nomadtf on the client
    timeout_s: float
    cache_dir: str | None

    @classmethod
    def from_normalized(cls, section: dict[str, Any] | None) -> JobEnvironment | None:
        if not section:
            return None
        return cls(tuple(section["requirements"]), section.get("python"), parse_seconds(section["timeout"]), section.get("cache_dir"))


@dataclass(frozen=True)
class JobSpec:
    """A job.json validated, with every default filled and every duration parsed: built once
    (`load_spec`, `parse_spec`; in a task `read_spec_file`), then only read.

    `document` is the normalised job.json itself (without the run): what the tasks' spec file
    carries (`spec_file_text`) and the job's Meta digests (`sha256`). `secrets` stays the
    schema's objects, and `vault.document` the schema's `vault`: vault.py takes them as they are.
    """

    name: str
    namespace: str
    region: str
    datacenters: tuple[str, ...]
    node_pool: str
    priority: int
    meta: dict[str, str]
    strategy: str
    success: str  # roles.SUCCESS_POLICIES
    roles: dict[str, Role]  # the roles that run, in roles.ROLES order (the job's groups)
    # role -> count of the roles that run; in a task, `nomadtf scale` replaces it
    counts: dict[str, int]
    entrypoint: Entrypoint
    source: Source | None
    model_dir: str
    context: dict[str, Any]
    env: dict[str, str]  # every task's; a role's own `env` is Role.env
    driver: Driver
    secrets: tuple[dict[str, Any], ...]
    vault: VaultSettings
    recovery: Recovery
    discovery: Discovery
    admission: Admission
    environment: JobEnvironment | None  # None: the code runs with nomadtf's own interpreter
    run_id: str  # set by `nomadtf run` for each submission (wire.META_RUN); "" before
    submitted_at: float | None
    model_run: str  # the run whose default model_dir is used (RunInfo.model_run)
    document: dict[str, Any] = field(repr=False)

    @property
    def gpus(self) -> dict[str, dict[str, Any] | None]:
        """role -> its GPU request (None: no GPU), for the roles that run."""
        return {role: cfg.gpus for role, cfg in self.roles.items()}

    @property
    def elastic(self) -> dict[str, tuple[int, int]]:
        """role -> (min, max) for the roles with an elastic count."""
        return {role: (cfg.count_min, cfg.count) for role, cfg in self.roles.items() if cfg.count_min is not None}

    def sha256(self) -> str:
        """A stable digest of the normalised job.json; the job's Meta carries it."""
        canonical = json.dumps(self.document, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def from_normalized(cls, document: dict[str, Any]) -> JobSpec:
        """Typed from a normalised document (`normalize`'s, or a task's spec file)."""
        entry = document["entrypoint"]
        kind = next(k for k in ("script", "module", "function") if k in entry)
        rec, disc, driver = document["recovery"], document["discovery"], document["driver"]
        source = document.get("source")
        run = document.get("run") or {}
        return cls(
            name=document["name"],
            namespace=document.get("namespace", wire.DEFAULT_NAMESPACE),
            region=document["region"],
            datacenters=tuple(document["datacenters"]),
            node_pool=document.get("node_pool", "default"),
            priority=document["priority"],
            meta=dict(document["meta"]),
            strategy=document["strategy"],
            success=document.get("success", "auto"),
            roles={role: Role.from_normalized(document["roles"][role]) for role in role_table.ROLES
                   if document["roles"].get(role, {}).get("count", 0) > 0},
            counts={role: cfg["count"] for role, cfg in document["roles"].items() if cfg["count"] > 0},
            entrypoint=Entrypoint(
                kind, entry[kind], tuple(entry.get("args", [])), entry.get("workdir"), tuple(entry.get("pythonpath", []))
            ),
            source=Source(source["url"], source["destination"], dict(source["options"])) if source else None,
            model_dir=document["model_dir"],
            context=document["context"],
            env=dict(document["env"]),
            driver=Driver(driver["name"], driver["python"], driver.get("image"), driver.get("gpu_image"), tuple(driver.get("volumes", ())), driver.get("code_user")),
            secrets=tuple(document["secrets"]),
            vault=VaultSettings.from_normalized(document["vault"]),
            recovery=Recovery(
                restart_attempts=rec["restart_attempts"],
                restart_interval_ns=parse_ns(rec["restart_interval"]),
                restart_delay_ns=parse_ns(rec["restart_delay"]),
                reschedule_attempts=rec["reschedule_attempts"],
                reschedule_interval_ns=parse_ns(rec["reschedule_interval"]),
                reschedule_delay_ns=parse_ns(rec["reschedule_delay"]),
                deadline_ns=parse_ns(rec["deadline"]),
                hang_timeout_ns=parse_ns(rec["hang_timeout"]),
                permanent_exit_codes=frozenset(rec["permanent_exit_codes"]),
            ),
            discovery=Discovery(
                provider=disc["provider"],
                consul_address=disc["consul_address"],
                consul_ca_file=disc.get("consul_ca_file"),
                reconfigure=disc["reconfigure"],
                rendezvous_timeout_s=parse_seconds(disc["rendezvous_timeout"]),
                debounce_s=parse_seconds(disc["debounce"]),
                consul_token_path=disc.get("consul_token_path", ""),
            ),
            admission=Admission.from_normalized(document.get("admission"), parse_seconds(disc["rendezvous_timeout"])),
            environment=JobEnvironment.from_normalized(document.get("environment")),
            run_id=run.get("id", ""),
            submitted_at=run.get("submitted_at"),
            model_run=run.get("model_run", ""),
            document={key: value for key, value in document.items() if key != "run"},
        )

"""DC/OS `beta-tensorflow` options file -> nomadtf job.json. Pure: no I/O, no clients.

The DC/OS package ran user code that exports `main(server, log_dir, context)`; nomadtf's
`legacy_server` strategy calls the same function, so the code runs unchanged. What has no
nomadtf equivalent (fixed ports, disk reservations, DC/OS secret-store paths, the task user,
...) comes back as a note, one per thing, never dropped silently. A role section whose count
is 0 asks for no task, so nothing in it needs carrying over.

Usage:
    conversion = convert_options(json.loads(Path("options.json").read_text()))
    spec.normalize(conversion.job)      # the CLI validates before printing
    for note in conversion.notes:
        print("not carried over:", note)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from nomadtf.errors import SpecError
from nomadtf.job.validate import schema

MHZ_PER_CPU = 1000
# DC/OS section -> nomadtf role (gpu_worker joins worker: nomadtf has one worker group).
SECTIONS = ("service", "parameter_server", "worker", "gpu_worker", "tensorboard")
NOMAD_EPHEMERAL_DISK_MB = 300  # Nomad's default ephemeral_disk per group
SECRET_HINT = "add a `secrets` entry with the Vault path and key (and the Vault policy to vault.policies)"


@dataclass
class Conversion:
    job: dict[str, Any]
    notes: list[str] = field(default_factory=list)


class _Section:
    """One section of the options file; remembers which keys the converter looked at."""

    def __init__(self, name: str, data: Any):
        if data is not None and not isinstance(data, dict):
            raise SpecError(f"{name}: must be an object, got {type(data).__name__}")
        self.name = name
        self.data: dict[str, Any] = data or {}
        self.seen: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return self.data.get(key, default)

    def number(self, key: str) -> float | None:
        value = self.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SpecError(f"{self.name}.{key}: must be a number, got {value!r}")
        return value

    def unseen(self) -> list[str]:
        return [key for key in self.data if key not in self.seen]


def convert_options(options: dict[str, Any]) -> Conversion:
    """Map a DC/OS beta-tensorflow options dict to a nomadtf job.json dict plus notes."""
    if not isinstance(options, dict):
        raise SpecError("options: the top level must be an object")
    notes: list[str] = []
    sections = {name: _Section(name, options.get(name)) for name in SECTIONS}
    service = sections["service"]

    job: dict[str, Any] = {"name": _job_name(service, notes), "strategy": "legacy_server"}
    source = _source(service, notes)
    job["entrypoint"] = _entrypoint(service, source)
    if source:
        job["source"] = source
    job["context"] = _context(service)
    shared = service.get("shared_filesystem")
    if shared:
        job["model_dir"] = shared
    else:
        notes.append(
            "service.shared_filesystem is empty; DC/OS gave each task a persistent volume as log_dir. "
            "nomadtf's default model_dir is on each node's disk: "
            "set model_dir to a filesystem all tasks share"
        )
    driver = _driver(service, notes)
    if driver:
        job["driver"] = driver
    job["roles"] = _roles(sections, service, notes)
    _service_leftovers(service, notes)

    for name in SECTIONS:
        notes.extend(f"{name}.{key}; nomadtf has no equivalent" for key in sections[name].unseen())
    notes.extend(
        f"{key} (the whole section); nomadtf's converter does not know it"
        for key in options
        if key not in SECTIONS
    )
    return Conversion(job, notes)


def _job_name(service: _Section, notes: list[str]) -> str:
    given = service.get("name")
    if not isinstance(given, str) or not given.strip("/"):
        raise SpecError("service.name: required; it becomes the Nomad job ID")
    # DC/OS names may sit in folders (/team/mnist); Nomad IDs and Consul names must be DNS-safe.
    name = re.sub(r"[^a-z0-9]+", "-", given.lower()).strip("-")[:48].rstrip("-")
    if not name:
        raise SpecError(f"service.name: {given!r} has no letters or digits to build a job name from")
    if name != given:
        notes.append(
            f"service.name {given!r} as written; the Nomad job is {name!r} (job IDs must be DNS-safe)"
        )
    return name


def _source(service: _Section, notes: list[str]) -> dict[str, Any] | None:
    url = service.get("job_url")
    if not url:
        return None
    fetchable = schema()["properties"]["source"]["properties"]["url"]["pattern"]
    if not re.match(fetchable, url):
        notes.append(
            f"service.job_url {url!r}; Nomad's artifact block fetches http(s)://, git:: and s3:: URLs: "
            f"put the code at such a URL and set source.url"
        )
        return None
    return {"url": url}


def _entrypoint(service: _Section, source: dict[str, Any] | None) -> dict[str, Any]:
    job_name = service.get("job_name")
    if not isinstance(job_name, str) or not job_name:
        raise SpecError("service.job_name: required; the module (file name without .py) that defines main()")
    module = job_name.removesuffix(".py")
    if not module.isidentifier():
        raise SpecError(
            f"service.job_name: {job_name!r} is not an importable module name; "
            f"rename the file to letters, digits and '_'"
        )
    entry: dict[str, Any] = {"function": f"{module}:main"}
    job_path = (service.get("job_path") or "").rstrip("/")
    if source:
        # Nomad unpacks job_url into the artifact destination inside the task directory,
        # where DC/OS unpacked it into the sandbox; job_path stays relative to it.
        destination = schema()["properties"]["source"]["properties"]["destination"]["default"]
        job_path = f"{destination}/{job_path.lstrip('/')}" if job_path else destination
    if job_path:
        entry["pythonpath"] = [job_path]
    return entry


def _context(service: _Section) -> dict[str, Any]:
    raw = service.get("job_context")
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise SpecError(
            f"service.job_context: must be a string holding a JSON object, got {type(raw).__name__}"
        )
    try:
        context = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"service.job_context: not valid JSON ({exc.msg} at column {exc.colno}); "
            f"it must be a JSON object written as a string"
        ) from exc
    if not isinstance(context, dict):
        raise SpecError(f"service.job_context: must be a JSON object, got {type(context).__name__}")
    return context


def _driver(service: _Section, notes: list[str]) -> dict[str, Any] | None:
    image, gpu_image = service.get("tf_image"), service.get("gpu_tf_image")
    if not image and not gpu_image:
        return None
    driver = {"name": "docker", "image": image or gpu_image}
    if gpu_image and gpu_image != driver["image"]:
        driver["gpu_image"] = gpu_image
    notes.append(
        "the DC/OS wrapper inside the TensorFlow images; nomadtf runs `python3 -m nomadtf task` "
        "in driver.image, so the image needs nomadtf installed (`nomadtf validate` lists what the image "
        "must contain); or drop driver for raw_exec and give the image's Python packages as "
        "`environment.requirements`, which nomadtf builds on each client"
    )
    return driver


def _roles(sections: dict[str, _Section], service: _Section, notes: list[str]) -> dict[str, Any]:
    roles: dict[str, Any] = {}
    ps = _role(sections["parameter_server"], "ps", notes)
    if ps:
        roles["ps"] = ps
    worker = _role(sections["worker"], "worker", notes)
    gpu_worker = _role(sections["gpu_worker"], "worker", notes)
    if worker and gpu_worker:
        roles["worker"] = _merge_workers(worker, gpu_worker, notes)
    elif worker or gpu_worker:
        roles["worker"] = worker or gpu_worker
    board = sections["tensorboard"]
    if service.get("use_tensorboard"):
        roles["tensorboard"] = {"count": 1, **_resources(board)}
        port = board.get("port")
        if port:
            notes.append(
                f"tensorboard.port {port}; nomadtf gives TensorBoard a dynamic port "
                f"(set roles.tensorboard.port to pin it)"
            )
    elif board.data:
        board.seen.update(board.data)
        notes.append("tensorboard (the whole section); service.use_tensorboard is not true")
    return roles


def _role(section: _Section, role: str, notes: list[str]) -> dict[str, Any] | None:
    count = section.get("count", 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise SpecError(f"{section.name}.count: must be a whole number >= 0, got {count!r}")
    if count == 0:
        section.seen.update(section.data)  # no task asked for: nothing to carry over
        return None
    out: dict[str, Any] = {"count": count, **_resources(section)}
    if section.name == "gpu_worker":
        gpus = section.get("gpus", 1)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise SpecError(f"gpu_worker.gpus: must be a whole number >= 1, got {gpus!r}")
        out["gpus"] = gpus
    constraints = _placement(section, role, notes)
    if constraints:
        out["constraints"] = constraints
    port = section.get("port")
    if port:
        notes.append(
            f"{section.name}.port {port}; nomadtf gives every task a dynamic port that Consul publishes "
            f"(set roles.{role}.port to pin one)"
        )
    disk, disk_type = section.get("disk"), section.get("disk_type")
    if disk or disk_type:
        what = " ".join(
            filter(None, [f"disk {disk} MB" if disk else "", f"disk_type {disk_type}" if disk_type else ""])
        )
        notes.append(
            f"{section.name} {what}; nomadtf reserves no disk per task "
            f"(Nomad's default ephemeral disk, {NOMAD_EPHEMERAL_DISK_MB} MB per group, applies)"
        )
    return out


def _resources(section: _Section) -> dict[str, int]:
    out = {}
    cpus, mem = section.number("cpus"), section.number("mem")
    if cpus is not None:
        out["cpu"] = round(cpus * MHZ_PER_CPU)
    if mem is not None:
        out["memory"] = round(mem)
    return out


def _merge_workers(worker: dict[str, Any], gpu_worker: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    merged: dict[str, Any] = {"count": worker["count"] + gpu_worker["count"], "gpus": gpu_worker["gpus"]}
    for key in ("cpu", "memory"):
        values = [r[key] for r in (worker, gpu_worker) if key in r]
        if values:
            merged[key] = max(values)
    constraints = worker.get("constraints", []) + [
        c for c in gpu_worker.get("constraints", []) if c not in worker.get("constraints", [])
    ]
    if constraints:
        merged["constraints"] = constraints
    shape = ", ".join(
        [f"{merged['gpus']} GPU(s)"]
        + [f"{merged[k]} {unit}" for k, unit in (("cpu", "MHz"), ("memory", "MB")) if k in merged]
    )
    notes.append(
        f"worker and gpu_worker as separate groups; nomadtf has one worker group, so the "
        f"{worker['count']} workers and {gpu_worker['count']} GPU workers become {merged['count']} "
        f"workers, each with the larger request ({shape}) and the placement constraints of both"
    )
    return merged


def _placement(section: _Section, role: str, notes: list[str]) -> list[dict[str, str]]:
    """Marathon constraints ("hostname:UNIQUE" or [["hostname", "UNIQUE"]]) -> nomadtf constraints."""
    where = f"{section.name}.placement_constraint"
    text = section.get("placement_constraint")
    if not text:
        return []
    if isinstance(text, list):
        rules = text
    elif isinstance(text, str) and text.lstrip().startswith("["):
        try:
            rules = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    elif isinstance(text, str):
        rules = [part.split(":", 2) for part in text.split(",") if part.strip()]
    else:
        raise SpecError(f"{where}: must be a string such as 'hostname:UNIQUE', got {type(text).__name__}")
    constraints = []
    for rule in rules if isinstance(rules, list) else [rules]:
        if not (isinstance(rule, list) and len(rule) in (2, 3) and all(isinstance(p, str) for p in rule)):
            raise SpecError(f"{where}: {rule!r} is not a Marathon constraint [field, operator, value]")
        attribute, operator, *value = (part.strip() for part in rule)
        mapped = _nomad_constraint(attribute, operator.upper(), value[0] if value else None, role)
        if isinstance(mapped, dict):
            constraints.append(mapped)
        else:
            notes.append(f"{where} {':'.join(rule)!r}; {mapped}")
    return constraints


def _nomad_constraint(attribute: str, operator: str, value: str | None, role: str) -> dict[str, str] | str:
    """The Nomad constraint that means the same, or why there is none and what to write instead."""
    if operator == "GROUP_BY":
        # Not converted: a spread says "prefer", Marathon's GROUP_BY said "balance exactly";
        # the user decides whether a preference is enough.
        spread_over = "${node.unique.name}" if attribute == "hostname" else f"${{meta.{attribute}}}"
        return (
            f"Nomad's counterpart is a spread (a preference, not a rule): add "
            f'roles.{role}.spread [{{"attribute": "{spread_over}"}}] if that is enough'
        )
    if attribute != "hostname":
        return (
            f"Mesos agent attribute {attribute!r} has no fixed Nomad counterpart; if your Nomad clients "
            f"carry it as node meta, add a constraint on ${{meta.{attribute}}} to roles.{role}.constraints"
        )
    if operator == "UNIQUE" and value is None:
        return {"attribute": "${node.unique.id}", "operator": "distinct_hosts", "value": "true"}
    if operator == "MAX_PER" and value and value.isdigit():
        # distinct_property with a value N: at most N of the group's allocations per node.
        return {"attribute": "${node.unique.id}", "operator": "distinct_property", "value": value}
    if operator in ("CLUSTER", "LIKE", "UNLIKE"):
        return (
            f"DC/OS agent hostnames are often IP addresses; add the matching constraint on "
            f"${{attr.unique.hostname}} or ${{attr.unique.network.ip-address}} to roles.{role}.constraints"
        )
    return f"no Nomad constraint means the same; write your own in roles.{role}.constraints"


def _service_leftovers(service: _Section, notes: list[str]) -> None:
    for index, path in enumerate(service.get("secrets") or []):
        notes.append(f"service.secrets[{index}] {path!r}, a DC/OS secret-store path; {SECRET_HINT}")
    if service.get("use_gcs_key_secret"):
        notes.append(f"service.use_gcs_key_secret, the DC/OS secret /gcs_key; {SECRET_HINT}")
    if service.get("gcs_key"):
        # A credential written into the options file: never copied, never echoed.
        notes.append(f"service.gcs_key (a credential; not copied); store it in Vault and {SECRET_HINT}")
    user = service.get("user")
    if user:
        notes.append(
            f"service.user {user!r}; tasks run as the Nomad client's user (raw_exec) "
            f"or the image's user (docker)"
        )
    if service.get("virtual_network"):
        notes.append("service.virtual_network; nomadtf tasks use host networking with dynamic ports")
    if service.get("security"):
        notes.append(
            "service.security (Kerberos); deliver the keytab as a `secrets` file entry "
            "and configure Kerberos in the image"
        )
    if service.get("hdfs"):
        notes.append("service.hdfs; put the HDFS client configuration into the image or the task's env")

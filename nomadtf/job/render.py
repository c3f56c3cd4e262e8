"""JobSpec -> Nomad job (API JSON) through the Jinja2 templates. Pure and offline.

The templates read the JobSpec's attributes (`spec.recovery.restart_delay_ns`,
`spec.roles[role].gpus`); durations are already nanoseconds, as the API takes them.

Usage:
    job = render_job(load_spec(Path("job.json")))   # {"Job": {...}} for Nomad 1.6 (target.BASELINE)
    text = job_json(job)                   # the bytes `nomadtf render` prints
    render_job(spec, templates_dir=Path("my-templates"))
    render_job(spec, target=target.resolve("2.0.5", "--nomad-version"))  # workload identity
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import posixpath
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from nomadtf import __version__, wire
from nomadtf.durations import parse_ns
from nomadtf.errors import RenderError, SpecError
from nomadtf.job import target as target_mod
from nomadtf.job.spec import JobSpec, Role, RunInfo
from nomadtf.job.taskfile import spec_file_text
from nomadtf.job.validate import namespace_folder
from nomadtf.roles import ROLES
from nomadtf.tfconfig import runs_user_code

TEMPLATE_FILES = ("job.json.j2", "group.json.j2", "cluster.ctmpl.j2")


def default_templates_dir() -> Path:
    """Inside the wheel the templates live in nomadtf/templates; in a checkout, at the root."""
    packaged = Path(str(resources.files("nomadtf"))) / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "templates"


def _constraints(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"LTarget": c["attribute"], "RTarget": c["value"], "Operand": c["operator"]} for c in items]


def _placement_constraints(role: Role) -> list[dict[str, Any]]:
    """A role's own placement options as Nomad group constraints: `node_class` is a
    constraint on ${node.class}; `distinct_hosts` is Nomad's operator of that name, which
    compares nothing (no LTarget) and keeps two allocations of the group off one node."""
    out = []
    if role.node_class:
        out.append({"LTarget": "${node.class}", "RTarget": role.node_class, "Operand": "="})
    if role.distinct_hosts:
        out.append({"LTarget": "", "RTarget": "true", "Operand": "distinct_hosts"})
    return out


# The node attribute Nomad's docker driver sets from its plugin's `volumes { enabled }`.
DOCKER_VOLUMES_ATTRIBUTE = "${attr.driver.docker.volumes.enabled}"


def driver_constraints(spec: JobSpec) -> list[dict[str, Any]]:
    """What the driver needs of a node, as group constraints: a docker task with job.json's
    own driver.volumes bind-mounts host paths, which the client's docker plugin must allow.
    Without the constraint such a job is placed and each task fails to start ("volumes are
    not enabled"); with it, the plan says at once that no node can take it (plan.py names
    the fix). nomadtf's own mounts are host volumes, which need no such setting."""
    if spec.driver.name != "docker" or not spec.driver.volumes:
        return []
    return [{"LTarget": DOCKER_VOLUMES_ATTRIBUTE, "RTarget": "true", "Operand": "="}]


def _spreads(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "Attribute": s["attribute"],
            "Weight": s["weight"],
            "SpreadTarget": [{"Value": t["value"], "Percent": t["percent"]} for t in s["targets"]],
        }
        for s in items
    ]


def _affinities(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"LTarget": a["attribute"], "RTarget": a["value"], "Operand": a["operator"], "Weight": a.get("weight", 50)}
        for a in items
    ]


def _device_constraints(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    if gpu.get("model"):
        out.append({"LTarget": "${device.model}", "RTarget": gpu["model"], "Operand": "="})
    if gpu.get("min_memory_mib"):
        out.append({"LTarget": "${device.attr.memory}", "RTarget": f"{gpu['min_memory_mib']} MiB", "Operand": ">="})
    if gpu.get("min_memory"):
        amount, unit = re.fullmatch(r"(\d+) ?(\w+)", gpu["min_memory"]).groups()  # the schema's pattern
        out.append({"LTarget": "${device.attr.memory}", "RTarget": f"{amount} {unit}", "Operand": ">="})
    return out


def _undefined_json(value: Any) -> Any:
    """json.dumps hook for `tojson`: a StrictUndefined value (even nested in a dict) fails as
    an undefined value instead of a TypeError that names no variable."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def template_set(templates_dir: Path | None = None) -> jinja2.Environment:
    """The templates of `templates_dir` (default: nomadtf's) with nomadtf's filters, compiled."""
    return _compiled_template_set(str(templates_dir or default_templates_dir()))


@functools.lru_cache(maxsize=8)
def _compiled_template_set(templates_dir: str) -> jinja2.Environment:
    # Cached: compiling the templates is ~95% of a render (bench/bench_render.py).
    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir),
        undefined=jinja2.StrictUndefined,  # a missing value fails loudly (Levant #393)
        autoescape=False,
        keep_trailing_newline=True,
    )
    templates.filters.update(
        ns=parse_ns,  # the templates' own durations ("20s"); the job's are nanoseconds already
        constraints=_constraints,
        placement_constraints=_placement_constraints,
        spreads=_spreads,
        affinities=_affinities,
        device_constraints=_device_constraints,
    )
    templates.globals["runs_user_code"] = runs_user_code
    templates.globals["needs_vault_token"] = needs_vault_token
    templates.globals["approle_template"] = approle_template
    templates.globals["notify_template"] = notify_template
    templates.globals["docker_host_mounts"] = docker_host_mounts
    templates.filters["volume_requests"] = lambda mounts: {m.volume: m.request() for m in mounts}
    templates.filters["volume_mounts"] = lambda mounts: [m.mount() for m in mounts]
    templates.globals["driver_constraints"] = driver_constraints
    # Sorted keys make the output byte-identical for the same input.
    templates.policies["json.dumps_kwargs"] = {"sort_keys": True, "default": _undefined_json}
    return templates


def task_env(spec: JobSpec, role: str) -> dict[str, str]:
    """The environment of one role's task: the user's env, then what `nomadtf task` reads."""
    env = {**spec.env, **spec.roles[role].env}
    env.update({wire.ENV_TASK_ROLE: role, "CONSUL_HTTP_ADDR": spec.discovery.consul_address})
    if spec.discovery.consul_ca_file:
        env["CONSUL_CACERT"] = spec.discovery.consul_ca_file
    if spec.vault.address:
        env["VAULT_ADDR"] = spec.vault.address
    if spec.vault.ca_file:
        env["VAULT_CACERT"] = spec.vault.ca_file
    return env


@dataclass(frozen=True)
class HostMount:
    """A Nomad host volume a docker task mounts: the operator declares `volume` in the
    client's config (`host_volume "<volume>" { path = ... }`) and Nomad's ACLs say which
    namespace may mount it (`host_volume` policy), so no job needs the docker plugin's
    `volumes.enabled`, which would let any job bind-mount any host path."""

    volume: str
    destination: str
    read_only: bool

    def request(self) -> dict[str, Any]:
        """The group's `volume` block."""
        return {"Name": self.volume, "Type": "host", "Source": self.volume, "ReadOnly": self.read_only}

    def mount(self) -> dict[str, Any]:
        """The task's `volume_mount` block."""
        return {"Volume": self.volume, "Destination": self.destination, "ReadOnly": self.read_only, "PropagationMode": "private"}


def docker_host_mounts(spec: JobSpec) -> list[HostMount]:
    """What a docker task mounts from its client: its namespace's checkpoint folder at the
    same path (`nomadtf-<namespace>`, read-write: this namespace's jobs' checkpoints and no
    other team's), and the directory of the CA files the task is told to trust
    (`nomadtf-ca`, read-only; CONSUL_CACERT and VAULT_CACERT name paths in it). A model_dir
    URL (gs://…) is TensorFlow's to write: nothing to mount. Spec validation made sure the
    folder and the one CA directory exist (spec.docker_path_problems)."""
    mounts = []
    if "://" not in spec.model_dir:
        folder = namespace_folder(spec.model_dir, spec.namespace)
        if folder is None:
            raise RenderError(f"model_dir: {spec.model_dir!r} is outside the namespace's folder (validate the spec first)")
        mounts.append(HostMount(wire.checkpoint_volume(spec.namespace), folder, read_only=False))
    cas = dict.fromkeys(posixpath.dirname(ca) for ca in (spec.discovery.consul_ca_file, spec.vault.ca_file) if ca)
    mounts += [HostMount(wire.CA_VOLUME, folder, read_only=True) for folder in cas][:1]
    return mounts


def approle_template(spec: JobSpec, role: str) -> str | None:
    """consul-template source of the task's AppRole ids file (wire.APPROLE_FILE), from the
    job's Nomad variable: for an AppRole job whose env does not carry the ids, in the tasks
    that log in to Vault (secrets, a Consul token from Vault). None for the others."""
    if spec.vault.auth != "approle" or wire.ENV_VAULT_SECRET_ID in spec.env:
        return None
    if not spec.discovery.consul_token_path and not (spec.secrets and runs_user_code(spec.strategy, role)):
        return None
    # Listed first: `nomadVar` of a variable nobody wrote blocks the task before it starts,
    # with nothing to say why; a listing does not, so the file is empty and the supervisor
    # fails the run naming the variable to write (vault.login).
    variable = wire.approle_variable(spec.name)
    return (f'{{{{ range nomadVarList "{variable}" }}}}{{{{ if eq .Path "{variable}" }}}}{{{{ with nomadVar .Path }}}}'
            f'{{{{ .{wire.APPROLE_ROLE_KEY} }}}}\n{{{{ .{wire.APPROLE_SECRET_KEY} }}}}\n{{{{ end }}}}{{{{ end }}}}{{{{ end }}}}')


def notify_template(spec: JobSpec) -> str | None:
    """consul-template source of the notify URL's file (wire.NOTIFY_FILE), from the job's
    Nomad variable key `notify_url` (a URL's credentials, never in the job); for a job with
    `notify`. Listed first, as the AppRole ids are: a variable nobody wrote leaves the file
    empty instead of holding the task."""
    if "notify" not in spec.document:
        return None
    variable = wire.approle_variable(spec.name)
    return (f'{{{{ range nomadVarList "{variable}" }}}}{{{{ if eq .Path "{variable}" }}}}{{{{ with nomadVar .Path }}}}'
            f'{{{{ range $k, $v := . }}}}{{{{ if eq $k "{wire.NOTIFY_URL_KEY}" }}}}{{{{ $v }}}}{{{{ end }}}}{{{{ end }}}}'
            f'{{{{ end }}}}{{{{ end }}}}{{{{ end }}}}')


def needs_vault_token(spec: JobSpec, role: str) -> bool:
    """Whether Nomad derives a Vault token for `role`'s task: for the secrets of the roles
    that run user code (parameter servers never see one), and for every task when the
    tasks' Consul token comes from Vault."""
    if spec.vault.auth != "nomad":
        return False
    if spec.discovery.consul_token_path:
        return True
    return bool(spec.secrets) and runs_user_code(spec.strategy, role)


def spec_template(spec: JobSpec, run: RunInfo | None = None) -> str:
    """consul-template source that writes the spec file every task reads (wire.SPEC_FILE).
    Base64 keeps the JSON out of reach of both template languages (no `{{`, no `${`)."""
    encoded = base64.b64encode(spec_file_text(spec, run).encode()).decode()
    return '{{ base64Decode "' + encoded + '" }}'


def embedded_spec(task: dict[str, Any]) -> dict[str, Any]:
    """The normalised document a rendered task carries (the inverse of `spec_template`)."""
    for template in task.get("Templates") or []:
        if template.get("DestPath") == f"local/{wire.SPEC_FILE}":
            encoded = template["EmbeddedTmpl"].split('"')[1]
            return json.loads(base64.b64decode(encoded))
    raise RenderError(f"task {task.get('Name')!r} carries no {wire.SPEC_FILE} template")


def job_meta(spec: JobSpec, run: RunInfo | None = None, target: target_mod.Target | None = None) -> dict[str, str]:
    meta = {
        **spec.meta,
        wire.META_VERSION: __version__,
        wire.META_SPEC_SHA256: spec.sha256(),
        wire.META_STRATEGY: spec.strategy,
    }
    steps = spec.context.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
        meta[wire.META_STEPS] = str(steps)
    if spec.admission.duration_s is not None:
        meta[wire.META_DURATION] = f"{spec.admission.duration_s:g}"
    if run:
        meta[wire.META_RUN] = run.id
        if run.model_run and run.model_run != run.id:
            meta[wire.META_MODEL_RUN] = run.model_run
    if target:
        meta[wire.META_NOMAD_VERSION] = str(target.version)
    return meta


def vault_role(spec: JobSpec) -> str:
    """The Vault JWT auth role a task's vault block names on Nomad 1.7+: job.json's
    `vault.role`, else the job's own (the name `nomadtf acl apply` gives it)."""
    return spec.vault.role or wire.acl_name(spec.namespace, spec.name)


def rendering_notes(spec: JobSpec, target: target_mod.Target | None) -> list[str]:
    """What the rendering for `target` leaves out of job.json, in words for the submitter:
    on a Nomad whose tasks log in to Vault with their identity, `vault.policies` is not
    rendered (Nomad 1.10+ drops a job's policies); the job's JWT role grants them instead,
    the one `nomadtf acl apply` writes (acl.jwt_role_policies), unless vault.role names
    another. The job's own policy, which that role always grants, is not mentioned."""
    vault = spec.vault
    if target is None or not any(needs_vault_token(spec, role) for role in spec.roles):
        return []
    if not target.rendering(vault.workflow).vault_identity:
        return []
    own = wire.acl_name(spec.namespace, spec.name)
    listed = [policy for policy in vault.policies if policy != own]
    if not listed:
        return []
    role = vault_role(spec)
    if role != own:
        return [
            f"vault.policies {listed} are not rendered for Nomad {target.version}: its tasks log in with the JWT role {role} "
            "(vault.role), which grants what its operator wrote into it"
        ]
    return [
        f"vault.policies {listed} are granted through the JWT role {role} that `nomadtf acl apply` writes; "
        "Nomad >= 1.10 ignores a job's policies"
    ]


def version_dependent(spec: JobSpec) -> list[str]:
    """Why `spec` renders differently for Nomad 1.6 and for later versions in a way that
    breaks at run time when the guess is wrong (docs/nomad-versions.md, "What differs");
    [] when a rendering for 1.6 also runs on later versions."""
    reasons = []
    if any(needs_vault_token(spec, role) for role in spec.roles):
        reasons.append("its tasks get their Vault token from Nomad (with vault.policies on 1.6, a workload identity and a JWT role on 1.7+)")
    if spec.discovery.reconfigure == "template":
        reasons.append("template mode's tasks read Consul in a template (Nomad 1.10+ needs a consul block for that)")
    return reasons


def rendering_context(spec: JobSpec, target: target_mod.Target | None) -> dict[str, Any]:
    """What the templates need to know about the target Nomad: the decisions (never the
    version) and the identities' settings. No target: Nomad 1.6, the rendering of before."""
    workflow = spec.vault.workflow
    effective = target or target_mod.Target(target_mod.BASELINE, target_mod.BASELINE, "no --nomad-version")
    problems = target_mod.workflow_problems(workflow, effective)
    if problems:
        raise SpecError(problems)
    return {
        "rendering": effective.rendering(workflow),
        "vault_role": vault_role(spec),
        "identity": {
            "vault": target_mod.VAULT_IDENTITY_NAME,
            "vault_audience": target_mod.VAULT_AUDIENCE,
            "consul": target_mod.CONSUL_IDENTITY_NAME,
            "consul_audience": target_mod.CONSUL_AUDIENCE,
            "ttl": target_mod.IDENTITY_TTL,
        },
    }


def render_job(
    spec: JobSpec,
    templates_dir: Path | None = None,
    run: RunInfo | None = None,
    target: target_mod.Target | None = None,
) -> dict[str, Any]:
    """The Nomad job for `spec`; `run` (from `nomadtf run`) goes into the job's Meta and the
    tasks' spec file. Without one the job is the same for the same spec, byte for byte.
    `target`: the Nomad it is for (recorded in the Meta); None renders for Nomad 1.6 and
    records none, as nomadtf always did."""
    templates = template_set(templates_dir)
    roles = list(spec.roles)
    context = {
        **rendering_context(spec, target),
        "spec": spec,
        "roles": roles,
        "service_names": {role: wire.service_name(spec.namespace, spec.name, role) for role in ROLES},
        "service_tags": {role: wire.service_tags(role) for role in ROLES},
        "wire": wire,
    }
    try:
        cluster_template = templates.get_template("cluster.ctmpl.j2").render(context)
        text = templates.get_template("job.json.j2").render(
            **context,
            meta=job_meta(spec, run, target),
            task_env={role: task_env(spec, role) for role in roles},
            cluster_template=cluster_template,
            spec_template=spec_template(spec, run),
        )
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"template {exc.name!r} not found in {templates_dir or default_templates_dir()}") from exc
    except jinja2.UndefinedError as exc:
        raise RenderError(f"template uses an undefined value: {exc.message}") from exc
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        line = text.splitlines()[exc.lineno - 1] if exc.lineno <= len(text.splitlines()) else ""
        raise RenderError(f"templates produced invalid JSON at line {exc.lineno}: {exc.msg}: {line.strip()}") from exc


def stamp_run(job: dict[str, Any], spec: JobSpec, run: RunInfo) -> dict[str, Any]:
    """`job` (render_job's for `spec`, with or without a run) as render_job renders it with
    `run`, without rendering again: only the job's Meta and each task's spec file carry the
    run (tests/unit/job/test_render.py holds the two equal). A copy; `job` is left as it is."""
    stamped = copy.deepcopy(job)
    body = stamped["Job"]
    run_keys = (wire.META_RUN, wire.META_MODEL_RUN)
    meta = {key: value for key, value in (body.get("Meta") or {}).items() if key not in run_keys}
    body["Meta"] = {**meta, **{key: value for key, value in job_meta(spec, run).items() if key in run_keys}}
    source = spec_template(spec, run)
    for group in body.get("TaskGroups") or []:
        for task in group.get("Tasks") or []:
            for template in task.get("Templates") or []:
                if template.get("DestPath") == f"local/{wire.SPEC_FILE}":
                    template["EmbeddedTmpl"] = source
    return stamped


def docker_image_needs(spec: JobSpec) -> list[str]:
    """What driver.image must contain: with docker the image is the job's environment
    (job.json `environment` is refused there), and the task the templates render runs
    nomadtf inside it."""
    driver = spec.driver
    if driver.name != "docker":
        return []
    images = " and ".join(dict.fromkeys(i for i in (driver.image, driver.gpu_image) if i))
    needs = [
        f"docker: {images} must contain:",
        "  - python3 on PATH (the task runs `python3 -m nomadtf task --role <role>`, under Docker's init)",
        "  - nomadtf with its dependencies for that python3 (pip install nomadtf)",
        "  - TensorFlow in the version the code needs (a CUDA build in driver.gpu_image for GPU roles)",
    ]
    if "tensorboard" in spec.roles:
        needs.append("  - tensorboard (the tensorboard role runs `python3 -m tensorboard.main`)")
    if spec.source is None:
        needs.append(f"  - the code at {spec.entrypoint.workdir or 'the task directory'} (or fetch it with source.url)")
    return needs


def job_json(job: dict[str, Any]) -> str:
    return json.dumps(job, indent=2, sort_keys=True) + "\n"

"""job.json checked: plain JSON values, the schema (every problem at once, each with its JSON
path and the fix), the schema's defaults filled once, and the checks across fields; pure.

Usage:
    document = normalize(raw)              # or SpecError naming every problem
"""

from __future__ import annotations

import copy
import difflib
import json
import posixpath
import re
import urllib.parse
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from nomadtf import durations, wire
from nomadtf import roles as role_table
from nomadtf.durations import parse_ns, parse_seconds
from nomadtf.errors import SpecError
from nomadtf.roles import SINGLETON_ROLES

if TYPE_CHECKING:
    import jsonschema


# jsonschema and yaml are imported where they are used: `nomadtf task` reads the spec it was
# rendered with (JSON, validated at submission) and starts faster without them.


@cache
def schema() -> dict[str, Any]:
    text = resources.files("nomadtf").joinpath("schema/job.schema.json").read_text()
    return json.loads(text)


NAMESPACE_RULE = "use letters, digits and '-' (1 to 128 of them)"


DOCKER_CODE_USER = "65534:65534"  # nobody, where the cluster profile names no code user


def normalize(data: dict[str, Any]) -> dict[str, Any]:
    """Validate (all problems at once) and return the spec with every default filled in."""
    problems = json_value_problems(data)
    if problems:
        raise SpecError(problems)  # the schema and the templates expect plain JSON
    problems = schema_problems(data)
    if problems:
        raise SpecError(problems)
    document = fill_defaults(data, schema(), schema())
    if document["driver"]["name"] == "docker":
        # A container's code never runs as root beside its supervisor (runtime/codeuser.py).
        document["driver"].setdefault("code_user", DOCKER_CODE_USER)
    problems = elastic_count_problems(document)
    if problems:
        raise SpecError(problems)
    problems = cross_field_problems(document)
    if problems:
        raise SpecError(problems)
    return document


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _json_path(parts: Any) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:  # quoted, so a key with a newline or a dot shows as written
            out += f"[{part!r}]"
    return out or "(top level)"


INT64 = 2**63  # Nomad decodes every integer of the job into a Go int64 (durations too, in ns)


MAX_DEPTH = 64


MAX_VALUES = 100_000


def json_value_problems(data: Any) -> list[str]:
    """What is not plain, Nomad-sized JSON: YAML's non-string keys, dates and sets,
    NaN/Infinity, integers beyond int64, and documents nested or (YAML aliases) expanded
    beyond reason. Values are not echoed: they may be tokens."""
    problems: list[str] = []
    stack: list[tuple[list[Any], Any]] = [([], data)]
    seen = 0
    while stack and len(problems) < 20:
        parts, value = stack.pop()
        seen += 1
        where = _json_path(parts)
        if seen > MAX_VALUES:
            return problems + [f"(top level): more than {MAX_VALUES} values (YAML aliases that expand?); not a job.json"]
        if len(parts) > MAX_DEPTH:
            problems.append(f"{where}: nested more than {MAX_DEPTH} deep")
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):
                    stack.append(([*parts, key], item))
                else:
                    problems.append(f"{where}: key {key!r} must be a string; quote it")
        elif isinstance(value, list):
            stack.extend(([*parts, i], item) for i, item in enumerate(value))
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            pass
        elif isinstance(value, int):
            if not -INT64 <= value < INT64:
                problems.append(f"{where}: a number too large for Nomad (64-bit integers)")
        elif isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                problems.append(f"{where}: NaN and Infinity are not JSON numbers")
        else:
            hint = "; quote it" if type(value).__module__ == "datetime" else ""
            problems.append(f"{where}: a {type(value).__name__} is not a JSON value{hint}")
    return problems


def _is_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 2.0 as an integer; Nomad's Go decoder refuses it for Count, CPU...
    return isinstance(instance, int) and not isinstance(instance, bool)


def _pattern(validator: Any, pattern: str, instance: Any, node: dict[str, Any]) -> Any:
    # JSON Schema's (ECMA-262's) `$` ends the string; Python's also matches before a final
    # newline, which would let "abc\n" through as a job name or "5s\n" as a duration.
    if validator.is_type(instance, "string"):
        python = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
        if not re.search(python, instance):
            import jsonschema

            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@cache
def _validator_class() -> Any:
    import jsonschema

    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        validators={"pattern": _pattern},
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
    )


def schema_problems(data: dict[str, Any]) -> list[str]:
    validator = _validator_class()(schema())
    problems = []
    for error in sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        problems.extend(_explain(error, data))
    return list(dict.fromkeys(problems))


def _explain(error: jsonschema.ValidationError, data: dict[str, Any]) -> list[str]:
    where = _json_path(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = list((error.schema.get("properties") or {}).keys())
        unknown = [k for k in error.instance if k not in allowed] if isinstance(error.instance, dict) else []
        lines = []
        for key in unknown:
            path = _json_path([*error.absolute_path, key])
            if key == "value" and "secrets" in where:
                lines.append(
                    f"{path}: a secret's value never goes in job.json; store it in Vault and "
                    f"reference it with path and key"
                )
                continue
            guess = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
            hint = f"; did you mean {guess[0]!r}?" if guess else f"; allowed: {', '.join(allowed)}"
            lines.append(f"{path}: unknown key {key!r}{hint}")
        return lines
    if error.validator == "pattern" and where == "name":
        return [
            f"name: {error.instance!r} is not DNS-safe; use lower-case letters, digits and '-' "
            f"(at most 48, starting and ending with a letter or digit)"
        ]
    if error.validator == "pattern" and where == "namespace":
        return [f"namespace: {error.instance!r} is not a Nomad namespace; {NAMESPACE_RULE}"]
    if error.validator == "minimum" and where.endswith(".count"):
        return [f"{where}: count must be >= {error.validator_value}, got {error.instance}"]
    if error.validator == "oneOf" and where == "entrypoint":
        return ["entrypoint: give exactly one of 'script', 'module' or 'function'"]
    if error.validator == "oneOf" and where.startswith("secrets"):
        if not isinstance(error.instance, dict):
            return []  # the item's own type error says it; repeating it would echo the value
        return [f"{where}: give exactly one of 'env' or 'file' for where the secret goes"]
    if _holds_secrets(where) and error.validator == "type":
        # Never echo what was written there: it may be a secret's value (or a token in env).
        return [f"{where}: must be of type {error.validator_value}, got {type(error.instance).__name__}"]
    if error.validator == "oneOf" and error.context:
        # Explain the branch written for this kind of value (gpus: 2 or {"count": 2, ...}),
        # so a misspelt key inside it still gets its did-you-mean.
        branches: dict[Any, list[jsonschema.ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        fitting = [
            subs for subs in branches.values()
            if not any(sub.validator == "type" and not sub.relative_path for sub in subs)
        ]
        if len(fitting) == 1:
            return [line for sub in fitting[0] for line in _explain(sub, data)]
        kinds = [sub.validator_value for subs in branches.values() for sub in subs if sub.validator == "type" and not sub.relative_path]
        if not fitting and not _holds_secrets(where):
            return [f"{where}: {error.instance!r} is not of type {' or '.join(map(repr, kinds))}"]
    if error.validator == "required":
        return [f"{where}: {error.message}"]
    if error.validator == "pattern" and "$defs/duration" in str(error.schema_path) or (
        error.validator == "pattern" and isinstance(error.instance, str) and error.schema.get("pattern", "").endswith("(ms|s|m|h)$")
    ):
        return [f"{where}: {error.instance!r} is not a duration; write e.g. 30s, 5m or 2h"]
    return [f"{where}: {error.message}"]


def _holds_secrets(where: str) -> bool:
    """`secrets`, and the environment (`env`, `roles.<role>.env`), where tokens end up."""
    return where.startswith(("secrets", "env")) or bool(re.match(r"roles\.\w+\.env(\.|$)", where))


def fill_defaults(value: Any, node: dict[str, Any], root: dict[str, Any]) -> Any:
    """Copy `value`, adding schema defaults for missing object properties, recursively."""
    if "$ref" in node:
        ref = node["$ref"].removeprefix("#/$defs/")
        return fill_defaults(value, root["$defs"][ref], root)
    if isinstance(value, dict) and "properties" in node:
        out = {}
        for key, sub in node["properties"].items():
            if key in value:
                out[key] = fill_defaults(value[key], sub, root)
            elif "default" in sub:
                out[key] = fill_defaults(copy.deepcopy(sub["default"]), sub, root)
        for key in value:
            if key not in out:
                out[key] = copy.deepcopy(value[key])
        return out
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [fill_defaults(v, node["items"], root) for v in value]
    if "oneOf" in node and isinstance(value, dict):
        for option in node["oneOf"]:
            if option.get("type") == "object":
                return fill_defaults(value, option, root)
    return copy.deepcopy(value)


def elastic_count_problems(document: dict[str, Any]) -> list[str]:
    """An elastic count (`{"min": m, "max": n}`) becomes `count: n` and `count_min: m` in
    `document` (in place), so everything after reads a number; the problems with it."""
    problems = []
    for role, cfg in document["roles"].items():
        count = cfg.get("count")
        if not isinstance(count, dict):
            continue
        if role not in role_table.SCALABLE_ROLES:
            problems.append(f"roles.{role}.count: only {', '.join(role_table.SCALABLE_ROLES)} may be elastic; give {role} a number")
        elif count["min"] > count["max"]:
            problems.append(f"roles.{role}.count: min ({count['min']}) is more than max ({count['max']}); swap them")
        cfg["count"], cfg["count_min"] = count["max"], count["min"]
    return problems


def cross_field_problems(document: dict[str, Any]) -> list[str]:
    problems = []
    strategy = document["strategy"]
    roles = document["roles"]
    for role in sorted(role_table.required_roles(strategy)):
        if roles.get(role, {}).get("count", 0) < 1:
            problems.append(f"roles.{role}: strategy {strategy!r} needs at least one {role}; add roles.{role}")
    for role in sorted(set(roles) - role_table.allowed_roles(strategy)):
        if roles[role]["count"] > 0:
            problems.append(f"roles.{role}: strategy {strategy!r} has no {role} role; remove it")
    for role in SINGLETON_ROLES:
        if roles.get(role, {}).get("count", 0) > 1:
            problems.append(f"roles.{role}.count: at most one {role} per job, got {roles[role]['count']}")
    problems += data_service_problems(roles)
    success = document["success"]
    if success == "chief" and roles.get("chief", {}).get("count", 0) < 1:
        problems.append("success: 'chief' needs a chief; add roles.chief or use 'worker0' / 'all_workers'")
    if success in ("worker0", "all_workers") and not role_table.runs_user_code(strategy, "worker"):
        problems.append(f"success: {success!r} needs workers that run your code; strategy {strategy!r} runs a bare server there; use 'chief'")
    ready = parse_seconds((document.get("admission") or {}).get("ready_timeout", "0s"))
    rendezvous = parse_seconds((document.get("discovery") or {}).get("rendezvous_timeout", "5m"))
    if ready and ready >= rendezvous:
        problems.append(f"admission.ready_timeout: must be shorter than discovery.rendezvous_timeout ({rendezvous:g}s), or the run fails "
                        "before it could be queued again; shorten it, or lengthen the rendezvous timeout")  # fmt: skip
    if not role_table.uses_tf_config(strategy):
        for role, cfg in sorted(roles.items()):
            if isinstance(cfg.get("gpus"), dict) and "memory_limit_mib" in cfg["gpus"]:
                problems.append(f"roles.{role}.gpus.memory_limit_mib: caps TensorFlow's memory, not JAX's; under strategy {strategy!r} "
                                "remove it and set XLA_PYTHON_CLIENT_MEM_FRACTION (e.g. \"0.5\") in env instead")  # fmt: skip
    entry = document["entrypoint"]
    if "function" in entry and strategy != "legacy_server":
        problems.append("entrypoint.function: only for strategy 'legacy_server'; use 'script' or 'module'")
    if strategy == "legacy_server" and "function" not in entry:
        problems.append("entrypoint: strategy 'legacy_server' calls main(server, log_dir, context); give 'function': 'module:main'")
    driver = document["driver"]
    if driver["name"] == "docker" and not driver.get("image"):
        problems.append("driver.image: the docker driver needs an image with TensorFlow and nomadtf (`nomadtf dev image build` makes one)")
    if driver["name"] == "exec":
        # Nomad's exec driver runs a task in a chroot of the client's /bin, /lib, /usr and /etc:
        # a nomadtf and a TensorFlow installed in a virtual environment or under /opt are not
        # in it, and the task dies with "No module named nomadtf" before it can say why.
        problems.append(
            "driver.name: 'exec' runs each task in a chroot of the client's system directories, which holds no "
            "nomadtf or TensorFlow of a virtual environment; use 'docker' (isolation, with driver.image) or 'raw_exec'"
        )
    if driver["name"] != "docker" and driver.get("volumes"):
        problems.append("driver.volumes: only the docker driver mounts volumes; remove them or use driver docker")
    if driver["name"] == "docker":
        problems += docker_path_problems(document)
    if document["secrets"] and document["vault"]["auth"] == "nomad" and not document["vault"]["policies"]:
        problems.append("vault.policies: secrets are read with the token Nomad gives the task; list the Vault policies that allow reading them")
    if document["discovery"].get("consul_token_path") and document["vault"]["auth"] == "nomad" and not document["vault"]["policies"]:
        problems.append(
            "vault.policies: discovery.consul_token_path is read with the token Nomad gives the task; list the Vault "
            "policy that allows reading it (`nomadtf acl policies` prints one)"
        )
    if document["vault"]["auth"] == "jwt":
        # Nomad 1.6 signs workload identities but publishes no JWKS for Vault to verify them
        # (Nomad 1.7 added that): a JWT login cannot be set up with the Nomad this targets.
        problems.append(
            "vault.auth: 'jwt' needs Nomad's workload identities for Vault, which Nomad 1.7+ provides and Nomad 1.6 "
            "does not; use 'nomad' (the token Nomad derives for the task) or 'approle'"
        )
    targets = [s.get("env") or s.get("file") for s in document["secrets"]]
    for dup in sorted({t for t in targets if targets.count(t) > 1}):
        problems.append(f"secrets: {dup!r} is the target of more than one secret")
    for section, node in schema()["properties"].items():  # every duration of a section
        for key, value in (document.get(section) or {}).items() if "properties" in node else ():
            if node["properties"].get(key, {}).get("$ref") == "#/$defs/duration" and parse_ns(value) >= durations.INT64:
                problems.append(f"{section}.{key}: {value!r} is longer than Nomad can hold (about 292 years)")
    problems += environment_problems(document)
    problems += notify_problems(document)
    problems += archive_problems(document)
    if parse_seconds(document["recovery"]["reschedule_delay"]) < 5:
        problems.append("recovery.reschedule_delay: Nomad needs at least 5s; write e.g. 5s")
    for role, cfg in roles.items():
        if cfg.get("memory_max") is not None and cfg["memory_max"] < cfg["memory"]:
            problems.append(f"roles.{role}.memory_max: must be >= memory ({cfg['memory']})")
        problems += spread_problems(f"roles.{role}.spread", cfg["spread"])
    return problems


def docker_path_problems(document: dict[str, Any]) -> list[str]:
    """The paths a docker task must find inside its container: Nomad mounts only the task's
    local/ (at /local), secrets/ and the allocation's shared directory into it, and nomadtf
    bind-mounts model_dir's root at the same path."""
    problems = []
    source = document.get("source")
    destination = posixpath.normpath(source["destination"]) if source else "local"
    if destination != "local" and not destination.startswith("local/"):
        # Nomad unpacks the artifact relative to the task's directory on the client; of that
        # directory a container sees local/ only (an `alloc/` there is not the shared one).
        problems.append(
            f"source.destination: {source['destination']!r} is outside the container of a docker task, which sees "
            "only the task's local/ directory; write 'local/code' (the default) or another path under local/"
        )
    model_dir = document["model_dir"]
    if "://" not in model_dir and not model_dir.startswith("/"):
        problems.append(
            f"model_dir: {model_dir!r} is not an absolute path; with the docker driver give a path on storage every "
            "client shares (it is mounted at the same path in each container) or a URL TensorFlow writes itself (gs://…)"
        )
    elif "://" not in model_dir and namespace_folder(model_dir, document.get("namespace", wire.DEFAULT_NAMESPACE)) is None:
        volume = wire.checkpoint_volume(document.get("namespace", wire.DEFAULT_NAMESPACE))
        problems.append(
            f"model_dir: {model_dir!r} is outside every namespace's folder; a docker task sees only its namespace's "
            f"checkpoint folder (the client's host volume {volume}), so give a model_dir under <root>/${{NOMAD_NAMESPACE}}/, "
            "like the default /tmp/nomadtf/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMADTF_RUN_ID}"
        )
    cas = {posixpath.dirname(ca) for ca in ((document.get("discovery") or {}).get("consul_ca_file"), (document.get("vault") or {}).get("ca_file")) if ca}
    if len(cas) > 1:
        problems.append(
            f"discovery.consul_ca_file and vault.ca_file: in two directories ({', '.join(sorted(cas))}); a docker task "
            f"mounts one, the client's read-only host volume {wire.CA_VOLUME}: keep both CA files in one directory"
        )
    return problems


def namespace_folder(model_dir: str, namespace: str) -> str | None:
    """The folder of `namespace` that holds `model_dir`: the path up to its first segment
    that is the namespace (or ${NOMAD_NAMESPACE}) with no task variable before it. A docker
    task mounts that folder, the client's host volume for the namespace, at the same path.
    None when model_dir has no such segment. Pure."""
    segments = model_dir.replace("${" + wire.ENV_NOMAD_NAMESPACE + "}", namespace).split("/")
    for i, segment in enumerate(segments):
        if "$" in segment:
            return None
        if i and segment == namespace:
            return "/".join(segments[: i + 1])
    return None


def environment_problems(document: dict[str, Any]) -> list[str]:
    """`environment` with the driver that runs it: a client-wide cache needs raw_exec."""
    section = document.get("environment")
    if not section:
        return []
    from nomadtf.venvs import requirement_problems  # packaging only when it is used

    problems = requirement_problems(section["requirements"])
    driver = document["driver"]["name"]
    if driver == "docker":
        problems.append(
            "environment: with the docker driver the image is the job's environment; install these requirements "
            "in driver.image (it must also hold python3 with nomadtf, see `nomadtf validate`), or use driver raw_exec"
        )
    return problems


def notify_problems(document: dict[str, Any]) -> list[str]:
    """A notify URL that carries credentials: they would be in the rendered job. Pure."""
    url = (document.get("notify") or {}).get("url", "")
    if "@" in urllib.parse.urlsplit(url).netloc:
        return [
            f"notify.url: {urllib.parse.urlsplit(url).hostname}'s URL carries credentials, which would be in the job; "
            f"give it without them and put the whole URL in the job's Nomad variable "
            f"(nomad var put nomad/jobs/<job> {wire.NOTIFY_URL_KEY}=URL)"
        ]
    return []


def archive_problems(document: dict[str, Any]) -> list[str]:
    """An archive folder outside the job's own namespace's folder: the supervisor (root) makes
    the run's folders there, so a job.json could make them in another team's folder, or
    anywhere. Like model_dir's, it holds a segment that is the namespace. Pure."""
    folder = (document.get("archive") or {}).get("folder")
    namespace = document.get("namespace", wire.DEFAULT_NAMESPACE)
    if not folder:
        return []
    if ".." in folder.split("/") or namespace_folder(folder, namespace) is None:
        return [
            f"archive.folder: {folder!r} is not a folder of namespace {namespace!r}; the run's archive lies in its own "
            "namespace's folder: give a path with ${NOMAD_NAMESPACE} as a segment and no '..', "
            "like /shared/archive/${NOMAD_NAMESPACE}"
        ]
    return []


def data_service_problems(roles: dict[str, Any]) -> list[str]:
    """The tf.data service comes whole: workers need a dispatcher to register with, and a
    dispatcher without workers would hold the code's first read forever. Pure."""
    dispatchers = roles.get("data_dispatcher", {}).get("count", 0)
    workers = roles.get("data_worker", {}).get("count", 0)
    if workers and not dispatchers:
        return ["roles.data_worker: data workers register with a dispatcher; add roles.data_dispatcher ({\"count\": 1})"]
    if dispatchers and not workers:
        return ["roles.data_dispatcher: a dispatcher without data workers serves no data; add roles.data_worker (e.g. {\"count\": 2})"]
    return []


def spread_problems(where: str, spreads: list[dict[str, Any]]) -> list[str]:
    """What Nomad would refuse in a role's spread blocks, said before anything is sent."""
    problems = []
    for i, spread in enumerate(spreads):
        values = [t["value"] for t in spread["targets"]]
        for dup in sorted({v for v in values if values.count(v) > 1}):
            problems.append(f"{where}[{i}].targets: value {dup!r} is listed more than once")
        total = sum(t["percent"] for t in spread["targets"])
        if total > 100:
            problems.append(f"{where}[{i}].targets: the percentages add up to {total}; at most 100")
    return problems


def _gpu_request(gpus: int | dict[str, Any]) -> dict[str, Any] | None:
    """A role's `gpus` (a count or an object) as {"count", "vendor", ...}, None for none."""
    if isinstance(gpus, int):
        return {"count": gpus, "vendor": "nvidia"} if gpus > 0 else None
    return {"vendor": "nvidia", **gpus}

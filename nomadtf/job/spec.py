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

import copy
import dataclasses
import difflib
import hashlib
import json
import os
import posixpath
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
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


def read_options(path: Path) -> dict[str, Any]:
    """Parse a job.json (or .yaml/.yml) file into a dict."""
    import yaml

    is_yaml = path.suffix in (".yaml", ".yml")
    kind = "YAML" if is_yaml else "JSON"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read it ({exc.strerror})") from exc
    try:
        text = raw.decode("utf-8-sig")  # an editor's byte-order mark is harmless
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x}); save it as UTF-8") from exc
    try:
        data = yaml.safe_load(text) if is_yaml else json.loads(text)
    except yaml.MarkedYAMLError as exc:
        # Line and column only: the snippet PyYAML quotes may be a line holding a token.
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}: not valid YAML{where}: {exc.problem or exc.context}") from exc
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: JSONDecodeError, an integer of 4300+ digits
        raise SpecError(f"{path}: not valid {kind}: {exc}") from exc
    except RecursionError as exc:
        raise SpecError(f"{path}: nested too deeply to be a job.json") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the top level must be an object")
    problems = json_value_problems(data)  # before anything walks it recursively
    if problems:
        raise SpecError(problems)
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`roles.worker.count=4` sets data["roles"]["worker"]["count"] = 4.

    The value is parsed as JSON when it parses (numbers, booleans, lists, objects),
    otherwise taken as a string.
    """
    result = copy.deepcopy(data)
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise SpecError(f"--var {item!r}: expected path=value, e.g. roles.worker.count=4")
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON (or 4300+ digits, or too deep): a string
            value = raw
        node = result
        keys = path.split(".")
        for key in keys[:-1]:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise SpecError(f"--var {path}: {key!r} is not an object")
            node = child
        node[keys[-1]] = value
    return result


DCOS_SECTIONS = ("service", "parameter_server", "gpu_worker")


def looks_like_dcos_options(data: Any) -> bool:
    """A DC/OS `beta-tensorflow` options file (the users we migrate) rather than a job.json:
    its `service` section, or its DC/OS-only role sections, and none of job.json's own keys."""
    return (
        isinstance(data, dict)
        and not {"roles", "entrypoint"} & data.keys()
        and any(isinstance(data.get(section), dict) for section in DCOS_SECTIONS)
    )


def load_options(path: Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """job.json as written, with the `--var` overrides and the namespace applied; not yet
    validated. The one step that sees the raw mapping (`acl` adds its policy to it)."""
    data = read_options(path)
    if looks_like_dcos_options(data):
        raise SpecError(
            f"{path} is a DC/OS beta-tensorflow options file, not a nomadtf job.json; convert it first: "
            f"nomadtf convert-dcos {path} --out job.json (it lists what cannot be carried over)"
        )
    return with_namespace(apply_overrides(data, overrides or []), os.environ)


def load_spec(path: Path, overrides: list[str] | None = None) -> JobSpec:
    """The job file, validated and typed: what every client-side command works from."""
    return parse_spec(load_options(path, overrides))


def parse_spec(data: dict[str, Any]) -> JobSpec:
    """A job.json mapping validated (every problem at once), its defaults filled, typed."""
    return JobSpec.from_normalized(normalize(data))


def with_vault_policies(data: dict[str, Any], policies: list[str]) -> dict[str, Any]:
    """`data` with these Vault policies when it lists none: what `nomadtf acl` is about to
    create, so that the spec it works from reads the secrets with them."""
    vault = data.get("vault") or {}
    if not isinstance(vault, dict) or vault.get("policies"):
        return data  # its own policies, or a mistake that validation names
    return {**data, "vault": {**vault, "policies": list(policies)}}


def with_namespace(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """job.json's namespace, else NOMAD_NAMESPACE, else `default` (wire.resolve_namespace),
    the same rule as every command that takes a job id. One from NOMAD_NAMESPACE is checked
    here, where the message can say where it came from."""
    if "namespace" in data:
        return data
    namespace = wire.resolve_namespace(None, environ)
    if not re.search(wire.NAMESPACE_PATTERN[:-1] + r"\Z", namespace):
        raise SpecError(f"namespace: NOMAD_NAMESPACE={namespace!r} is not a Nomad namespace; {NAMESPACE_RULE}, or set namespace in job.json")
    return {**data, "namespace": namespace}


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

"""job.json read: the file (JSON or YAML), its `--var` overrides, DC/OS options told apart,
the namespace and the Vault policies filled in: the raw mapping validation takes (validate.py).

Usage:
    raw = load_options(Path("job.json"), ["roles.worker.count=4"])
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nomadtf import wire
from nomadtf.errors import SpecError
from nomadtf.job.validate import NAMESPACE_RULE, json_value_problems


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

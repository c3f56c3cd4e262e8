"""Fuzzing job.json: inputs generated from the schema and mutations of the examples.

The property, for `render` (and `validate`, `plan`, `run` where they could reach a server):
an input gives exit 0 with a Nomad job (JSON with the Job shape, every integer an int64),
or exit 2 with each problem naming a field path. Never a traceback, never another exit
code, never a request to Nomad, Consul or Vault for an input that is invalid, and never a
token written in `env` or `secrets` echoed back in an error.

The CLI runs in-process through `cli.main` (the real exit path: its catch-all turns a stray
exception into exit 70, which fails here); a few cases also run the console script.

Profiles (HYPOTHESIS_PROFILE): `nomadtf` (default) is derandomized so CI checks the same
inputs on every run and a failure reproduces; `nomadtf-explore` draws fresh random inputs,
many more of them, for hunting by hand.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from nomadtf import cli
from nomadtf.job.validate import schema
from tests.helpers import EXAMPLES, nomadtf

settings.register_profile(
    "nomadtf",
    max_examples=60,
    deadline=None,  # this slow, shared machine makes per-example timings meaningless
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
settings.register_profile("nomadtf-explore", parent=settings.get_profile("nomadtf"), max_examples=int(os.environ.get("NOMADTF_FUZZ_EXAMPLES", "2000")), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "nomadtf"))

SCHEMA = schema()
TOP_LEVEL = set(SCHEMA["properties"])
EXAMPLE_FILES = sorted(EXAMPLES.glob("*/job*.json"))
EXAMPLE_JOBS = [json.loads(p.read_text()) for p in EXAMPLE_FILES]
CANARY = "hunter2-canary-7f3a"
INT64 = 2**63


# ---- the servers that must never be asked ----------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def _record(self) -> None:
        _Recorder.requests.append(f"{self.command} {self.path}")
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_DELETE = _record

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def servers():
    """One local HTTP server stands in for Nomad, Consul and Vault and records every request."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    yield {"NOMAD_ADDR": address, "CONSUL_HTTP_ADDR": address, "VAULT_ADDR": address, "NOMAD_TOKEN": None}
    server.shutdown()
    server.server_close()


# ---- running the CLI ---------------------------------------------------------------------


def invoke(args: list[str], env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    """`nomadtf ARGS` in-process through the console script's own entry point."""
    runner = CliRunner()
    saved_argv = sys.argv
    with runner.isolation(env=env) as (out, err, _):
        sys.argv = ["nomadtf", *args]
        try:
            cli.main()
            code: Any = 0
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.argv = saved_argv
            cli.state["debug"] = False
        return code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


PROBLEM_LINE = re.compile(r"^  - (.*)$")


def names_a_field(line: str, path: Path) -> bool:
    """A problem line begins with where: a field path (`roles.worker.count`, `['odd key']`
    for a key with odd characters), `(top level)`, or the file itself."""
    if line.startswith(str(path)):
        return True
    where = line.split(": ", 1)[0]
    head = re.split(r"[.\[]", where, maxsplit=1)[0]
    quoted = re.match(r"\[(['\"]).*\1\]", where)
    return ": " in line and (head in TOP_LEVEL or head == "(top level)" or bool(quoted) or "unknown key" in line)


def assert_render_outcome(code: int, out: str, err: str, path: Path) -> None:
    assert "Traceback" not in out + err, err
    assert code in (0, 2), f"exit {code}: {err}"
    if code == 0:
        job = json.loads(out)
        assert_job_shape(job)
        return
    assert err.startswith("error: job.json"), err
    problems = [m[1] for line in err.splitlines() if (m := PROBLEM_LINE.match(line))]
    assert problems, err
    for problem in problems:
        assert names_a_field(problem, path), f"names no field: {problem!r}"


def assert_job_shape(job: dict[str, Any]) -> None:
    """What tests/unit/job/test_render.py relies on and Nomad's Go decoder needs: a Job with groups of
    tasks, and every number an integer that fits Go's int64."""
    assert set(job) == {"Job"}
    body = job["Job"]
    assert isinstance(body["ID"], str) and body["ID"] and body["Name"] == body["ID"]
    assert body["TaskGroups"]
    for group in body["TaskGroups"]:
        assert isinstance(group["Count"], int) and group["Count"] >= 1
        assert group["Tasks"] and all(t["Driver"] and isinstance(t["Env"], dict) for t in group["Tasks"])
        assert all(isinstance(v, str) for t in group["Tasks"] for v in t["Env"].values())

    def numbers(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                numbers(item)
        elif isinstance(value, list):
            for item in value:
                numbers(item)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            assert isinstance(value, int) and -INT64 <= value < INT64, value

    numbers(job)


def write(tmp: Path, data: Any, fmt: str) -> Path:
    if fmt == "yaml":
        path = tmp / "job.yaml"
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
    else:
        path = tmp / "job.json"
        path.write_text(json.dumps(data, ensure_ascii=fmt == "json-ascii"))
    return path


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# ---- inputs from the schema --------------------------------------------------------------

ODD_TEXT = st.sampled_from(
    ["", " ", "\n", "\x00", "ä😀", "${NOMAD_JOB_ID}", "{{ .Port }}", "{% raw %}", '"', "\\", "a\nb", "x" * 5000, "../../etc"]
)
TEXT = st.one_of(st.text(max_size=12), ODD_TEXT)
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False), TEXT
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)), max_leaves=8)


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


def from_schema(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that (mostly) satisfy a node of the job schema: a small walker over the
    keywords this schema uses (type, enum, pattern, minimum/maximum, properties, required,
    additionalProperties, propertyNames, items, oneOf). Cross-field rules are left to chance."""
    node = _resolve(node)
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if "oneOf" in node and "type" not in node:
        return st.one_of(*(from_schema(option) for option in node["oneOf"]))
    kind = node.get("type")
    if kind == "string":
        if "pattern" in node:
            return st.from_regex(node["pattern"].removesuffix("$") + r"\Z", fullmatch=True)
        return st.text(min_size=node.get("minLength", 0), max_size=12) | ODD_TEXT.filter(lambda s: len(s) >= node.get("minLength", 0))
    if kind == "integer":
        low, high = node.get("minimum"), node.get("maximum")
        return st.integers(low, high) | st.integers(low if low is not None else -(2**64), high if high is not None else 2**64)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        items = from_schema(node["items"]) if "items" in node else JSON_VALUES
        return st.lists(items, min_size=node.get("minItems", 0), max_size=3)
    if kind == "object":
        return _object(node)
    return JSON_VALUES


def _object(node: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    props = node.get("properties", {})
    if not props:
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            names = node.get("propertyNames", {}).get("pattern")
            keys = st.from_regex(names.removesuffix("$") + r"\Z", fullmatch=True) if names else TEXT
            return st.dictionaries(keys, from_schema(extra), max_size=3)
        return st.dictionaries(TEXT, JSON_VALUES, max_size=3)  # free-form: context

    @st.composite
    def build(draw):
        required = set(node.get("required", []))
        excluded: set[str] = set()
        if "oneOf" in node:  # entrypoint, secrets: exactly one of a few keys
            option = draw(st.sampled_from(node["oneOf"]))
            required |= set(option.get("required", []))
            excluded = {k for other in node["oneOf"] for k in other.get("required", [])} - required
        optional = sorted(set(props) - required - excluded)
        chosen = draw(st.lists(st.sampled_from(optional), unique=True, max_size=len(optional))) if optional else []
        if node.get("minProperties") and not required and not chosen:
            chosen = [draw(st.sampled_from(optional))]
        return {key: draw(from_schema(props[key])) for key in sorted(required) + chosen}

    return build()


@st.composite
def job_from_schema(draw):
    job = draw(from_schema(SCHEMA))
    # Bias towards jobs that pass the cross-field rules too: a sensible strategy/roles pair.
    if draw(st.booleans()):
        job["strategy"] = "multi_worker_mirrored"
        job["roles"] = {"worker": {**job["roles"].get("worker", {}), "count": draw(st.integers(1, 4))}}
        job.pop("success", None)
        job["entrypoint"] = {k: v for k, v in job["entrypoint"].items() if k != "function"} or {"script": "t.py"}
        if "function" in job["entrypoint"] or not {"script", "module"} & job["entrypoint"].keys():
            job["entrypoint"]["script"] = "t.py"
    return job


# ---- mutations of the examples -----------------------------------------------------------

ODD_VALUES = st.one_of(
    st.sampled_from([None, 2.0, 1e300, -1, 0, 2**63, -(2**63) - 1, 10**30, True, [], {}, [None], {"a": None}, {"a": {"b": None}}]),
    JSON_VALUES,
    ODD_TEXT,
)


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*prefix, i))
    return found


def _parent(doc: Any, path: tuple) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


@st.composite
def mutated_example(draw, extra_values=ODD_VALUES):
    job = copy.deepcopy(draw(st.sampled_from(EXAMPLE_JOBS)))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(job)))
        parent = _parent(job, where)
        action = draw(st.sampled_from(["delete", "replace", "add", "role", "count"]))
        if action == "delete":
            del parent[where[-1]]
        elif action == "replace":
            parent[where[-1]] = copy.deepcopy(draw(extra_values))  # never mutate a shared literal
        elif action == "add" and isinstance(parent, dict):
            parent[draw(TEXT | st.sampled_from(sorted(TOP_LEVEL)))] = copy.deepcopy(draw(extra_values))  # never mutate a shared literal
        elif action == "role" and isinstance(job.get("roles", {}), dict):  # another role, or one's settings twice over
            role = draw(st.sampled_from(["chief", "worker", "ps", "evaluator", "tensorboard", "Worker", "workers"]))
            settings_of = list(job.get("roles", {}).values()) or [{}]
            job.setdefault("roles", {})[role] = copy.deepcopy(draw(st.sampled_from(settings_of)))
        elif action == "count" and isinstance(job.get("roles"), dict) and job["roles"]:
            role = draw(st.sampled_from(sorted(job["roles"])))
            if isinstance(job["roles"][role], dict):
                job["roles"][role]["count"] = draw(st.sampled_from([0, 1, 2, 7, -3, 2.0, 10**6, 2**62, 2**64, "2", None]))
        if not job or not paths(job):
            break
    return job


# ---- the properties ----------------------------------------------------------------------

FORMATS = st.sampled_from(["json", "json-ascii", "yaml"])


@given(job=job_from_schema(), fmt=FORMATS)
@example(job={"name": "a", "entrypoint": {"script": "t.py"}, "strategy": "multi_worker_mirrored", "roles": {"worker": {"count": 1}}}, fmt="json")
def test_jobs_from_the_schema_render_or_name_a_field(tmp, servers, job, fmt):
    path = write(tmp, job, fmt)
    _Recorder.requests.clear()
    assert_render_outcome(*invoke(["render", str(path)], env=servers), path)
    assert _Recorder.requests == []  # render is offline, valid job or not


REGRESSIONS = {
    # Each was exit 70 ("unexpected error") or a Job Nomad cannot decode, before the fix.
    "gpus 2.0": ("roles.worker.gpus", 2.0),
    "count 2.0": ("roles.worker.count", 2.0),
    "count beyond int64": ("roles.worker.count", 2**64),
    "percent 60.0": ("roles.worker.spread", [{"attribute": "${node.datacenter}", "targets": [{"value": "a", "percent": 60.0}]}]),
    "duration beyond int64 ns": ("recovery.deadline", "99999999999999999999999h"),
    "duration with 5000 digits": ("recovery.deadline", "9" * 5000 + "s"),
    "name with a newline": ("name", "digits\n"),
    "duration with a newline": ("recovery.hang_timeout", "5m\n"),
    "NaN in context": ("context", {"lr": float("nan")}),
}


def _set(job: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    job = copy.deepcopy(job)
    *parents, last = dotted.split(".")
    node = job
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return job


@given(job=mutated_example(), fmt=FORMATS)
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["gpus 2.0"]), fmt="json")
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["count 2.0"]), fmt="json")
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["count beyond int64"]), fmt="yaml")
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["percent 60.0"]), fmt="json")
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["duration beyond int64 ns"]), fmt="json")
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["duration with 5000 digits"]), fmt="json")
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["name with a newline"]), fmt="json")
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["duration with a newline"]), fmt="yaml")
@example(job=_set(EXAMPLE_JOBS[0], *REGRESSIONS["NaN in context"]), fmt="json")
def test_mutated_examples_render_or_name_a_field(tmp, servers, job, fmt):
    path = write(tmp, job, fmt)
    _Recorder.requests.clear()
    assert_render_outcome(*invoke(["render", str(path)], env=servers), path)
    assert _Recorder.requests == []


GOOD_YAML = "name: a\nstrategy: multi_worker_mirrored\nentrypoint: {script: t.py}\nroles: {worker: {count: 1}}\n"
# "Billion laughs": nine levels of ten aliases each, 10**9 values once expanded.
ALIAS_BOMB = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"{name}: &{name} [{', '.join(['*' + below] * 10)}]\n" for below, name in zip("abcdefgh", "bcdefghi", strict=True)
)
RAW_FILES = [
    # (file name, bytes): what a parser hands back that is not plain JSON, or no parse at all.
    ("job.json", b'{"name": "a\xff"}'),  # not UTF-8
    ("job.json", b"\xef\xbb\xbf" + json.dumps(EXAMPLE_JOBS[0]).encode()),  # a byte-order mark
    ("job.json", b'{"context": ' + b"1" * 5000 + b"}"),  # an integer Python will not parse
    ("job.json", b"[" * 100_000 + b"]" * 100_000),  # deeper than the parser goes
    ("job.json", b'{"context": ' + b"[" * 500 + b"]" * 500 + b"}"),  # deep, but parses
    ("job.json", b'{"roles": {"worker": {"count": 1}, "worker": {"count": 2}}}'),  # a duplicate key
    ("job.json", b'{"name": "a", "context": {"x": NaN, "y": Infinity}}'),
    ("job.yaml", (GOOD_YAML + "context: {when: 2024-01-01}\n").encode()),  # a date
    ("job.yaml", (GOOD_YAML + "meta: {1: x, b: y}\n").encode()),  # a non-string key
    ("job.yaml", (GOOD_YAML + "1: 2\n").encode()),
    ("job.yaml", (GOOD_YAML + "context: !!set {a, b}\n").encode()),
    ("job.yaml", (GOOD_YAML + "context: {x: .nan}\n").encode()),
    ("job.yaml", (GOOD_YAML + f"env: {{TOKEN: {CANARY}: x}}\n").encode()),  # a syntax error on a token's line
    ("job.yaml", (ALIAS_BOMB + GOOD_YAML).encode()),
    ("job.yaml", b"- just\n- a list\n"),
    ("job.yaml", b""),
]


@pytest.mark.parametrize("name,raw", RAW_FILES, ids=[f"{n}:{r[:24]!r}" for n, r in RAW_FILES])
def test_files_that_are_not_plain_json_exit_2(tmp, name, raw):
    path = tmp / name
    path.write_bytes(raw)
    code, out, err = invoke(["render", str(path)])
    assert_render_outcome(code, out, err, path)
    assert CANARY not in out + err


@st.composite
def invalid_jobs(draw):
    """Mutated examples that fail validation (the servers must not hear of them)."""
    job = draw(mutated_example())
    job.setdefault("roles", {})
    bad = draw(st.sampled_from(["name", "count", "unknown", "duration", "keep"]))
    if bad == "name":
        job["name"] = draw(st.sampled_from(["", "UPPER", "a" * 60, "digits\n", "ä"]))
    elif bad == "count" and isinstance(job["roles"], dict):
        job["roles"]["worker"] = {"count": draw(st.sampled_from([-1, 2.5, "2", None, 2**64]))}
    elif bad == "duration":
        job["recovery"] = {"deadline": draw(st.sampled_from(["", "5 minutes", "5s\n", "9" * 400 + "h"]))}
    else:
        job["unknwon_key"] = 1
    return job


@given(job=invalid_jobs(), command=st.sampled_from(["validate", "plan", "run"]), fmt=FORMATS)
@settings(max_examples=30)
def test_invalid_inputs_never_reach_nomad_consul_or_vault(tmp, servers, job, command, fmt):
    path = write(tmp, job, fmt)
    _Recorder.requests.clear()
    code, out, err = invoke([command, str(path), "--detach"] if command == "run" else [command, str(path)], env=servers)
    assert _Recorder.requests == [], f"{command} sent {_Recorder.requests} for an invalid job: {err}"
    assert "Traceback" not in out + err
    # `plan` keeps `nomad job plan`'s exit codes: 255 for any error (docs/reference/commands.md).
    assert code == (255 if command == "plan" else 2), f"{command} exit {code}: {err}"
    problems = [m[1] for line in err.splitlines() if (m := PROBLEM_LINE.match(line))]
    assert problems and all(names_a_field(p, path) for p in problems), err


def test_the_server_recorder_hears_a_valid_run(tmp, servers):
    """The recorder works: a valid job is submitted to it (and fails on its 500s, exit 1)."""
    path = write(tmp, EXAMPLE_JOBS[0], "json")
    _Recorder.requests.clear()
    code, _, err = invoke(["run", str(path), "--detach"], env=servers)
    assert _Recorder.requests and code == 1, err


# Where a token could be written, as the value or inside a wrong-typed value.
CANARY_PLACES = [
    ("env.CONSUL_HTTP_TOKEN", [CANARY]),
    ("env.CONSUL_HTTP_TOKEN", {"token": CANARY}),
    ("env", [f"TOKEN={CANARY}"]),
    ("env", CANARY),
    ("roles.worker.env.TOKEN", [CANARY]),
    ("roles.worker.env", f"TOKEN={CANARY}"),
    ("secrets", [{"path": "secret/a", "key": "k", "env": "TOKEN", "value": CANARY}]),
    ("secrets", [{"path": "secret/a", "key": "k", "env": "TOKEN", "secret": CANARY}]),
    ("secrets", [{"path": "secret/a", "key": ["k", CANARY], "env": "TOKEN"}]),
    ("secrets", [CANARY]),
    ("secrets", {"TOKEN": CANARY}),
    ("secrets", CANARY),
]


@given(job=mutated_example(), place=st.sampled_from(CANARY_PLACES), fmt=FORMATS)
@settings(max_examples=40)
def test_a_token_in_env_or_secrets_is_never_echoed_in_an_error(tmp, job, place, fmt):
    dotted, value = place
    if isinstance(_parent_of(job, dotted), dict):
        job = _set(job, dotted, value)
    path = write(tmp, job, fmt)
    code, out, err = invoke(["render", str(path)])
    assert_render_outcome(code, out, err, path)
    if code == 2:
        assert CANARY not in out + err, err


def _parent_of(job: dict[str, Any], dotted: str) -> Any:
    node: Any = job
    for key in dotted.split(".")[:-1]:
        if not isinstance(node, dict):
            return None
        node = node.get(key, {})
    return node


ODD_VARS = ["=", "=1", "name", ".=1", "roles..count=1", "roles.worker.count.x=1", "name.x=1", "entrypoint=null",
            "roles.worker=[]", f"env.TOKEN=[\"{CANARY}\"]", "roles.worker.count=1e999", "roles.worker.count=NaN",
            "context.x=Infinity", "roles.worker.count=" + "9" * 5000, "context.x=" + "[" * 5000]


@pytest.mark.parametrize("var", ODD_VARS)
def test_odd_var_overrides_exit_2(var):
    path = EXAMPLE_FILES[0]
    code, out, err = invoke(["render", str(path), "--var", var])
    assert "Traceback" not in out + err
    assert code in (0, 2), err
    if code == 2:
        assert err.startswith("error:") and CANARY not in err, err


@pytest.mark.parametrize("raw", [b'{"name": "a\xff"}', b"{", json.dumps(_set(EXAMPLE_JOBS[0], "roles.worker.gpus", 2.0)).encode()])
def test_the_console_script_exits_2_without_a_traceback(tmp, raw):
    path = tmp / "console.json"
    path.write_bytes(raw)
    result = nomadtf("render", str(path), timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: job.json")

"""job.json validation as a user meets it: `nomadtf render` on a bad file exits 2 and names
the field; --var overrides reach the rendered job; the typed JobSpec built once from it,
and read back from the tasks' spec file."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from nomadtf import wire
from nomadtf.errors import SpecError
from nomadtf.job.options import apply_overrides, load_options, read_options, with_vault_policies
from nomadtf.job.render import embedded_spec
from nomadtf.job.spec import JobSpec, RunInfo, load_spec, parse_spec
from nomadtf.job.taskfile import for_task, read_spec_file, spec_file_text
from nomadtf.job.validate import normalize, schema
from nomadtf.servers.nomadhttp import NomadSettings
from tests.helpers import EXAMPLES, nomadtf, probe_job, write_job

DIGITS_FILE = str(EXAMPLES / "digits" / "job.json")
DIGITS = read_options(Path(DIGITS_FILE))


def edited(change):
    data = copy.deepcopy(DIGITS)
    change(data)
    return data


def set_in(path, value):
    def change(data):
        node = data
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return change


def render_fails(tmp_path, data):
    result = nomadtf("render", str(write_job(tmp_path, data)))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    return result.stderr


BAD_INPUTS = {
    "unknown role": (
        lambda d: d["roles"].update(workr={"count": 2}),
        ["roles.workr: unknown key 'workr'; did you mean 'worker'?"],
    ),
    "unknown role field": (
        set_in("roles.worker.memroy", 2048),
        ["roles.worker.memroy: unknown key 'memroy'; did you mean 'memory'?"],
    ),
    "unknown top-level key": (
        set_in("strategie", "parameter_server"),
        ["strategie: unknown key 'strategie'; did you mean 'strategy'?"],
    ),
    "unknown key inside a gpus object": (
        set_in("roles.worker.gpus", {"count": 1, "modle": "A100"}),
        ["roles.worker.gpus.modle: unknown key 'modle'; did you mean 'model'?"],
    ),
    "wrong type": (
        set_in("roles.worker.count", "two"),
        ["roles.worker.count: 'two' is not of type 'integer' or 'object'"],
    ),
    "negative count": (
        set_in("roles.ps.count", -1),
        ["roles.ps.count: count must be >= 0, got -1"],
    ),
    "zero gpus in a gpus object": (
        set_in("roles.worker.gpus", {"count": 0}),
        ["roles.worker.gpus.count: count must be >= 1, got 0"],
    ),
    "parameter_server without ps": (
        set_in("roles.ps.count", 0),
        ["roles.ps: strategy 'parameter_server' needs at least one ps"],
    ),
    "multi_worker_mirrored without workers": (
        lambda d: d.update(strategy="multi_worker_mirrored", roles={"chief": {"count": 1}}),
        ["roles.worker: strategy 'multi_worker_mirrored' needs at least one worker"],
    ),
    "a role the strategy does not have": (
        set_in("strategy", "multi_worker_mirrored"),
        ["roles.ps: strategy 'multi_worker_mirrored' has no ps role; remove it"],
    ),
    "jax with a chief": (
        lambda d: d.update(strategy="jax", roles={"chief": {"count": 1}, "worker": {"count": 2}}),
        ["roles.chief: strategy 'jax' has no chief role; remove it"],
    ),
    "jax with TensorFlow's GPU memory cap": (
        lambda d: d.update(strategy="jax", roles={"worker": {"count": 2, "gpus": {"count": 1, "memory_limit_mib": 1024}}}),
        ["roles.worker.gpus.memory_limit_mib: caps TensorFlow's memory, not JAX's; under strategy 'jax' remove it and set "
         "XLA_PYTHON_CLIENT_MEM_FRACTION"],
    ),
    "two chiefs": (
        set_in("roles.chief.count", 2),
        ["roles.chief.count: at most one chief per job, got 2"],
    ),
    "two evaluators": (
        set_in("roles.evaluator", {"count": 2}),
        ["roles.evaluator.count: at most one evaluator per job, got 2"],
    ),
    "name not DNS-safe": (
        set_in("name", "Digits_Job"),
        ["name: 'Digits_Job' is not DNS-safe"],
    ),
    "name too long": (
        set_in("name", "d" * 49),
        ["is not DNS-safe", "at most 48"],
    ),
    "bad duration": (
        set_in("recovery", {"restart_delay": "2 seconds"}),
        ["recovery.restart_delay: '2 seconds' is not a duration"],
    ),
    "function entrypoint outside legacy_server": (
        set_in("entrypoint", {"function": "train:main"}),
        ["entrypoint.function: only for strategy 'legacy_server'"],
    ),
    "two entrypoints": (
        set_in("entrypoint", {"script": "a.py", "module": "a"}),
        ["entrypoint: give exactly one of 'script', 'module' or 'function'"],
    ),
    "docker without an image": (
        set_in("driver", {"name": "docker"}),
        ["driver.image: the docker driver needs an image"],
    ),
    "the exec driver": (
        set_in("driver", {"name": "exec"}),
        ["driver.name: 'exec' runs each task in a chroot of the client's system directories"],
    ),
    "volumes without docker": (
        set_in("driver", {"name": "raw_exec", "volumes": ["/a:/b"]}),
        ["driver.volumes: only the docker driver mounts volumes"],
    ),
    "a volume that is not HOST:CONTAINER": (
        set_in("driver", {"name": "docker", "image": "tf", "volumes": ["data:/data"]}),
        ["driver.volumes"],
    ),
    "docker code unpacked outside local/": (
        lambda d: d.update(driver={"name": "docker", "image": "tf"}, source={"url": "https://example.com/c.zip", "destination": "alloc/code"}),
        ["source.destination: 'alloc/code' is outside the container of a docker task", "write 'local/code' (the default)"],
    ),
    "docker with a relative model_dir": (
        lambda d: d.update(driver={"name": "docker", "image": "tf"}, model_dir="models/run1"),
        ["model_dir: 'models/run1' is not an absolute path; with the docker driver", "or a URL TensorFlow writes itself (gs://"],
    ),
    "secrets without vault policies": (
        set_in("secrets", [{"path": "secret/team/s3", "key": "access", "env": "AWS_KEY"}]),
        ["vault.policies: secrets are read with the token Nomad gives the task"],
    ),
}


@pytest.mark.parametrize("change, expected", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_exits_2_and_names_the_field(tmp_path, change, expected):
    stderr = render_fails(tmp_path, edited(change))
    assert "job.json is invalid" in stderr
    for text in expected:
        assert text in stderr


def test_a_secret_value_is_refused_and_never_echoed(tmp_path):
    secret = "s3cr3t-do-not-print"
    data = edited(
        set_in(
            "secrets",
            [
                {"path": "secret/team/s3", "key": "access", "env": "AWS_KEY", "value": secret},
                secret,  # a bare string where a reference belongs
            ],
        )
    )
    data["vault"] = {"policies": ["team-read"]}
    stderr = render_fails(tmp_path, data)
    assert "secrets[0].value: a secret's value never goes in job.json; store it in Vault" in stderr
    assert "secrets[1]: must be of type object, got str" in stderr
    assert secret not in stderr


def test_every_problem_is_reported_in_one_run(tmp_path):
    data = edited(
        lambda d: (
            d.update(name="Bad_Name", colour="blue"),
            d["roles"].update(workr={"count": 1}),
            d["roles"]["ps"].update(count=-3),
            d["roles"]["worker"].update(cpu="lots"),
        )
    )
    stderr = render_fails(tmp_path, data)
    assert "job.json has 5 problems" in stderr
    for path in ("name:", "colour:", "roles.workr:", "roles.ps.count:", "roles.worker.cpu:"):
        assert f"  - {path}" in stderr


def test_cross_field_problems_are_reported_together(tmp_path):
    data = edited(lambda d: d["roles"].update(chief={"count": 2}, evaluator={"count": 2}, ps={"count": 0}))
    stderr = render_fails(tmp_path, data)
    assert "job.json has 3 problems" in stderr
    assert "roles.ps: strategy 'parameter_server' needs at least one ps" in stderr
    assert "roles.chief.count: at most one chief per job, got 2" in stderr
    assert "roles.evaluator.count: at most one evaluator per job, got 2" in stderr


def test_a_file_that_is_not_json_exits_2(tmp_path):
    path = tmp_path / "job.json"
    path.write_text('{"name": "digits",')
    result = nomadtf("render", str(path))
    assert result.returncode == 2
    assert f"{path}: not valid JSON" in result.stderr


def test_yaml_options_load_like_json(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: digits\nentrypoint: {script: train_ps.py}\n"
        "roles:\n  chief: {count: 1}\n  worker: {count: 3}\n  ps: {count: 1}\n"
    )
    assert load_spec(path).roles["worker"].count == 3


def task_spec(job, role):
    """The normalised spec as the task of `role` receives it."""
    group = next(g for g in job["Job"]["TaskGroups"] if g["Name"] == role)
    return embedded_spec(group["Tasks"][0])


def test_var_overrides_reach_the_rendered_job():
    result = nomadtf(
        "render",
        DIGITS_FILE,
        "--var", "roles.worker.count=5",
        "--var", "context.learning_rate=0.05",
        "--var", "context.schedule.warmup_steps=100",
        "--var", "roles.worker.gpus={\"count\": 1, \"model\": \"A100\"}",
        "--var", "discovery.reconfigure=template",
        "--var", "entrypoint.args=[\"--fast\"]",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    worker = next(g for g in job["Job"]["TaskGroups"] if g["Name"] == "worker")
    assert worker["Count"] == 5
    assert worker["Tasks"][0]["Resources"]["Devices"][0]["Count"] == 1
    spec = task_spec(job, "worker")
    assert spec["context"]["learning_rate"] == 0.05
    assert spec["context"]["schedule"] == {"warmup_steps": 100}
    assert spec["context"]["steps"] == 600  # siblings of an overridden key stay
    assert spec["roles"]["worker"]["gpus"] == {"count": 1, "model": "A100", "vendor": "nvidia"}
    assert spec["discovery"]["reconfigure"] == "template"
    assert spec["entrypoint"]["args"] == ["--fast"]


def test_an_override_that_breaks_the_spec_is_reported_like_the_file(tmp_path):
    result = nomadtf("render", DIGITS_FILE, "--var", "roles.workr.count=2")
    assert result.returncode == 2
    assert "roles.workr: unknown key 'workr'; did you mean 'worker'?" in result.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        ("roles.worker.count", "--var 'roles.worker.count': expected path=value"),
        ("name.first=x", "--var name.first: 'name' is not an object"),
    ],
)
def test_malformed_overrides_exit_2(override, message):
    result = nomadtf("render", DIGITS_FILE, "--var", override)
    assert result.returncode == 2
    assert message in result.stderr


def test_overrides_leave_the_input_alone():
    before = copy.deepcopy(DIGITS)
    after = apply_overrides(DIGITS, ["roles.worker.count=7", "context.new.key=x"])
    assert DIGITS == before
    assert after["roles"]["worker"]["count"] == 7
    assert after["context"]["new"] == {"key": "x"}


def test_normalize_fills_every_default():
    spec = normalize(
        {"name": "tiny", "entrypoint": {"script": "t.py"}, "roles": {"worker": {}, "ps": {}, "chief": {}}}
    )
    assert spec["strategy"] == "parameter_server"
    assert spec["roles"]["worker"] == {
        "count": 1,
        "cpu": 500,
        "memory": 1024,
        "gpus": 0,
        "port": 0,
        "constraints": [],
        "affinities": [],
        "distinct_hosts": False,
        "spread": [],
        "env": {},
    }
    assert spec["recovery"]["restart_delay"] == "2s"
    assert spec["discovery"] == {
        "provider": "consul",
        "reconfigure": "watch",
        "rendezvous_timeout": "5m",
        "debounce": "1500ms",
        "consul_address": "127.0.0.1:8500",
    }
    assert spec["entrypoint"] == {"script": "t.py", "args": [], "pythonpath": []}


def test_spec_error_keeps_each_problem():
    with pytest.raises(SpecError) as caught:
        normalize({"name": "x", "entrypoint": {"script": "t.py"}, "roles": {"workr": {}}, "zzz": 1})
    assert caught.value.problems == [
        "zzz: unknown key 'zzz'; allowed: " + ", ".join(schema()["properties"]),
        "roles.workr: unknown key 'workr'; did you mean 'worker'?",
    ]
    assert caught.value.exit_code == 2


def test_the_task_expands_nomad_variables_in_paths_and_arguments():
    """The spec file is not interpolated by Nomad, so the task expands ${NOMAD_...} itself:
    the default model_dir must differ per job, not be one shared directory."""
    from nomadtf.job.spec import JobSpec
    from nomadtf.job.taskfile import for_task

    data = normalize({"name": "j", "entrypoint": {"script": "${NOMAD_TASK_DIR}/t.py", "args": ["--out=${NOMAD_ALLOC_ID}", "${unknown}"]},
                      "roles": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}}})
    env = {"NOMAD_NAMESPACE": "team-a", "NOMAD_JOB_ID": "j", "NOMAD_TASK_DIR": "/alloc/t", "NOMAD_ALLOC_ID": "a1"}
    spec = for_task(JobSpec.from_normalized({**data, "run": {"id": "r42"}}), env)
    assert spec.model_dir == "/tmp/nomadtf/team-a/j/r42"  # fresh for every run
    assert spec.run_id == "r42"
    assert spec.entrypoint.target == "/alloc/t/t.py"
    assert spec.entrypoint.args == ("--out=a1", "${unknown}")


def test_code_from_source_url_runs_where_nomad_unpacked_it():
    from nomadtf.job.spec import JobSpec
    from nomadtf.job.taskfile import for_task

    data = normalize({"name": "j", "entrypoint": {"script": "train_ps.py"}, "source": {"url": "http://127.0.0.1:1/code.zip"},
                      "roles": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}}})
    spec = for_task(JobSpec.from_normalized(data), {"NOMAD_TASK_DIR": "/a/alloc1/chief/local"})
    assert spec.entrypoint.workdir == "/a/alloc1/chief/local/code"
    # In a docker task's container NOMAD_TASK_DIR is /local: the code is at /local/code.
    assert for_task(JobSpec.from_normalized(data), {"NOMAD_TASK_DIR": "/local"}).entrypoint.workdir == "/local/code"
    explicit = normalize({**data, "entrypoint": {"script": "t.py", "workdir": "/srv/code"}})
    assert for_task(JobSpec.from_normalized(explicit), {"NOMAD_TASK_DIR": "/x/local"}).entrypoint.workdir == "/srv/code"


def test_a_success_policy_that_cannot_be_met_is_named_with_the_fix():
    import pytest as _pytest

    from nomadtf.errors import SpecError
    from nomadtf.job.validate import normalize

    base = {"name": "s", "entrypoint": {"script": "t.py"}}
    with _pytest.raises(SpecError, match="success: 'chief' needs a chief"):
        normalize({**base, "strategy": "multi_worker_mirrored", "success": "chief", "roles": {"worker": {"count": 2}}})
    with _pytest.raises(SpecError, match="runs a bare server there"):
        normalize({**base, "success": "all_workers", "roles": {r: {"count": 1} for r in ("chief", "worker", "ps")}})
    spec = normalize({**base, "strategy": "multi_worker_mirrored", "success": "all_workers", "roles": {"worker": {"count": 2}}})
    assert spec["success"] == "all_workers"


# ---- the typed JobSpec ------------------------------------------------------------------------


TINY = {"name": "tiny", "entrypoint": {"script": "t.py"}, "roles": {"ps": {}, "worker": {"count": 2, "gpus": 1}, "chief": {},
                                                                   "evaluator": {"count": 0}}}


def test_the_job_spec_is_built_once_with_defaults_filled_and_durations_parsed():
    spec = parse_spec({**TINY, "recovery": {"restart_delay": "1500ms", "deadline": "2h"}})
    assert spec.document == normalize({**TINY, "recovery": {"restart_delay": "1500ms", "deadline": "2h"}})
    # The roles that run, in the order of the job's groups; a count of 0 is no role.
    assert list(spec.roles) == ["chief", "worker", "ps"]
    assert spec.counts == {"chief": 1, "worker": 2, "ps": 1}
    worker = spec.roles["worker"]
    assert (worker.count, worker.cpu, worker.memory, worker.memory_max, worker.port) == (2, 500, 1024, None, 0)
    assert worker.gpus == {"count": 1, "vendor": "nvidia"} and spec.roles["ps"].gpus is None
    assert spec.gpus == {"chief": None, "worker": {"count": 1, "vendor": "nvidia"}, "ps": None}
    # Nanoseconds, exactly, as Nomad takes them; seconds where the runtime counts.
    assert spec.recovery.restart_delay_ns == 1_500_000_000
    assert spec.recovery.restart_interval_ns == 300 * 10**9
    assert spec.recovery.reschedule_delay_ns == 5 * 10**9
    assert spec.recovery.deadline_ns == 7200 * 10**9 and spec.recovery.deadline_s == 7200.0
    assert spec.recovery.hang_timeout_s == 600.0
    assert (spec.discovery.rendezvous_timeout_s, spec.discovery.debounce_s) == (300.0, 1.5)
    assert (spec.discovery.provider, spec.discovery.consul_address, spec.discovery.consul_ca_file) == ("consul", "127.0.0.1:8500", None)
    assert (spec.driver.name, spec.driver.python, spec.driver.image) == ("raw_exec", "python3", None)
    assert (spec.region, spec.datacenters, spec.priority, spec.namespace) == ("global", ("*",), 50, "default")
    assert spec.source is None and spec.environment is None and spec.run_id == ""


def test_the_spec_file_reads_back_as_the_same_spec_with_its_run(tmp_path):
    spec = parse_spec({**TINY, "env": {wire.ENV_VAULT_ROLE_ID: "id", "MODE": "x"}, "source": {"url": "https://example.com/c.zip"}})
    path = tmp_path / "nomadtf-spec.json"
    path.write_text(spec_file_text(spec, RunInfo("r1", 1796000000.5, model_run="r0")))
    task = read_spec_file(path)
    assert (task.run_id, task.submitted_at, task.model_run) == ("r1", 1796000000.5, "r0")
    assert task.env == {"MODE": "x"}  # a credential never reaches the file the code can read
    assert task.source == spec.source and task.source.destination == "local/code"
    assert (task.roles, task.recovery, task.discovery, task.driver) == (spec.roles, spec.recovery, spec.discovery, spec.driver)
    assert "run" not in task.document  # the document is the job's, the run is data


def test_a_spec_file_of_an_older_nomadtf_reads_with_the_defaults_added_since(tmp_path):
    document = json.loads(spec_file_text(parse_spec(TINY)))
    del document["roles"]["worker"]["distinct_hosts"], document["recovery"]["hang_timeout"]
    path = tmp_path / "nomadtf-spec.json"
    path.write_text(json.dumps(document))
    task = read_spec_file(path)
    assert task.roles["worker"].distinct_hosts is False and task.recovery.hang_timeout_s == 600.0


def test_the_raw_options_are_one_step_before_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMAD_NAMESPACE", "team-a")
    path = write_job(tmp_path, {k: v for k, v in TINY.items()})
    raw = load_options(path, ["roles.worker.count=3"])
    assert raw["roles"]["worker"]["count"] == 3 and raw["namespace"] == "team-a"
    assert "cpu" not in raw["roles"]["worker"]  # not yet validated: no defaults
    assert load_spec(path, ["roles.worker.count=3"]) == parse_spec(raw)
    # `nomadtf acl`'s policy goes in only where the file lists none.
    assert parse_spec(with_vault_policies(raw, ["p1"])).vault.policies == ("p1",)
    own = {**raw, "vault": {"policies": ["mine"]}}
    assert with_vault_policies(own, ["p1"]) is own
    assert isinstance(parse_spec(raw), JobSpec)


def _task_spec(run: RunInfo) -> JobSpec:
    submitted = load_spec(EXAMPLES / "digits" / "job.json")
    spec = JobSpec.from_normalized(json.loads(spec_file_text(submitted, run)))
    return for_task(spec, {"NOMAD_NAMESPACE": "default", "NOMAD_JOB_ID": "digits"})


def test_a_fresh_run_trains_in_its_own_directory_and_a_resumed_one_in_the_run_it_continues():
    fresh = _task_spec(RunInfo("r2", 1.0))
    resumed = _task_spec(RunInfo("r3", 1.0, model_run="r1"))
    assert fresh.model_dir.endswith("/default/digits/r2")
    assert resumed.model_dir.endswith("/default/digits/r1")
    assert resumed.run_id == "r3"  # the code still sees its own run id


# ---- namespaces: one Nomad accepts, and one rule for which one a command uses ----------------


@pytest.mark.parametrize("namespace", ["", "team x", "ml/team", "a" * 129, "dev\n"])
def test_a_namespace_nomad_would_refuse_is_named(namespace):
    with pytest.raises(SpecError) as caught:
        normalize({**probe_job("ns-check"), "namespace": namespace})
    assert caught.value.problems == [f"namespace: {namespace!r} is not a Nomad namespace; use letters, digits and '-' (1 to 128 of them)"]


def test_namespace_precedence_job_json_then_nomad_namespace_then_default(tmp_path, monkeypatch):
    without = write_job(tmp_path, probe_job("ns-without"))
    with_own = write_job(tmp_path, {**probe_job("ns-with"), "namespace": "from-json"})
    monkeypatch.delenv("NOMAD_NAMESPACE", raising=False)
    assert load_spec(without).namespace == "default"
    assert NomadSettings.from_env({}).namespace == "default"
    monkeypatch.setenv("NOMAD_NAMESPACE", "from-env")
    assert load_spec(without).namespace == "from-env"
    assert load_spec(with_own).namespace == "from-json"
    # The commands that take a job id: --namespace, then NOMAD_NAMESPACE, then default.
    assert NomadSettings.from_env({"NOMAD_NAMESPACE": "from-env"}).namespace == "from-env"
    assert NomadSettings.from_env({"NOMAD_NAMESPACE": "from-env"}, namespace="flag").namespace == "flag"
    monkeypatch.setenv("NOMAD_NAMESPACE", "no good")
    with pytest.raises(SpecError, match="NOMAD_NAMESPACE='no good' is not a Nomad namespace"):
        load_spec(without)


def test_render_follows_nomad_namespace_like_status_does(tmp_path):
    job = write_job(tmp_path, probe_job("ns-render"))
    rendered = nomadtf("render", str(job), env={"NOMAD_NAMESPACE": "team-r"}, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    assert json.loads(rendered.stdout)["Job"]["Namespace"] == "team-r"
    policies = nomadtf("acl", "policies", str(job), env={"NOMAD_NAMESPACE": "team-r"}, timeout=60)
    assert policies.returncode == 0 and wire.acl_name("team-r", "ns-render") in policies.stdout, policies.stderr
    empty = nomadtf("render", str(write_job(tmp_path, {**probe_job("ns-empty"), "namespace": ""})), timeout=60)
    assert empty.returncode == 2 and "namespace: '' is not a Nomad namespace" in empty.stderr, empty.stderr


# ---- placement options of a role (distinct_hosts, spread, node_class) ---------------------


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        ({"distinct_hosts": "yes"}, "roles.worker.distinct_hosts: 'yes' is not of type 'boolean'"),
        ({"node_class": ""}, "roles.worker.node_class: '' should be non-empty"),
        ({"spread": [{"attribute": "${meta.rack}", "weight": 0}]}, "roles.worker.spread[0].weight: 0 is less than the minimum of 1"),
        ({"spread": [{"atribute": "${meta.rack}"}]}, "roles.worker.spread[0].atribute: unknown key 'atribute'; did you mean 'attribute'?"),
        (
            {"spread": [{"attribute": "a", "targets": [{"value": "x", "percent": 60}, {"value": "y", "percent": 50}]}]},
            "roles.worker.spread[0].targets: the percentages add up to 110; at most 100",
        ),
        (
            {"spread": [{"attribute": "a", "targets": [{"value": "x", "percent": 10}, {"value": "x", "percent": 10}]}]},
            "roles.worker.spread[0].targets: value 'x' is listed more than once",
        ),
    ],
)
def test_bad_placement_options_are_named_with_their_path(worker, expected):
    with pytest.raises(SpecError) as caught:
        normalize({"name": "place", "entrypoint": {"script": "train.py"}, "roles": {"chief": {}, "worker": {"count": 3, **worker}, "ps": {}}})
    assert expected in caught.value.problems


@pytest.mark.parametrize("folder", ["/tmp/nomadtf/team-b", "/etc", "/srv/archive/${NOMAD_NAMESPACE}/../team-b"])
def test_an_archive_folder_outside_the_job_s_own_namespace_is_refused(folder):
    # The supervisor makes the run's folders there: a job.json must not name another team's.
    data = {"name": "a", "namespace": "team-a", "strategy": "multi_worker_mirrored", "entrypoint": {"script": "t.py"},
            "roles": {"worker": {"count": 1}}, "archive": {"folder": folder}}
    with pytest.raises(SpecError, match=r"archive.folder: .* is not a folder of namespace 'team-a'"):
        parse_spec(data)
    data["archive"]["folder"] = "/srv/archive/${NOMAD_NAMESPACE}"
    assert parse_spec(data).document["archive"]["folder"] == "/srv/archive/${NOMAD_NAMESPACE}"

"""job.json -> Nomad job JSON. Golden files pin what every example renders to.

After an intended change to the templates or the schema, rewrite the golden files with
    NOMADTF_UPDATE_GOLDEN=1 python -m pytest tests/unit/job/test_render.py
and review the diff before committing it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from nomadtf import __version__
from nomadtf.errors import RenderError, SpecError
from nomadtf.job.dcos import convert_options
from nomadtf.job.options import read_options
from nomadtf.job.render import default_templates_dir, embedded_spec, job_json, render_job, stamp_run
from nomadtf.job.spec import JobSpec, RunInfo, load_spec, parse_spec
from nomadtf.job.target import resolve
from nomadtf.job.validate import namespace_folder, normalize
from tests.helpers import EXAMPLES, nomadtf

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE_GOLDEN = os.environ.get("NOMADTF_UPDATE_GOLDEN") == "1"

JOB_EXAMPLES = {
    "digits": EXAMPLES / "digits" / "job.json",
    "digits-mwms": EXAMPLES / "digits" / "job-mwms.json",
    "data-service": EXAMPLES / "data-service" / "job.json",
    "jax": EXAMPLES / "jax" / "job.json",
    "gpu": EXAMPLES / "gpu" / "job.json",
    "legacy": EXAMPLES / "legacy" / "job.json",
    "secrets": EXAMPLES / "secrets" / "job.json",
    "docker": EXAMPLES / "docker" / "job.json",
}


def example_spec(name):
    if name == "dcos":
        return parse_spec(convert_options(read_options(EXAMPLES / "dcos" / "options.json")).job)
    return load_spec(JOB_EXAMPLES[name])


def groups(job):
    return {group["Name"]: group for group in job["Job"]["TaskGroups"]}


def task(job, role):
    return groups(job)[role]["Tasks"][0]


@pytest.mark.parametrize("name", [*JOB_EXAMPLES, "dcos"])
def test_example_renders_as_its_golden_file(name):
    text = job_json(render_job(example_spec(name)))
    golden = GOLDEN / f"{name}.json"
    if UPDATE_GOLDEN:
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing; create it with NOMADTF_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{name} renders differently from {golden}; if intended, regenerate it"


def test_the_cli_prints_the_golden_bytes():
    result = nomadtf("render", str(JOB_EXAMPLES["gpu"]))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (GOLDEN / "gpu.json").read_text()


def _keys_reversed(value):
    if isinstance(value, dict):
        return {key: _keys_reversed(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_keys_reversed(item) for item in value]
    return value


@pytest.mark.parametrize("name", [*JOB_EXAMPLES, "dcos"])
def test_a_run_stamped_on_the_rendered_job_is_the_job_rendered_with_it(name):
    # `nomadtf run` renders once and stamps each run on that job (run.py): only the Meta and
    # the spec file may carry a run, and a job stamped twice keeps nothing of the first run.
    spec = example_spec(name)
    target = resolve("1.10.2", "test")
    plain = render_job(spec, target=target)
    fresh = RunInfo("run-2", 1_800_000_000.5, "run-2")
    resumed = RunInfo("run-3", 1_800_000_100.25, "run-1")
    for run in (fresh, resumed):
        assert stamp_run(plain, spec, run) == render_job(spec, run=run, target=target)
    assert stamp_run(stamp_run(plain, spec, resumed), spec, fresh) == render_job(spec, run=fresh, target=target)
    assert plain == render_job(spec, target=target)  # the job stamped is left as it was


def test_rendering_depends_on_the_spec_alone():
    # Processes with different hash seeds, and the same spec with every key in reverse
    # order, give the golden bytes: no set order, dict order or clock leaks into the job.
    for seed in ("0", "1"):
        result = nomadtf("render", str(JOB_EXAMPLES["secrets"]), env={"PYTHONHASHSEED": seed})
        assert result.returncode == 0, result.stderr
        assert result.stdout == (GOLDEN / "secrets.json").read_text(), f"PYTHONHASHSEED={seed}"
    reordered = _keys_reversed(example_spec("digits").document)
    assert list(reordered["roles"]) != list(example_spec("digits").document["roles"])
    assert job_json(render_job(JobSpec.from_normalized(reordered))) == (GOLDEN / "digits.json").read_text()


def test_every_present_role_gets_a_group_with_its_count():
    job = render_job(example_spec("digits"))
    assert [(g["Name"], g["Count"]) for g in job["Job"]["TaskGroups"]] == [
        ("chief", 1),
        ("worker", 2),
        ("ps", 1),
    ]
    assert job["Job"]["Type"] == "batch"
    for role, group in groups(job).items():
        assert group["Services"][0]["Name"] == f"digits-{role}"
        assert task(job, role)["Config"]["command"] == "nohup"  # SIGHUP ignored from the first instant
        assert task(job, role)["Config"]["args"] == ["python3", "-m", "nomadtf", "task", "--role", role]


def test_template_mode_embeds_consul_template_verbatim():
    result = nomadtf("render", str(JOB_EXAMPLES["digits"]), "--var", "discovery.reconfigure=template")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    for role in ("chief", "worker", "ps"):
        template = task(job, role)["Templates"][1]
        assert template["DestPath"] == "local/nomadtf-cluster.json"
        # No change signal: Nomad fails a task it cannot signal, e.g. one that is finishing.
        assert template["ChangeMode"] == "noop" and "ChangeSignal" not in template
        text = template["EmbeddedTmpl"]
        for member in ("chief", "worker", "ps"):
            assert f'{{{{ range service "digits-{member}" }}}}' in text
        assert '"address": "{{ .Address }}:{{ .Port }}"' in text
        assert "{% raw %}" not in text and "{%" not in text


def test_nomad_native_services_are_refused_until_supported():
    with pytest.raises(SpecError, match=r"discovery.provider"):
        normalize({**read_options(JOB_EXAMPLES["digits"]), "discovery": {"provider": "nomad"}})


def test_watch_mode_has_only_the_spec_template():
    spec = example_spec("digits")
    job = render_job(spec)
    for role in ("chief", "worker", "ps"):
        [template] = task(job, role)["Templates"]
        assert template["DestPath"] == "local/nomadtf-spec.json" and template["ChangeMode"] == "noop"
        assert "{{" not in template["EmbeddedTmpl"].removeprefix("{{ base64Decode ").removesuffix(" }}")
        assert embedded_spec(task(job, role)) == spec.document
        assert "NOMADTF_SPEC" not in task(job, role)["Env"]  # no 128 KiB env limit, no ${} interpolation


def test_gpu_roles_get_devices_with_constraints():
    job = render_job(example_spec("gpu"))
    assert task(job, "worker")["Resources"]["Devices"] == [
        {
            "Name": "nvidia/gpu",
            "Count": 2,
            "Constraints": [{"LTarget": "${device.attr.memory}", "RTarget": "15 GiB", "Operand": ">="}],
        }
    ]
    gpus = {"count": 1, "vendor": "nvidia", "model": "NVIDIA A100-SXM4-40GB", "min_memory_mib": 16000}
    spec = load_spec(JOB_EXAMPLES["gpu"], [f"roles.worker.gpus={json.dumps(gpus)}"])
    assert task(render_job(spec), "worker")["Resources"]["Devices"][0]["Constraints"] == [
        {"LTarget": "${device.model}", "RTarget": "NVIDIA A100-SXM4-40GB", "Operand": "="},
        {"LTarget": "${device.attr.memory}", "RTarget": "16000 MiB", "Operand": ">="},
    ]
    assert task(job, "chief")["Resources"]["Devices"] == [
        {"Name": "nvidia/gpu", "Count": 1, "Constraints": []}
    ]
    assert "Devices" not in task(job, "ps")["Resources"]


def test_docker_gpu_roles_get_the_gpu_image():
    job = render_job(example_spec("dcos"))
    assert task(job, "worker")["Config"]["image"] == "mesosphere/dcos-tensorflow:v1.3-gpu"
    assert task(job, "ps")["Config"]["image"] == "mesosphere/dcos-tensorflow:v1.3"


def test_docker_tasks_run_nomadtf_on_the_host_network_with_model_dir_mounted():
    spec = load_spec(JOB_EXAMPLES["docker"], ['driver.volumes=["/data/shared:/data:ro"]'])
    config = task(render_job(spec), "worker")["Config"]
    assert config["entrypoint"] == ["python3", "-m", "nomadtf"] and config["args"] == ["task", "--role", "worker"]
    assert config["network_mode"] == "host" and config["init"] is True
    # The default model_dir is under /tmp/nomadtf on the client: the tasks share it there.
    assert config["volumes"] == ["/data/shared:/data:ro"] and config["security_opt"] == ["no-new-privileges"]
    assert task(render_job(spec), "worker")["Resources"]["MemoryMB"] == 1024


def test_only_a_docker_job_with_its_own_bind_mounts_needs_a_docker_driver_that_allows_them():
    needs = {"LTarget": "${attr.driver.docker.volumes.enabled}", "RTarget": "true", "Operand": "="}
    docker = render_job(load_spec(JOB_EXAMPLES["docker"], []))
    assert all(needs not in g["Constraints"] for g in docker["Job"]["TaskGroups"])
    binds = render_job(load_spec(JOB_EXAMPLES["docker"], ['driver.volumes=["/data:/data:ro"]']))
    assert all(needs in g["Constraints"] for g in binds["Job"]["TaskGroups"])
    raw = render_job(example_spec("digits"))
    assert all(needs not in (g["Constraints"] or []) for g in raw["Job"]["TaskGroups"])


def test_docker_tasks_get_the_ca_files_they_are_told_to_trust_read_only_at_the_same_path():
    spec = load_spec(JOB_EXAMPLES["docker"], ["discovery.consul_ca_file=/etc/consul.d/ca.pem", "vault.ca_file=/etc/consul.d/ca.pem"])
    config, env = task(render_job(spec), "chief")["Config"], task(render_job(spec), "chief")["Env"]
    assert config["volumes"] == []  # no bind mount: the client's docker plugin needs no volumes.enabled
    mounts = task(render_job(spec), "chief")["VolumeMounts"]
    assert [(m["Volume"], m["Destination"], m["ReadOnly"]) for m in mounts] == [
        ("nomadtf-default", "/tmp/nomadtf/default", False), ("nomadtf-ca", "/etc/consul.d", True)]  # one mount for both CAs
    with pytest.raises(SpecError, match="in two directories.*keep both CA files in one directory"):
        load_spec(JOB_EXAMPLES["docker"], ["discovery.consul_ca_file=/etc/consul.d/ca.pem", "vault.ca_file=/etc/vault.d/ca.pem"])
    assert env["CONSUL_CACERT"] == env["VAULT_CACERT"] == "/etc/consul.d/ca.pem"


def test_a_model_dir_url_is_tensorflow_s_to_write_and_not_mounted():
    spec = load_spec(JOB_EXAMPLES["docker"], ["model_dir=gs://bucket/models/${NOMAD_JOB_ID}", 'driver.volumes=["/data:/data:ro"]'])
    assert task(render_job(spec), "chief")["Config"]["volumes"] == ["/data:/data:ro"]


def test_a_docker_task_mounts_its_namespace_s_folder_and_no_other():
    assert namespace_folder("/tmp/nomadtf/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMADTF_RUN_ID}", "team-a") == "/tmp/nomadtf/team-a"
    assert namespace_folder("/mnt/shared/team-a/models/${NOMAD_JOB_ID}", "team-a") == "/mnt/shared/team-a"
    assert namespace_folder("/mnt/shared/team-b/models", "team-a") is None  # another team's folder
    assert namespace_folder("/tmp/ckpt-${NOMAD_JOB_ID}/team-a", "team-a") is None  # a variable before it
    spec = load_spec(JOB_EXAMPLES["docker"], ["namespace=team-a"])
    group = render_job(spec)["Job"]["TaskGroups"][0]
    assert group["Volumes"] == {"nomadtf-team-a": {"Name": "nomadtf-team-a", "Type": "host", "Source": "nomadtf-team-a", "ReadOnly": False}}
    assert group["Tasks"][0]["VolumeMounts"] == [
        {"Volume": "nomadtf-team-a", "Destination": "/tmp/nomadtf/team-a", "ReadOnly": False, "PropagationMode": "private"}]
    with pytest.raises(SpecError, match=r"model_dir: '/tmp/shared/\$\{NOMAD_JOB_ID\}' is outside every namespace's folder.*host volume nomadtf-team-a"):
        load_spec(JOB_EXAMPLES["docker"], ["namespace=team-a", "model_dir=/tmp/shared/${NOMAD_JOB_ID}"])


def test_secrets_give_a_vault_block_and_no_value():
    spec = example_spec("secrets")
    job = render_job(spec)
    assert task(job, "chief")["Vault"]["Policies"] == ["nomadtf-digits-read"]
    # Workers and parameter servers run a bare TF server: no token for them.
    assert "Vault" not in task(job, "worker") and "Vault" not in task(job, "ps")
    for role in ("chief", "worker", "ps"):
        # The secret's target env name is set by `nomadtf task` in the child only.
        assert "DIGITS_API_TOKEN" not in task(job, role)["Env"]
    text = job_json(job) + json.dumps(embedded_spec(task(job, "chief")))
    assert "secret/nomadtf/digits" in text  # the reference travels ...
    assert not re.search(r'"value"\s*:', text.lower())  # ... and nothing that holds a value
    assert all("Vault" not in task(render_job(example_spec("digits")), r) for r in ("chief", "worker", "ps"))


def test_job_meta_identifies_the_job():
    spec = example_spec("digits")
    meta = render_job(spec)["Job"]["Meta"]
    assert meta["nomadtf.version"] == __version__
    assert meta["nomadtf.spec_sha256"] == spec.sha256()
    assert re.fullmatch(r"[0-9a-f]{64}", meta["nomadtf.spec_sha256"])
    # The digest of the normalised document, whatever the order of its keys.
    assert JobSpec.from_normalized(_keys_reversed(spec.document)).sha256() == spec.sha256()
    bigger = parse_spec(
        {**read_options(JOB_EXAMPLES["digits"]), "roles": {**spec.document["roles"], "worker": {"count": 3}}}
    )
    assert render_job(bigger)["Job"]["Meta"]["nomadtf.spec_sha256"] != meta["nomadtf.spec_sha256"]


def test_tf_config_shows_every_task_and_keeps_the_evaluator_out_of_the_cluster():
    result = nomadtf("render", str(JOB_EXAMPLES["digits"]), "--tf-config", "--var", "roles.evaluator.count=1")
    assert result.returncode == 0, result.stderr
    configs = json.loads(result.stdout)
    assert sorted(configs) == ["chief[0]", "evaluator[0]", "ps[0]", "worker[0]", "worker[1]"]
    cluster = configs["chief[0]"]["cluster"]
    assert sorted(cluster) == ["chief", "ps", "worker"]
    assert cluster["worker"] == ["<digits-worker[0] address>:<port>", "<digits-worker[1] address>:<port>"]
    assert configs["evaluator[0]"] == {"cluster": cluster, "task": {"type": "evaluator", "index": 0}}
    assert configs["worker[1]"]["task"] == {"type": "worker", "index": 1}


def test_tf_config_for_mirrored_lists_workers_only():
    result = nomadtf("render", str(JOB_EXAMPLES["digits-mwms"]), "--tf-config")
    assert result.returncode == 0, result.stderr
    configs = json.loads(result.stdout)
    assert sorted(configs) == ["worker[0]", "worker[1]"]
    assert list(configs["worker[0]"]["cluster"]) == ["worker"]


@pytest.fixture
def template_copy(tmp_path):
    copy = tmp_path / "templates"
    shutil.copytree(default_templates_dir(), copy)
    return copy


def test_templates_option_renders_with_a_users_copy(template_copy):
    group = template_copy / "group.json.j2"
    group.write_text(
        group.read_text().replace('"KillTimeout": {{ "20s" | ns }}', '"KillTimeout": {{ "45s" | ns }}')
    )
    result = nomadtf("render", str(JOB_EXAMPLES["digits"]), "--templates", str(template_copy))
    assert result.returncode == 0, result.stderr
    assert task(json.loads(result.stdout), "chief")["KillTimeout"] == 45_000_000_000
    assert task(render_job(example_spec("digits")), "chief")["KillTimeout"] == 20_000_000_000


@pytest.mark.parametrize(
    "expression",
    ["{{ spec.job_type | tojson }}", '{{ {"kind": spec.job_type} | tojson }}', '"{{ spec.job_type }}"'],
    ids=["through tojson", "nested in tojson", "bare"],
)
def test_an_undefined_template_value_fails_loudly(template_copy, expression):
    job_template = template_copy / "job.json.j2"
    job_template.write_text(job_template.read_text().replace('"batch"', expression))
    with pytest.raises(RenderError, match="template uses an undefined value: .*job_type"):
        render_job(example_spec("digits"), template_copy)
    result = nomadtf("render", str(JOB_EXAMPLES["digits"]), "--templates", str(template_copy))
    assert result.returncode == 2
    assert "template uses an undefined value" in result.stderr and "job_type" in result.stderr
    assert result.stdout == ""


def test_a_template_that_writes_bad_json_names_the_line(template_copy):
    job_template = template_copy / "job.json.j2"
    job_template.write_text(job_template.read_text().replace('"Type": "batch",', '"Type": "batch"'))
    with pytest.raises(
        RenderError, match=r"templates produced invalid JSON at line \d+: Expecting ',' delimiter"
    ):
        render_job(example_spec("digits"), template_copy)


def test_a_missing_templates_dir_is_a_render_error(tmp_path):
    with pytest.raises(RenderError, match=f"template '.*' not found in {tmp_path}"):
        render_job(example_spec("digits"), tmp_path)


def test_a_run_id_reaches_the_meta_and_the_tasks_spec_file_only():
    spec = example_spec("digits")
    from nomadtf.job.spec import RunInfo

    job = render_job(spec, run=RunInfo("r1a2b3", 1796000000.5))
    assert job["Job"]["Meta"]["nomadtf.run"] == "r1a2b3"
    assert embedded_spec(task(job, "chief"))["run"] == {"id": "r1a2b3", "submitted_at": 1796000000.5}
    assert job["Job"]["Meta"]["nomadtf.spec_sha256"] == spec.sha256()  # the same spec, another run
    assert "nomadtf.run" not in render_job(spec)["Job"]["Meta"]


def test_gpu_affinities_become_device_affinities():
    gpus = {
        "count": 1, "vendor": "nvidia",
        "affinities": [{"attribute": "${device.model}", "operator": "=", "value": "NVIDIA A100-SXM4-40GB", "weight": 80}],
    }
    spec = load_spec(JOB_EXAMPLES["gpu"], [f"roles.worker.gpus={json.dumps(gpus)}"])
    (device,) = task(render_job(spec), "worker")["Resources"]["Devices"]
    assert device["Affinities"] == [{"LTarget": "${device.model}", "RTarget": "NVIDIA A100-SXM4-40GB", "Operand": "=", "Weight": 80}]
    assert "Affinities" not in task(render_job(example_spec("gpu")), "worker")["Resources"]["Devices"][0]


def test_with_a_consul_token_from_vault_every_task_gets_a_vault_token_without_a_file():
    spec = parse_spec({
        "name": "tok", "entrypoint": {"script": "t.py"},
        "roles": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}},
        "discovery": {"consul_address": "https://127.0.0.1:8501", "consul_ca_file": "/etc/ca.pem",
                      "consul_token_path": "consul/creds/nomadtf-default-tok"},
        "vault": {"policies": ["nomadtf-default-tok"], "ca_file": "/etc/ca.pem"},
    })
    job = render_job(spec)["Job"]
    for group in job["TaskGroups"]:
        task = group["Tasks"][0]
        assert task["Vault"] == {"Policies": ["nomadtf-default-tok"], "Env": False, "DisableFile": False, "ChangeMode": "noop"}
        assert task["Env"]["CONSUL_CACERT"] == "/etc/ca.pem" and task["Env"]["VAULT_CACERT"] == "/etc/ca.pem"
        assert "consul/creds" not in json.dumps(task["Env"])  # the path travels in the spec file, not as a token
    # Without it (and without secrets) no task gets a Vault token at all.
    plain = render_job(parse_spec({"name": "p", "entrypoint": {"script": "t.py"}, "roles": {
        "chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}}}))["Job"]
    assert all("Vault" not in g["Tasks"][0] for g in plain["TaskGroups"])


# ---- placement options of a role (distinct_hosts, spread, node_class) ---------------------
# How a placement they make impossible is explained: test_plan.py; on real clients:
# tests/stack/test_multiclient.py.


def placement_job(**worker):
    return {"name": "place", "entrypoint": {"script": "train.py"}, "roles": {"chief": {}, "worker": {"count": 3, **worker}, "ps": {}}}


def placed(spec):
    return groups(render_job(parse_spec(spec)))


def test_defaults_render_no_extra_constraint_and_no_spread():
    worker = placed(placement_job())["worker"]
    assert worker["Constraints"] == [] and worker["Spreads"] == []
    assert normalize(placement_job())["roles"]["worker"]["distinct_hosts"] is False
    assert "node_class" not in normalize(placement_job())["roles"]["worker"]


def test_distinct_hosts_and_node_class_become_group_constraints_after_the_users_own():
    rendered = placed(
        placement_job(
            distinct_hosts=True,
            node_class="gpu-a100",
            constraints=[{"attribute": "${attr.kernel.name}", "value": "linux"}],
        )
    )
    assert rendered["worker"]["Constraints"] == [
        {"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="},
        {"LTarget": "${node.class}", "RTarget": "gpu-a100", "Operand": "="},
        {"LTarget": "", "RTarget": "true", "Operand": "distinct_hosts"},
    ]
    # Per role: the other groups are untouched.
    assert rendered["chief"]["Constraints"] == [] and rendered["ps"]["Constraints"] == []


def test_spread_becomes_nomad_spreads_with_the_default_weight():
    rendered = placed(
        placement_job(
            spread=[
                {"attribute": "${node.datacenter}"},
                {"attribute": "${meta.rack}", "weight": 80, "targets": [{"value": "r1", "percent": 70}, {"value": "r2", "percent": 30}]},
            ]
        )
    )
    assert rendered["worker"]["Spreads"] == [
        {"Attribute": "${node.datacenter}", "Weight": 50, "SpreadTarget": []},
        {
            "Attribute": "${meta.rack}",
            "Weight": 80,
            "SpreadTarget": [{"Value": "r1", "Percent": 70}, {"Value": "r2", "Percent": 30}],
        },
    ]


def test_node_pool_is_rendered_only_when_job_json_names_one():
    document = json.loads((EXAMPLES / "digits" / "job.json").read_text())
    assert "NodePool" not in render_job(parse_spec(document))["Job"]  # Nomad's own default: "default"
    job = render_job(parse_spec({**document, "node_pool": "gpus"}))["Job"]
    assert job["NodePool"] == "gpus"
    with pytest.raises(SpecError, match="node_pool"):
        parse_spec({**document, "node_pool": "no spaces"})


def test_approle_ids_come_from_the_job_s_nomad_variable_into_a_secrets_file_not_the_job():
    spec = load_spec(JOB_EXAMPLES["secrets"], ["vault.auth=approle", "vault.policies=[]"])
    files = {t["DestPath"]: t for t in task(render_job(spec), "chief")["Templates"]}
    approle = files["secrets/vault_approle"]
    variable = f"nomad/jobs/{spec.name}"
    assert approle["EmbeddedTmpl"] == (f'{{{{ range nomadVarList "{variable}" }}}}{{{{ if eq .Path "{variable}" }}}}{{{{ with nomadVar .Path }}}}'
                                       '{{ .vault_role_id }}\n{{ .vault_secret_id }}\n{{ end }}{{ end }}{{ end }}')
    assert approle["Perms"] == "0600" and approle["ChangeMode"] == "noop"
    assert "secrets/vault_approle" not in {t["DestPath"] for t in task(render_job(spec), "ps")["Templates"]}  # no code, no login
    with_env = load_spec(JOB_EXAMPLES["secrets"], ["vault.auth=approle", "vault.policies=[]", 'env={"NOMADTF_VAULT_ROLE_ID": "r", "NOMADTF_VAULT_SECRET_ID": "s"}'])
    assert "secrets/vault_approle" not in {t["DestPath"] for t in task(render_job(with_env), "chief")["Templates"]}


def test_every_jax_process_gets_a_port_of_its_own_the_first_the_coordinators():
    """Strategy jax: the `tf` port of each worker is its JAX process's address (worker 0's the
    coordinator's, which it binds), registered as the service the rendezvous reads."""
    group = groups(render_job(example_spec("jax")))["worker"]
    assert group["Networks"][0]["DynamicPorts"] == [{"Label": "tf"}, {"Label": "health"}]
    assert group["Services"][0]["PortLabel"] == "tf"
    assert "TF_CONFIG" not in json.dumps(group)

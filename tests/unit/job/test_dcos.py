"""`nomadtf convert-dcos`: a DC/OS beta-tensorflow options file becomes a job.json that
validates, and everything that does not carry over is said on stderr."""

from __future__ import annotations

import copy
import json

import pytest

from nomadtf.errors import SpecError
from nomadtf.job.dcos import convert_options
from nomadtf.job.options import read_options
from nomadtf.job.render import render_job
from nomadtf.job.spec import load_spec, parse_spec
from nomadtf.job.validate import normalize
from tests.helpers import EXAMPLES, nomadtf

OPTIONS_FILE = EXAMPLES / "dcos" / "options.json"
OPTIONS = read_options(OPTIONS_FILE)
DISTINCT_HOSTS = {"attribute": "${node.unique.id}", "operator": "distinct_hosts", "value": "true"}


def options_with(**sections):
    """The example options with some sections (or service keys, as service={...}) changed."""
    data = copy.deepcopy(OPTIONS)
    for name, value in sections.items():
        if value is None:
            data.pop(name, None)
        elif name == "service":
            data["service"].update(value)
        else:
            data[name] = value
    return data


def notes_about(notes, text):
    return [note for note in notes if text in note]


def test_the_example_maps_onto_legacy_server():
    job = convert_options(OPTIONS).job
    assert job["name"] == "mnist-with-summaries"
    assert job["strategy"] == "legacy_server"
    assert job["entrypoint"] == {
        "function": "mnist_with_summaries:main",
        "pythonpath": ["local/code/dcos-tensorflow-tools-master/examples/source/mnist_with_summaries"],
    }
    assert job["source"] == {"url": OPTIONS["service"]["job_url"]}
    assert job["context"] == {"learning_rate": 0.001, "max_steps": 100000, "run_name": "demo"}
    assert job["model_dir"] == "gs://team-ml-checkpoints/mnist-with-summaries"
    assert job["driver"] == {
        "name": "docker",
        "image": "mesosphere/dcos-tensorflow:v1.3",
        "gpu_image": "mesosphere/dcos-tensorflow:v1.3-gpu",
    }
    assert job["roles"] == {
        "ps": {"count": 2, "cpu": 1000, "memory": 2048, "constraints": [DISTINCT_HOSTS]},
        # 3 plain + 1 GPU worker: one group, the larger request of the two.
        "worker": {"count": 4, "gpus": 1, "cpu": 2000, "memory": 8192, "constraints": [DISTINCT_HOSTS]},
        "tensorboard": {"count": 1, "cpu": 500, "memory": 1024},
    }


def test_the_example_lists_what_does_not_carry_over():
    notes = convert_options(OPTIONS).notes
    assert notes_about(notes, "parameter_server.port 2223")
    assert notes_about(notes, "worker.port 2222")
    assert notes_about(notes, "tensorboard.port 6006")
    assert len(notes_about(notes, "nomadtf reserves no disk")) == 3  # ps, worker, gpu_worker
    assert notes_about(
        notes, "worker.placement_constraint 'rack_id:GROUP_BY:2'; Nomad's counterpart is a spread (a preference, "
        'not a rule): add roles.worker.spread [{"attribute": "${meta.rack_id}"}]'
    )
    [secret] = notes_about(notes, "service.secrets[0]")
    assert (
        "'team-ml/dataset-token'" in secret and "add a `secrets` entry with the Vault path and key" in secret
    )
    assert notes_about(notes, "service.use_gcs_key_secret")
    assert notes_about(notes, "service.user 'root'")
    [merge] = notes_about(notes, "nomadtf has one worker group")
    assert "3 workers and 1 GPU workers become 4 workers" in merge
    assert notes_about(notes, "needs nomadtf installed")
    assert not notes_about(notes, "nomadtf has no equivalent")  # every key of the example is understood


def test_the_converted_example_normalises_and_renders():
    spec = parse_spec(convert_options(OPTIONS).job)
    assert spec.entrypoint.kind == "function" and spec.entrypoint.target == "mnist_with_summaries:main"
    groups = {g["Name"]: g for g in render_job(spec)["Job"]["TaskGroups"]}
    assert sorted(groups) == ["ps", "tensorboard", "worker"]
    assert groups["worker"]["Tasks"][0]["Resources"]["Devices"][0]["Name"] == "nvidia/gpu"
    assert groups["ps"]["Constraints"] == [{"LTarget": "${node.unique.id}", "RTarget": "true", "Operand": "distinct_hosts"}]
    # A DC/OS job runs its images with the docker driver, with no bind mount: the clients need
    # no docker volumes setting.
    assert groups["ps"]["Tasks"][0]["Driver"] == "docker" and groups["ps"]["Tasks"][0]["Config"]["volumes"] == []
    assert groups["worker"]["Tasks"][0]["Artifacts"][0]["RelativeDest"] == "local/code"


def test_the_command_prints_the_job_and_the_notes():
    result = nomadtf("convert-dcos", str(OPTIONS_FILE))
    assert result.returncode == 0, result.stderr
    conversion = convert_options(OPTIONS)
    assert json.loads(result.stdout) == conversion.job
    lines = result.stderr.splitlines()
    assert lines == [f"not carried over: {note}" for note in conversion.notes]


def test_the_command_writes_a_file_that_nomadtf_loads(tmp_path):
    out = tmp_path / "job.json"
    result = nomadtf("convert-dcos", str(OPTIONS_FILE), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert f"wrote {out}" in result.stderr
    assert load_spec(out).roles["worker"].count == 4
    rendered = nomadtf("render", str(out))
    assert rendered.returncode == 0, rendered.stderr


def test_job_context_that_is_not_json_exits_2_naming_the_field(tmp_path):
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options_with(service={"job_context": "{learning_rate: 0.1}"})))
    result = nomadtf("convert-dcos", str(path))
    assert result.returncode == 2
    assert "service.job_context: not valid JSON" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "job_context, message",
    [
        ('["not", "an", "object"]', "service.job_context: must be a JSON object, got list"),
        (42, "service.job_context: must be a string holding a JSON object, got int"),
    ],
)
def test_job_context_must_hold_an_object(job_context, message):
    with pytest.raises(SpecError, match=message):
        convert_options(options_with(service={"job_context": job_context}))


def test_an_empty_job_context_is_an_empty_context():
    assert convert_options(options_with(service={"job_context": ""})).job["context"] == {}


def test_a_job_that_does_not_validate_exits_2(tmp_path):
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options_with(worker={"count": 0}, gpu_worker={"count": 0})))
    result = nomadtf("convert-dcos", str(path))
    assert result.returncode == 2
    assert "roles.worker: strategy 'legacy_server' needs at least one worker" in result.stderr


@pytest.mark.parametrize(
    "job_name, message",
    [
        ("mnist-train", "service.job_name: 'mnist-train' is not an importable module name"),
        (None, "service.job_name: required"),
    ],
)
def test_job_name_must_be_an_importable_module(job_name, message):
    with pytest.raises(SpecError, match=message):
        convert_options(options_with(service={"job_name": job_name}))


def test_job_name_with_py_suffix_is_the_module():
    assert (
        convert_options(options_with(service={"job_name": "train.py"})).job["entrypoint"]["function"]
        == "train:main"
    )


@pytest.mark.parametrize(
    "constraint, expected",
    [
        ("hostname:UNIQUE", [DISTINCT_HOSTS]),
        ('[["hostname", "UNIQUE"]]', [DISTINCT_HOSTS]),
        ([["hostname", "UNIQUE"]], [DISTINCT_HOSTS]),
        ("hostname:MAX_PER:2", [{**DISTINCT_HOSTS, "operator": "distinct_property", "value": "2"}]),
        ("hostname:unique,hostname:MAX_PER:3", [
            DISTINCT_HOSTS, {"attribute": "${node.unique.id}", "operator": "distinct_property", "value": "3"},
        ]),
    ],
)  # fmt: skip
def test_placement_constraints_that_map(constraint, expected):
    conversion = convert_options(
        options_with(parameter_server={"count": 1, "placement_constraint": constraint})
    )
    assert conversion.job["roles"]["ps"]["constraints"] == expected
    assert not notes_about(conversion.notes, "parameter_server.placement_constraint")


@pytest.mark.parametrize(
    "constraint, hint",
    [
        ("hostname:LIKE:10.0.0.159|10.0.1.202", "${attr.unique.network.ip-address}"),
        ("hostname:CLUSTER:10.0.0.159", "${attr.unique.hostname}"),
        ("rack_id:CLUSTER:rack-1", "${meta.rack_id} to roles.ps.constraints"),
        ("@zone:GROUP_BY:3", 'roles.ps.spread [{"attribute": "${meta.@zone}"}]'),
    ],
)
def test_placement_constraints_that_do_not_map_are_listed(constraint, hint):
    conversion = convert_options(
        options_with(parameter_server={"count": 1, "placement_constraint": constraint})
    )
    assert "constraints" not in conversion.job["roles"]["ps"]
    [note] = notes_about(conversion.notes, "parameter_server.placement_constraint")
    assert repr(constraint) in note and hint in note


def test_a_malformed_placement_constraint_names_the_field():
    with pytest.raises(SpecError, match="worker.placement_constraint: not valid JSON"):
        convert_options(options_with(worker={"count": 1, "placement_constraint": '[["hostname", "UNIQUE"]'}))


def test_gpu_workers_alone_keep_their_shape_without_a_merge_note():
    conversion = convert_options(options_with(worker={"count": 0, "port": 2222}))
    assert conversion.job["roles"]["worker"] == {"count": 1, "cpu": 1500, "memory": 8192, "gpus": 1}
    assert not notes_about(conversion.notes, "one worker group")
    assert not notes_about(conversion.notes, "worker.port")  # a section of count 0 asks for nothing


def test_a_credential_in_the_options_is_never_copied_or_echoed(tmp_path):
    key = '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----MIIEv"}'
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options_with(service={"gcs_key": key, "use_gcs_key_secret": False})))
    result = nomadtf("convert-dcos", str(path))
    assert result.returncode == 0, result.stderr
    assert "MIIEv" not in result.stdout + result.stderr
    assert "not carried over: service.gcs_key (a credential; not copied)" in result.stderr


def test_unknown_keys_and_sections_are_listed_not_dropped():
    conversion = convert_options(
        options_with(
            service={"virtual_network": True, "hdfs": {"config_uri": "http://hdfs/v1/endpoints"}, "zzz": 1},
            extra={"a": 1},
        )
    )
    assert notes_about(conversion.notes, "service.zzz; nomadtf has no equivalent")
    assert notes_about(conversion.notes, "extra (the whole section)")
    assert notes_about(conversion.notes, "service.virtual_network")
    assert notes_about(conversion.notes, "service.hdfs")


def test_a_folder_service_name_becomes_a_dns_safe_job_name():
    conversion = convert_options(options_with(service={"name": "/ML-Team/mnist_v2"}))
    assert conversion.job["name"] == "ml-team-mnist-v2"
    assert notes_about(
        conversion.notes, "service.name '/ML-Team/mnist_v2' as written; the Nomad job is 'ml-team-mnist-v2'"
    )


def test_without_tensorboard_its_section_is_listed():
    conversion = convert_options(options_with(service={"use_tensorboard": False}))
    assert "tensorboard" not in conversion.job["roles"]
    assert notes_about(
        conversion.notes, "tensorboard (the whole section); service.use_tensorboard is not true"
    )


def test_without_images_the_job_keeps_the_default_driver():
    conversion = convert_options(options_with(service={"tf_image": "", "gpu_tf_image": ""}))
    assert "driver" not in conversion.job
    assert normalize(conversion.job)["driver"]["name"] == "raw_exec"


def test_an_unfetchable_job_url_is_listed():
    conversion = convert_options(
        options_with(service={"job_url": "hdfs://namenode/jobs/mnist.zip", "job_path": "mnist"})
    )
    assert "source" not in conversion.job
    assert conversion.job["entrypoint"]["pythonpath"] == ["mnist"]
    assert notes_about(conversion.notes, "service.job_url 'hdfs://namenode/jobs/mnist.zip'")


def test_an_empty_shared_filesystem_is_listed():
    conversion = convert_options(options_with(service={"shared_filesystem": ""}))
    assert "model_dir" not in conversion.job
    assert notes_about(conversion.notes, "service.shared_filesystem is empty")


@pytest.mark.parametrize(
    "section, message",
    [
        ({"count": "3"}, r"worker.count: must be a whole number >= 0, got '3'"),
        ({"count": 1, "cpus": "two"}, r"worker.cpus: must be a number, got 'two'"),
        ("three workers", r"worker: must be an object, got str"),
    ],
)
def test_malformed_sections_name_the_field(section, message):
    with pytest.raises(SpecError, match=message):
        convert_options(options_with(worker=section))


def test_run_validate_and_render_recognise_an_options_file_and_name_the_conversion(tmp_path):
    from tests.helpers import EXAMPLES, nomadtf

    options = EXAMPLES / "dcos" / "options.json"
    for command in ("run", "validate", "render"):
        out = nomadtf(command, str(options))
        assert out.returncode == 2, (command, out.stderr)
        assert "DC/OS beta-tensorflow options file" in out.stderr and f"nomadtf convert-dcos {options}" in out.stderr, out.stderr
        assert "did you mean" not in out.stderr

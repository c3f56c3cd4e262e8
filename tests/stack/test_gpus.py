"""GPUs on the real stack: the Nomad client offers fake NVIDIA GPUs through the project's
device plugin (tests/conftest.py TEST_GPUS); Nomad places, reserves and releases them; each
task's code sees exactly the GPUs Nomad assigned to it."""

from __future__ import annotations

import os
import re
import time

import pytest
import requests

from nomadtf.devstack.probes import node_gpu_count
from nomadtf.runtime.launch import child_argv, gpu_env
from nomadtf.spec import JobSpec, load_spec, spec_file_text
from tests.conftest import TEST_GPUS
from tests.helpers import (
    EXAMPLES,
    allocations,
    nomadtf,
    probe_job,
    purge,
    task_log,
    unique,
    wait_until,
    write_job,
)


def _gpu_job(name: str, **gpus_by_role) -> dict:
    spec = probe_job(name, strategy="multi_worker_mirrored")
    spec["roles"] = {"chief": {"count": 1}, "worker": {"count": 2}}
    for role, cfg in spec["roles"].items():
        cfg.update(cpu=200, memory=600, gpus=gpus_by_role.get(role, 0))
    return spec


def _visible(alloc: dict) -> dict[str, str]:
    out = task_log(alloc["ID"], alloc["TaskGroup"])
    return dict(re.findall(r"^env (\w+)=(.*)$", out, re.M))


@pytest.mark.stack
def test_the_client_offers_the_fake_gpus_as_the_nvidia_plugin_would(stack):
    nodes = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/nodes", params={"resources": "true"}, timeout=10).json()
    assert sum(node_gpu_count(n) for n in nodes) == TEST_GPUS
    node = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/node/{nodes[0]['ID']}", timeout=10).json()
    (group,) = node["NodeResources"]["Devices"]
    assert (group["Vendor"], group["Type"]) == ("nvidia", "gpu")
    assert all(i["ID"].startswith("GPU-") and i["Healthy"] for i in group["Instances"])
    assert group["Attributes"]["memory"]["Unit"] == "MiB" and "driver_version" in group["Attributes"]


@pytest.mark.stack
def test_each_task_sees_exactly_its_own_gpus_and_they_are_free_again_after_the_job(stack, tmp_path):
    name = unique("gpus")
    job = write_job(tmp_path, _gpu_job(name, chief=1, worker=2))
    try:
        for attempt in (1, 2):  # the second run can only be placed if the first released its 5 GPUs
            out = nomadtf("run", str(job), "--timeout", "3m")
            assert out.returncode == 0, (attempt, out.stderr)
        allocs = [a for a in allocations(name) if a["JobVersion"] == max(x["JobVersion"] for x in allocations(name))]
        seen: list[str] = []
        for alloc in allocs:
            env = _visible(alloc)
            ids = env["NVIDIA_VISIBLE_DEVICES"].split(",")
            assert len(ids) == (1 if alloc["TaskGroup"] == "chief" else 2), env
            assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
            full = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/allocation/{alloc['ID']}", timeout=10).json()
            devices = full["AllocatedResources"]["Tasks"][alloc["TaskGroup"]]["Devices"]
            assert sorted(ids) == sorted(devices[0]["DeviceIDs"])  # exactly what Nomad reserved
            seen += ids
        assert len(seen) == len(set(seen)) == 5  # disjoint across tasks
    finally:
        purge(name)


@pytest.mark.stack
def test_a_role_without_gpus_sees_none(stack, tmp_path):
    name = unique("nogpu")
    try:
        out = nomadtf("run", str(write_job(tmp_path, _gpu_job(name, worker=1))), "--timeout", "3m")
        assert out.returncode == 0, out.stderr
        chief = next(a for a in allocations(name) if a["TaskGroup"] == "chief")
        env = _visible(chief)
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "<unset>", env
        assert "GPUs: none requested" in task_log(chief["ID"], "chief", "stderr")
    finally:
        purge(name)


@pytest.mark.stack
def test_more_gpus_than_exist_is_explained_and_run_fails_fast(stack, tmp_path):
    name = unique("toomany")
    job = write_job(tmp_path, _gpu_job(name, worker=TEST_GPUS))  # two workers: twice what the node has
    plan = nomadtf("plan", str(job))
    assert plan.returncode == 1
    assert "worker: cannot be placed" in plan.stdout + plan.stderr and "nvidia/gpu x6" in plan.stdout + plan.stderr
    started = time.monotonic()
    out = nomadtf("run", str(job), "--timeout", "3m")
    try:
        assert out.returncode == 1 and "cannot be placed" in out.stderr, out.stderr
        assert time.monotonic() - started < 30
    finally:
        purge(name)


@pytest.mark.stack
@pytest.mark.parametrize(
    "gpus, placeable",
    [
        ({"count": 1, "min_memory": "8 GiB"}, True),
        ({"count": 1, "min_memory": "40 GiB"}, False),
        ({"count": 1, "model": "Tesla-V100-SXM2-16GB"}, True),
        ({"count": 1, "model": "NVIDIA A100-SXM4-40GB"}, False),
        # The model is matched exactly: how a role is kept off (or put on) the MIG slices that
        # nomad-device-nvidia 1.1 lists as GPUs named "<model> MIG 1g.5gb" (docs/nomad-versions.md).
        ({"count": 1, "model": "Tesla-V100-SXM2-16GB MIG 1g.5gb"}, False),
        ({"count": 1, "model": "Tesla-V100"}, False),
        # An affinity is a preference: a model nobody offers still places on what there is.
        ({"count": 1, "affinities": [{"attribute": "${device.model}", "value": "NVIDIA A100-SXM4-40GB", "weight": 80}]}, True),
    ],
)
def test_model_and_memory_constraints_are_honoured(stack, tmp_path, gpus, placeable):
    job = write_job(tmp_path, _gpu_job(unique("gpucons"), chief=gpus))

    def plan() -> tuple[int, str]:
        out = nomadtf("plan", str(job))
        return out.returncode, out.stdout + out.stderr

    if placeable:
        # GPUs of an earlier test's job may still be held while its allocations stop.
        # Only a plan that places the new job counts: one that errors (exit 255) does not.
        last: list[str] = []

        def placed() -> bool:
            code, text = plan()
            last[:] = [text]
            return code == 1 and "job diff: added" in text and "cannot be placed" not in text

        try:
            wait_until(placed, 60, "the GPUs to be free for a placeable request")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last plan said:\n{last[0]}") from None
        assert "chief: place 1" in last[0] and "worker: place 2" in last[0], last[0]
    else:
        code, text = plan()
        assert code == 1, text
        assert "chief: cannot be placed" in text and "nvidia/gpu x1" in text, text


def test_the_gpu_example_renders_device_blocks_and_the_gpu_image():
    spec = load_spec(EXAMPLES / "gpu" / "job.json")
    assert spec.gpus["worker"]["count"] == 2 and spec.gpus["ps"] is None
    assert spec.roles["worker"].gpus == {"count": 2, "vendor": "nvidia", "min_memory": "15 GiB"}


def test_gpu_env_maps_the_assignment_for_cuda_and_tensorflow():
    assigned = {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert gpu_env({"count": 2}, assigned) == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert gpu_env(None, assigned) == {"CUDA_VISIBLE_DEVICES": ""}
    capped = gpu_env({"count": 1, "memory_limit_mib": 4096}, assigned)
    assert capped == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "NOMADTF_GPU_MEMORY_LIMIT_MIB": "4096"}


def test_a_memory_limit_runs_the_code_through_the_cap():
    import json

    spec = load_spec(EXAMPLES / "gpu" / "job.json", ['roles.worker.gpus={"count": 1, "memory_limit_mib": 2048}',
                                                     "strategy=multi_worker_mirrored", "roles.ps.count=0"])
    typed = JobSpec.from_normalized(json.loads(spec_file_text(spec)))  # as the task reads it
    argv = child_argv(typed, "worker", 2222, python="python3")
    assert argv[:4] == ["python3", "-u", "-m", "nomadtf.gpulimit"] and argv[4] == "train_ps.py"
    assert child_argv(typed, "chief", 2222, python="python3")[:3] == ["python3", "-u", "train_ps.py"]

"""GPUs on the real stack: the Nomad client offers fake NVIDIA GPUs through the project's
device plugin (tests/conftest.py TEST_GPUS), and beside them MIG slices as nomad-device-nvidia
1.1 lists them (TEST_MIG, a device group named "<model> MIG 1g.5gb"); Nomad places, reserves
and releases them; each task's code sees exactly the GPUs Nomad assigned to it; `gpus.model`
and `min_memory` keep a role off the slices or put it on one."""

from __future__ import annotations

import os
import re
import time

import pytest
import requests

from nomadtf.devstack import gpu_plugin
from nomadtf.devstack.probes import node_gpu_count
from nomadtf.job.spec import JobSpec, load_spec
from nomadtf.job.taskfile import spec_file_text
from nomadtf.runtime.launch import child_argv, gpu_env
from tests.conftest import TEST_GPUS, TEST_MIG
from tests.helpers import (
    EXAMPLES,
    allocations,
    nomad,
    nomadtf,
    probe_job,
    purge,
    submit_raw,
    task_log,
    unique,
    wait_until,
    write_job,
)

# The test bed's two device groups: whole GPUs, and MIG slices of them.
WHOLE = gpu_plugin.DEFAULT_MODEL
SLICE = gpu_plugin.mig_model()


def _pinned(count: int, model: str = WHOLE) -> dict:
    """A role's gpus on one device group (the model is matched exactly)."""
    return {"count": count, "model": model}


def _gpu_job(name: str, **gpus_by_role) -> dict:
    spec = probe_job(name, strategy="multi_worker_mirrored")
    spec["roles"] = {"chief": {"count": 1}, "worker": {"count": 2}}
    for role, cfg in spec["roles"].items():
        cfg.update(cpu=200, memory=600, gpus=gpus_by_role.get(role, 0))
    return spec


def _visible(alloc: dict) -> dict[str, str]:
    out = task_log(alloc["ID"], alloc["TaskGroup"])
    return dict(re.findall(r"^env (\w+)=(.*)$", out, re.M))


def _device_ids(model: str) -> set[str]:
    """The instance ids the node offers in device group `model` (what the plugin made).
    GET /v1/nodes?resources=true"""
    return {
        instance["ID"]
        for node in nomad("nodes", resources="true")
        for group in (node.get("NodeResources") or {}).get("Devices") or []
        if group["Name"] == model
        for instance in group["Instances"]
    }


@pytest.mark.stack
def test_the_client_offers_the_fake_gpus_as_the_nvidia_plugin_would(stack):
    nodes = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/nodes", params={"resources": "true"}, timeout=10).json()
    assert sum(node_gpu_count(n) for n in nodes) == TEST_GPUS + TEST_MIG
    node = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/node/{nodes[0]['ID']}", timeout=10).json()
    groups = {g["Name"]: g for g in node["NodeResources"]["Devices"]}
    assert {name: len(g["Instances"]) for name, g in groups.items()} == {WHOLE: TEST_GPUS, SLICE: TEST_MIG}
    for group in groups.values():
        assert (group["Vendor"], group["Type"]) == ("nvidia", "gpu")
        assert all(i["ID"].startswith("GPU-") and i["Healthy"] for i in group["Instances"])
        assert group["Attributes"]["memory"]["Unit"] == "MiB" and "driver_version" in group["Attributes"]
    # A slice is a GPU with less memory, as nomad-device-nvidia 1.1 reports one.
    assert groups[WHOLE]["Attributes"]["memory"]["Int"] == gpu_plugin.DEFAULT_MEMORY_MIB
    assert groups[SLICE]["Attributes"]["memory"]["Int"] == gpu_plugin.MIG_MEMORY_MIB


@pytest.mark.stack
def test_each_task_sees_exactly_its_own_gpus_and_they_are_free_again_after_the_job(stack, tmp_path):
    name = unique("gpus")
    # On whole GPUs (of 6, 5 held): an unpinned request could take a slice (test below).
    job = write_job(tmp_path, _gpu_job(name, chief=_pinned(1), worker=_pinned(2)))
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
            assert devices[0]["Name"] == WHOLE
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
        # The model is matched exactly: how a role is put on (or kept off) the MIG slices that
        # nomad-device-nvidia 1.1 lists as GPUs named "<model> MIG 1g.5gb" (docs/nomad-versions.md).
        ({"count": 1, "model": SLICE}, True),
        ({"count": TEST_MIG + 1, "model": SLICE}, False),  # more slices than there are; whole GPUs do not count
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
        assert "chief: cannot be placed" in text and f"nvidia/gpu x{gpus['count']}" in text, text


def _gpu_holder(job_id: str, count: int, model: str) -> dict:
    """A plain Nomad job whose one task sleeps holding `count` GPUs of `model`."""
    device = {"Name": "nvidia/gpu", "Count": count, "Constraints": [{"LTarget": "${device.model}", "RTarget": model, "Operand": "="}]}
    task = {"Name": "hold", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["600"]},
            "Resources": {"CPU": 50, "MemoryMB": 32, "Devices": [device]}}  # fmt: skip
    group = {"Name": "hold", "Count": 1, "Tasks": [task], "RestartPolicy": {"Attempts": 0, "Mode": "fail"}}
    return {"Job": {"ID": job_id, "Name": job_id, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [group]}}


@pytest.mark.stack
def test_gpus_model_puts_a_role_on_a_mig_slice_and_a_pinned_model_or_memory_never_lands_on_one(stack, tmp_path):
    """The rule docs/guide/gpus.md gives for nodes whose GPUs are split into MIG slices
    (nomad-device-nvidia 1.1), on the test bed's 2 slices: with every whole GPU held, a role
    naming the slice's model gets a slice, and so does a role that pins nothing (the hazard);
    a role pinned to the whole model, or asking more memory than a slice has, is not placed
    on the free slices: plan says it does not fit now, and it fits once whole GPUs are free."""
    slices, whole = _device_ids(SLICE), _device_ids(WHOLE)
    assert (len(slices), len(whole)) == (TEST_MIG, TEST_GPUS)
    holder = unique("gpuhold")

    def held() -> bool:
        return any(a["ClientStatus"] == "running" for a in allocations(holder))

    def plan(gpus: dict) -> str:
        out = nomadtf("plan", str(write_job(tmp_path, _gpu_job(unique("gpumig"), chief=gpus, worker=0))))
        assert out.returncode == 1, out.stdout + out.stderr
        return out.stdout + out.stderr

    try:
        submit_raw(_gpu_holder(holder, TEST_GPUS, WHOLE))
        wait_until(held, 120, f"{holder} to hold every whole GPU")  # other tests' jobs may still hold some

        name = unique("gpumig")
        spec = _gpu_job(name, chief=_pinned(1, SLICE), worker=1)
        spec["roles"]["worker"]["count"] = 1
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "3m")
        try:
            assert out.returncode == 0, out.stderr
            landed = {}
            for alloc in allocations(name):
                (device,) = nomad(f"allocation/{alloc['ID']}")["AllocatedResources"]["Tasks"][alloc["TaskGroup"]]["Devices"]
                visible = _visible(alloc)["NVIDIA_VISIBLE_DEVICES"]
                assert visible.split(",") == device["DeviceIDs"], (visible, device)
                landed[alloc["TaskGroup"]] = (device["Name"], visible)
            # Both on slices (the plugin's ids of the slice group), one each.
            assert {role: model for role, (model, _id) in landed.items()} == {"chief": SLICE, "worker": SLICE}, landed
            assert {gpu for _model, gpu in landed.values()} == slices
        finally:
            purge(name)

        # The slices are the only free GPUs now; a control that asks for one places.
        wait_until(lambda: "chief: place 1" in plan(_pinned(1, SLICE)), 60, "the slices to be free again")
        for pinned in (_pinned(1, WHOLE), {"count": 1, "min_memory": "8 GiB"}):
            text = plan(pinned)
            assert "chief: cannot be placed" in text and "not enough free nvidia/gpu x1" in text, (pinned, text)
            assert "it does not fit now (capacity in use)" in text and "can never fit" not in text, (pinned, text)
    finally:
        purge(holder)
    for pinned in (_pinned(1, WHOLE), {"count": 1, "min_memory": "8 GiB"}):
        wait_until(lambda gpus=pinned: "chief: place 1" in plan(gpus), 60, f"{pinned} to fit once the whole GPUs are free")


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
    assert argv[:4] == ["python3", "-u", "-m", "nomadtf.usercode.gpulimit"] and argv[4] == "train_ps.py"
    assert child_argv(typed, "chief", 2222, python="python3")[:3] == ["python3", "-u", "train_ps.py"]

"""Every rendered example is accepted by the real Nomad and placed on the stack its page
names, and `plan` explains what it cannot place."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from nomadtf.devstack import binaries
from nomadtf.job.render import job_json, render_job
from nomadtf.job.spec import load_spec
from nomadtf.servers.nomad import NomadAPI
from tests.docs_commands import example_stacks
from tests.helpers import EXAMPLES, REPO, nomad, nomadtf, unique

pytestmark = pytest.mark.stack

JOB_FILES = sorted(p for p in EXAMPLES.glob("*/job*.json"))


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rendered_example_passes_nomads_validation(stack, path: Path, tmp_path):
    job = render_job(load_spec(path))
    NomadAPI.from_env().validate(job)  # raises NomadError listing Nomad's objections
    rendered = tmp_path / "job.json"
    rendered.write_text(job_json(job))
    nomad = binaries.find_or_build("nomad", lambda _m: None)
    cli = subprocess.run([str(nomad), "job", "validate", "-json", str(rendered)], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "Job validation successful" in cli.stdout
    assert nomadtf("validate", str(path)).returncode == 0


def _asks(job: dict) -> dict[str, int]:
    """What a rendered job reserves in all: MHz, MB and devices of every task of every group."""
    total = {"cpu": 0, "memory": 0, "gpus": 0}
    for group in job["Job"]["TaskGroups"]:
        for task in group["Tasks"]:
            resources = task.get("Resources") or {}
            total["cpu"] += group["Count"] * resources.get("CPU", 0)
            total["memory"] += group["Count"] * resources.get("MemoryMB", 0)
            total["gpus"] += group["Count"] * sum(d.get("Count", 1) for d in resources.get("Devices") or [])
    return total


def _named_gpus(command: str) -> int:
    """The fake GPUs a single-node `nomadtf dev up …` command gives; another shape fails, so
    that an example naming one is checked against that stack once this test knows it."""
    shape = re.fullmatch(r"nomadtf dev up( --gpus (\d+))?( --docker)?", command)
    assert shape, f"{command!r}: this test places examples on the single-node stack only"
    return int(shape[2] or 0)


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_example_is_placed_on_the_stack_its_page_names(stack, path: Path):
    # The page (docs/guide/examples.md) names the stack: its capacity must hold the whole job
    # (one client: this machine's CPU and memory, and the GPUs the command asks for), and
    # Nomad's plan must place it there. Other tests' jobs may hold some of that capacity at
    # the moment, so the plan may only fail for room taken now, never for a constraint or a
    # device nobody offers.
    command = example_stacks()[str(path.relative_to(REPO))]
    gpus = _named_gpus(command)
    assert gpus <= stack.recorded_gpus(), f"{command!r} offers more GPUs than the test bed has ({stack.recorded_gpus()})"
    assert "--docker" not in command or stack.recorded_docker(), "the test bed runs no Docker daemon"
    job = render_job(load_spec(path, [f"name={unique(path.parent.name)}"]))
    asks = _asks(job)
    (listed,) = nomad("nodes")
    node = nomad(f"node/{listed['ID']}")
    resources, reserved = node["NodeResources"], node.get("ReservedResources") or {}
    capacity = {
        "cpu": resources["Cpu"]["CpuShares"] - (reserved.get("Cpu") or {}).get("CpuShares", 0),
        "memory": resources["Memory"]["MemoryMB"] - (reserved.get("Memory") or {}).get("MemoryMB", 0),
        "gpus": gpus,
    }
    assert all(asks[k] <= capacity[k] for k in asks), f"{path.name} asks {asks}; `{command}` offers {capacity}"
    plan = NomadAPI.from_env().plan(job)
    for group, metric in plan.failed_groups.items():
        assert not metric.constraint_filtered and not metric.nodes_filtered, (group, metric)
        assert all(d in ("cpu", "memory") or "device" in d for d in metric.dimension_exhausted), (group, metric)


def test_validate_reports_nomads_own_objections(stack, tmp_path):
    out = nomadtf("validate", str(EXAMPLES / "digits" / "job.json"), "--var", "recovery.reschedule_delay=5s", "--var", "roles.chief.cpu=5")
    assert out.returncode == 2 and "roles.chief.cpu" in out.stderr


def test_plan_of_the_gpu_example_places_it_on_the_fake_gpus(stack):
    # The test bed's client offers 6 fake GPUs: a 1-GPU chief and two 2-GPU workers fit.
    out = nomadtf("plan", str(EXAMPLES / "gpu" / "job.json"), "--var", "driver.python=python3",
                  "--var", "roles.chief.memory=600", "--var", "roles.worker.memory=600", "--var", "roles.ps.memory=600",
                  "--var", "roles.chief.cpu=200", "--var", "roles.worker.cpu=200", "--var", "roles.ps.cpu=200")
    assert "cannot be placed" not in out.stdout, out.stdout
    assert "worker: create 2" in out.stdout or "worker: place 2" in out.stdout, out.stdout


def test_plan_of_the_gpu_example_explains_a_model_nobody_offers(stack):
    out = nomadtf("plan", str(EXAMPLES / "gpu" / "job.json"), "--var", 'roles.worker.gpus={"count": 2, "model": "NVIDIA A100-SXM4-40GB"}')
    assert out.returncode in (1, 255), out.stdout + out.stderr
    assert "nvidia/gpu" in out.stdout and "cannot be placed" in out.stdout, out.stdout


def test_plan_of_a_placeable_job_shows_the_groups_it_would_create(stack):
    out = nomadtf("plan", str(EXAMPLES / "digits" / "job.json"), "--var", "name=plan-only")
    assert out.returncode == 1, out.stdout + out.stderr  # something would change: the job is new
    assert "job diff: added" in out.stdout
    assert "worker: create 2" in out.stdout or "worker: place 2" in out.stdout, out.stdout

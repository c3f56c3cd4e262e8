"""Every rendered example is accepted by the real Nomad, and `plan` explains what it cannot place."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nomadtf.devstack import binaries
from nomadtf.nomad import NomadAPI
from nomadtf.render import job_json, render_job
from nomadtf.spec import load_spec
from tests.helpers import EXAMPLES, nomadtf

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

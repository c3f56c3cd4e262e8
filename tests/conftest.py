"""Shared fixtures. `stack` is the real local Nomad + Consul + OpenBao: reused when it is
already up, started (and stopped at the end) otherwise. It never skips: a stack that cannot
start fails the run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import requests

from nomadtf.devstack.stack import DevStack

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def _progress(message: str) -> None:
    sys.stderr.write(f"[stack] {message}\n")


@pytest.fixture(scope="session")
def stack():
    dev = DevStack.default()
    started = dev.up(progress=_progress, timeout=180)
    saved = {k: os.environ.get(k) for k in ("NOMAD_ADDR", "CONSUL_HTTP_ADDR", "VAULT_ADDR", "VAULT_TOKEN")}
    os.environ.update(dev.env())
    yield dev
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if started and not os.environ.get("NOMADTF_KEEP_STACK"):
        dev.down(progress=_progress)


def wait_until(check, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Poll `check` until it returns a truthy value (tests only; the product uses blocking queries)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def nomad_get(path: str, **params):
    resp = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/{path}", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()


def run_raw_job(job: dict) -> str:
    resp = requests.post(f"{os.environ['NOMAD_ADDR']}/v1/jobs", json=job, timeout=10)
    resp.raise_for_status()
    return resp.json()["EvalID"]


def purge_job(job_id: str) -> None:
    requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{job_id}", params={"purge": "true"}, timeout=10)

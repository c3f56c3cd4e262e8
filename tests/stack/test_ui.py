"""The job shows up cleanly in the Nomad web UI: a real browser (Debian's headless Chromium,
driven by Playwright) opens the job's page and finds its task groups and nomadtf's Meta.
A screenshot is kept in test-artifacts/."""

from __future__ import annotations

import shutil

import pytest
from playwright.sync_api import sync_playwright

from nomadtf.devstack import stack as stack_mod
from tests.helpers import REPO, nomadtf, probe_job, purge, unique, write_job

pytestmark = pytest.mark.stack

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    # This machine has no network beyond loopback: keep Chromium from trying.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def test_nomad_ui_shows_the_job_its_groups_and_meta(stack, tmp_path):
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is needed (scripts/setup installs it)"
    job_id = unique("ui")
    out = nomadtf("run", str(write_job(tmp_path, probe_job(job_id, context={"sleep": -1}))), "--detach")
    assert out.returncode == 0, out.stderr
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(f"{stack_mod.NOMAD_ADDR}/ui/jobs/{job_id}@default")
            for group in ("chief", "worker", "ps"):
                page.get_by_role("link", name=group, exact=True).first.wait_for(timeout=30_000)
            page.get_by_text("nomadtf.version").first.wait_for(timeout=30_000)
            body = page.inner_text("body")
            page.screenshot(path=str(artifacts / f"nomad-ui-{job_id}.png"), full_page=True)
            browser.close()
        assert job_id in body
        assert "nomadtf.spec_sha256" in body
    finally:
        nomadtf("stop", job_id, "--purge")
        purge(job_id)

"""Renderings for Nomad 1.7 to 2.0.5, decoded by Nomad's own API structs (the MPL-2.0
`github.com/hashicorp/nomad/api` module at a commit after v2.0.5) with unknown fields
refused, and linted for what those versions accept but ignore. Nomad itself from 1.7 on is
never built or run here (not open source); tools/nomadapi-check is built with the machine's
Go into the stack's binary cache, once per change of its sources (~2 s warm)."""

from __future__ import annotations

import json
import shutil

import pytest

from nomadtf.job.dcos import convert_options
from nomadtf.job.options import apply_overrides, read_options
from nomadtf.job.render import job_json, render_job
from nomadtf.job.spec import load_spec, parse_spec
from nomadtf.job.target import resolve
from tests.helpers import EXAMPLES
from tests.nomadapi import nomadapi_check, run_check
from tests.unit.job.test_render import JOB_EXAMPLES, example_spec

if shutil.which("go") is None:
    # Never a skip: without Go the newer-Nomad check would pass silently (scripts/setup needs Go too).
    pytest.fail("tools/nomadapi-check needs Go on PATH to build: install Go, as scripts/setup expects", pytrace=False)

# What varies the rendering: the discovery mode, the Vault paths (the Consul token from Vault
# gives every task a Vault block), the auth kinds, GPUs (the gpu example), the roles (every
# strategy's examples).
VARIANTS = {
    "": [],
    "template": ["discovery.reconfigure=template"],
    "consul-token": ["discovery.consul_token_path=consul/creds/digits", "vault.policies=[\"p\"]"],
    "approle": ["vault.auth=approle", "vault.role=r", "vault.policies=[]"],
    "token-for-code": ["vault.token_for_code=true"],
}


@pytest.fixture(scope="module")
def checker():
    return nomadapi_check()


def variant_spec(name: str, overrides: list[str]):
    """An example with a variant's `--var`s (the DC/OS one as `convert-dcos` makes it, then varied)."""
    if name == "dcos":
        return parse_spec(apply_overrides(convert_options(read_options(EXAMPLES / "dcos" / "options.json")).job, overrides))
    return load_spec(JOB_EXAMPLES[name], overrides)


def renderings(tmp_path, version: str, variants=VARIANTS):
    """Every example in every variant (5 each), each different."""
    paths = []
    for name in [*JOB_EXAMPLES, "dcos"]:
        for variant, overrides in variants.items():
            spec = variant_spec(name, overrides)
            path = tmp_path / f"{name}{'-' + variant if variant else ''}.json"
            path.write_text(job_json(render_job(spec, target=resolve(version, "test"))))
            paths.append(path)
    return paths


@pytest.mark.parametrize("version", ["2.0.5", "1.10.0", "1.8.0", "1.7.0"])
def test_every_rendering_decodes_strictly_and_lints_clean(checker, tmp_path, version):
    paths = renderings(tmp_path, version)
    assert len({path.read_text() for path in paths}) == len(paths) == 5 * (len(JOB_EXAMPLES) + 1)  # no variant left unvaried
    out = run_check(checker, version, paths)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(": ok\n") == len(paths)


def test_the_token_workflow_of_1_7_to_1_9_decodes_too(checker, tmp_path):
    spec = load_spec(JOB_EXAMPLES["secrets"], ["vault.workflow=token"])
    path = tmp_path / "token.json"
    path.write_text(job_json(render_job(spec, target=resolve("1.9.7", "test"))))
    out = run_check(checker, "1.9.7", [path])
    assert out.returncode == 0, out.stdout


def test_the_1_6_rendering_is_what_2_0_5_would_silently_drop(checker, tmp_path):
    # What the issue measured: the 1.6 job decodes, but its Vault.Policies mean nothing on
    # 1.10+, and template mode's cluster file would get no Consul token there.
    path = tmp_path / "old.json"
    path.write_text(job_json(render_job(load_spec(JOB_EXAMPLES["secrets"], ["discovery.reconfigure=template"]))))
    out = run_check(checker, "2.0.5", [path])
    assert out.returncode == 1
    assert "vault.policies is kept in the API and dropped silently" in out.stdout
    assert "reads Consul but the task has no consul block" in out.stdout
    assert run_check(checker, "1.6.1", [path]).returncode == 0


def test_an_unknown_field_and_the_replaced_disconnect_fields_are_caught(checker, tmp_path):
    job = render_job(example_spec("digits"), target=resolve("2.0.5", "test"))
    job["Job"]["VaultToken"] = "x"  # the job's Vault token: a 1.6 field that 1.10 removed
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps(job))
    out = run_check(checker, "2.0.5", [unknown])
    assert out.returncode == 1 and 'unknown field "VaultToken"' in out.stdout, out.stdout
    job = render_job(example_spec("digits"), target=resolve("2.0.5", "test"))
    job["Job"]["TaskGroups"][0].update(MaxClientDisconnect=60 * 10**9, PreventRescheduleOnLost=True)
    old_fields = tmp_path / "old-fields.json"
    old_fields.write_text(json.dumps(job))
    out = run_check(checker, "2.0.5", [old_fields])
    assert out.returncode == 1
    assert "max_client_disconnect is deprecated" in out.stdout and "prevent_reschedule_on_lost" in out.stdout

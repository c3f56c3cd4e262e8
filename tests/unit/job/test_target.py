"""The target Nomad version: parsing, comparing, and what each version's rendering does.

Golden files under golden/nomad-2.0.5/ pin the 2.0.5 rendering of every example (the ones
in golden/ stay the 1.6 rendering, byte for byte). Rewrite them with
    NOMADTF_UPDATE_GOLDEN=1 python -m pytest tests/unit/job/test_target.py
and review the diff.
"""

from __future__ import annotations

import pytest

from nomadtf import wire
from nomadtf.errors import SpecError
from nomadtf.job import target
from nomadtf.job.render import job_json, render_job
from nomadtf.job.spec import load_spec
from nomadtf.job.target import NomadVersion, rendering_for, resolve
from tests.unit.job.test_render import GOLDEN, JOB_EXAMPLES, UPDATE_GOLDEN, example_spec, groups, task

V205 = resolve("2.0.5", "test")
GOLDEN_205 = GOLDEN / "nomad-2.0.5"


# ---- versions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("1.6.1", NomadVersion(1, 6, 1)),
        ("v2.0.5", NomadVersion(2, 0, 5)),
        ("1.10", NomadVersion(1, 10, 0)),
        ("1.11.3+ent", NomadVersion(1, 11, 3)),
        ("1.10.0-beta.1", NomadVersion(1, 10, 0, "beta.1")),
    ],
)
def test_versions_parse_as_nomad_prints_them(text, parsed):
    assert NomadVersion.parse(text) == parsed


def test_versions_compare_numerically_and_a_release_is_newer_than_its_betas():
    assert NomadVersion.parse("1.10.0") > NomadVersion.parse("1.9.7")  # not as strings
    assert NomadVersion.parse("1.10.0-beta.1") < NomadVersion.parse("1.10.0")
    assert NomadVersion.parse("1.10.0-beta.1") > NomadVersion.parse("1.9.9")
    assert str(NomadVersion.parse("v1.10.0-rc.1")) == "1.10.0-rc.1"


@pytest.mark.parametrize("text", ["", "latest", "1", "1.x.2", "2.0.5 "[:-1] + " and more"])
def test_what_is_not_a_version_is_refused_with_an_example(text):
    with pytest.raises(SpecError, match=r"e\.g\. 1\.6\.1"):
        NomadVersion.parse(text)


def test_a_version_older_than_1_6_is_refused():
    with pytest.raises(SpecError, match="1.6.0 and later"):
        resolve("1.5.6", "--nomad-version")


def test_a_newer_version_gets_the_newest_rendering_with_a_note():
    newer = resolve("2.1.0", "server")
    assert newer.version == NomadVersion(2, 1, 0)
    assert newer.rendering_version == target.NEWEST_KNOWN
    assert newer.notes and "newer than 2.0.5" in newer.notes[0] and "(server)" in newer.notes[0]
    assert resolve("2.0.5", "server").notes == ()


# ---- the decisions per version --------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "identity", "token_available", "disconnect", "consul_block"),
    [
        ("1.6.1", False, True, False, False),
        ("1.7.0", True, True, False, False),
        ("1.8.4", True, True, True, False),
        ("1.9.7", True, True, True, False),
        ("1.10.0", True, False, True, True),
        ("1.11.3", True, False, True, True),
        ("2.0.5", True, False, True, True),
    ],
)
def test_each_version_gets_its_own_rendering(version, identity, token_available, disconnect, consul_block):
    r = rendering_for(NomadVersion.parse(version))
    assert (r.vault_identity, r.vault_token_workflow_available, r.disconnect_block, r.consul_block_for_templates) == (
        identity, token_available, disconnect, consul_block
    )


def test_the_token_workflow_on_1_7_to_1_9_only_when_the_job_asks():
    spec = load_spec(JOB_EXAMPLES["secrets"], ["vault.workflow=token"])
    chief = task(render_job(spec, target=resolve("1.9.7", "test")), "chief")
    assert chief["Vault"]["Policies"] == ["nomadtf-digits-read"] and "Role" not in chief["Vault"]
    assert "Identities" not in chief
    with pytest.raises(SpecError, match="vault.workflow: Nomad 2.0.5 has no token workflow"):
        render_job(spec, target=V205)
    with pytest.raises(SpecError, match="need Nomad 1.7.0"):
        render_job(load_spec(JOB_EXAMPLES["secrets"], ["vault.workflow=identity"]), target=resolve("1.6.1", "test"))
    with pytest.raises(SpecError, match="need Nomad 1.7.0"):  # no target: the 1.6 rendering
        render_job(load_spec(JOB_EXAMPLES["secrets"], ["vault.workflow=identity"]))


# ---- what the 2.0.5 rendering holds -------------------------------------------------------


def test_without_a_target_the_job_is_the_1_6_rendering_and_records_no_target():
    job = render_job(example_spec("secrets"))
    assert wire.META_NOMAD_VERSION not in job["Job"]["Meta"]
    assert job_json(job) == (GOLDEN / "secrets.json").read_text()


def test_the_jobs_meta_records_the_target_as_given():
    job = render_job(example_spec("digits"), target=resolve("2.1.0", "server"))
    assert job["Job"]["Meta"][wire.META_NOMAD_VERSION] == "2.1.0"


def test_vault_tasks_log_in_with_their_identity_and_the_jobs_role_not_policies():
    spec = example_spec("secrets")
    job = render_job(spec, target=V205)
    role = wire.acl_name("default", "digits-secrets")
    chief = task(job, "chief")  # under parameter_server only the chief runs the code that reads them
    assert chief["Vault"] == {"Role": role, "Env": False, "DisableFile": False, "ChangeMode": "noop"}
    assert chief["Identities"] == [
        {"Name": "vault_default", "Audience": ["vault.io"], "TTL": 3600 * 10**9, "ChangeMode": "noop", "Env": False, "File": False}
    ]
    for bare in ("worker", "ps"):  # bare TensorFlow servers: no Vault token, no identity for Vault
        assert "Vault" not in task(job, bare) and "Identities" not in task(job, bare)


def test_job_json_names_the_role_when_it_wants_another():
    spec = load_spec(JOB_EXAMPLES["secrets"], ["vault.role=team-ml-training"])
    assert task(render_job(spec, target=V205), "chief")["Vault"]["Role"] == "team-ml-training"


def test_template_mode_asks_for_consul_on_1_10_and_not_before():
    spec = load_spec(JOB_EXAMPLES["digits"], ["discovery.reconfigure=template"])
    for name in ("chief", "worker", "ps"):
        t = task(render_job(spec, target=V205), name)
        assert t["Consul"] == {}
        assert [i["Name"] for i in t["Identities"]] == ["consul_default"]
        assert t["Identities"][0]["Audience"] == ["consul.io"]
        old = task(render_job(spec, target=resolve("1.9.7", "test")), name)
        assert "Consul" not in old and "Identities" not in old
    watch = task(render_job(example_spec("digits"), target=V205), "chief")
    assert "Consul" not in watch  # the spec file's template reads nothing from Consul


def test_groups_get_the_disconnect_block_from_1_8_and_never_the_fields_it_replaced():
    for version, expected, client_stop in (("1.6.1", False, False), ("1.7.7", False, False), ("1.8.0", True, False),
                                           ("1.10.1", True, False), ("1.10.2", True, True), ("2.0.5", True, True)):
        for group in groups(render_job(example_spec("digits"), target=resolve(version, "test"))).values():
            assert ("Disconnect" in group) is expected
            # Never stop_after_client_disconnect: Nomad 1.6.1's client deadlocks on it (the template says how).
            assert not {"MaxClientDisconnect", "StopAfterClientDisconnect", "PreventRescheduleOnLost"} & group.keys()
            if expected:
                stop = {"StopOnClientAfter": 15_000_000_000} if client_stop else {}  # one task session TTL
                assert group["Disconnect"] == {"LostAfter": 0, "Replace": True, "Reconcile": "best_score", **stop}


@pytest.mark.parametrize("name", [*JOB_EXAMPLES, "dcos"])
def test_example_renders_for_2_0_5_as_its_golden_file(name):
    text = job_json(render_job(example_spec(name), target=V205))
    golden = GOLDEN_205 / f"{name}.json"
    if UPDATE_GOLDEN:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing; create it with NOMADTF_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{name} renders for 2.0.5 differently from {golden}; if intended, regenerate it"


def test_vault_policies_on_a_workload_identity_target_are_said_to_go_through_the_jwt_role():
    from nomadtf.job.render import rendering_notes

    spec = example_spec("secrets")  # lists nomadtf-digits-read
    role = wire.acl_name("default", "digits-secrets")
    notes = rendering_notes(spec, V205)
    assert notes == [
        f"vault.policies ['nomadtf-digits-read'] are granted through the JWT role {role} that `nomadtf acl apply` writes; "
        "Nomad >= 1.10 ignores a job's policies"
    ]
    assert rendering_notes(spec, resolve("1.6.1", "test")) == [] and rendering_notes(spec, None) == []  # rendered as Policies
    assert rendering_notes(load_spec(JOB_EXAMPLES["secrets"], ["vault.workflow=token"]), resolve("1.9.7", "test")) == []
    # Only the job's own policy (what the profile or `acl` adds): the role grants it, nothing to say.
    assert rendering_notes(load_spec(JOB_EXAMPLES["secrets"], [f"vault.policies=[\"{role}\"]"]), V205) == []
    other = rendering_notes(load_spec(JOB_EXAMPLES["secrets"], ["vault.role=team-ml"]), V205)
    assert len(other) == 1 and "JWT role team-ml (vault.role)" in other[0] and "not rendered for Nomad 2.0.5" in other[0]
    assert rendering_notes(example_spec("digits"), V205) == []  # no task gets a Vault token

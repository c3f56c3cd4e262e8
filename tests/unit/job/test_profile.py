"""The cluster profile: what it fills into a job, in which order the target is chosen, and
what a Consul that does not answer gives. Its trip through the real Consul KV is
tests/stack/test_profile.py's."""

from __future__ import annotations

import json

import pytest

from nomadtf import wire
from nomadtf.client import cluster_facts
from nomadtf.errors import NomadError, SpecError, UnknownNomadVersion, UnreachableError
from nomadtf.job.options import load_options
from nomadtf.job.profile import ClusterProfile, consul_token_path, fill_job, offline_target, profile_from_file
from nomadtf.job.render import render_job
from nomadtf.job.spec import parse_spec
from nomadtf.job.target import BASELINE, ENV_NOMAD_VERSION, resolve
from tests.unit.job.test_render import JOB_EXAMPLES, task

SECURE = ClusterProfile(
    consul_address="https://127.0.0.1:8501",
    consul_ca_file="/etc/nomadtf/ca.pem",
    vault_address="https://127.0.0.1:8200",
    vault_ca_file="/etc/nomadtf/ca.pem",
    consul_token_source="engine",
    job_vault_policy=True,
    source="test",
)


def test_the_profile_fills_what_job_json_leaves_unset_and_nothing_it_sets():
    spec = parse_spec(fill_job(load_options(JOB_EXAMPLES["secrets"], ["discovery.consul_address=10.0.0.1:8500"]), SECURE, None))
    own = wire.acl_name("default", "digits-secrets")
    assert spec.discovery.consul_address == "10.0.0.1:8500"  # --var wins
    assert spec.discovery.consul_ca_file == "/etc/nomadtf/ca.pem"
    assert spec.discovery.consul_token_path == f"consul/creds/{own}"
    assert spec.vault.address == "https://127.0.0.1:8200" and spec.vault.ca_file == "/etc/nomadtf/ca.pem"
    assert spec.vault.policies == ("nomadtf-digits-read", own)  # job.json's, and the job's own
    chief = task(render_job(spec), "chief")
    assert chief["Env"]["CONSUL_HTTP_ADDR"] == "10.0.0.1:8500" and chief["Env"]["VAULT_CACERT"] == "/etc/nomadtf/ca.pem"
    assert chief["Vault"]["Policies"] == ["nomadtf-digits-read", own]


def test_job_json_overrides_every_setting_of_the_profile():
    raw = {
        "name": "x",
        "discovery": {"consul_address": "a:1", "consul_ca_file": "/a", "consul_token_path": "kv/mine"},
        "vault": {"address": "https://v", "ca_file": "/v", "policies": ["mine"]},
    }
    filled = fill_job(raw, SECURE, None)
    assert filled["discovery"] == raw["discovery"]
    assert filled["vault"] == {**raw["vault"], "policies": ["mine", wire.acl_name("default", "x")]}
    approle = fill_job({"name": "x", "vault": {"auth": "approle", "role": "r"}}, SECURE, None)
    assert "policies" not in approle["vault"]  # nomadtf logs in itself: no Nomad policy to add


def test_without_a_profile_a_job_is_left_as_written_on_1_6_and_gets_its_own_policy_on_1_7():
    raw = {"name": "x", "secrets": [{"path": "secret/a/b", "key": "k", "env": "K"}]}
    assert fill_job(raw, None, None) == raw
    assert fill_job(raw, None, resolve("1.6.1", "test")) == raw
    assert fill_job(raw, None, resolve("2.0.5", "test"))["vault"]["policies"] == [wire.acl_name("default", "x")]
    assert "policies" not in fill_job({**raw, "vault": {"workflow": "token"}}, None, resolve("1.9.0", "test"))["vault"]


def test_the_token_sources_follow_acl_applys_convention():
    assert consul_token_path("engine", "ml", "train") == f"consul/creds/{wire.acl_name('ml', 'train')}"
    assert consul_token_path("kv", "ml", "train") == "secret/nomadtf/consul-tokens/ml/train"


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"consul_adress": "x"}, "did you mean 'consul_address'"),
        ({"consul_token_source": "vault"}, "consul_token_source must be one of engine, kv"),
        ({"vault_ca_file": ""}, "vault_ca_file must be a non-empty string"),
        ({"job_vault_policy": "yes"}, "job_vault_policy must be a boolean"),
        ([], "must be a JSON object"),
        ({"nomad_version": "two"}, "write it as Nomad prints it"),
    ],
)
def test_a_broken_profile_is_refused_naming_the_field(data, problem):
    with pytest.raises(SpecError, match=problem):
        ClusterProfile.from_json(data, "test")


def test_a_profile_survives_its_own_json():
    assert ClusterProfile.from_json(SECURE.to_json(), "again") == ClusterProfile(**{**SECURE.__dict__, "source": "again"})


def test_the_offline_target_comes_from_the_flag_then_the_environment_then_the_profile(tmp_path):
    profile = ClusterProfile(nomad_version="1.11.3", source="p")
    assert str(offline_target("2.0.5", profile, {ENV_NOMAD_VERSION: "1.8.0"}).version) == "2.0.5"
    assert str(offline_target(None, profile, {ENV_NOMAD_VERSION: "1.8.0"}).version) == "1.8.0"
    assert str(offline_target(None, profile, {}).version) == "1.11.3"
    assert offline_target(None, None, {}) is None
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"nomad_version": "2.0.5"}))
    facts = cluster_facts.offline(None, {"NOMADTF_CLUSTER_PROFILE": str(path)})
    assert facts.profile == profile_from_file({"NOMADTF_CLUSTER_PROFILE": str(path)})
    assert str(facts.target.version) == "2.0.5" and facts.target.source == f"cluster profile {path}"


class _FakeNomad:
    """NomadAPI's agent_version and server_versions, answering or refusing as a server would."""

    address = "http://127.0.0.1:1"

    def __init__(self, answer, members=()):
        self.answer = answer
        self.members = members
        self.asked_members = False

    def agent_version(self):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def server_versions(self):
        self.asked_members = True
        if isinstance(self.members, Exception):
            raise self.members
        return list(self.members)


def test_the_server_says_the_target_and_a_refusal_falls_back_with_a_note():
    found, notes = cluster_facts.server_target(_FakeNomad("2.0.5"), None, {})
    assert str(found.version) == "2.0.5" and notes == []
    newer, notes = cluster_facts.server_target(_FakeNomad("2.2.0"), None, {})
    assert newer.rendering_version == resolve("2.0.5", "t").version and "newer than 2.0.5" in notes[0]
    refused = UnreachableError("cannot reach Nomad")
    found, notes = cluster_facts.server_target(_FakeNomad(refused), ClusterProfile(nomad_version="1.11.3", source="p"), {})
    assert str(found.version) == "1.11.3" and "cannot reach Nomad" in notes[0]
    found, notes = cluster_facts.server_target(_FakeNomad(refused), None, {})
    assert found.version == BASELINE and ENV_NOMAD_VERSION in notes[0] and "node:read" in notes[0]
    assert not found.assumed  # nothing can be submitted to a Nomad that does not answer: no refusal for it


def _denied(what: str, needs: str) -> NomadError:
    """What nomad.nomad_error makes of a 403."""
    return NomadError(f"Nomad refused {what} (403 Permission denied): NOMAD_TOKEN lacks the {needs} capability in namespace 'default'", 403)


AGENT_READ_DENIED = _denied("reading the agent's version", "agent:read")


def test_a_token_without_agent_read_gets_the_version_from_the_servers_gossip_tags():
    nomad = _FakeNomad(AGENT_READ_DENIED, members=["1.6.1", "1.6.1", "1.6.1"])
    found, notes = cluster_facts.server_target(nomad, None, {ENV_NOMAD_VERSION: "2.0.5"})
    assert str(found.version) == "1.6.1" and "/v1/agent/members" in found.source and notes == [] and not found.assumed
    # An upgrade in progress: the oldest server decides (Nomad turns a feature on once all have it).
    found, notes = cluster_facts.server_target(_FakeNomad(AGENT_READ_DENIED, ["1.10.2", "1.9.7", "1.10.2"]), None, {})
    assert str(found.version) == "1.9.7" and notes == ["Nomad's servers run 1.9.7, 1.10.2; rendering for the oldest, 1.9.7"]
    # Nomad that does not answer is not asked twice.
    unreachable = _FakeNomad(UnreachableError("cannot reach Nomad"), members=["2.0.5"])
    assert cluster_facts.server_target(unreachable, None, {})[0].version == BASELINE and not unreachable.asked_members


def test_a_version_nobody_said_refuses_a_job_whose_tasks_get_vault_tokens_and_names_the_fix():
    members_denied = _denied("reading the servers' versions", "node:read")
    found, notes = cluster_facts.server_target(_FakeNomad(AGENT_READ_DENIED, members_denied), None, {})
    facts = cluster_facts.ClusterFacts(found, None, notes)
    assert facts.target.assumed and "lacks the agent:read" in facts.target.unread and "lacks the node:read" in facts.target.unread
    secrets = parse_spec(fill_job(load_options(JOB_EXAMPLES["secrets"], []), None, facts.target))
    with pytest.raises(UnknownNomadVersion) as refused:
        facts.require_target_for(secrets)
    message = str(refused.value)
    assert refused.value.exit_code == 2 and "lacks the agent:read" in message and "Vault token" in message
    for fix in (ENV_NOMAD_VERSION, "--nomad-version", "nomad_version", "node:read"):
        assert fix in message, fix
    facts.require_target_for(parse_spec(load_options(JOB_EXAMPLES["digits"], [])))  # renders alike everywhere: a note only
    with pytest.raises(UnknownNomadVersion, match="template mode"):
        facts.require_target_for(parse_spec(load_options(JOB_EXAMPLES["digits"], ["discovery.reconfigure=template"])))
    # A version someone said is never refused.
    said = cluster_facts.ClusterFacts(resolve("1.6.1", "NOMADTF_NOMAD_VERSION"), None)
    said.require_target_for(secrets)


def test_a_consul_that_does_not_answer_gives_no_profile_and_a_note(monkeypatch):
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "127.0.0.1:1")
    monkeypatch.delenv("NOMADTF_CLUSTER_PROFILE", raising=False)
    profile, notes = cluster_facts.read_profile()
    assert profile is None and "cannot reach Consul" in notes[0]


def test_the_profile_keeps_the_operator_s_vault_policy_allowlist_and_refuses_anything_but_names():
    profile = ClusterProfile.from_json({"vault_policy_allowlist": ["team-a-datasets"]}, "test")
    assert profile.vault_policy_allowlist == ("team-a-datasets",)
    assert profile.to_json() == {"vault_policy_allowlist": ["team-a-datasets"]}
    for bad in ("team-a-datasets", [""], [1]):
        with pytest.raises(SpecError, match="vault_policy_allowlist must be a list of Vault policy names"):
            ClusterProfile.from_json({"vault_policy_allowlist": bad}, "test")


def test_the_operator_s_code_users_decide_who_the_code_runs_as_and_a_job_cannot_pick_another_team_s_uid():
    profile = ClusterProfile(code_users={"team-a": "10001:10001", "team-b": "10002:10002"}, source="test")
    raw = {"name": "j", "namespace": "team-a", "driver": {"name": "docker", "image": "i", "code_user": "10002:10002"}}
    assert fill_job(raw, profile, None)["driver"]["code_user"] == "10001:10001"  # team-b's uid asked for: team-a's given
    other = {**raw, "namespace": "team-c"}
    assert "code_user" not in fill_job(other, profile, None)["driver"]  # not in the map: the driver's default (nobody)
    anyone = ClusterProfile(code_users={"*": "65534:65534"}, source="test")
    assert fill_job(other, anyone, None)["driver"]["code_user"] == "65534:65534"
    assert fill_job(raw, None, None)["driver"]["code_user"] == "10002:10002"  # no map: job.json's own
    with pytest.raises(SpecError, match='code_users must map namespaces'):
        ClusterProfile.from_json({"code_users": {"team-a": "root"}}, "test")

"""The admission controller's own Nomad service job (nomadtf/admission/deploy.py): where its
replicas go, how they get their tokens (never written into the job), what of the deployer's
environment they are given. Pure, with a stand-in for the Nomad API."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import nomadtf
from nomadtf import wire
from nomadtf.admission import deploy as deploy_mod
from nomadtf.admission.deploy import SERVICE_TOKENS_VAR, service_env, service_job
from nomadtf.errors import SpecError
from nomadtf.job.answers import JobWrite, Node

SECRETS = {"NOMAD_TOKEN": "nomad-secret-1f2e", "CONSUL_HTTP_TOKEN": "consul-secret-9a8b", "VAULT_TOKEN": "vault-secret-7c6d"}
ADDRESSES = {"NOMAD_ADDR": "https://nomad.example:4646", "CONSUL_HTTP_ADDR": "https://consul.example:8501", "NOMAD_CACERT": "/etc/ca.pem"}


def _group(job: dict) -> dict:
    (group,) = job["Job"]["TaskGroups"]
    return group


def test_the_job_is_a_nomadtf_service_running_admission_serve():
    job = service_job(2, python="/opt/venv/bin/python", env=ADDRESSES, namespace="ops", datacenters=("dc1",))
    inner = job["Job"]
    assert (inner["ID"], inner["Type"], inner["Namespace"], inner["Datacenters"]) == (wire.ADMISSION_SERVICE_JOB, "service", "ops", ["dc1"])
    assert inner["Meta"] == {wire.META_SERVICE: "admission"}
    (task,) = _group(job)["Tasks"]
    assert task["Config"] == {"command": "/opt/venv/bin/python", "args": [
        "-m", "nomadtf", "admission", "serve", "--metrics-port", "${NOMAD_PORT_metrics}", "--metrics-address", "${NOMAD_IP_metrics}"]}  # fmt: skip
    assert task["Env"] == ADDRESSES and _group(job)["Count"] == 2
    # Each replica's metrics port, in Nomad's own service catalogue (no Consul rights needed).
    assert _group(job)["Networks"] == [{"DynamicPorts": [{"Label": "metrics"}]}]
    assert _group(job)["Services"] == [{"Name": "nomadtf-admission", "PortLabel": "metrics", "Provider": "nomad", "Tags": ["metrics"]}]


def test_replicas_are_kept_on_distinct_hosts_when_there_are_enough_clients():
    group = _group(service_job(2, python="/p", clients=3))
    assert group["Constraints"] == [{"Operand": "distinct_hosts", "RTarget": "true"}]
    assert "Spreads" not in group
    assert _group(service_job(3, python="/p", clients=3))["Constraints"][0]["Operand"] == "distinct_hosts"


@pytest.mark.parametrize("clients", [0, 1, 2])
def test_replicas_are_only_spread_when_the_clients_are_fewer_or_unknown(clients):
    group = _group(service_job(3, python="/p", clients=clients))
    assert group["Spreads"] == [{"Attribute": "${node.unique.id}", "Weight": 100}]
    assert "Constraints" not in group  # a hard constraint would leave a replica unplaced


def test_one_replica_needs_neither_constraint_nor_spread():
    group = _group(service_job(1, python="/p", clients=5))
    assert "Constraints" not in group and "Spreads" not in group


def test_with_tokens_the_replicas_read_them_from_their_job_s_own_variable():
    (task,) = _group(service_job(2, python="/p", tokens=True))["Tasks"]
    (template,) = task["Templates"]
    assert SERVICE_TOKENS_VAR == "nomad/jobs/nomadtf-admission"
    assert 'nomadVar "nomad/jobs/nomadtf-admission"' in template["EmbeddedTmpl"]
    assert "NOMAD_TOKEN={{ .nomad_token }}" in template["EmbeddedTmpl"] and "CONSUL_HTTP_TOKEN={{ .consul_token }}" in template["EmbeddedTmpl"]
    assert template["Envvars"] is True and template["DestPath"].startswith("secrets/")


def test_without_tokens_there_is_no_template():
    (task,) = _group(service_job(2, python="/p"))["Tasks"]
    assert "Templates" not in task


def test_no_token_value_is_ever_written_into_the_job():
    environ = {**ADDRESSES, **SECRETS}
    for tokens in (False, True):
        text = json.dumps(service_job(2, python="/p", env=service_env(environ), tokens=tokens))
        assert not [name for name, secret in SECRETS.items() if secret in text], tokens


def test_without_a_python_the_job_runs_this_interpreter_with_this_checkout_on_its_path():
    (task,) = _group(service_job(2))["Tasks"]
    assert task["Config"]["command"] == sys.executable
    assert task["Env"]["PYTHONPATH"] == str(Path(nomadtf.__file__).resolve().parent.parent)
    (given,) = _group(service_job(2, python="/opt/venv/bin/python"))["Tasks"]
    assert "PYTHONPATH" not in given["Env"]


def test_service_env_keeps_only_the_addresses():
    environ = {**ADDRESSES, **SECRETS, "CONSUL_HTTP_SSL": "true", "NOMAD_REGION": "eu", "NOMAD_TLS_SERVER_NAME": "server.eu.nomad",
               "CONSUL_CACERT": "/etc/consul-ca.pem", "HOME": "/root", "NOMAD_NAMESPACE": "team-a", "NOMAD_CLIENT_KEY": "/k.pem"}  # fmt: skip
    assert service_env(environ) == {**ADDRESSES, "CONSUL_HTTP_SSL": "true", "NOMAD_REGION": "eu", "NOMAD_TLS_SERVER_NAME": "server.eu.nomad",
                                    "CONSUL_CACERT": "/etc/consul-ca.pem"}  # fmt: skip


def test_service_env_leaves_out_empty_values():
    assert service_env({"NOMAD_ADDR": "", "CONSUL_HTTP_ADDR": "http://c:8500"}) == {"CONSUL_HTTP_ADDR": "http://c:8500"}


# ---- deploy, against a stand-in Nomad ------------------------------------------------------


class FakeNomad:
    namespace = "ops"

    def __init__(self, ready_nodes: int):
        self.ready_nodes = ready_nodes
        self.variables: dict[str, dict] = {}
        self.registered: list[dict] = []

    def nodes(self) -> list[Node]:
        return [Node(f"n{i}", f"n{i}", "dc1", status="ready") for i in range(self.ready_nodes)]

    def put_variable(self, path: str, items: dict) -> None:
        self.variables[path] = items

    def register(self, job: dict) -> JobWrite:
        self.registered.append(job)
        return JobWrite("0123456789abcdef")


CONTROLLER_TOKENS = {deploy_mod.CONTROLLER_TOKEN_ENV["nomad_token"]: "controller-nomad-5e4d", deploy_mod.CONTROLLER_TOKEN_ENV["consul_token"]: "controller-consul-3c2b"}


def test_deploy_with_tokens_writes_the_controller_s_own_to_the_variable_and_none_into_the_job():
    api = FakeNomad(ready_nodes=2)
    deploy_mod.deploy(api, 2, "/p", tokens=True, environ={**ADDRESSES, **SECRETS, **CONTROLLER_TOKENS})
    assert api.variables == {SERVICE_TOKENS_VAR: {"nomad_token": "controller-nomad-5e4d", "consul_token": "controller-consul-3c2b"}}
    (job,) = api.registered
    text = json.dumps(job)
    assert not [secret for secret in (*SECRETS.values(), *CONTROLLER_TOKENS.values()) if secret in text]
    assert job["Job"]["Namespace"] == "ops" and _group(job)["Constraints"][0]["Operand"] == "distinct_hosts"  # 2 clients counted


def test_deploy_with_tokens_never_hands_the_replicas_the_operator_s_tokens():
    api = FakeNomad(ready_nodes=1)
    with pytest.raises(SpecError) as err:
        deploy_mod.deploy(api, 2, "/p", tokens=True, environ={**ADDRESSES, **SECRETS})  # only the operator's own
    assert all(name in str(err.value) for name in CONTROLLER_TOKENS)
    assert api.registered == [] and api.variables == {}


def test_deploy_with_one_controller_token_missing_registers_nothing():
    api = FakeNomad(ready_nodes=2)
    nomad_only = {deploy_mod.CONTROLLER_TOKEN_ENV["nomad_token"]: "x"}
    with pytest.raises(SpecError, match=deploy_mod.CONTROLLER_TOKEN_ENV["consul_token"]):
        deploy_mod.deploy(api, 2, "/p", tokens=True, environ={**ADDRESSES, **nomad_only})
    assert api.registered == [] and api.variables == {}


def test_deploy_without_tokens_writes_no_variable():
    api = FakeNomad(ready_nodes=0)
    deploy_mod.deploy(api, 2, "/p", environ={**ADDRESSES, **SECRETS, **CONTROLLER_TOKENS})
    (job,) = api.registered
    assert api.variables == {} and _group(job)["Spreads"]  # no client counted: spread, not bound apart


def test_a_node_pool_keeps_the_replicas_on_the_operator_s_clients():
    assert service_job(node_pool="ops")["Job"]["NodePool"] == "ops"
    assert "NodePool" not in service_job()["Job"]  # Nomad's default pool

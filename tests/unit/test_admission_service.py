"""The admission service's Nomad job (admission_service.service_job): where its replicas go,
and how they get tokens on a cluster with ACLs. Registering and running it are tested on
the real stacks (tests/stack/test_queueing.py, tests/stack/test_secure.py)."""

from __future__ import annotations

from nomadtf.admission_service import SERVICE_TOKENS_VAR, service_env, service_job


def group(**kwargs) -> dict:
    return service_job(python="/usr/bin/python3", **kwargs)["Job"]["TaskGroups"][0]


def test_replicas_are_kept_on_different_clients_when_there_are_enough():
    assert group(count=2, clients=3)["Constraints"] == [{"Operand": "distinct_hosts", "RTarget": "true"}]
    assert group(count=3, clients=3)["Constraints"][0]["Operand"] == "distinct_hosts"


def test_with_fewer_clients_than_replicas_they_are_spread_not_bound_so_every_one_places():
    for clients in (0, 1, 2):  # 0: the deployer could not count them
        placed = group(count=3, clients=clients)
        assert "Constraints" not in placed, clients
        assert placed["Spreads"] == [{"Attribute": "${node.unique.id}", "Weight": 100}]
    assert "Constraints" not in group(count=1, clients=3) and "Spreads" not in group(count=1, clients=3)


def test_tokens_come_from_the_job_s_own_variable_never_from_the_job():
    task = group(count=2, clients=3, tokens=True, env={"NOMAD_ADDR": "https://10.0.0.1:4646"})["Tasks"][0]
    (template,) = task["Templates"]
    assert f'nomadVar "{SERVICE_TOKENS_VAR}"' in template["EmbeddedTmpl"] and template["Envvars"] is True
    assert "NOMAD_TOKEN={{ .nomad_token }}" in template["EmbeddedTmpl"] and "CONSUL_HTTP_TOKEN={{ .consul_token }}" in template["EmbeddedTmpl"]
    assert SERVICE_TOKENS_VAR == "nomad/jobs/nomadtf-admission"  # the path a job's tasks may read
    assert "NOMAD_TOKEN" not in task["Env"] and "Templates" not in group(count=2)["Tasks"][0]


def test_the_deployer_s_addresses_travel_its_tokens_do_not():
    env = service_env({"NOMAD_ADDR": "https://s:4646", "NOMAD_TOKEN": "secret", "CONSUL_HTTP_TOKEN": "secret", "CONSUL_CACERT": "/ca.pem"})
    assert env == {"NOMAD_ADDR": "https://s:4646", "CONSUL_CACERT": "/ca.pem"}

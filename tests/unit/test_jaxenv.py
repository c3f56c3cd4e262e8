"""Strategy "jax": members -> what Keras 3 and JAX read (nomadtf.jaxenv, pure), and the role table."""

from __future__ import annotations

import pytest

from nomadtf import jaxenv, roles
from nomadtf.tfconfig import Member

# Registered out of order, with an evaluator: the processes are the workers, by index.
MEMBERS = [Member("worker", 2, "10.0.0.3:303"), Member("evaluator", 0, "10.0.0.9:909"),
           Member("worker", 0, "10.0.0.1:101"), Member("worker", 1, "10.0.0.2:202")]
COUNTS = {"worker": 3, "evaluator": 1}


def test_the_processes_are_the_workers_in_index_order():
    assert jaxenv.process_addresses("jax", COUNTS, MEMBERS) == ["10.0.0.1:101", "10.0.0.2:202", "10.0.0.3:303"]


def test_each_process_gets_every_address_the_coordinator_and_its_own_id():
    addresses = jaxenv.process_addresses("jax", COUNTS, MEMBERS)
    for i in range(3):
        assert jaxenv.process_env(addresses, i) == {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:101,10.0.0.2:202,10.0.0.3:303",
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "3",
            "KERAS_DISTRIBUTION_PROCESS_ID": str(i),
            "JAX_COORDINATOR_ADDRESS": "10.0.0.1:101",  # worker 0's: what Keras takes as the coordinator
            "JAX_NUM_PROCESSES": "3",
            "JAX_PROCESS_ID": str(i),
        }


def test_a_missing_worker_or_an_id_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"worker\[1\]"):
        jaxenv.process_addresses("jax", COUNTS, [m for m in MEMBERS if m.index != 1])
    with pytest.raises(ValueError, match="process 3 is not one of 3"):
        jaxenv.process_env(["a:1", "b:2", "c:3"], 3)


def test_the_backend_and_cpu_collectives_unless_the_job_chose_its_own():
    assert jaxenv.waiting_env({}) == {"KERAS_BACKEND": "jax", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    assert jaxenv.waiting_env({"JAX_CPU_COLLECTIVES_IMPLEMENTATION": "mpi"})["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "mpi"


def test_render_shows_every_process_with_placeholders():
    envs = jaxenv.all_process_envs("j", "jax", {"worker": 2})
    assert sorted(envs) == ["worker[0]", "worker[1]"]
    assert envs["worker[1]"]["JAX_COORDINATOR_ADDRESS"] == "<j-worker[0] address>:<port>"
    assert envs["worker[1]"]["KERAS_DISTRIBUTION_PROCESS_ID"] == "1"


def test_the_jax_strategy_has_workers_only_and_no_tf_config():
    assert {"worker", "evaluator", "tensorboard"} <= roles.allowed_roles("jax")
    assert not {"chief", "ps"} & roles.allowed_roles("jax")
    assert roles.required_roles("jax") == {"worker"}
    assert roles.cluster_roles("jax") == ("worker",)
    assert "worker" in roles.rendezvous_roles("jax", "worker")
    assert not roles.uses_tf_config("jax")
    assert all(roles.uses_tf_config(s) for s in roles.STRATEGIES if s != "jax")
    # No chief: worker 0 decides the outcome, or every worker under all_workers.
    assert roles.completes_job("jax", "worker", 0, {"worker": 2})
    assert not roles.completes_job("jax", "worker", 1, {"worker": 2})
    assert roles.completes_job("jax", "worker", 1, {"worker": 2}, "all_workers")

"""What the child runs and the environment it gets (nomadtf.runtime.launch, pure)."""

from __future__ import annotations

import json

from nomadtf.job.spec import JobSpec
from nomadtf.job.validate import normalize
from nomadtf.runtime import launch
from nomadtf.tfconfig import Member

SPEC = JobSpec.from_normalized({
    **normalize({"name": "j", "entrypoint": {"module": "trainer.main", "args": ["--x"], "pythonpath": ["/code"]},
                 "roles": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}}, "context": {"lr": 0.1}}),
    "run": {"id": "r1", "submitted_at": 1.0},
})
MEMBERS = [Member("chief", 0, "h:1", "a/1"), Member("worker", 0, "h:2", "b/1"), Member("ps", 0, "h:3", "c/1")]
TASK_ENV = {
    "PATH": "/bin", "VAULT_TOKEN": "hvs.secret", "NOMAD_TOKEN": "n", "CONSUL_HTTP_TOKEN": "c",
    "NOMADTF_VAULT_ROLE_ID": "role", "NOMADTF_VAULT_SECRET_ID": "sid", "NOMADTF_SPEC_FILE": "/x", "PYTHONPATH": "/lib",
}


def test_the_child_gets_tf_config_and_names_but_no_credential():
    env = launch.child_env(SPEC, "chief", 0, MEMBERS, 3, TASK_ENV, "/t/p.json", {"API_KEY": "from-vault"})
    for dropped in ("VAULT_TOKEN", "NOMAD_TOKEN", "CONSUL_HTTP_TOKEN", "NOMADTF_VAULT_ROLE_ID", "NOMADTF_VAULT_SECRET_ID", "NOMADTF_SPEC_FILE"):
        assert dropped not in env
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}, "task": {"type": "chief", "index": 0}}
    assert env["NOMADTF_RUN_ID"] == "r1" and env["NOMADTF_GENERATION"] == "3" and env["NOMADTF_INDEX"] == "0"
    assert json.loads(env["NOMADTF_CONTEXT"]) == {"lr": 0.1}
    assert env["PYTHONPATH"] == "/code:/lib" and env["API_KEY"] == "from-vault" and env["PATH"] == "/bin"


def test_who_runs_what():
    assert launch.child_argv(SPEC, "chief", 9, python="py") == ["py", "-u", "-m", "trainer.main", "--x"]
    assert launch.child_argv(SPEC, "worker", 9, python="py") == ["py", "-m", "nomadtf.usercode.tfserver", "server"]
    assert launch.child_argv(SPEC, "tensorboard", 9, python="py")[:3] == ["py", "-m", "tensorboard.main"]
    # TensorBoard listens on the task's own address, not on every interface of the node.
    assert launch.child_argv(SPEC, "tensorboard", 9, python="py", host="10.1.2.3")[-2:] == ["--host", "10.1.2.3"]
    assert launch.child_argv(SPEC, "tensorboard", 9, python="py")[-1] == "--bind_all"
    env = launch.child_env(SPEC, "tensorboard", 0, [], 1, {}, "/p", {})
    assert "TF_CONFIG" not in env


def test_the_vault_token_reaches_the_code_only_when_the_job_asks_for_it():
    asked = JobSpec.from_normalized({
        **normalize({"name": "j", "entrypoint": {"script": "t.py"}, "roles": {"worker": {"count": 1}},
                     "strategy": "multi_worker_mirrored", "vault": {"token_for_code": True}}),
    })
    members = [Member("worker", 0, "h:2", "b/1")]
    env = launch.child_env(asked, "worker", 0, members, 1, TASK_ENV, "/t/p.json", {})
    assert env["VAULT_TOKEN"] == "hvs.secret"
    assert "CONSUL_HTTP_TOKEN" not in env and "NOMADTF_VAULT_SECRET_ID" not in env  # never these


JAX_SPEC = JobSpec.from_normalized({
    **normalize({"name": "j", "strategy": "jax", "entrypoint": {"script": "train.py"},
                 "roles": {"worker": {"count": 2}, "evaluator": {"count": 1}, "tensorboard": {"count": 1}}}),
    "run": {"id": "r1", "submitted_at": 1.0},
})
JAX_MEMBERS = [Member("worker", 1, "h:2", "b/1"), Member("worker", 0, "h:1", "a/1"), Member("evaluator", 0, "h:3", "c/1")]


def test_under_jax_each_worker_is_a_jax_process_and_gets_no_tf_config():
    for index in (0, 1):
        env = launch.child_env(JAX_SPEC, "worker", index, JAX_MEMBERS, 2, TASK_ENV, "/t/p.json", {"API_KEY": "k"})
        assert "TF_CONFIG" not in env and "VAULT_TOKEN" not in env
        assert env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "h:1,h:2" and env["JAX_COORDINATOR_ADDRESS"] == "h:1"
        assert env["KERAS_DISTRIBUTION_PROCESS_ID"] == env["JAX_PROCESS_ID"] == str(index)
        assert env["KERAS_DISTRIBUTION_NUM_PROCESSES"] == env["JAX_NUM_PROCESSES"] == "2"
        assert env["KERAS_BACKEND"] == "jax" and env["NOMADTF_GENERATION"] == "2" and env["API_KEY"] == "k"
    assert launch.child_argv(JAX_SPEC, "worker", 9, python="py") == ["py", "-u", "train.py"]


def test_under_jax_the_side_roles_are_no_process_of_its_computation():
    for role in ("evaluator", "tensorboard"):
        env = launch.child_env(JAX_SPEC, role, 0, JAX_MEMBERS, 1, {}, "/p", {})
        assert env["KERAS_BACKEND"] == "jax"
        assert not {"TF_CONFIG", "KERAS_DISTRIBUTION_JOB_ADDRESSES", "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_ID"} & set(env)
    # A child started ahead of the cluster already has the backend (nothing that depends on the cluster).
    waiting = launch.waiting_env(JAX_SPEC, "worker", 0, {}, "/p")
    assert waiting["KERAS_BACKEND"] == "jax" and "KERAS_DISTRIBUTION_PROCESS_ID" not in waiting

"""The tf.data service roles (issue #34 item 1), their pure pieces: the role table, who waits
for whom, what restarts, the children's argv and env, job.json's checks, the rendered
groups; and the servers themselves (nomadtf.usercode.dataservice) as real local processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nomadtf import roles, tfconfig, wire
from nomadtf.errors import SpecError
from nomadtf.job.render import render_job
from nomadtf.job.spec import JobSpec, parse_spec
from nomadtf.job.validate import normalize
from nomadtf.runtime import launch, policy
from nomadtf.tfconfig import Member
from nomadtf.usercode import dataservice

ROOT = Path(__file__).resolve().parents[2]
DATA_ROLES = {"data_dispatcher": {"count": 1}, "data_worker": {"count": 2}}


def spec(strategy: str = "multi_worker_mirrored", **extra_roles) -> JobSpec:
    base = {"multi_worker_mirrored": {"worker": {"count": 2}},
            "parameter_server": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}}}[strategy]
    document = normalize({"name": "j", "strategy": strategy, "entrypoint": {"script": "t.py"}, "model_dir": "/m/j/r1",
                          "roles": {**base, **DATA_ROLES, **extra_roles}})
    return JobSpec.from_normalized({**document, "run": {"id": "r1", "submitted_at": 1.0}})


MEMBERS = [Member("worker", 0, "h:1", "a/1"), Member("worker", 1, "h:2", "b/1"), Member("data_dispatcher", 0, "d:7", "c/1"),
           Member("data_worker", 0, "w:8", "e/1"), Member("data_worker", 1, "w:9", "f/1")]


def test_jax_may_not_add_the_data_roles_a_tf_data_service_feeds_tensorflow():
    assert not set(roles.DATA_ROLES) & roles.allowed_roles("jax")
    data = {"name": "j", "strategy": "jax", "entrypoint": {"script": "t.py"},
            "roles": {"worker": {"count": 2}, "data_dispatcher": {"count": 1}, "data_worker": {"count": 1}}}
    with pytest.raises(SpecError, match="roles.data_dispatcher: strategy 'jax' has no data_dispatcher role"):
        parse_spec(data)


@pytest.mark.parametrize("strategy", [s for s in roles.STRATEGIES if s not in roles.JAX_STRATEGIES])
def test_every_tensorflow_strategy_may_add_the_data_roles_as_side_roles_outside_tf_config(strategy):
    assert set(roles.DATA_ROLES) <= roles.allowed_roles(strategy)
    assert not set(roles.DATA_ROLES) & roles.required_roles(strategy)
    for role in roles.DATA_ROLES:
        assert roles.is_soft(role) and not roles.runs_user_code(strategy, role) and role not in roles.cluster_roles(strategy)
    assert "data_dispatcher" in roles.SINGLETON_ROLES and "data_worker" not in roles.SINGLETON_ROLES


def test_the_code_and_the_data_workers_wait_for_the_dispatcher_and_nobody_for_the_data_workers():
    assert roles.rendezvous_roles("multi_worker_mirrored", "worker") == ("chief", "worker", "data_dispatcher")
    assert roles.rendezvous_roles("parameter_server", "chief") == ("chief", "worker", "ps", "data_dispatcher")
    assert roles.rendezvous_roles("parameter_server", "ps") == ("chief", "worker", "ps")  # a bare server reads nothing
    assert roles.rendezvous_roles("multi_worker_mirrored", "data_worker") == ("data_dispatcher",)
    assert roles.rendezvous_roles("multi_worker_mirrored", "data_dispatcher") == ()
    assert not any("data_worker" in roles.rendezvous_roles(s, r) for s in roles.STRATEGIES for r in roles.TABLE[s])
    # A job without a dispatcher waits for none: missing counts only the roles it has.
    assert tfconfig.missing_members({"worker": 1}, [Member("worker", 0, "h:1")], roles.rendezvous_roles("multi_worker_mirrored", "worker")) == []
    s = spec()
    assert tfconfig.missing_members(s.counts, MEMBERS[:2], roles.rendezvous_roles(s.strategy, "worker")) == ["data_dispatcher[0]"]


def test_only_a_dispatcher_that_moved_restarts_the_code_and_the_data_workers():
    moved = [*MEMBERS[:2], Member("data_dispatcher", 0, "elsewhere:7", "z/1"), *MEMBERS[3:]]
    restarted = [*MEMBERS[:2], Member("data_dispatcher", 0, "d:7", "c/2"), *MEMBERS[3:]]
    data_worker_gone = [m for m in MEMBERS if (m.role, m.index) != ("data_worker", 1)]
    data_worker_moved = [*MEMBERS[:4], Member("data_worker", 1, "v:9", "g/1")]
    for role, index in (("worker", 0), ("data_worker", 0)):
        assert policy.must_restart("multi_worker_mirrored", role, index, MEMBERS, moved)
        # Restarted in place: the same address, its journal read back; nobody restarts.
        assert not policy.must_restart("multi_worker_mirrored", role, index, MEMBERS, restarted)
    for after in (data_worker_gone, data_worker_moved):
        assert not policy.must_restart("multi_worker_mirrored", "worker", 0, MEMBERS, after)
    assert not policy.must_restart("parameter_server", "ps", 0, MEMBERS, moved)


def test_the_servers_argv_port_journal_and_advertised_address():
    s = spec()
    assert launch.child_argv(s, "data_dispatcher", 7001, python="py", host="10.0.0.5") == [
        "py", "-m", "nomadtf.usercode.dataservice", "dispatcher", "--port", "7001", "--work-dir", "/m/j/r1/data_service"]
    assert launch.child_argv(s, "data_worker", 7002, python="py", host="10.0.0.6") == [
        "py", "-m", "nomadtf.usercode.dataservice", "worker", "--port", "7002", "--address", "10.0.0.6:7002"]


def test_the_dispatchers_address_reaches_the_code_and_the_data_workers_but_no_tf_config_the_data_roles():
    s = spec()
    for role, index in (("worker", 1), ("data_worker", 0)):
        env = launch.child_env(s, role, index, MEMBERS, 2, {"PATH": "/bin"}, "/p", {})
        assert env[wire.ENV_DATA_SERVICE] == "grpc://d:7"
    assert "TF_CONFIG" in launch.child_env(s, "worker", 1, MEMBERS, 2, {}, "/p", {})
    for role in roles.DATA_ROLES:
        assert "TF_CONFIG" not in launch.child_env(s, role, 0, MEMBERS, 2, {}, "/p", {})
    assert wire.ENV_DATA_SERVICE not in launch.child_env(s, "data_dispatcher", 0, MEMBERS, 2, {}, "/p", {})
    assert launch.data_service_env("parameter_server", "ps", MEMBERS) == {}  # a bare server reads no data
    assert launch.data_service_env("multi_worker_mirrored", "worker", MEMBERS[:2]) == {}  # no dispatcher, no name
    # `nomadtf render --tf-config` lists the TensorFlow tasks only.
    assert set(tfconfig.all_tf_configs("j", s.strategy, s.counts)) == {"worker[0]", "worker[1]"}


@pytest.mark.parametrize(("roles_", "field"), [
    ({"data_worker": {"count": 2}}, "roles.data_worker: data workers register with a dispatcher; add roles.data_dispatcher"),
    ({"data_dispatcher": {"count": 1}}, "roles.data_dispatcher: a dispatcher without data workers serves no data; add roles.data_worker"),
    ({"data_dispatcher": {"count": 2}, "data_worker": {"count": 1}}, "roles.data_dispatcher.count: at most one data_dispatcher per job, got 2"),
])
def test_an_incomplete_data_service_is_refused_naming_the_field_and_the_fix(roles_, field):
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "j", "strategy": "multi_worker_mirrored", "entrypoint": {"script": "t.py"}, "roles": {"worker": {"count": 1}, **roles_}})
    assert field in str(err.value)


def test_the_data_roles_render_as_groups_with_services_nomad_accepts():
    job = render_job(spec())["Job"]
    groups = {g["Name"]: g for g in job["TaskGroups"]}
    assert [(g["Name"], g["Count"]) for g in job["TaskGroups"]] == [("worker", 2), ("data_dispatcher", 1), ("data_worker", 2)]
    # Nomad takes letters, digits and dashes only in a service name.
    assert groups["data_worker"]["Services"][0]["Name"] == "j-data-worker"
    assert groups["data_dispatcher"]["Services"][0]["Name"] == "j-data-dispatcher"
    for role in roles.DATA_ROLES:
        task = groups[role]["Tasks"][0]
        assert task["Config"]["args"] == ["python3", "-m", "nomadtf", "task", "--role", role]
        assert "Devices" not in task["Resources"] and "Vault" not in task  # CPU only, no secrets


def test_the_server_module_imports_no_tensorflow_and_reads_its_arguments():
    code = "import sys, nomadtf.usercode.dataservice; print('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout.strip() == "False"
    assert dataservice.dispatcher_address("grpc://h:5") == "h:5"
    args = dataservice.parse(["worker", "--port", "5", "--address", "h:5"])
    assert (args.mode, args.port, args.address) == ("worker", 5, "h:5")
    assert dataservice.ENV_DATA_SERVICE == wire.ENV_DATA_SERVICE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_reader_goes_on_while_a_data_worker_and_the_dispatcher_die_and_come_back(tmp_path):
    """The real servers, as nomadtf starts them: a data worker killed and started again at its
    address registers again; a dispatcher killed and started again reads its journal back,
    and the reader, which never restarts, gets its elements throughout."""
    import tensorflow as tf

    dport, wports = _free_port(), [_free_port(), _free_port()]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "0", wire.ENV_DATA_SERVICE: f"grpc://127.0.0.1:{dport}"}
    journal = tmp_path / "journal"

    def start(args: list[str], log: str) -> subprocess.Popen:
        with open(tmp_path / log, "a") as out:
            return subprocess.Popen([sys.executable, "-m", "nomadtf.usercode.dataservice", *args], env=env, stdout=out, stderr=subprocess.STDOUT)

    def dispatcher() -> subprocess.Popen:
        return start(["dispatcher", "--port", str(dport), "--work-dir", str(journal)], "dispatcher.log")

    def worker(port: int) -> subprocess.Popen:
        return start(["worker", "--port", str(port), "--address", f"127.0.0.1:{port}"], f"worker{port}.log")

    def logged(name: str, text: str, times: int) -> str:
        """Wait until `text` is in the server's log `times` times (TensorFlow loads slowly here)."""
        log = tmp_path / name
        deadline = time.monotonic() + 90
        while log.read_text().count(text) < times:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        return log.read_text()

    def registered(port: int, times: int) -> None:
        logged(f"worker{port}.log", "registered with grpc://", times)

    servers = [dispatcher(), worker(wports[0]), worker(wports[1])]
    try:
        registered(wports[0], 1)
        registered(wports[1], 1)
        dataset = tf.data.Dataset.range(1 << 30).map(lambda x: x * 2).apply(
            tf.data.experimental.service.distribute(processing_mode="parallel_epochs", service=f"grpc://127.0.0.1:{dport}"))
        elements = iter(dataset)

        def read(n: int) -> None:
            started = time.monotonic()
            values = [int(next(elements)) for _ in range(n)]
            assert all(v % 2 == 0 for v in values) and time.monotonic() - started < 60

        read(100)
        servers[1].kill()
        servers[1].wait()
        read(100)
        servers[1] = worker(wports[0])
        registered(wports[0], 2)
        read(100)
        servers[0].kill()
        servers[0].wait()
        servers[0] = dispatcher()
        log = logged("dispatcher.log", "tf.data dispatcher", 2)
        assert log.count("restore dispatcher state from journal") == 2 and log.count("No journal found") == 1, log
        read(100)
        assert (journal / "tf_data_dispatcher_journal").exists()
    finally:
        for server in servers:
            server.kill()
            server.wait()

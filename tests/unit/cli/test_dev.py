"""`nomadtf dev` (nomadtf/cli/dev.py) over stacks chosen by `nomadtf.devstack`: which stack
each command means, and what it prints. Every stack here lives in a temporary directory and
starts no server; the real stacks are tests/stack/test_devstack.py's and test_multiclient.py's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from nomadtf import cli, devstack
from nomadtf.cli.dev import status_lines
from nomadtf.devstack import processes
from nomadtf.devstack import stack as stack_mod
from nomadtf.devstack.cluster import ClusterStack
from nomadtf.devstack.protocol import Status, StatusRow
from nomadtf.devstack.record import MARKER
from nomadtf.devstack.stack import DevStack
from tests.helpers import nomadtf


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """Both stacks' state directories, in tmp_path (not made); the env for a `nomadtf` child."""
    env = {"NOMADTF_DEV_DIR": str(tmp_path / "dev"), "NOMADTF_DEV_CLUSTER_DIR": str(tmp_path / "cluster")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def _invoke(args: list[str]) -> tuple[int, str, str]:
    """`nomadtf ARGS` in this process (so a test may stand in for a part of it): exit code, stdout, stderr."""
    runner = CliRunner()
    saved_argv = sys.argv
    with runner.isolation() as (out, err, _):
        sys.argv = ["nomadtf", *args]
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.argv = saved_argv
            cli.state["debug"] = False
        return code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


def _record(state_dir, components: list[dict], **extra) -> None:
    state_dir.mkdir(exist_ok=True)
    (state_dir / MARKER).write_text("")
    (state_dir / "stack.json").write_text(json.dumps({"components": components, **extra}))


def test_up_with_clients_or_acls_means_the_several_client_stack(dirs):
    assert isinstance(devstack.for_options(1, False), DevStack)
    assert isinstance(devstack.for_options(2, False), ClusterStack)
    assert isinstance(devstack.for_options(1, True), ClusterStack)


def test_env_means_the_single_node_stack_unless_only_the_cluster_has_a_record(dirs, tmp_path):
    assert isinstance(devstack.running(), DevStack)  # neither: the default one names itself in its error
    assert isinstance(devstack.running(cluster=True), ClusterStack)
    _record(tmp_path / "cluster", [{"name": "consul", "pid": 1, "binary": "consul", "log": "x"}])
    assert isinstance(devstack.running(), ClusterStack)
    _record(tmp_path / "dev", [{"name": "consul", "pid": 1, "binary": "consul", "log": "x"}])
    assert isinstance(devstack.running(), DevStack)


def test_down_means_every_stack_there_is_unless_one_is_named(dirs, tmp_path):
    kinds = lambda **flags: [type(s) for s in devstack.selected(**flags)]  # noqa: E731
    assert kinds() == [DevStack]
    (tmp_path / "cluster").mkdir()
    assert kinds() == [DevStack, ClusterStack]
    assert kinds(cluster=True) == [ClusterStack] and kinds(single=True) == [DevStack]
    assert kinds(cluster=True, single=True) == [DevStack, ClusterStack]


def test_without_any_stack_the_commands_say_so(dirs):
    status = nomadtf("dev", "status", env=dirs, timeout=60)
    assert (status.returncode, status.stdout) == (1, "local stack: not running\n")
    status = nomadtf("dev", "status", "--cluster", env=dirs, timeout=60)
    assert (status.returncode, status.stdout) == (1, "several-client stack: not running\n")
    env = nomadtf("dev", "env", env=dirs, timeout=60)
    assert env.returncode == 1 and f"error: no local stack at {dirs['NOMADTF_DEV_DIR']}; run `nomadtf dev up`" in env.stderr
    env = nomadtf("dev", "env", "--cluster", env=dirs, timeout=60)
    assert env.returncode == 1 and "no several-client stack at" in env.stderr and "--clients N" in env.stderr
    down = nomadtf("dev", "down", env=dirs, timeout=60)
    assert (down.returncode, down.stderr.splitlines()) == (0, ["local stack stopped"])
    down = nomadtf("dev", "down", "--cluster", env=dirs, timeout=60)
    assert (down.returncode, down.stderr.splitlines()) == (0, ["several-client stack stopped"])


def test_gpu_clients_without_clients_is_refused_before_anything_starts(dirs, tmp_path):
    up = nomadtf("dev", "up", "--gpus", "2", "--gpu-clients", "3", env=dirs, timeout=60)
    assert up.returncode == 1, up.stderr
    assert up.stderr == "error: --gpu-clients is for the several-client stack: add --clients N (2 or more)\n"
    assert not (tmp_path / "dev").exists()


def test_status_shows_a_recorded_stack_and_fails_when_part_of_it_stopped(dirs, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = {"name": "consul", "pid": sleeper.pid, "binary": sys.executable, "log": "/l/consul.log",
                   "create_time": processes.started_at(sleeper.pid)}  # fmt: skip
        _record(tmp_path / "dev", [running], gpus=2)
        shown = nomadtf("dev", "status", env=dirs, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == (
            f"consul   running  pid {sleeper.pid:<7} http://127.0.0.1:8500    log /l/consul.log\n"
            "nomad client: 2 fake NVIDIA GPUs (device plugin nomadtf-fake-gpu)\n"
        )
        gone = {**running, "name": "nomad", "create_time": running["create_time"] - 100}  # a PID reused since
        _record(tmp_path / "dev", [running, gone])
        shown = nomadtf("dev", "status", env=dirs, timeout=60)
        assert shown.returncode == 1 and f"nomad    stopped  pid {sleeper.pid:<7} http://127.0.0.1:4646" in shown.stdout
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_running_stack_of_another_gpu_shape_is_refused_and_the_same_one_left_alone(dirs, tmp_path, monkeypatch):
    """The shape `dev up` compares includes the MIG slices: a count given and different is
    an error naming the commands; one left out means as the stack runs."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = {"pid": sleeper.pid, "binary": sys.executable, "create_time": processes.started_at(sleeper.pid)}
        _record(tmp_path / "dev", [{**proc, "name": name, "log": f"/l/{name}.log"} for name in ("consul", "openbao", "nomad")],
                gpus=6, mig=2)  # fmt: skip
        # The same shape is left alone: `up` only makes sure its admission controller leads (a
        # stand-in here: the recorded "servers" are sleepers), in this process, where it can be.
        ensured = []
        monkeypatch.setattr(stack_mod.controller, "ensure_controller", lambda stack, progress, secure=False: ensured.append(stack.state_dir))
        for same in (["--gpus", "6", "--mig", "2"], ["--gpus", "6"], ["--mig", "2"], []):
            code, _, stderr = _invoke(["dev", "up", *same])
            assert code == 0 and "is already up" in stderr, (same, stderr)
        assert ensured == [tmp_path / "dev"] * 4
        up = nomadtf("dev", "up", "--gpus", "6", "--mig", "0", env=dirs, timeout=60)
        assert up.returncode == 1
        assert up.stderr == (
            "error: the running local stack has 6 fake NVIDIA GPUs and 2 MIG slices, not 6 fake NVIDIA GPUs; "
            "`nomadtf dev down --single`, then `nomadtf dev up --gpus 6`\n"
        )
        up = nomadtf("dev", "up", "--mig", "1", env=dirs, timeout=60)
        assert up.returncode == 1 and "not 6 fake NVIDIA GPUs and 1 MIG slices" in up.stderr and "--gpus 6 --mig 1`" in up.stderr
        assert len(ensured) == 4  # a refused shape deploys nothing
        shown = nomadtf("dev", "status", env=dirs, timeout=60)
        assert shown.stdout.splitlines()[-1] == "nomad client: 6 fake NVIDIA GPUs and 2 MIG slices (device plugin nomadtf-fake-gpu)"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_mig_slices_are_the_single_node_stack_s(dirs, tmp_path):
    up = nomadtf("dev", "up", "--clients", "3", "--mig", "2", env=dirs, timeout=60)
    assert (up.returncode, up.stderr) == (1, "error: --mig (fake MIG slices) is for the single-node stack: leave out --clients and --secure\n")
    assert not (tmp_path / "cluster").exists()


def test_a_single_node_status_has_no_node_column():
    rows = (StatusRow("consul", "running", 804, "http://127.0.0.1:8500", "/s/consul.log"),
            StatusRow("openbao", "stopped", 813, "http://127.0.0.1:8200", "/s/openbao.log"))  # fmt: skip
    assert status_lines(Status(rows, footer="nomad client: 6 fake NVIDIA GPUs")) == [
        "consul   running  pid 804     http://127.0.0.1:8500    log /s/consul.log",
        "openbao  stopped  pid 813     http://127.0.0.1:8200    log /s/openbao.log",
        "nomad client: 6 fake NVIDIA GPUs",
    ]


def test_a_several_client_status_has_the_shape_first_and_each_clients_node():
    rows = (
        StatusRow("consul", "running", 12522, "https://198.18.0.1:8501", "/c/consul.log", node=""),
        StatusRow("consul-client-1", "running", 13086, "198.18.0.11 (ntf-c1)", "/c/cc1.log", node=""),
        StatusRow("nomad-client-1", "running", 13110, "198.18.0.11 (ntf-c1)", "/c/nc1.log", node="ready", gpus=0),
        StatusRow("nomad-client-2", "running", 13111, "198.18.0.12 (ntf-c2)", "/c/nc2.log", node="down", gpus=2),
    )
    assert status_lines(Status(rows, heading="several-client stack: 2 clients with 2 fake GPUs on client 2")) == [
        "several-client stack: 2 clients with 2 fake GPUs on client 2",
        "consul           running  pid 12522   https://198.18.0.1:8501                log /c/consul.log",
        "consul-client-1  running  pid 13086   198.18.0.11 (ntf-c1)                   log /c/cc1.log",
        "nomad-client-1   running  pid 13110   198.18.0.11 (ntf-c1)     node ready    log /c/nc1.log",
        "nomad-client-2   running  pid 13111   198.18.0.12 (ntf-c2)     node down     log /c/nc2.log",
    ]
    assert [r.healthy for r in rows] == [True, True, True, False]

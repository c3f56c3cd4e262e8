"""The local stack is real and wired together: Nomad runs raw_exec jobs, registers their
services in Consul, hands out Vault tokens from OpenBao, and serves its UI.

The unit tests at the end start no server: `down` runs on a temporary state directory whose
stack.json records `sleep` trees this test spawned."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import uuid
from dataclasses import asdict

import hvac
import psutil
import pytest
import requests

from nomadtf.devstack import probes, processes
from nomadtf.devstack import stack as stack_mod
from nomadtf.devstack.record import adopt_legacy, claim_state_dir
from nomadtf.errors import DevStackError, PortInUseError
from tests.docs_commands import shown_argv, shown_argvs
from tests.helpers import nomad, nomadtf, purge, submit_raw, wait_until


def _batch_job(job_id: str, task: dict, services: list | None = None) -> dict:
    return {
        "Job": {
            "ID": job_id,
            "Name": job_id,
            "Type": "batch",
            "Datacenters": ["*"],
            "TaskGroups": [
                {
                    "Name": "main",
                    "Count": 1,
                    "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
                    "Services": services or [],
                    "RestartPolicy": {"Attempts": 0, "Mode": "fail"},
                    "ReschedulePolicy": {"Attempts": 0, "Unlimited": False},
                    "Tasks": [{"Name": "main", "Driver": "raw_exec", **task}],
                }
            ],
        }
    }


def _wait_complete(job_id: str, timeout: float = 60) -> dict:
    def done():
        allocs = nomad(f"job/{job_id}/allocations")
        finished = [a for a in allocs if a["ClientStatus"] in ("complete", "failed", "lost")]
        return finished[0] if finished else None

    return wait_until(done, timeout, f"job {job_id} to finish")


@pytest.mark.stack
def test_raw_exec_job_runs_and_its_service_is_in_consul(stack):
    job_id = f"wired-{uuid.uuid4().hex[:6]}"
    service = f"{job_id}-svc"
    job = _batch_job(
        job_id,
        {"Config": {"command": "/bin/sh", "args": ["-c", "sleep 6; echo finished"]}},
        services=[{"Name": service, "PortLabel": "http", "Provider": "consul", "Tags": ["nomadtf-test"]}],
    )
    submit_raw(job)
    try:
        def registered():
            resp = requests.get(f"http://{stack_mod.CONSUL_ADDR}/v1/catalog/service/{service}", timeout=5)
            return resp.json()

        entries = wait_until(registered, 30, f"{service} in the Consul catalog")
        assert entries[0]["ServiceTags"] == ["nomadtf-test"]
        assert entries[0]["ServicePort"] > 0
        alloc = _wait_complete(job_id)
        assert alloc["ClientStatus"] == "complete", alloc["TaskStates"]
        assert alloc["TaskStates"]["main"]["Events"][-1]["ExitCode"] == 0
    finally:
        purge(job_id)


@pytest.mark.stack
def test_vault_block_gives_the_task_a_working_token(stack):
    value = secrets.token_hex(16)
    path = f"nomadtf-test/{uuid.uuid4().hex[:6]}"
    client = hvac.Client(url=stack_mod.VAULT_ADDR, token=stack.root_token())
    client.secrets.kv.v2.create_or_update_secret(path=path, secret={"password": value}, mount_point="secret")
    client.sys.create_or_update_policy("nomadtf-test-read", 'path "secret/data/nomadtf-test/*" { capabilities = ["read"] }')
    # The task proves it read the value by printing its digest; the value itself is never in the job.
    reader = (
        "import hashlib, json, os, urllib.request as u;"
        f"r = u.Request(os.environ['VAULT_ADDR'] + '/v1/secret/data/{path}', headers={{'X-Vault-Token': os.environ['VAULT_TOKEN']}});"
        "v = json.load(u.urlopen(r))['data']['data']['password'];"
        "print('digest=' + hashlib.sha256(v.encode()).hexdigest())"
    )
    job_id = f"vault-{uuid.uuid4().hex[:6]}"
    job = _batch_job(
        job_id,
        {
            "Config": {"command": sys.executable, "args": ["-c", reader]},
            "Env": {"VAULT_ADDR": stack_mod.VAULT_ADDR},
            "Vault": {"Policies": ["nomadtf-test-read"], "Env": True, "ChangeMode": "noop"},
        },
    )
    submit_raw(job)
    try:
        alloc = _wait_complete(job_id)
        logs = requests.get(
            f"{os.environ['NOMAD_ADDR']}/v1/client/fs/logs/{alloc['ID']}",
            params={"task": "main", "type": "stdout", "plain": "true"},
            timeout=10,
        ).text
        assert alloc["ClientStatus"] == "complete", (alloc["TaskStates"], logs)
        assert f"digest={hashlib.sha256(value.encode()).hexdigest()}" in logs
        stored = json.dumps(nomad(f"job/{job_id}"))
        assert value not in stored
        assert value not in logs
    finally:
        purge(job_id)


@pytest.mark.stack
def test_nomad_serves_its_real_web_ui(stack):
    resp = requests.get(f"{stack_mod.NOMAD_ADDR}/ui/", timeout=10)
    assert resp.status_code == 200
    assert "UI is disabled" not in resp.text
    assert "nomad-ui/config/environment" in resp.text  # the Ember app's config meta tag


@pytest.mark.stack
def test_up_twice_is_a_noop_and_status_hides_the_token(stack):
    before = [c.pid for c in stack.components()]
    assert stack.up(progress=lambda _m: None) is False
    assert [c.pid for c in stack.components()] == before
    # --single: the several-client stack the session may also hold has its own test.
    out = subprocess.run([sys.executable, "-m", "nomadtf", "dev", "status", "--single"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "nomad" in out.stdout and "consul" in out.stdout and "openbao" in out.stdout
    assert stack.root_token() not in out.stdout + out.stderr
    assert oct(stack.token_path.stat().st_mode & 0o777) == "0o600"
    env = subprocess.run([sys.executable, "-m", "nomadtf", "dev", "env"], capture_output=True, text=True).stdout
    assert "export NOMAD_ADDR=http://127.0.0.1:4646" in env


@pytest.mark.stack
@pytest.mark.parametrize(
    "argv", shown_argvs(r"nomadtf dev up --gpus 6( --mig 2)?( --docker)?") + shown_argvs(r"nomadtf dev up --docker"), ids=" ".join
)
def test_dev_up_as_the_docs_show_it_finds_the_running_stack_and_leaves_it_alone(stack, argv):
    """The docs' `nomadtf dev up --gpus 6 [--mig 2] [--docker]` and `nomadtf dev up --docker`,
    run as commands on the session's stack (the same shape: 6 fake GPUs, 2 MIG slices and its
    Docker daemon; a count left out means as it runs): exit 0, say it is already up, and
    restart nothing."""
    assert (stack.recorded_gpus(), stack.recorded_mig(), stack.recorded_docker()) == (6, 2, True)  # the shape the docs show
    before = [(c.name, c.pid) for c in stack.components()]
    out = nomadtf(*argv, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"is already up ({stack.state_dir})" in out.stderr, out.stderr
    assert [(c.name, c.pid) for c in stack.components()] == before
    assert all(c.process() for c in stack.components())


@pytest.mark.stack
def test_the_probes_and_the_stack_api_see_the_running_stack(stack):
    """What `up` waits on, asked of the stack that runs (read-only): every probe holds, and
    one more GPU than the node has (whole GPUs and MIG slices) is not ready. The -dev agent
    is also the client whose heartbeats HeartbeatWatch reads (a Go duration in its agent/self)."""
    api = stack.api()
    assert api.urls == {"nomad": stack_mod.NOMAD_ADDR, "consul": f"http://{stack_mod.CONSUL_ADDR}", "vault": stack_mod.VAULT_ADDR}
    assert probes.consul_leader(api) and probes.consul_node_alive(api, "nomadtf-dev")
    assert probes.openbao_listening(api) and probes.openbao_active(api)
    offered = stack.recorded_gpus() + stack.recorded_mig()
    assert probes.nomad_leader(api) and probes.nomad_node_ready(api, offered)
    assert not probes.nomad_node_ready(api, offered + 1)
    assert not probes.nomad_node_ready(api, 0, name="client-1")  # no such node here
    assert set(probes.node_statuses(api).values()) == {"ready"}
    seen = probes.HeartbeatWatch(api, api.nomad_url)
    probes.wait_for(seen.heartbeated, 60, "the -dev client's next heartbeat", "")
    assert api.vault().sys.read_health_status(method="GET")["initialized"]  # the root token of api(): hvac
    assert api.vault().lookup_token()["data"]["policies"] == ["root"]
    rows = stack.status().rows
    docker = [("docker", "running", None)] if stack.recorded_docker() else []
    assert [(r.component, r.state, r.node) for r in rows] == [("consul", "running", None), ("openbao", "running", None), *docker, ("nomad", "running", None)]
    assert probes.nomad_node_ready(api, drivers=("raw_exec", "docker") if docker else ("raw_exec",))


@pytest.mark.stack
def test_a_taken_port_is_a_clear_error(tmp_path, stack):
    other = stack_mod.DevStack(tmp_path / "other")
    with pytest.raises(PortInUseError, match=r"port \d+ .* already taken"):
        other.up(progress=lambda _m: None)


@pytest.mark.stack
@pytest.mark.restarts_stack
def test_down_leaves_no_process_and_up_comes_back(stack):
    pids = [c.pid for c in stack.components()]
    started = [p for c in stack.components() for p in processes.tree(psutil.Process(c.pid))]
    try:
        # --single: the several-client stack the session may hold (secure_cluster) stays up.
        out = subprocess.run([sys.executable, "-m", "nomadtf", *shown_argv(r"nomadtf dev down"), "--single"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert not any(processes.pid_alive(p) for p in pids)
        # The agents are this test process's children: until it reaps them they are zombies,
        # which is gone as far as anyone else can tell.
        assert [p.pid for p in started if processes.running(p)] == []
        assert str(stack.state_dir) not in open("/proc/self/mounts").read()  # tasks' tmpfs mounts too
        assert not stack.state_dir.exists()
        if stack.recorded_docker() or stack.docker:
            # The daemon went with its containers; its images stay in the cache (docker.py).
            assert not stack.daemon.socket.exists() and stack.daemon.data_root.is_dir()
    finally:
        # Bring it back for the tests that follow, also when an assertion above failed; the
        # session fixture still owns it.
        assert stack.up(progress=lambda _m: None) is True
        os.environ.update(stack.env())


# ---- down, on hand-written state (no servers) ----------------------------------------------

# A recorded server with a child, a grandchild and a grandchild in its own session (as
# raw_exec tasks are). The root ignores SIGTERM, so `down` has to fall back to SIGKILL.
SERVER_TREE = """
bash -c 'sleep 300 & python3 -c "import os, time; os.setsid(); time.sleep(300)" & wait' &
trap '' TERM
wait
"""


@pytest.fixture
def spawned():
    """Start processes for a test; whatever still runs at its end is stopped, tree and all."""
    started: list[psutil.Process] = []

    def spawn(argv: list[str], cwd, descendants: int = 0) -> psutil.Process:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL)
        root = psutil.Process(proc.pid)
        wait_until(lambda: len(root.children(recursive=True)) == descendants, 10, f"{argv[0]}'s descendants")
        started.extend(processes.tree(root))
        return root

    yield spawn
    processes.stop([p for p in started if p.is_running()], grace=1.0)


def _state_dir(
    tmp_path, recorded: dict[str, psutil.Process], marker: bool = True, create_time_shift: float = 0.0, legacy=False
):
    """A state directory as `up` leaves it, recording `recorded`; `legacy`: as an older
    nomadtf left it (no start times, no marker)."""
    state = tmp_path / "dev"
    state.mkdir(exist_ok=True)
    if marker and not legacy:
        (state / stack_mod.MARKER).write_text("")
    components = [
        {"name": name, "pid": proc.pid, "binary": proc.exe(), "log": str(state / f"{name}.log")}
        | ({} if legacy else {"create_time": proc.create_time() + create_time_shift})
        for name, proc in recorded.items()
    ]
    (state / "stack.json").write_text(json.dumps({"components": components}))
    (state / "nomad.log").write_text("a log someone is reading\n")
    return stack_mod.DevStack(state)


def test_down_stops_recorded_trees_and_leaves_no_zombie(tmp_path, spawned):
    (tmp_path / "dev").mkdir()
    nomad_agent = spawned(["bash", "-c", SERVER_TREE], tmp_path / "dev", descendants=3)
    consul_agent = spawned(["sleep", "300"], tmp_path / "dev")
    tree = processes.tree(nomad_agent) + [consul_agent]
    assert any(os.getsid(p.pid) == p.pid for p in tree)  # one has left the agent's session
    dev = _state_dir(tmp_path, {"nomad": nomad_agent, "consul": consul_agent})
    assert [r.state for r in dev.status().rows] == ["running", "running"]

    dev.down(progress=lambda _m: None, grace=1.0)

    # is_running() is False once a PID is gone and reaped: a zombie would still count.
    assert [p.pid for p in tree if p.is_running()] == []
    assert not dev.state_dir.exists()


def test_down_spares_processes_it_did_not_start(tmp_path, spawned):
    state = tmp_path / "dev"
    (state / "nomad-data").mkdir(parents=True)
    (state / "nomad.log").write_text("a log someone is reading\n")
    recorded = spawned(["sleep", "300"], state)
    shell_inside = spawned(["sleep", "300"], state / "nomad-data")  # a user's shell cd'd into it
    log_reader = spawned(["tail", "-f", str(state / "nomad.log")], tmp_path)  # `less` of a log
    dev = _state_dir(tmp_path, {"nomad": recorded})

    dev.down(progress=lambda _m: None, grace=1.0)

    assert not recorded.is_running()
    assert shell_inside.is_running() and log_reader.is_running()
    assert not state.exists()


def test_down_refuses_a_directory_without_the_marker(tmp_path, spawned):
    (tmp_path / "dev").mkdir()
    recorded = spawned(["sleep", "300"], tmp_path / "dev")
    dev = _state_dir(tmp_path, {"nomad": recorded}, marker=False)
    before = {p.name: p.read_bytes() for p in dev.state_dir.iterdir()}

    with pytest.raises(DevStackError, match=rf"{dev.state_dir}.*no {stack_mod.MARKER}.*NOMADTF_DEV_DIR"):
        dev.down(progress=lambda _m: None, grace=1.0)

    assert recorded.is_running()
    assert {p.name: p.read_bytes() for p in dev.state_dir.iterdir()} == before


def test_down_does_not_kill_a_reused_pid(tmp_path, spawned):
    # The recorded start time differs from the running process's: the PID is someone else's now.
    stranger = spawned(["sleep", "300"], tmp_path)
    dev = _state_dir(tmp_path, {"nomad": stranger}, create_time_shift=-100.0)
    assert [r.state for r in dev.status().rows] == ["stopped"]

    dev.down(progress=lambda _m: None, grace=1.0)

    assert stranger.is_running()
    assert not dev.state_dir.exists()


def test_up_takes_over_a_running_stack_of_an_older_nomadtf(tmp_path, spawned):
    (tmp_path / "dev").mkdir()
    server = spawned(["sleep", "300"], tmp_path / "dev")
    dev = _state_dir(tmp_path, {"nomad": server}, legacy=True)
    assert [r.state for r in dev.status().rows] == ["stopped"]  # unverifiable until taken over

    adopted = adopt_legacy(dev.record, dev.marker_path)
    assert adopted is not None
    dev.record.save(components=[asdict(c) for c in adopted])

    assert dev.marker_path.is_file()
    assert [c.create_time for c in dev.components()] == [server.create_time()]
    dev.down(progress=lambda _m: None, grace=1.0)
    assert not server.is_running() and not dev.state_dir.exists()


def test_a_legacy_record_older_than_its_process_is_not_taken_over(tmp_path, spawned):
    # The process started after stack.json was written: its PID was reused.
    stranger = spawned(["sleep", "300"], tmp_path)
    dev = _state_dir(tmp_path, {"nomad": stranger}, legacy=True)
    os.utime(dev.record_path, (stranger.create_time() - 60, stranger.create_time() - 60))

    assert adopt_legacy(dev.record, dev.marker_path) is None

    assert not dev.marker_path.exists()
    with pytest.raises(DevStackError, match="no .nomadtf-devstack"):
        dev.down(progress=lambda _m: None, grace=1.0)
    assert stranger.is_running()


def test_up_refuses_a_foreign_state_directory(tmp_path):
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    with pytest.raises(DevStackError, match=rf"{foreign} exists and was not created by `nomadtf dev up`"):
        claim_state_dir(stack_mod.DevStack(foreign).state_dir, "NOMADTF_DEV_DIR")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]

    fresh = stack_mod.DevStack(tmp_path / "new")
    claim_state_dir(fresh.state_dir, "NOMADTF_DEV_DIR")
    assert fresh.marker_path.is_file()
    fresh.down(progress=lambda _m: None)
    assert not fresh.state_dir.exists()

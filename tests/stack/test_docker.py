"""Every role in a container through Nomad's docker driver (issue #23), on the real local
stack with its own Docker daemon (`dev up --docker`) and the image `nomadtf dev image
build` makes from the repository's Dockerfile: nothing mocked, the containers are real.

The image is built once per session (and cached in the daemon's data root between runs on
one machine)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from nomadtf.devstack import images
from tests import faults
from tests.docs_commands import shown_argv
from tests.helpers import (
    OTHER_TF,
    TEAM_UIDS,
    all_logs,
    code_process,
    nomadtf,
    probe_job,
    purge,
    two_teams,
    unique,
    wait_until,
    write_job,
)
from tests.stack.test_recovery import ACCURACY_FLOOR

pytestmark = [pytest.mark.stack, pytest.mark.docker]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "docker" / "job.json"
MiB = 2**20


# docker_client and task_image (the image of this checkout, built once) are conftest.py's.


def _job_containers(client, job_id: str) -> list:
    return client.containers.list(filters={"label": f"com.hashicorp.nomad.job_name={job_id}"})


class ContainerWatch:
    """The containers of one job, seen while it runs (Nomad removes them once they stop)."""

    def __init__(self, client, job_id: str):
        self.client, self.job_id = client, job_id
        self.seen: dict[str, dict] = {}  # container id -> its `docker inspect`
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ContainerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            try:
                for container in _job_containers(self.client, self.job_id):
                    self.seen.setdefault(container.id, container.attrs)
            except Exception:  # noqa: BLE001 (a container gone between list and inspect)
                continue

    def tasks(self) -> dict[str, list[dict]]:
        """task name -> the containers it had."""
        out: dict[str, list[dict]] = {}
        for attrs in self.seen.values():
            out.setdefault(attrs["Config"]["Labels"]["com.hashicorp.nomad.task_name"], []).append(attrs)
        return out


def test_dev_image_build_prints_the_image_on_its_last_line_and_reuses_the_cached_build(docker_client, task_image):
    """The command the docs show, as a user runs it: the session's build is found, not redone,
    and the reference on the last line is the one driver.image takes; the key-less alias a
    job.json on this machine names (examples/docker/job.json) is the same image."""
    started = time.monotonic()
    out = nomadtf(*shown_argv(r"nomadtf dev image build"), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == task_image
    assert "is built already" in out.stderr and time.monotonic() - started < 60, out.stderr
    alias = f"{images.REPOSITORY}:tf{images.installed_tensorflow()}-cpu"
    assert docker_client.images.get(alias).id == docker_client.images.get(task_image).id
    assert re.fullmatch(r"nomadtf:tf[0-9.]+-cpu", json.loads(EXAMPLE.read_text())["driver"]["image"])


def test_dev_image_build_without_a_docker_stack_names_the_command_that_starts_one(tmp_path):
    # Neither stack there (a several-client stack with daemons would be used otherwise).
    out = nomadtf("dev", "image", "build", env={"NOMADTF_DEV_DIR": str(tmp_path / "no-stack"), "NOMADTF_DEV_CLUSTER_DIR": str(tmp_path / "no-cluster")})
    assert out.returncode != 0
    assert "nomadtf dev up --docker" in out.stderr and "Traceback" not in out.stderr


def test_the_docker_example_trains_with_every_task_in_a_container_of_its_memory(stack, docker_client, task_image, tmp_path):
    """The docs' command as it is: the example names the key-less alias of the session's image."""
    job = json.loads(EXAMPLE.read_text())
    job_id = unique("docker")
    with ContainerWatch(docker_client, job_id) as watch:
        out = nomadtf(*shown_argv(r"nomadtf run examples/docker/job\.json"), "--var", f"name={job_id}", "--var", "context.steps=300",
                      "--timeout", "8m")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert "succeeded" in out.stdout + out.stderr
        tasks = watch.tasks()
        assert sorted(tasks) == ["chief", "ps", "worker"], tasks.keys()
        assert len(tasks["worker"]) >= 2  # one container per task, each worker its own
        for role, containers in tasks.items():
            for attrs in containers:
                assert attrs["HostConfig"]["Memory"] == job["roles"][role]["memory"] * MiB, (role, attrs["HostConfig"]["Memory"])
                # The role's cpu is Docker's relative weight, not a quota (docs/operations/drivers.md).
                assert attrs["HostConfig"]["CpuShares"] == job["roles"][role]["cpu"], (role, attrs["HostConfig"]["CpuShares"])
                assert not attrs["HostConfig"]["CpuQuota"], (role, attrs["HostConfig"]["CpuQuota"])
                assert attrs["HostConfig"]["NetworkMode"] == "host"
                assert attrs["Image"] == docker_client.images.get(task_image).id
        logs = all_logs(job_id)
        # The chief's own report of its accuracy (train_ps.py) and the versions line (item 5).
        assert float(re.findall(r"final_accuracy=([0-9.]+)", out.stdout + out.stderr + logs)[-1]) >= ACCURACY_FLOOR
        assert f"tensorflow-cpu {images.installed_tensorflow()}" in logs and "/opt/nomadtf/venv/bin/python3" in logs
    finally:
        purge(job_id)


def test_side_roles_code_from_source_url_and_a_legacy_main_run_in_containers(stack, docker_client, task_image, tmp_path, code_server):
    """The roles and code sources the example does not use, each in a container: a chief,
    an evaluator and TensorBoard on code Nomad fetched from source.url (unpacked into the
    task's local/, the one task directory a container sees, at /local/code), then the legacy
    main() of examples/legacy with the driver swapped to docker."""
    from tests.helpers import task_log

    job_id = unique("docker-roles")
    # The probes wait for this file; in the namespace's checkpoint folder, which every container mounts.
    release = Path("/tmp/nomadtf/default") / f"{job_id}.release"
    job = probe_job(job_id, context={"until_file": str(release)}, source={"url": f"{code_server}/code.tar.gz"})
    job["entrypoint"] = {"script": "probe.py"}  # no workdir: where Nomad unpacked the code
    job["roles"].update(evaluator={"count": 1, "cpu": 200, "memory": 600}, tensorboard={"count": 1, "cpu": 200, "memory": 600})
    job["driver"] = {"name": "docker", "image": task_image}
    legacy = json.loads((EXAMPLE.parents[1] / "legacy" / "job.json").read_text())
    legacy.update(name=unique("docker-legacy"), driver={"name": "docker", "image": task_image})
    run = subprocess.Popen([str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, job)), "--timeout", "5m"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        with ContainerWatch(docker_client, job_id) as watch:
            said = []
            for line in run.stdout:  # `run` names TensorBoard's address once its container runs
                said.append(line)
                if "TensorBoard: " in line:
                    break
            url = said[-1].split("TensorBoard: ", 1)[-1].strip()
            assert url.startswith("http://"), "".join(said)
            page = wait_until(lambda: _answer(url), 90, "TensorBoard in its container to answer")
            assert "TensorBoard" in page
            release.parent.mkdir(parents=True, exist_ok=True)
            release.touch()
            rest, _ = run.communicate(timeout=180)
        assert run.returncode == 0, "".join(said) + rest
        assert sorted(watch.tasks()) == ["chief", "evaluator", "ps", "tensorboard", "worker"], watch.tasks().keys()
        evaluator = _allocs(job_id, "evaluator")[0]
        log = task_log(evaluator["ID"], "evaluator")
        assert json.loads(log.split("TF_CONFIG=", 1)[1].splitlines()[0])["task"] == {"type": "evaluator", "index": 0}
        assert "probe finished" in log

        with ContainerWatch(docker_client, legacy["name"]) as legacy_watch:
            out = nomadtf("run", str(write_job(tmp_path, legacy)), "--timeout", "5m")
        assert out.returncode == 0, out.stdout + out.stderr
        assert sorted(legacy_watch.tasks()) == ["ps", "worker"]
        logs = all_logs(legacy["name"])
        assert "legacy_ok" in logs and "cluster_jobs=ps,worker" in logs
    finally:
        if run.poll() is None:
            run.kill()
        release.unlink(missing_ok=True)
        purge(job_id)
        purge(legacy["name"])


def _answer(url: str) -> str | None:
    try:
        resp = requests.get(url, timeout=5)
    except requests.RequestException:
        return None
    return resp.text if resp.status_code == 200 else None


def test_a_killed_container_heals_and_the_job_succeeds(stack, docker_client, task_image, tmp_path):
    """`docker kill` (SIGKILL, nothing can clean up) of the chief's container mid-training:
    Nomad restarts the task, the cluster re-forms from Consul, the chief resumes from its
    checkpoint, and the run still succeeds. The chief only: the containers' soak
    (test_soak.py) kills every role's code and `nomadtf task` in containers, and checks after
    each fault that only what the recovery policy restarts is new."""
    role = "chief"
    job = json.loads(EXAMPLE.read_text())
    job_id = unique(f"docker-kill-{role}")
    job.update(name=job_id, driver={"name": "docker", "image": task_image})
    job["context"].update(steps=1000, checkpoint_every=100)  # killed at step 150 or so: the rest proves the resume
    job["roles"]["worker"]["count"] = 1
    run = subprocess.Popen([str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, job)), "--timeout", "10m"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        def training():
            found = [c for c in _job_containers(docker_client, job_id) if c.labels.get("com.hashicorp.nomad.task_name") == role]
            # Past the first checkpoint (step 100; the log line comes before the save).
            return found[0] if found and faults.step(job_id) >= 150 else None

        wait_until(training, 300, f"the {role} container while the chief trains past a checkpoint").kill()
        output, _ = run.communicate(timeout=600)
        assert run.returncode == 0, output
        assert "succeeded" in output
        # Nomad's account of the kill: the task ended by SIGKILL (137), then Nomad restarted it.
        events = [e for a in _allocs(job_id, role) for t in a["TaskStates"].values() for e in t["Events"]]
        killed = [e["Time"] for e in events if e["Type"] == "Terminated" and (e.get("ExitCode") == 137 or e.get("Signal") == 9)]
        assert killed, f"the {role} task never ended by SIGKILL: the kill did not land ({[(e['Type'], e.get('ExitCode')) for e in events]})"
        assert any(e["Type"] == "Restarting" and e["Time"] > killed[0] for e in events), [e["Type"] for e in events]
        # A new chief process: it must start from the checkpoint, not from 0.
        resumed = [int(n) for n in re.findall(r"resumed from step (\d+)", faults.chief_stdout(job_id))]
        assert resumed and resumed[0] >= 100, resumed
    finally:
        if run.poll() is None:
            run.kill()
        purge(job_id)


def test_a_stop_reaches_the_code_in_its_container_as_sigterm(stack, docker_client, task_image, tmp_path, code_server):
    """Nomad stops a docker task with `docker stop` (SIGTERM, then SIGKILL after the grace):
    the signal passes Docker's init and `nomadtf task` and reaches the code, which can
    checkpoint; the run is reported stopped, not succeeded."""
    from tests.helpers import task_log

    job_id = unique("docker-term")
    job = _probe_in_docker(job_id, task_image, code_server, "multi_worker_mirrored", context={"report_sigterm": True, "sleep": -1})
    job["roles"]["worker"]["count"] = 1
    run = subprocess.Popen([str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, job)), "--timeout", "4m"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_until(lambda: "model_dir=" in all_logs(job_id), 180, "the probe running in its container")
        stopped = nomadtf("stop", job_id)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 4, output  # stopped
        (alloc,) = _allocs(job_id, "worker")
        # Docker's log of a stopped container reaches Nomad's log files a moment after `run` returned.
        wait_until(lambda: "probe got SIGTERM" in task_log(alloc["ID"], "worker"), 30, "the probe's SIGTERM line in its log")

        def killed():  # Nomad's own account of it: a kill it asked for, not a crash
            events = [e["Type"] for a in _allocs(job_id, "worker") for t in a["TaskStates"].values() for e in t["Events"]]
            return "Killed" in events and events

        wait_until(killed, 60, "Nomad's Killed event of the worker")
    finally:
        if run.poll() is None:
            run.kill()
        purge(job_id)


def _allocs(job_id: str, group: str) -> list[dict]:
    from tests.helpers import nomad

    return [nomad(f"allocation/{a['ID']}") for a in nomad(f"job/{job_id}/allocations") if a["TaskGroup"] == group]


def test_code_over_its_memory_is_reported_as_killed_for_memory_not_as_a_bug(stack, task_image, tmp_path, code_server):
    job_id = unique("docker-oom")
    job = _probe_in_docker(job_id, task_image, code_server, "multi_worker_mirrored", context={"allocate_mb": 1024})
    job["roles"]["worker"].update(count=1, memory=300)
    started = time.monotonic()
    out = nomadtf("run", str(write_job(tmp_path, job)), "--timeout", "4m")
    try:
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert "worker[0] exited 137, killed for exceeding its 300 MiB: raise roles.worker.memory" in text
        assert "what to do: raise roles.worker.memory in job.json" in text
        assert time.monotonic() - started < 120, "an OOM kill is final: it is not retried until a timeout"
    finally:
        purge(job_id)


def test_an_image_that_cannot_be_pulled_fails_the_run_at_once_naming_the_image_and_the_fix(stack, tmp_path):
    """Nomad's docker driver retries a failed pull as recoverable (restarts × reschedules,
    minutes); nomadtf reads the task's "Driver Failure" event and ends the run at once."""
    from tests.helpers import nomad

    job = json.loads(EXAMPLE.read_text())
    job_id = unique("docker-noimage")
    job["name"] = job_id
    started = time.monotonic()
    out = nomadtf("run", str(write_job(tmp_path, job)), "--var", "driver.image=nomadtf:no-such", "--timeout", "4m")
    try:
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert re.search(r"\w+\[\d\]: driver\.image nomadtf:no-such could not be pulled on client \S+: .+; build it "
                         r"\(`nomadtf dev image build`\) or push it where the clients pull from", text), text  # fmt: skip
        assert "what to do: make nomadtf:no-such pullable by every client" in text
        assert time.monotonic() - started < 60, "a pull failure is final: it is not retried for minutes"
        assert nomad(f"job/{job_id}")["Stop"], "a failed run is stopped: its other tasks must not hold the clients"
    finally:
        purge(job_id)


def _probe_in_docker(job_id: str, image: str, code_server: str, strategy: str = "parameter_server", **extra) -> dict:
    """tests/jobs/probe.py in containers of `image`, fetched by Nomad from `code_server` (a
    bind mount of the tests' folder would need the docker plugin's volumes.enabled, which
    this stack, like a shared cluster, does not give)."""
    job = probe_job(job_id, strategy, source={"url": f"{code_server}/code.tar.gz"}, **extra)
    job["entrypoint"] = {"script": "probe.py"}  # no workdir: where Nomad unpacked the code
    job["driver"] = {"name": "docker", "image": image}
    return job


def test_a_gpu_role_s_container_sees_exactly_the_gpus_nomad_reserved(stack, docker_client, task_image, tmp_path, code_server):
    from tests.helpers import nomad, task_log

    job_id = unique("docker-gpu")
    job = _probe_in_docker(job_id, task_image, code_server, "multi_worker_mirrored")
    job["roles"]["worker"].update(count=2, gpus=2)
    job["driver"]["gpu_image"] = task_image
    with ContainerWatch(docker_client, job_id) as watch:
        out = nomadtf("run", str(write_job(tmp_path, job)), "--timeout", "4m")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        seen: list[str] = []
        for alloc in nomad(f"job/{job_id}/allocations"):
            env = dict(re.findall(r"^env (\w+)=(.*)$", task_log(alloc["ID"], "worker"), re.M))
            reserved = nomad(f"allocation/{alloc['ID']}")["AllocatedResources"]["Tasks"]["worker"]["Devices"][0]["DeviceIDs"]
            assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(reserved), (env, reserved)
            assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"]
            seen += reserved
        assert len(seen) == len(set(seen)) == 4
        # Nomad's docker driver ran each GPU task under the `nvidia` runtime (the stack's is
        # runc by that name: the fake GPUs need no hook).
        assert {attrs["HostConfig"]["Runtime"] for attrs in watch.seen.values()} == {"nvidia"}
    finally:
        purge(job_id)


def test_secrets_reach_the_code_s_container_only_and_no_image_inspect_or_log(stack, docker_client, task_image, tmp_path, code_server):
    import hvac

    from nomadtf.devstack import stack as stack_mod

    root = hvac.Client(url=stack_mod.VAULT_ADDR, token=stack.root_token())
    job_id = unique("docker-secrets")
    canary_env, canary_file = f"canary-env-{uuid.uuid4().hex}", f"canary-file-{uuid.uuid4().hex}"
    root.secrets.kv.v2.create_or_update_secret(path=f"dockercanary/{job_id}", secret={"env": canary_env, "file": canary_file}, mount_point="secret")
    root.sys.create_or_update_policy("nomadtf-dockercanary", 'path "secret/data/dockercanary/*" { capabilities = ["read"] }')
    job = _probe_in_docker(
        job_id, task_image, code_server,
        secrets=[{"path": f"secret/dockercanary/{job_id}", "key": "env", "env": "PROBE_SECRET"},
                 {"path": f"secret/dockercanary/{job_id}", "key": "file", "file": "probe.key"}],
        vault={"policies": ["nomadtf-dockercanary"], "address": stack_mod.VAULT_ADDR},
        context={"sleep": 4},
    )  # fmt: skip
    with ContainerWatch(docker_client, job_id) as watch:
        out = nomadtf("run", str(write_job(tmp_path, job)), "--timeout", "4m")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        logs = all_logs(job_id)
        # The chief's code got both, the file 0600 in the task's /secrets ...
        assert hashlib.sha256(canary_env.encode()).hexdigest() in logs
        assert f"secret_file_sha256={hashlib.sha256(canary_file.encode()).hexdigest()} mode=0o600" in logs
        # ... and nothing else holds them: no container's configuration, no log, no image.
        assert sorted(watch.tasks()) == ["chief", "ps", "worker"]
        for attrs in watch.seen.values():
            assert canary_env not in json.dumps(attrs) and canary_file not in json.dumps(attrs)
        assert canary_env not in logs + out.stdout + out.stderr and canary_file not in logs
        # The task's Vault token is in no container's configuration, not in PID 1's
        # environment, and its file was removed before the code started (issue #33).
        for attrs in watch.seen.values():
            tokens = [e for e in (attrs.get("Config") or {}).get("Env") or [] if e.split("=", 1)[0] in ("VAULT_TOKEN", "CONSUL_HTTP_TOKEN", "NOMAD_TOKEN")]
            assert not tokens, (attrs["Name"], [t.split("=", 1)[0] for t in tokens])
        assert "vault_token_file=False" in logs and "vault_token_visible=False" in logs, logs
        # The code is not root (nobody, the default code user): PID 1's environment and its
        # supervisor's are not its to read (issue #33).
        assert "uid=65534 gid=65534" in logs and "pid1_vault_token=unreadable (PermissionError)" in logs, logs
        assert "supervisor_environ=unreadable (PermissionError)" in logs, logs
        # No container mounts a host folder shared with other jobs' containers beyond its own
        # namespace's checkpoint folder, a host volume: the docker plugin allows no bind mounts
        # of host paths (volumes.enabled = false on this stack).
        for attrs in watch.seen.values():
            outside = {(m["Source"], m["Destination"], m["RW"]) for m in attrs["Mounts"] if "/nomad-data/alloc/" not in m["Source"]}
            assert outside == {("/tmp/nomadtf/default", "/tmp/nomadtf/default", True)}, (attrs["Name"], attrs["Mounts"])
        assert "enabled = false" in (stack.state_dir / "nomad.hcl").read_text().split('plugin "docker"', 1)[1].split("gc {", 1)[0]
        history = json.dumps([layer for layer in docker_client.api.history(task_image)])
        assert canary_env not in history and canary_file not in history
    finally:
        purge(job_id)




@pytest.mark.tf
def test_two_tensorflow_versions_as_two_images_train_side_by_side(stack, docker_client, task_image, other_tf_image, tmp_path, code_server):
    from tests.stack.test_environments import finish, start_run, task_logs, tf_job

    # The second image (the session built it in the background, as conftest.py builds the
    # first) through the command the docs show: found, and named on its last line.
    built = nomadtf(*shown_argv(r"nomadtf dev image build --tf 2\.20\.0"), timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    other_image = built.stdout.strip().splitlines()[-1]
    assert other_image == other_tf_image and other_image.startswith(f"nomadtf:tf{OTHER_TF}-cpu-"), built.stdout
    versions = {task_image: images.installed_tensorflow(), other_image: OTHER_TF}
    assert len(set(versions.values())) == 2
    jobs = {}
    for image in versions:
        job_id = unique("docker-tf")
        job = tf_job(job_id, None)
        job["driver"] = {"name": "docker", "image": image}
        job["source"] = {"url": f"{code_server}/jobs.tar.gz"}
        job["entrypoint"] = {"script": "tf_version.py"}  # where Nomad unpacked the code
        folder = tmp_path / job_id
        folder.mkdir()
        jobs[job_id] = (image, start_run(write_job(folder, job)))
    try:
        for job_id, (image, run) in jobs.items():
            code, text = finish(run)
            assert code == 0, text
            logs = task_logs(job_id)
            assert f"tf_version={versions[image]}" in logs["chief"] and "trained steps=5" in logs["chief"]
            # Every task's own log says what its child ran (issue #23, item 5), ps and worker too.
            for role in ("chief", "worker", "ps"):
                assert "our child runs Python 3.11" in logs[role] and f"tensorflow-cpu {versions[image]}" in logs[role], role
            # ... and `run` says it once for the job, `status` per role.
            assert re.findall(r"\] runs Python 3\.11\.\d+ \(/opt/nomadtf/venv/bin/python3\), tensorflow-cpu (\S+)", text) == [versions[image]], text[-3000:]
            status = nomadtf("status", job_id)
            assert f"tensorflow-cpu {versions[image]}  (chief 1, ps 1, worker 1)" in status.stdout, status.stdout + status.stderr
    finally:
        for job_id in jobs:
            purge(job_id)


def test_two_teams_on_one_client_reach_nothing_of_each_other(stack, docker_client, task_image, tmp_path, code_server):
    """team-a's and team-b's jobs in containers on the one client, each team's code as its
    own uid (the cluster profile's code_users): team-a's code looks for team-b's checkpoint
    folder, task directories, code process and the Docker socket, and finds none of them;
    its own model_dir it reads (issue #33)."""
    env = two_teams(stack.api().nomad_url, tmp_path)
    job_b, job_a = unique("team-b-job"), unique("team-a-job")
    spec_b = _probe_in_docker(job_b, task_image, code_server, "multi_worker_mirrored", namespace="team-b", context={"sleep": 300})
    spec_b["roles"]["worker"]["count"] = 1
    out = nomadtf("run", str(write_job(tmp_path, spec_b)), "--detach", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        code = wait_until(lambda: code_process(job_b, TEAM_UIDS["team-b"]), 180, "team-b's code running as uid 10002")
        b_alloc = code.environ()["NOMAD_ALLOC_ID"]
        b_task_dir = next(Path(stack.state_dir, "nomad-data", "alloc").glob(f"{b_alloc}/worker"))
        b_folder = Path("/tmp/nomadtf/team-b") / job_b
        wait_until(b_folder.is_dir, 120, "team-b's job folder (made when its code is handed the cluster)")
        assert b_folder.is_dir() and (b_folder.stat().st_uid, b_folder.stat().st_mode & 0o777) == (10002, 0o700)
        targets = [str(b_folder), str(b_task_dir / "secrets"), str(b_task_dir / "local"), f"/proc/{code.pid}/environ",
                   "/var/run/docker.sock", str(Path(stack.state_dir, "docker.sock"))]
        spec_a = _probe_in_docker(job_a, task_image, code_server, "multi_worker_mirrored", namespace="team-a",
                                  context={"try_read": ["${NOMADTF_MODEL_DIR}", *targets]})
        spec_a["roles"]["worker"]["count"] = 1
        ran = nomadtf("run", str(write_job(tmp_path, spec_a)), "--timeout", "4m", env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        logs = all_logs(job_a, namespace="team-a")
        assert "uid=10001 gid=10001" in logs, logs
        assert re.search(r"try_read /tmp/nomadtf/team-a/\S+=allowed", logs), logs  # it can read, what is its own
        tried = [line for line in logs.splitlines() if line.startswith("try_read ")]
        for target in targets:
            # Not there to see (FileNotFoundError), or under /root, which nobody else enters (PermissionError).
            assert f"try_read {target}=denied (FileNotFoundError)" in tried or f"try_read {target}=denied (PermissionError)" in tried, (target, tried)
    finally:
        purge(job_b, namespace="team-b")
        purge(job_a, namespace="team-a")

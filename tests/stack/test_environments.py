"""Each job brings its own Python environment (job.json `environment`), on the real stack.

Two jobs train at the same time: one on TensorFlow 2.20.0 from its own environment (built
once per test session with uv, into a session directory; uv's own cache keeps the wheels
between sessions), one on the TensorFlow that nomadtf's installation carries (2.21). Then
the same requirements again (reused at once), and an impossible one (a clear error, the
job stopped, exit 1).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    JOBS,
    OTHER_TF,
    all_logs,
    nomad,
    nomadtf,
    purge,
    task_log,
    unique,
    wait_until,
    write_job,
)

pytestmark = [pytest.mark.stack, pytest.mark.tf]

TF_EXTRA = f"tensorflow-cpu=={OTHER_TF}"  # the one extra TensorFlow version the tests build


def tf_job(name: str, cache_dir: Path | None, requirements: list[str] | None = None, steps: int = 5, timeout: str = "15m") -> dict:
    spec = {
        "name": name,
        "strategy": "parameter_server",
        "entrypoint": {"script": "tf_version.py", "workdir": str(JOBS)},
        "context": {"steps": steps},
        "roles": {
            "chief": {"count": 1, "cpu": 200, "memory": 1024},
            "worker": {"count": 1, "cpu": 200, "memory": 800},
            "ps": {"count": 1, "cpu": 200, "memory": 800},
        },
        "recovery": {"restart_attempts": 0, "reschedule_attempts": 0},
        "discovery": {"rendezvous_timeout": "5m"},
    }
    if requirements:
        spec["environment"] = {"requirements": requirements, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
                               "timeout": timeout, "cache_dir": str(cache_dir)}
    return spec


def start_run(path: Path) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "nomadtf"
    return subprocess.Popen([str(exe), "run", str(path), "--timeout", "12m"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=900)
    return proc.returncode, out + err


def task_logs(job_id: str) -> dict[str, str]:
    """role -> its stdout and stderr (every allocation of the job)."""
    logs: dict[str, str] = {}
    for alloc in nomad(f"job/{job_id}/allocations"):
        role = alloc["TaskGroup"]
        for stream in ("stdout", "stderr"):
            logs[role] = logs.get(role, "") + task_log(alloc["ID"], role, stream)
    return logs


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nomadtf-envs")


@pytest.fixture(scope="module")
def side_by_side(stack, env_dir, tmp_path_factory):
    """Job A on TensorFlow 2.20 (its own environment, built now), job B on nomadtf's own
    TensorFlow, submitted together and followed to the end."""
    tmp = tmp_path_factory.mktemp("side-by-side")
    a, b = unique("env-tf220"), unique("env-default")
    started = time.monotonic()
    procs = {a: start_run(write_job(tmp, tf_job(a, env_dir, [TF_EXTRA]))), b: start_run(write_job(tmp, tf_job(b, None)))}
    results = {job: finish(proc) for job, proc in procs.items()}
    elapsed = time.monotonic() - started
    logs = {job: task_logs(job) for job in procs}
    statuses = {job: nomadtf("status", job) for job in procs}
    yield {"a": a, "b": b, "results": results, "logs": logs, "elapsed": elapsed, "statuses": statuses}
    for job in procs:
        purge(job)


def test_two_tensorflow_versions_train_side_by_side(side_by_side):
    a, b = side_by_side["a"], side_by_side["b"]
    for job in (a, b):
        code, out = side_by_side["results"][job]
        assert code == 0, out[-3000:]
        assert "succeeded" in out
    logs_a, logs_b = side_by_side["logs"][a], side_by_side["logs"][b]
    assert "tf_version=2.20.0" in logs_a["chief"] and "trained steps=5" in logs_a["chief"]
    assert "tf_version=2.21.0" in logs_b["chief"] and "trained steps=5" in logs_b["chief"]
    # The bare TensorFlow servers of job A run in its environment too.
    for role in ("ps", "worker"):
        assert "(TensorFlow 2.20.0)" in logs_a[role], logs_a[role][-2000:]
        assert "(TensorFlow 2.21.0)" in logs_b[role], logs_b[role][-2000:]
    # Job A's code runs with the environment's interpreter, nothing of nomadtf's leaks in.
    assert "leaked=none" in logs_a["chief"], logs_a["chief"][-2000:]
    assert re.search(r"prefix=\S+/[0-9a-f]{16}\b", logs_a["chief"])
    # `run` and `status` say which TensorFlow each job's code ran (issue #23, item 5): `run`
    # once for its three tasks, `status` with the count of tasks per role.
    for job, version in ((a, "2.20.0"), (b, "2.21.0")):
        _code, out = side_by_side["results"][job]
        said = re.findall(r"\] runs Python 3\.\d+\.\d+ \(\S+\), tensorflow-cpu (\S+)", out)
        assert said == [version], out[-3000:]
        status = side_by_side["statuses"][job]
        assert status.returncode == 0, status.stderr
        assert re.search(rf"runs Python 3\.\d+\.\d+ \(\S+\), tensorflow-cpu {re.escape(version)}  \(chief 1, ps 1, worker 1\)", status.stdout), status.stdout
    print(f"\nside by side: both jobs done in {side_by_side['elapsed']:.0f}s")


def test_run_shows_the_build(side_by_side):
    """`run` shows each task's environment; a build it sees in progress as "building
    environment … (n s)" (a build shorter than one of its looks shows only as built)."""
    _code, out = side_by_side["results"][side_by_side["a"]]
    assert len(re.findall(r"\[0\] environment [0-9a-f]{16} ready \((built|reused) in [\d.]+ s\)", out)) == 3, out[-3000:]
    assert len(re.findall(r"ready \(built in", out)) == 1
    for line in re.findall(r".*building environment.*", out):
        assert re.search(r"building environment [0-9a-f]{16} \(tensorflow-cpu==2\.20\.0; Python 3\.\d+\) \(\d+ s\)", line)
    _code, out_b = side_by_side["results"][side_by_side["b"]]
    assert "environment" not in out_b  # without `environment`, nothing changes


def test_tasks_of_one_job_on_one_client_build_once(side_by_side):
    logs = side_by_side["logs"][side_by_side["a"]]
    built = [role for role, text in logs.items() if re.search(r"built environment [0-9a-f]{16}", text)]
    reused = [role for role, text in logs.items() if re.search(r"reusing environment [0-9a-f]{16}", text)]
    installs = sum(text.count("uv: Installed ") for text in logs.values())
    assert len(built) == 1 and installs == 1, {r: t[-1500:] for r, t in logs.items()}
    assert sorted(built + reused) == ["chief", "ps", "worker"]
    first_build = float(re.search(r"built environment \S+ \(.*?\) after ([\d.]+)s", logs[built[0]])[1])
    print(f"\nfirst build of {TF_EXTRA}: {first_build:.1f}s ({built[0]} built it, {', '.join(reused)} waited and reused it)")


def test_the_same_requirements_again_reuse_the_environment(side_by_side, env_dir, tmp_path):
    name = unique("env-again")
    started = time.monotonic()
    result = nomadtf("run", str(write_job(tmp_path, tf_job(name, env_dir, ["TensorFlow-CPU == 2.20.0"], steps=3))), "--timeout", "10m")
    elapsed = time.monotonic() - started
    try:
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        logs = task_logs(name)
        text = "\n".join(logs.values())
        assert "tf_version=2.20.0" in logs["chief"]
        assert "uv:" not in text and "Installed" not in text and "building environment" not in text
        times = [float(t) for t in re.findall(r"reusing environment [0-9a-f]{16} \(.*?\) after ([\d.]+)s", text)]
        assert len(times) == 3, text[-3000:]
        assert "ready (reused in" in result.stderr
        listed = nomadtf("env", "list", "--dir", str(env_dir))
        assert listed.returncode == 0 and "tensorflow-cpu==2.20.0" in listed.stdout and "idle" in listed.stdout
        kept = nomadtf("env", "gc", "--older-than", "1h", "--dir", str(env_dir))
        assert kept.returncode == 0 and "removed 0 environment(s)" in kept.stdout
        print(f"\nreuse: {max(times):.2f}s in the slowest task; the whole job {elapsed:.0f}s")
    finally:
        purge(name)


def test_an_impossible_requirement_fails_the_job_clearly(stack, env_dir, tmp_path):
    name = unique("env-impossible")
    spec = tf_job(name, env_dir, ["tensorflow-cpu==1.0.0"], timeout="3m")
    started = time.monotonic()
    result = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "6m")
    elapsed = time.monotonic() - started
    try:
        out = result.stdout + result.stderr
        assert result.returncode == 1, out[-3000:]
        assert f"job {name} failed: " in out and "its Python environment: cannot build the environment: requirement 'tensorflow-cpu==1.0.0'" in out, out[-3000:]
        assert "environment failed:" in out
        assert f"stopped {name}" in out
        job = nomad(f"job/{name}")
        assert job["Stop"] is True
        # A task that tried the build again when the first failed may still be stopping: its
        # half-built directory goes as it stops, never to be used.
        wait_until(lambda: not any(p.name.startswith(".build-") for p in env_dir.iterdir()), 60, "half-built environments removed")
        print(f"\nimpossible requirement: `run` exited 1 after {elapsed:.0f}s")
    finally:
        purge(name)


def test_gc_never_removes_an_environment_in_use(side_by_side, env_dir, tmp_path):
    """A job holds its environment while it runs: `gc --older-than 0s` keeps it, and
    removes it once the job is over."""
    name = unique("env-held")
    spec = tf_job(name, env_dir, [TF_EXTRA])
    spec["entrypoint"] = {"script": "probe.py", "workdir": str(JOBS)}
    spec["context"] = {"sleep": -1}
    submitted = nomadtf("run", str(write_job(tmp_path, spec)), "--detach", timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    try:
        wait_until(lambda: "role=chief" in all_logs(name), 240, "the chief's code to run")
        held = nomadtf("env", "gc", "--older-than", "0s", "--dir", str(env_dir))
        assert held.returncode == 0 and "kept " in held.stdout and "in use by a task" in held.stdout, held.stdout
        assert nomadtf("env", "list", "--dir", str(env_dir)).stdout.count("in use") == 1
    finally:
        nomadtf("stop", name)
        purge(name)
    # Once the job's tasks have exited, nothing holds it.
    wait_until(lambda: "removed 1 environment(s)" in nomadtf("env", "gc", "--older-than", "0s", "--dir", str(env_dir)).stdout,
               90, "gc to remove the environment once the job stopped", interval=2)
    assert [p.name for p in env_dir.iterdir()] == ["locks"]

"""job.json `environment`, the job's venv (nomadtf/venvs.py, nomadtf/runtime/venvcache.py): the pure parts (requirements, keys, error wording, GC selection,
the child's paths), the spec's rules, and the cache's locks and markers on a real
filesystem, with real uv builds of a tiny local wheel (offline, about a second each)."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from nomadtf import venvs
from nomadtf.client.runview import describe_environment
from nomadtf.errors import SpecError
from nomadtf.job.render import docker_image_needs, render_job
from nomadtf.job.spec import parse_spec
from nomadtf.job.validate import normalize
from nomadtf.runtime import jobenv
from nomadtf.runtime.venvcache import VenvCache
from nomadtf.venvs import EnvBuildError, EnvBuildStopped
from tests.helpers import nomadtf

BASE = {"name": "envjob", "entrypoint": {"script": "train.py"}, "roles": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}}}


def job(**extra) -> dict:
    return {**json.loads(json.dumps(BASE)), **extra}


# ---- requirements and keys ----------------------------------------------------------------------


def test_requirements_normalise_to_one_spelling():
    a = venvs.normalize_requirements(["TensorFlow_CPU==2.20.0", "numpy<3,>=1.26", "Keras[Jax,Backend]>=3"])
    b = venvs.normalize_requirements(["keras[backend,jax]>=3", "numpy>=1.26,<3", "tensorflow-cpu==2.20.0", "numpy >= 1.26, < 3"])
    assert a == b
    assert a == ("keras[backend,jax]>=3", "numpy<3,>=1.26", "tensorflow-cpu==2.20.0")


def test_key_is_stable_and_changes_with_what_changes_the_environment():
    key = venvs.venv_key(["tensorflow-cpu==2.20.0"], "3.11", "x86_64")
    # The key names the cached environment's directory on every client: pinned, so that a
    # change to it (which orphans every cache) is made on purpose, with a FORMAT bump.
    assert key == "26bffa05f588ef36"
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert key == venvs.venv_key(["TensorFlow-CPU == 2.20.0"], "3.11", "x86_64")
    assert venvs.venv_key(["numpy<3", "six"], "3.11", "x86_64") == venvs.venv_key(["six", "numpy<3"], "3.11", "x86_64")
    assert key != venvs.venv_key(["tensorflow-cpu==2.21.0"], "3.11", "x86_64")
    assert key != venvs.venv_key(["tensorflow-cpu==2.20.0"], "3.12", "x86_64")
    assert key != venvs.venv_key(["tensorflow-cpu==2.20.0"], "3.11", "aarch64")
    assert key != venvs.venv_key(["tensorflow-cpu==2.20.0"], "3.11", "x86_64", {"UV_INDEX_URL": "https://pypi.example/simple"})
    assert venvs.index_settings({"UV_INDEX_URL": "u", "HOME": "/root", "UV_FIND_LINKS": ""}) == {"UV_INDEX_URL": "u"}


def test_invalid_requirements_are_named_with_their_path():
    problems = venvs.requirement_problems(["tensorflow-cpu==2.20.0", "tensorflow-cpu=2.20", "--index-url https://x"])
    assert len(problems) == 2
    assert problems[0].startswith("environment.requirements[1]: 'tensorflow-cpu=2.20' is not a requirement")
    assert problems[1].startswith("environment.requirements[2]: '--index-url https://x' is not a requirement")


def test_blame_names_the_requirement_an_installer_error_is_about():
    reqs = ["tensorflow-cpu==9.9.9", "numpy<3", "six"]
    out = ("error: No solution found when resolving dependencies\n  cause: Because there is no version of "
           "tensorflow-cpu==9.9.9 and you require tensorflow-cpu==9.9.9, we can conclude ...")
    assert venvs.blame(reqs, out) == ["tensorflow-cpu==9.9.9"]
    assert venvs.blame(reqs, "error: Request failed\n  cause: Failed to fetch: https://pypi.org/simple/six/") == ["six"]
    assert venvs.blame(["tensorflow"], "Because there is no version of tensorflow-cpu==1") == []  # not a prefix match
    reason = venvs.installer_reason("Using Python 3.11\n" + out)
    assert reason.startswith("No solution found when resolving dependencies; Because there is no version of tensorflow-cpu==9.9.9")


def test_gc_selection():
    now = 1_000_000.0
    old = venvs.VenvInfo("a" * 16, Path("/x/a"), now - 8 * 86400)
    recent = venvs.VenvInfo("b" * 16, Path("/x/b"), now - 86400)
    assert venvs.unused_since([old, recent], now, 7 * 86400) == [old]
    assert venvs.unused_since([old, recent], now, 0) == [old, recent]


def test_the_child_path_keeps_the_codes_entries_and_drops_nomadtfs_installation():
    leaky = ["/opt/nomadtf/venv/lib/python3.11/site-packages", "/src/nomadtf-checkout"]
    inherited = os.pathsep.join(["/code", "/opt/nomadtf/venv/lib/python3.11/site-packages", "/extra", "/src/nomadtf-checkout", "/code"])
    assert venvs.child_pythonpath(inherited, leaky, ["/task/nomadtf-lib"]) == os.pathsep.join(["/code", "/extra", "/task/nomadtf-lib"])
    env = venvs.activation_env(
        "/envs/k/bin/python", Path("/envs/k"), Path("/task/nomadtf-lib"),
        {"PATH": "/opt/nomadtf/venv/bin:/usr/bin", "PYTHONPATH": "/code"}, leaky,
    )
    assert env == {"PATH": "/envs/k/bin:/opt/nomadtf/venv/bin:/usr/bin", "VIRTUAL_ENV": "/envs/k", "PYTHONPATH": "/code:/task/nomadtf-lib"}
    assert any("site-packages" in p for p in venvs.supervisor_paths())


def test_the_child_modules_import_without_nomadtfs_dependencies(tmp_path):
    """progress, tfserver, gpulimit and warmstart work from a Python that has none of nomadtf's
    dependencies: `-S -I` leaves out every site-packages, so only the copied modules exist."""
    lib = jobenv.install_child_modules(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import nomadtf.progress, nomadtf.usercode.tfserver, nomadtf.usercode.gpulimit, nomadtf.usercode.warmstart; "
            "import nomadtf; print(nomadtf.__file__)")
    out = subprocess.run([sys.executable, "-S", "-I", "-c", code, str(lib)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(lib))


def test_what_run_shows_about_an_environment():
    status = {"key": "26bffa05f588ef36", "requirements": "tensorflow-cpu==2.20.0", "python": "3.11"}
    assert describe_environment("chief", 0, {**status, "state": "building", "elapsed_s": 12}) == (
        "chief[0] building environment 26bffa05f588ef36 (tensorflow-cpu==2.20.0; Python 3.11) (12 s)"
    )
    assert describe_environment("ps", 0, {**status, "state": "waiting"}) == (
        "ps[0] waiting for environment 26bffa05f588ef36: another task on its client is building it"
    )
    assert describe_environment("worker", 1, {**status, "state": "ready", "reused": True, "elapsed_s": 0.01}) == (
        "worker[1] environment 26bffa05f588ef36 ready (reused in 0.0 s)"
    )
    assert describe_environment("chief", 0, {"state": "failed", "error": "cannot build the environment: requirement 'x==9'"}) == (
        "chief[0] environment failed: cannot build the environment: requirement 'x==9'"
    )


# ---- job.json --------------------------------------------------------------------------------


def test_environment_in_the_spec():
    spec = parse_spec(job(environment={"requirements": ["tensorflow-cpu==2.20.0"], "python": "3.11"}))
    assert spec.document["environment"] == {"requirements": ["tensorflow-cpu==2.20.0"], "python": "3.11", "timeout": "15m"}
    env = spec.environment
    assert env is not None and env.requirements == ("tensorflow-cpu==2.20.0",) and env.timeout_s == 900 and env.cache_dir is None
    assert parse_spec(job()).environment is None


def test_without_environment_nothing_changes_in_the_rendered_job():
    plain = render_job(parse_spec(job()))
    assert "environment" not in json.dumps(plain)


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"requirements": []}, "environment.requirements: [] should be non-empty"),
        ({"python": "3.11"}, "environment: 'requirements' is a required property"),
        ({"requirements": ["six"], "pyhton": "3.11"}, "environment.pyhton: unknown key 'pyhton'; did you mean 'python'?"),
        ({"requirements": ["six"], "python": "python3"}, "environment.python: 'python3' does not match"),
        ({"requirements": ["six"], "timeout": "soon"}, "environment.timeout: 'soon' is not a duration"),
        ({"requirements": ["six", "tensorflow==="]}, "environment.requirements[1]: 'tensorflow===' is not a requirement"),
    ],
)
def test_environment_problems_name_the_field(environment, expected):
    with pytest.raises(SpecError) as err:
        normalize(job(environment=environment))
    assert any(p.startswith(expected) for p in err.value.problems), err.value.problems


def test_environment_needs_raw_exec():
    with pytest.raises(SpecError, match="with the docker driver the image is the job's environment"):
        normalize(job(environment={"requirements": ["six"]}, driver={"name": "docker", "image": "tf:2.20"}))
    with pytest.raises(SpecError, match="'exec' runs each task in a chroot of the client's system directories"):
        normalize(job(environment={"requirements": ["six"]}, driver={"name": "exec"}))


def test_validate_says_what_a_docker_image_must_contain():
    needs = docker_image_needs(parse_spec(job(driver={"name": "docker", "image": "tf:2.20", "gpu_image": "tf:2.20-gpu"})))
    text = "\n".join(needs)
    assert needs[0] == "docker: tf:2.20 and tf:2.20-gpu must contain:"
    assert "python3 -m nomadtf task" in text and "pip install nomadtf" in text and "TensorFlow" in text
    assert "the code at the task directory" in text and "tensorboard" not in text
    with_all = docker_image_needs(parse_spec(job(
        driver={"name": "docker", "image": "tf:2.20"}, source={"url": "https://example.com/c.zip"},
        roles={**BASE["roles"], "tensorboard": {"count": 1}},
    )))
    assert with_all[0] == "docker: tf:2.20 must contain:" and "python3 -m tensorboard.main" in "\n".join(with_all)
    assert not any("the code at" in line for line in with_all)  # Nomad fetches it
    assert docker_image_needs(parse_spec(job())) == []


# ---- the cache on a real filesystem -------------------------------------------------------------


def fake_env(cache: VenvCache, requirements: list[str], python: str = "3.11", age_s: float = 0.0, environ=None) -> str:
    """A complete environment as a build leaves it (marker included), without building."""
    key = venvs.venv_key(requirements, python, index=venvs.index_settings(environ or {}))
    path = cache.venv_path(key)
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    marker = path / venvs.MARKER
    marker.write_text(json.dumps({"key": key, "requirements": requirements, "python_version": "3.11.7"}))
    os.utime(marker, (time.time() - age_s, time.time() - age_s))
    return key


def hold(cache: VenvCache, key: str, kind: int) -> int:
    fd = cache._open_lock(key)
    fcntl.flock(fd, kind)
    return fd


def test_a_complete_environment_is_reused_at_once_and_held(tmp_path):
    cache = VenvCache(tmp_path)
    key = fake_env(cache, ["six==1.16.0"], age_s=3600)
    ready = cache.reuse_or_build(["Six == 1.16.0"], "3.11", timeout_s=5, environ={})
    try:
        assert ready.reused and ready.info.key == key and ready.seconds < 5
        assert time.time() - ready.info.last_used < 60  # the marker's mtime is the last use
        assert cache.in_use(key)
        removed, busy = cache.gc(older_than_s=0)
        assert removed == [] and [e.key for e in busy] == [key]
    finally:
        ready.release()
    assert not cache.in_use(key)


def test_a_task_waits_for_another_tasks_build_and_then_reuses_it(tmp_path):
    cache = VenvCache(tmp_path)
    key = venvs.venv_key(["six"], "3.11", index={})
    builder = hold(cache, key, fcntl.LOCK_EX)  # another task is building it
    statuses = []

    def finish_build():
        time.sleep(0.6)
        fake_env(cache, ["six"])
        os.close(builder)

    threading.Thread(target=finish_build).start()
    ready = cache.reuse_or_build(["six"], "3.11", timeout_s=30, on_status=statuses.append, environ={})
    ready.release()
    assert ready.reused and statuses == [{"state": "waiting", "key": key}]


def test_waiting_is_bounded_by_the_timeout_and_stops_when_asked(tmp_path):
    cache = VenvCache(tmp_path)
    key = venvs.venv_key(["six"], "3.11", index={})
    builder = hold(cache, key, fcntl.LOCK_EX)
    try:
        with pytest.raises(EnvBuildError, match=r"still building it after environment.timeout \(1s\)"):
            cache.reuse_or_build(["six"], "3.11", timeout_s=1, environ={})
        with pytest.raises(EnvBuildStopped):
            cache.reuse_or_build(["six"], "3.11", timeout_s=30, should_stop=lambda: True, environ={})
    finally:
        os.close(builder)


def test_gc_removes_old_idle_environments_and_dead_builds_never_one_in_use(tmp_path):
    cache = VenvCache(tmp_path)
    old_idle = fake_env(cache, ["a"], age_s=10 * 86400)
    old_busy = fake_env(cache, ["b"], age_s=10 * 86400)
    recent = fake_env(cache, ["c"], age_s=3600)
    (tmp_path / f".build-{old_idle}-0123abcd").mkdir()  # a build that died
    (tmp_path / "half").mkdir()  # no marker: never listed, never used
    user = hold(cache, old_busy, fcntl.LOCK_SH)  # a task uses it
    try:
        assert [e.key for e in cache.gc(7 * 86400, dry_run=True)[0]] == [old_idle]
        assert cache.venv_path(old_idle).exists()
        removed, busy = cache.gc(7 * 86400)
        assert [e.key for e in removed] == [old_idle] and [e.key for e in busy] == [old_busy]
    finally:
        os.close(user)
    assert sorted(e.key for e in cache.entries()) == sorted([old_busy, recent])
    assert not any(p.name.startswith((".build-", ".trash-")) for p in tmp_path.iterdir())
    assert cache.lock_path(old_idle).exists()  # lock files stay: a deleted one splits the lock


def test_env_list_and_gc_commands(tmp_path):
    cache = VenvCache(tmp_path)
    old = fake_env(cache, ["tensorflow-cpu==2.20.0"], age_s=9 * 86400)
    recent = fake_env(cache, ["tensorflow-cpu==2.21.0"], age_s=60)
    listed = nomadtf("env", "list", "--dir", str(tmp_path))
    assert listed.returncode == 0
    assert re.search(rf"{old}  python 3.11.7  last used 9.0d ago  idle  built in \?s  tensorflow-cpu==2.20.0", listed.stdout), listed.stdout
    assert recent in listed.stdout
    dry = nomadtf("env", "gc", "--older-than", "7d", "--dry-run", "--dir", str(tmp_path))
    assert dry.stdout.splitlines()[0] == f"would remove {old} (tensorflow-cpu==2.20.0)" and cache.venv_path(old).exists()
    gone = nomadtf("env", "gc", "--older-than", "7d", "--dir", str(tmp_path))
    assert gone.returncode == 0 and f"removed 1 environment(s) from {tmp_path}; 0 in use" in gone.stdout
    assert [e.key for e in cache.entries()] == [recent]
    bad = nomadtf("env", "gc", "--older-than", "a week", "--dir", str(tmp_path))
    assert bad.returncode == 1 and "--older-than: 'a week' is not an age; write e.g. 7d, 12h or 30m" in bad.stderr
    negative = nomadtf("env", "gc", "--older-than", "-7d", "--dir", str(tmp_path))
    assert negative.returncode == 1 and "'-7d' is not an age" in negative.stderr
    assert [e.key for e in cache.entries()] == [recent]


# ---- real builds of a tiny local wheel (offline) -------------------------------------------------


def make_wheel(directory: Path, name: str = "nomadtfdemo", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel, written by hand so that no build backend is needed."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.fixture
def offline(tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    return {**os.environ, "UV_OFFLINE": "1", "UV_FIND_LINKS": str(wheels), "UV_NO_INDEX": "1"}


def test_a_build_is_atomic_marked_and_runs_the_asked_python(tmp_path, offline):
    cache = VenvCache(tmp_path / "envs")
    statuses, lines = [], []
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    ready = cache.reuse_or_build(["nomadtfdemo==1.0"], python, timeout_s=120, on_status=statuses.append, environ=offline, log=lines.append)
    ready.release()
    assert not ready.reused and statuses[0]["state"] == "building"
    marker = ready.info.marker
    assert marker["installed"] == ["nomadtfdemo==1.0"] and marker["python_version"].startswith(python)
    out = subprocess.run([str(ready.info.python), "-c", "import nomadtfdemo; print(nomadtfdemo.VERSION)"], capture_output=True, text=True)
    assert out.stdout.strip() == "1.0"
    assert any("Installed 1 package" in line for line in lines)
    assert [p.name for p in (tmp_path / "envs").iterdir() if p.name.startswith(".")] == []
    again = cache.reuse_or_build(["NomadtfDemo==1.0"], python, timeout_s=120, environ=offline)
    again.release()
    assert again.reused and again.info.key == ready.info.key


def test_concurrent_tasks_build_once(tmp_path, offline):
    cache = VenvCache(tmp_path / "envs")
    results, builds = [], []
    together = threading.Barrier(4)

    def task():
        together.wait()  # all at once: every one finds the environment missing
        ready = cache.reuse_or_build(["nomadtfdemo"], "3.11", timeout_s=120, environ=offline,
                              on_status=lambda s: builds.append(s) if s["state"] == "building" else None)
        results.append(ready)

    threads = [threading.Thread(target=task) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ready in results:
        ready.release()
    assert len(results) == 4 and len({r.info.key for r in results}) == 1
    assert sum(not r.reused for r in results) == 1
    assert len([s for s in builds if s["elapsed_s"] == 0]) == 1


def test_an_impossible_requirement_is_a_clear_error_and_leaves_nothing(tmp_path, offline):
    cache = VenvCache(tmp_path / "envs")
    with pytest.raises(EnvBuildError) as err:
        cache.reuse_or_build(["six", "nomadtfdemo==9.9"], "3.11", timeout_s=120, environ=offline)
    message = str(err.value)
    assert message.startswith("cannot build the environment: requirement 'nomadtfdemo==9.9':"), message
    assert cache.entries() == []
    assert [p.name for p in (tmp_path / "envs").iterdir()] == ["locks"]


def test_a_build_past_the_timeout_is_stopped(tmp_path, offline):
    cache = VenvCache(tmp_path / "envs")
    with pytest.raises(EnvBuildError, match=r"took longer than environment.timeout \(0s\)"):
        cache.reuse_or_build(["nomadtfdemo"], "3.11", timeout_s=0.0, environ=offline)
    assert cache.entries() == []


def test_a_cache_that_cannot_be_written_is_a_clear_error(tmp_path):
    (tmp_path / "not-a-dir").write_text("")
    with pytest.raises(EnvBuildError, match=r"environment [0-9a-f]{16} in .*not-a-dir/envs: Not a directory"):
        VenvCache(tmp_path / "not-a-dir" / "envs").reuse_or_build(["six"], "3.11", timeout_s=5, environ={})

"""The real-GPU check: nomadtf on a machine with NVIDIA GPUs, in one run.

1. Reads this machine's GPUs from `nvidia-smi --query-gpu=uuid,name,memory.total`.
2. Starts the single-node stack in its own state directory (NOMADTF_DEV_DIR, a fresh
   temporary one: no other stack's state is touched) with the project's device plugin
   advertising exactly those GPUs: their UUIDs, model name and memory.
3. Runs a MultiWorkerMirroredStrategy job, one GPU per worker, whose code imports
   TensorFlow and prints `tf.config.list_physical_devices("GPU")` and the UUIDs in
   NVIDIA_VISIBLE_DEVICES; every worker must list exactly one GPU, all different.
4. Trains examples/digits/train_mwms.py under `nomadtf run`, then the same code as bare
   processes with a hand-written TF_CONFIG (and the same one GPU each), and prints both
   steps/s and their ratio.
5. Stops the stack and every process it started, and removes its state.

`--docker IMAGE` does the same with every task in a container of IMAGE (a CUDA TensorFlow
image with nomadtf: the repository's Dockerfile on `tensorflow/tensorflow:2.21.0-gpu`, or
`nomadtf dev image build --gpu`) through Nomad's docker driver and the stack's own Docker
daemon, whose `nvidia` runtime is then the NVIDIA Container Toolkit's; the bare baseline
runs in containers of the same image with the same GPU each (`docker run --runtime nvidia`),
so the ratio is nomadtf's own cost.

Not run on real GPUs yet. On a machine with NVIDIA GPUs (and TensorFlow with CUDA, Go and
the binaries of `scripts/setup`; for --docker, Docker and the NVIDIA Container Toolkit):
`python bench/bench_gpu.py [--workers 2] [--steps 2000] [--docker IMAGE]`.
`--dry-run` prints what it would do, from `nvidia-smi` on PATH, and starts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nomadtf.devstack import gpu_plugin  # noqa: E402
from nomadtf.devstack.gpu_plugin import GpuInventory  # noqa: E402
from nomadtf.errors import NomadtfError  # noqa: E402

EXAMPLES = REPO / "examples"
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader"]
_MEMORY = re.compile(r"^(\d+)\s*MiB$")
_STEP = re.compile(r"^step=(\d+)\b")

# What each worker of the device check runs: the GPUs TensorFlow sees, and the UUIDs given.
DEVICE_PROBE = textwrap.dedent(
    """\
    import os
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    print("visible_uuids=" + os.environ.get("NVIDIA_VISIBLE_DEVICES", ""), flush=True)
    print(f"tf_gpus={len(gpus)} " + " ".join(g.name for g in gpus), flush=True)
    """
)


class BenchError(NomadtfError):
    pass


# ---- this machine's GPUs ---------------------------------------------------------------


def parse_nvidia_smi(text: str) -> GpuInventory:
    """`uuid, name, memory.total` lines (csv, noheader) -> the GPUs to advertise. One model
    only: the plugin's explicit ids make one device group. Pure."""
    rows = [[field.strip() for field in line.split(",")] for line in text.splitlines() if line.strip()]
    if not rows:
        raise BenchError("nvidia-smi lists no GPUs")
    ids, models, memories = [], set(), set()
    for row in rows:
        if len(row) != 3 or not row[0].startswith("GPU-"):
            raise BenchError(f"unexpected nvidia-smi line (want `GPU-<uuid>, <name>, <N> MiB`): {', '.join(row)!r}")
        memory = _MEMORY.match(row[2])
        if not memory:
            raise BenchError(f"unexpected memory.total {row[2]!r} (want `<N> MiB`)")
        ids.append(row[0])
        models.add(row[1])
        memories.add(int(memory.group(1)))
    if len(models) != 1 or len(memories) != 1:
        raise BenchError(f"this check wants GPUs of one model; nvidia-smi lists {sorted(models)}")
    # Nomad addresses a device group as vendor/type/name: no slash in the name.
    model = models.pop().replace("/", "-")
    return GpuInventory(ids=tuple(ids), model=model, memory_mib=memories.pop())


def read_gpus() -> GpuInventory:
    """This machine's GPUs, from nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        raise BenchError("nvidia-smi is not on PATH: this check needs a machine with NVIDIA GPUs and their driver")
    result = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise BenchError(f"`{' '.join(NVIDIA_SMI_QUERY)}` failed: {result.stderr.strip() or result.returncode}")
    return parse_nvidia_smi(result.stdout)


# ---- jobs ------------------------------------------------------------------------------


IMAGE_EXAMPLES = "/opt/nomadtf/examples"  # where the Dockerfile puts the examples


def docker_driver(image: str, workdir: Path) -> dict:
    """job.json `driver` for the docker mode: GPU roles on `image` too, the bench's own work
    directory (the probe script) mounted read-only at its path. Pure."""
    return {"name": "docker", "image": image, "gpu_image": image, "volumes": [f"{workdir}:{workdir}:ro"]}


def device_check_spec(name: str, workdir: Path, workers: int, image: str | None = None) -> dict:
    spec = {
        "name": name,
        "strategy": "multi_worker_mirrored",
        "entrypoint": {"script": "gpu_probe.py", "workdir": str(workdir)},
        "roles": {"worker": {"count": workers, "cpu": 500, "memory": 2048, "gpus": 1}},
        "recovery": {"restart_attempts": 0, "reschedule_attempts": 0},
    }
    if image:
        spec["driver"] = docker_driver(image, workdir)
    return spec


def digits_spec(name: str, workers: int, steps: int, image: str | None = None, workdir: Path | None = None) -> dict:
    data = json.loads((EXAMPLES / "digits" / "job-mwms.json").read_text())
    data["name"] = name
    data["entrypoint"]["workdir"] = f"{IMAGE_EXAMPLES}/digits" if image else str(EXAMPLES / "digits")
    data["context"].update({"steps": steps, "log_every": 10, "checkpoint_every": steps})
    data["roles"]["worker"].update(count=workers, gpus=1, memory=4096)
    data["recovery"] = {"restart_attempts": 0, "reschedule_attempts": 0}
    if image:
        data["driver"] = docker_driver(image, workdir or Path("/tmp"))
    return data


def check_device_output(outputs: list[str], ids: tuple[str, ...]) -> list[str]:
    """Each worker's output of DEVICE_PROBE -> the UUID it was given; raises unless every
    worker lists exactly one GPU, one of `ids`, and no two share one. Pure."""
    given = []
    for i, out in enumerate(outputs):
        uuids = re.search(r"^visible_uuids=(.*)$", out, re.M)
        tf_gpus = re.search(r"^tf_gpus=(\d+)", out, re.M)
        if not uuids or not tf_gpus:
            raise BenchError(f"worker {i} printed no device report:\n{out}")
        mine = [u for u in uuids.group(1).split(",") if u]
        if int(tf_gpus.group(1)) != 1 or len(mine) != 1 or mine[0] not in ids:
            raise BenchError(f"worker {i} should see exactly one of this machine's GPUs:\n{out}")
        given.append(mine[0])
    if len(set(given)) != len(given):
        raise BenchError(f"two workers were given the same GPU: {given}")
    return given


def steps_per_second(stamped: list[tuple[float, str]]) -> float:
    """Training speed from (time seen, line) pairs: steps between the first and the last
    `step=N` line over the time between them (start-up and the last save excluded). Pure."""
    points = [(t, int(m.group(1))) for t, line in stamped if (m := _STEP.match(line))]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        raise BenchError("fewer than two `step=` lines: too few steps to measure")
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def bare_tf_configs(workers: int, ports: list[int]) -> list[dict]:
    """The TF_CONFIG of each bare worker on this host. Pure."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports[:workers]]}
    return [{"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(workers)]


def bare_worker_env(tf_config: dict, steps: int, model_dir: Path) -> dict[str, str]:
    """What a bare worker of the baseline is given instead of what `nomadtf task` hands its
    code (the GPU it may use is the caller's: CUDA_VISIBLE_DEVICES for a process,
    NVIDIA_VISIBLE_DEVICES for a container). Pure."""
    return {
        "TF_CONFIG": json.dumps(tf_config),
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "NOMADTF_CONTEXT": json.dumps({"steps": steps, "log_every": 10, "checkpoint_every": steps}),
        "NOMADTF_MODEL_DIR": str(model_dir),
    }


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# ---- running it ------------------------------------------------------------------------


def _nomadtf(*args: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nomadtf", *args], capture_output=True, text=True, env=env, timeout=timeout)


def _api(env: dict, path: str, **params):
    import requests

    # GET {NOMAD_ADDR}/v1/<path>
    resp = requests.get(f"{env['NOMAD_ADDR']}/v1/{path}", params=params, timeout=10)
    resp.raise_for_status()
    return resp


def _worker_stdouts(env: dict, job_id: str) -> dict[str, str]:
    """Alloc name -> its stdout. GET /v1/job/:id/allocations ; GET /v1/client/fs/logs/:alloc"""
    out = {}
    for alloc in _api(env, f"job/{job_id}/allocations").json():
        text = _api(env, f"client/fs/logs/{alloc['ID']}", task=alloc["TaskGroup"], type="stdout", plain="true").text
        out[alloc["Name"]] = text
    return out


def _run_job(env: dict, spec: dict, workdir: Path) -> dict[str, list[tuple[float, str]]]:
    """`nomadtf run` the job to its end, stamping each worker's stdout lines as they appear."""
    path = workdir / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    stamped: dict[str, list[tuple[float, str]]] = {}
    seen: dict[str, str] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                texts = _worker_stdouts(env, spec["name"])
            except Exception:  # the job is not registered yet, or a log is not there yet
                texts = {}
            now = time.monotonic()
            for name, text in texts.items():
                old = seen.get(name, "")
                if len(text) > len(old):
                    stamped.setdefault(name, []).extend((now, line) for line in text[len(old):].splitlines() if line)
                    seen[name] = text
            time.sleep(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        run = _nomadtf("run", str(path), "--timeout", "15m", env=env, timeout=1000)
    finally:
        done.set()
        poller.join()
    if run.returncode != 0:
        raise BenchError(f"`nomadtf run {spec['name']}` failed:\n{run.stdout}{run.stderr}")
    for name, text in _worker_stdouts(env, spec["name"]).items():  # whatever came after the last poll
        old = seen.get(name, "")
        stamped.setdefault(name, []).extend((time.monotonic(), line) for line in text[len(old):].splitlines() if line)
    return stamped


def _run_bare(workers: int, steps: int, ids: tuple[str, ...], workdir: Path) -> list[tuple[float, str]]:
    """train_mwms.py as `workers` plain processes with a hand-written TF_CONFIG, one GPU each;
    the stamped stdout of worker 0."""
    configs = bare_tf_configs(workers, _free_ports(workers))
    procs = []
    for i, tf_config in enumerate(configs):
        env = {**os.environ, **bare_worker_env(tf_config, steps, workdir / "bare-model"), "CUDA_VISIBLE_DEVICES": ids[i]}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-u", "train_mwms.py"],
                cwd=EXAMPLES / "digits",
                env=env,
                stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    stamped = []
    try:
        for line in procs[0].stdout:
            stamped.append((time.monotonic(), line.rstrip("\n")))
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise BenchError(f"bare workers exited with {codes}")
    return stamped


def _run_bare_containers(client, image: str, workers: int, steps: int, ids: tuple[str, ...], workdir: Path) -> list[tuple[float, str]]:
    """train_mwms.py in `workers` plain containers of `image` (host network, the NVIDIA
    runtime, one GPU each, a hand-written TF_CONFIG): the baseline of the docker mode; the
    stamped stdout of worker 0. POST /containers/create ; /start ; GET /logs?follow"""
    configs = bare_tf_configs(workers, _free_ports(workers))
    model = workdir / "bare-model"
    model.mkdir(exist_ok=True)
    containers = []
    try:
        for i, tf_config in enumerate(configs):
            environment = {**bare_worker_env(tf_config, steps, model), "NVIDIA_VISIBLE_DEVICES": ids[i], "PYTHONUNBUFFERED": "1"}
            containers.append(client.containers.run(
                image, ["-u", "train_mwms.py"], entrypoint=["python3"], working_dir=f"{IMAGE_EXAMPLES}/digits",
                environment=environment, network_mode="host", runtime="nvidia", detach=True,
                volumes={str(model): {"bind": str(model), "mode": "rw"}},
            ))  # fmt: skip
        stamped = []
        pending = ""
        for chunk in containers[0].logs(stream=True, follow=True, stdout=True, stderr=False):
            pending += chunk.decode(errors="replace")
            *lines, pending = pending.split("\n")
            stamped.extend((time.monotonic(), line) for line in lines if line)
        codes = [c.wait(timeout=900)["StatusCode"] for c in containers]
    finally:
        for container in containers:
            container.remove(force=True)
    if any(codes):
        raise BenchError(f"bare worker containers exited with {codes}")
    return stamped


def plan(gpus: GpuInventory, workers: int, steps: int, state_dir: str, image: str | None = None, runtime: str | None = None) -> list[str]:
    """What a run does, in order (printed by --dry-run)."""
    where = f" in containers of {image} (driver docker)" if image else ""
    bare = f"as bare containers of {image} (runtime nvidia, one GPU each)" if image else "as bare processes"
    return [
        f"GPUs: {len(gpus.ids)} x {gpus.model} ({gpus.memory_mib} MiB): {', '.join(gpus.ids)}",
        f"start the single-node stack with NOMADTF_DEV_DIR={state_dir}"
        + (f" and its own Docker daemon (runtime nvidia = {runtime})" if image else "") + "; the Nomad client config gets:",
        textwrap.indent(gpus.plugin_hcl(gpu_plugin.plugin_dir()), "    "),
        f"run an MWMS job of {workers} workers x 1 GPU{where} printing tf.config.list_physical_devices('GPU'); "
        "each must list exactly one GPU, all different",
        f"train examples/digits/train_mwms.py ({steps} steps, {workers} workers x 1 GPU) under `nomadtf run`{where}, "
        f"then {bare} with a hand-written TF_CONFIG; print steps/s of both and the ratio",
        f"stop the stack and remove {state_dir}",
    ]


def nvidia_runtime() -> str:
    """The NVIDIA Container Toolkit's runtime, which the docker mode needs."""
    found = shutil.which("nvidia-container-runtime")
    if found is None:
        raise BenchError("--docker needs the NVIDIA Container Toolkit (nvidia-container-runtime on PATH): containers see no GPU without it")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="MWMS workers, one GPU each (default 2)")
    parser.add_argument("--steps", type=int, default=2000, help="training steps of each digits run")
    parser.add_argument("--docker", metavar="IMAGE", help="every task in a container of IMAGE (CUDA TensorFlow and nomadtf)")
    parser.add_argument("--dry-run", action="store_true", help="print what it would do and start nothing")
    args = parser.parse_args(argv)
    try:
        gpus = read_gpus()
        if len(gpus.ids) < args.workers:
            raise BenchError(f"{args.workers} workers need {args.workers} GPUs; this machine has {len(gpus.ids)}")
        runtime = nvidia_runtime() if args.docker else None
        if args.dry_run:
            print("\n".join(plan(gpus, args.workers, args.steps, "<a new temporary directory>", args.docker, runtime)))
            return 0
        return _bench(gpus, args.workers, args.steps, args.docker, runtime)
    except NomadtfError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _bench(gpus: GpuInventory, workers: int, steps: int, image: str | None = None, runtime: str | None = None) -> int:
    from nomadtf.devstack.stack import DevStack

    with tempfile.TemporaryDirectory(prefix="nomadtf-bench-gpu-") as tmp:
        work = Path(tmp)
        state_dir = work / "stack"
        os.environ["NOMADTF_DEV_DIR"] = str(state_dir)  # also for `nomadtf` children
        for line in plan(gpus, workers, steps, str(state_dir), image, runtime):
            print(line)
        stack = DevStack(state_dir)
        stack.gpus = len(gpus.ids)
        stack.gpu_inventory = gpus
        stack.up(progress=print, timeout=180, gpus=len(gpus.ids), docker=bool(image))
        try:
            env = {**os.environ, **stack.env()}
            (work / "gpu_probe.py").write_text(DEVICE_PROBE)
            probe = device_check_spec("bench-gpu-devices", work, workers, image)
            outputs = ["\n".join(line for _t, line in lines) for lines in _run_job(env, probe, work).values()]
            given = check_device_output(outputs, gpus.ids)
            print(f"device check: {workers} workers, each sees exactly one GPU: {', '.join(given)}")

            stamped = _run_job(env, digits_spec("bench-gpu-digits", workers, steps, image, work), work)
            under_nomadtf = max(steps_per_second(lines) for lines in stamped.values() if any(_STEP.match(x) for _t, x in lines))
            if image:
                bare = steps_per_second(_run_bare_containers(stack.daemon.client(timeout=900), image, workers, steps, gpus.ids, work))
            else:
                bare = steps_per_second(_run_bare(workers, steps, gpus.ids, work))
            what = "bare containers" if image else "bare processes"
            print(f"steps/s: nomadtf run {under_nomadtf:.1f}, {what} {bare:.1f}, ratio {under_nomadtf / bare:.3f}")
        finally:
            stack.down(progress=print)
    return 0


if __name__ == "__main__":
    sys.exit(main())

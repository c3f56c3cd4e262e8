"""The tf.data service, side by side in one run: steps/s of an input-bound training with its
pipeline in-process (0 data workers, the baseline) and read through a dispatcher and 2 data
workers, and how much of the training process's CPU moved to the data workers.

The pipeline and the model are examples/data-service/train.py's (a deliberately CPU-heavy
pure-TensorFlow map). The servers are nomadtf's own (`python -m nomadtf.usercode.dataservice`,
as the data roles run them), as local processes: the bench measures the service, not Nomad.
Each trainer is a fresh process; its CPU time (user + system, /proc via psutil) and the data
workers' are read around the timed steps only (warm-up steps excluded).

On this machine's few cores the trainer and the data workers share the same CPUs, so the
speed-up is bounded by the cores (the bench prints how many); on separate machines the data
workers add their own.

    python bench/bench_data_service.py [--steps 60] [--warmup 10] [--heavy 40] [--batch 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "data-service" / "train.py"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes and their children so far."""
    total = 0.0
    for pid in pids:
        proc = psutil.Process(pid)
        for p in (proc, *proc.children(recursive=True)):
            times = p.cpu_times()
            total += times.user + times.system
    return total


def trainer(args: argparse.Namespace) -> None:
    """One training process (run by the bench as a child): prints its figures as JSON."""
    import tensorflow as tf

    spec = importlib.util.spec_from_file_location("data_service_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    import keras

    params = {**example.DEFAULTS, "heavy": args.heavy, "batch_size": args.batch}
    model = keras.Sequential([keras.layers.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.05)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    iterator = iter(example.pipeline(params, args.service))

    @tf.function
    def step():
        x, y = next(iterator)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables, strict=True))
        return loss

    for _ in range(args.warmup):
        step()
    me = psutil.Process()
    cpu0, t0 = sum(me.cpu_times()[:2]), time.perf_counter()
    servers0 = cpu_seconds(args.server_pids)
    for _ in range(args.steps):
        step()
    elapsed = time.perf_counter() - t0
    print(json.dumps({"steps_per_s": args.steps / elapsed, "trainer_cpu_s": sum(me.cpu_times()[:2]) - cpu0,
                      "servers_cpu_s": cpu_seconds(args.server_pids) - servers0, "elapsed_s": elapsed}), flush=True)


def run_trainer(args: argparse.Namespace, service: str = "", server_pids: list[int] | None = None) -> dict:
    command = [sys.executable, __file__, "--trainer", "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--heavy", str(args.heavy), "--batch", str(args.batch), "--service", service,
               "--server-pids", ",".join(map(str, server_pids or []))]
    done = subprocess.run(command, env={**os.environ, **QUIET}, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"the trainer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def start_service(workdir: Path, workers: int) -> tuple[str, list[subprocess.Popen]]:
    """A dispatcher and `workers` data workers, as the data roles start them; waits until each
    worker has registered."""
    port = _free_port()
    url = f"grpc://127.0.0.1:{port}"
    env = {**os.environ, **QUIET, "TF_CPP_MIN_LOG_LEVEL": "0", "NOMADTF_DATA_SERVICE": url}
    module = [sys.executable, "-m", "nomadtf.usercode.dataservice"]
    procs, logs = [], []
    for i in range(workers + 1):
        log = workdir / f"server{i}.log"
        logs.append(log)
        if i == 0:
            args = ["dispatcher", "--port", str(port), "--work-dir", str(workdir / "journal")]
        else:
            wport = _free_port()
            args = ["worker", "--port", str(wport), "--address", f"127.0.0.1:{wport}"]
        with open(log, "w") as out:
            procs.append(subprocess.Popen([*module, *args], env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 180
    while not all("registered with" in log.read_text() for log in logs[1:]):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            sys.exit("the data service did not start:\n" + "\n".join(log.read_text()[-1500:] for log in logs))
        time.sleep(0.3)
    return url, procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="timed training steps in each mode")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the clock starts (tracing, the service's first reads)")
    parser.add_argument("--heavy", type=int, default=40, help="matmul rounds per example: how input-bound the training is")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="data workers")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--service", default="", help=argparse.SUPPRESS)
    parser.add_argument("--server-pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer:
        args.server_pids = [int(p) for p in args.server_pids.split(",") if p]
        trainer(args)
        return

    cores = os.cpu_count() or 1
    print(f"input-bound training: {args.steps} timed steps (after {args.warmup}), batch {args.batch}, {args.heavy} matmul rounds per example")
    base = run_trainer(args)
    with tempfile.TemporaryDirectory(prefix="bench-data-service-") as tmp:
        url, procs = start_service(Path(tmp), args.workers)
        try:
            served = run_trainer(args, url, [p.pid for p in procs])
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)

    def per_step(figures: dict, key: str) -> float:
        return figures[key] / (figures["steps_per_s"] * figures["elapsed_s"])

    moved = 1 - per_step(served, "trainer_cpu_s") / per_step(base, "trainer_cpu_s")
    print(f"0 data workers (in-process pipeline): {base['steps_per_s']:.2f} steps/s, trainer CPU {per_step(base, 'trainer_cpu_s') * 1000:.0f} ms/step")
    print(f"{args.workers} data workers (tf.data service):   {served['steps_per_s']:.2f} steps/s "
          f"({served['steps_per_s'] / base['steps_per_s']:.2f}x), trainer CPU {per_step(served, 'trainer_cpu_s') * 1000:.0f} ms/step, "
          f"dispatcher + data workers CPU {per_step(served, 'servers_cpu_s') * 1000:.0f} ms/step")
    print(f"trainer CPU moved to the data workers: {moved:.0%} of the in-process trainer's")
    print(f"this machine has {cores} core(s): the trainer and the data workers share them, so the speed-up is bounded "
          f"by the cores (at most about {cores}x here); on their own machines the data workers add theirs")


if __name__ == "__main__":
    main()

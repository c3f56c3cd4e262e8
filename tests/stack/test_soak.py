"""The chaos soak: the digits example trains for minutes under `nomadtf run` while seeded
random faults hit it one after another (tests/chaos.py: kill -9 of children and of
supervisors, Consul restarts, hung children), each once the job recovered from the last.

The proof: `nomadtf run` reports success, accuracy is above the example's floor, no fault
cost more than one checkpoint interval of progress, each fault replaced only the processes
the recovery policy restarts (a parameter server's crash restarts the chief's code; a
worker's or the chief's restarts nobody else; a Consul restart restarts nobody; under
multi-worker mirrored every worker restarts) and Nomad restarted only a killed `nomadtf
task`, and once the job ended none of its processes and none of its Consul sessions is
left. The seed is printed first; replay a failure with NOMADTF_SOAK_SEED=<seed>. Each run writes its faults and figures to
tests/.soak/<job>.json (and every task's logs next to it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import chaos
from tests.helpers import all_logs, purge, unique, wait_until, write_job
from tests.stack.test_recovery import ACCURACY_FLOOR, _spec

pytestmark = [pytest.mark.stack, pytest.mark.tf, pytest.mark.soak]

CHECKPOINT_EVERY = 50
FAULT_BOUND_S = 180.0  # one fault, from the hit to one checkpoint past recovery
# Recovery for a soak: in-place restarts are the point, so the budget never runs out
# (a hang costs its 20 s plus the 8 s stop grace).
RECOVERY = {"restart_attempts": 100, "restart_interval": "10m", "restart_delay": "1s",
            "reschedule_attempts": 2, "reschedule_delay": "5s", "hang_timeout": "20s"}


def _soak_spec(name: str, strategy: str, steps: int) -> dict:
    spec = _spec(name, strategy, steps=steps, log_every=CHECKPOINT_EVERY, checkpoint_every=CHECKPOINT_EVERY)
    spec["recovery"] = dict(RECOVERY)
    for role in spec["roles"].values():
        role["cpu"] = 200  # a reservation only (raw_exec): lets the soak share the node with other tests
    return spec


def _soak(stack, tmp_path: Path, strategy: str, steps: int, faults: int, extra: int, min_soak_s: float, image: str | None = None) -> None:
    seed = chaos.seed()
    print(f"\n[soak] {strategy}{' in containers' if image else ''}: seed {seed} (replay with NOMADTF_SOAK_SEED={seed})", flush=True)
    name = unique(("soak-ps" if strategy == "parameter_server" else "soak-mwms") + ("-docker" if image else ""))
    spec = _soak_spec(name, strategy, steps)
    if image:
        # Every task in a container of the image, the code from it; the memory is a real limit there.
        spec["driver"] = {"name": "docker", "image": image}
        spec["entrypoint"]["workdir"] = "/opt/nomadtf/examples/digits"
        spec["roles"]["chief"]["memory"] = 1536
    counts = {role: r["count"] for role, r in spec["roles"].items()}
    plan = chaos.schedule(seed, strategy, counts, faults, extra, CHECKPOINT_EVERY)
    print("[soak] schedule: " + ", ".join(f"{f.kind} {f.target} (+{f.after_steps} steps, +{f.delay_s}s)" for f in plan), flush=True)
    reports = chaos.report_dir()

    run_stderr = tmp_path / "run.stderr"
    with run_stderr.open("w") as err:
        follower = subprocess.Popen(
            [str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, spec)), "--timeout", "15m"],
            stdout=err, stderr=subprocess.STDOUT, env=dict(os.environ),
        )
    soak = chaos.Soak(name, strategy, counts, CHECKPOINT_EVERY, lambda: stack.restart_consul(progress=lambda _m: None),
                      alive=lambda: follower.poll() is None)
    try:
        try:
            soak.wait_for_training(240)
            for fault in plan:
                if len(soak.records) >= faults and soak.elapsed() >= min_soak_s:
                    break
                # Leave room for the fault's recovery before the training ends.
                if chaos.current_step(soak.producer_stdout()) + fault.after_steps + 20 * CHECKPOINT_EVERY > steps:
                    break
                record = soak.inject(fault, FAULT_BOUND_S)
                print(f"[soak] {record.number:>2} {record.at_s:6.1f}s {record.kind} {record.target}: next step "
                      f"{record.next_step_s}s, recovered {record.recovered_s}s, lost {record.steps_lost}", flush=True)
            soak.wait_for_end(600)
            code = follower.wait()
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n`nomadtf run` says:\n{run_stderr.read_text()[-3000:]}") from None
        training_s = round(soak.elapsed(), 1)
        stdout = soak.producer_stdout()
        history = chaos.events(stdout)
        accuracy = [float(line.split("=", 1)[1]) for line in stdout.splitlines() if line.startswith("final_accuracy=")]
        # Nomad marks the job dead as its tasks exit; give their processes a moment.
        time.sleep(3)
        leftovers = _settled(lambda: chaos.leftover_processes(name), 15)
        sessions = _settled(lambda: chaos.session_names(name), 15)
        result = {
            "seed": seed, "strategy": strategy, "job": name, "machine": f"{os.cpu_count()} cores",
            "steps": steps, "checkpoint_every": CHECKPOINT_EVERY, "hang_timeout": RECOVERY["hang_timeout"],
            "training_s": training_s, "nomadtf_run_exit": code, "final_accuracy": accuracy[-1] if accuracy else None,
            "summary": chaos.summary(soak.records), "faults": chaos.as_dicts(soak.records),
            "resumes": chaos.resumes_with_loss(history), "leftover_processes": leftovers, "sessions_left": sessions,
        }
        (reports / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"[soak] {strategy}, seed {seed}, {training_s:.0f}s of training, {len(soak.records)} faults:\n"
              f"{chaos.table(soak.records)}\n[soak] {json.dumps(result['summary'])}\n"
              f"[soak] written to {reports / (name + '.json')}", flush=True)

        assert code == 0, f"`nomadtf run` exited {code}:\n{run_stderr.read_text()[-3000:]}"
        assert len(soak.records) >= faults, f"only {len(soak.records)} faults fitted in {steps} steps: raise the steps"
        assert training_s >= min_soak_s, f"the training took {training_s}s, under {min_soak_s}s: raise the steps"
        assert accuracy and accuracy[-1] >= ACCURACY_FLOOR, accuracy
        assert history and history[0][0] == "step", f"the first run resumed from a checkpoint: {history[:3]}"
        assert chaos.step_regressions(history) == [], "step lines went back without a restart"
        too_costly = [(r, lost) for r, lost in chaos.resumes_with_loss(history) if lost > CHECKPOINT_EVERY]
        assert too_costly == [], f"restarts that lost more than one checkpoint interval (resumed from, lost): {too_costly}"
        assert all(r.hang_detected for r in soak.records if r.kind == chaos.HANG), "a hang ended without hang detection"
        # Role-aware recovery, fault by fault: only what the policy restarts is new.
        beyond = [(r.number, r.kind, r.target, r.replaced_beyond_policy, r.nomad_restarted_beyond_policy)
                  for r in soak.records if r.replaced_beyond_policy or r.nomad_restarted_beyond_policy]
        assert beyond == [], f"faults that replaced what the recovery policy leaves running (#, kind, target, processes, Nomad restarts): {beyond}"
        uncompared = [r.number for r in soak.records[:-1] if r.replaced_beyond_policy is None]
        assert uncompared == [], f"faults after which the job was not whole again before the training ended: {uncompared}"
        assert leftovers == {}, f"processes of the job left after its end: {leftovers}"
        assert sessions == [], f"Consul sessions of the job left after its end: {sessions}"
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        (reports / f"{name}.logs").write_text(all_logs(name))  # every task's, for a failure's post-mortem
        purge(name)


def _settled(look, timeout: float):
    """What `look` returns once it is empty, or after `timeout` what is still there."""
    try:
        wait_until(lambda: not look(), timeout, "nothing left")
    except AssertionError:
        pass
    return look()


def test_parameter_server_soak(stack, tmp_path):
    """One fault of every kind (each role's code, a `nomadtf task`, Consul, a hang) in a
    random order and at random moments, more while time is left."""
    _soak(stack, tmp_path, "parameter_server", steps=7000, faults=6, extra=4, min_soak_s=60)


def test_mirrored_soak(stack, tmp_path):
    _soak(stack, tmp_path, "multi_worker_mirrored", steps=4500, faults=5, extra=3, min_soak_s=90)


@pytest.mark.docker
def test_parameter_server_soak_in_containers(stack, tmp_path, task_image):
    """A short soak with every task in a container: the same faults (kill -9 of the code and of
    `nomadtf task`, which takes its container with it; Consul restarts; hangs) heal the same."""
    _soak(stack, tmp_path, "parameter_server", steps=5000, faults=4, extra=3, min_soak_s=60, image=task_image)

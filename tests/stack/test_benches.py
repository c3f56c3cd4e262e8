"""The benches under bench/ run end to end on the local stack, briefly (CI's smoke test):
each prints its table with every figure measured. No figure is judged here; the benches
print ratios and targets for a person to read (docs/benchmarks.md has the full runs)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.stack

# A minus sign belongs to a figure only where no word or figure runs into it ("-40", not "a-1").
NUMBER = r"(nan|(?<![\w.])-?[0-9]+(?:\.[0-9]+)?)"


def bench(*args: str, timeout: float) -> str:
    out = subprocess.run([sys.executable, str(REPO / "bench" / args[0]), *args[1:]], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def figures(text: str, label: str) -> list[float]:
    """The numbers on the report line that starts with `label`."""
    line = next((ln for ln in text.splitlines() if ln.startswith(label)), None)
    assert line is not None, f"no line {label!r} in:\n{text}"
    return [float(n) for n in re.findall(NUMBER, line[len(label):])]


def measured(values: list[float]) -> bool:
    return bool(values) and all(math.isfinite(v) and v >= 0 for v in values)


@pytest.mark.tf
@pytest.mark.timeout(600)
def test_bench_overhead_measures_bare_and_nomadtf_side_by_side(stack):
    out = bench("bench_overhead.py", "--rounds", "1", "--steps", "150", timeout=540)
    for label in ("submit -> first step (s)", "whole job (s)", "training speed (steps/s)"):
        bare, ours, ratio = figures(out, label)[:3]
        assert measured([bare, ours, ratio]), out
        assert ratio == pytest.approx(ours / bare, abs=0.01)
    assert re.search(r"nomadtf task: CPU [0-9.]+ s per task .* peak RSS [0-9.]+ MiB", out), out


@pytest.mark.timeout(600)
def test_bench_reconfig_times_moves_in_both_modes(stack):
    out = bench("bench_reconfig.py", "--moves", "2", timeout=540)
    for mode in ("watch", "template"):
        numbers = figures(out, mode)
        moves, detection_p50, detection_p99 = numbers[0], numbers[1], numbers[2]
        # Detection may be a little below zero: a member's watch can return before the
        # bench's own witness does (both wait on the same Consul index; the bench says so).
        assert moves == 2 and all(math.isfinite(d) and d > -1000 for d in (detection_p50, detection_p99)), out
        total_p50, total_p99, placed = numbers[-4], numbers[-3], numbers[-1]
        assert measured([total_p50, total_p99, placed]), out
        assert detection_p50 <= detection_p99 and total_p50 <= total_p99, out


@pytest.mark.timeout(600)
def test_bench_supervisor_counts_a_small_jobs_consul_requests(stack):
    out = bench("bench_supervisor.py", "--quick", timeout=540)
    assert "NOT MEASURED" not in out and "not steady state" not in out, out
    numbers = figures(out, "4 (mwm)")
    assert measured(numbers) and len(numbers) >= 5, out


@pytest.mark.timeout(420)
def test_bench_admission_times_admissions_and_releases_and_counts_requests_per_admission(stack):
    out = bench("bench_admission.py", "--queued", "10", "--rounds", "1", timeout=360)
    row = figures(out, "10 ")  # burst MHz, admissions/s, first, p50, p99, req/adm x2, KB/adm x2, step ms x2
    assert measured(row) and len(row) == 11, out
    assert row[3] <= row[4], out
    for window in ("10 burst", "10 one"):
        by_endpoint = figures(out, window)
        assert measured(by_endpoint) and len(by_endpoint) == 3 * 9, out  # requests (KB, ms) of 9 endpoints
    timed, missed, out_of_order, beside, board_kb, _others = figures(out, "10 queued:")
    assert (timed, missed, out_of_order, beside) == (20, 0, 0, 0) and measured([board_kb]), out


@pytest.mark.timeout(300)
def test_bench_preemption_measures_steps_lost_with_and_without_the_checkpoint_request(stack):
    out = bench("bench_preemption.py", "--rounds", "1", "--checkpoint-every", "40", timeout=280)
    for label in ("code that saves on the request:", "code that ignores it"):
        lost, worst, waited = figures(out, label)[:3]
        assert lost == worst >= 0 and waited > 0, out


@pytest.mark.timeout(420)
def test_bench_sharing_measures_fairness_utilisation_and_the_largest_runs_wait(stack):
    out = bench("bench_sharing.py", "--runs", "25", timeout=360)
    (jain,) = figures(out, "Jain's index over the busy period:")[:1]
    (utilisation,) = figures(out, "utilisation while runs wait:")[:1]
    assert 0 < jain <= 1 and 0 < utilisation <= 100, out
    assert figures(out, "largest runs' wait:"), out
    for team in range(1, 6):
        row = figures(out, f"bench-share-{team} ")
        assert measured(row) and len(row) == 5, out  # runs, size %, mean wait, core-s, held/fair


@pytest.mark.tf
@pytest.mark.timeout(400)
def test_bench_data_service_measures_0_and_2_data_workers_side_by_side():
    out = bench("bench_data_service.py", "--steps", "20", "--warmup", "5", timeout=360)
    base = figures(out, "0 data workers (in-process pipeline):")
    served = figures(out, "2 data workers (tf.data service):")
    assert len(base) == 2 and len(served) == 4 and measured(base + served), out  # steps/s, ms/step; steps/s, ratio, ms/step x2
    assert served[1] == pytest.approx(served[0] / base[0], abs=0.01)
    assert re.search(r"trainer CPU moved to the data workers: -?[0-9]+% of the in-process trainer's", out), out
    assert re.search(r"this machine has [0-9]+ core\(s\).*bounded by the cores", out), out

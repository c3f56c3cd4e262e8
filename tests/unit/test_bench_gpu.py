"""bench/bench_gpu.py, the real-GPU check, without GPUs: its parsing and checks, and
`--dry-run` with a fake `nvidia-smi` on PATH (no stack is started)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_gpu

REPO = Path(__file__).resolve().parents[2]
UUIDS = ["GPU-0f3c9a2e-1111-4222-8333-444455556666", "GPU-8a21b7c4-aaaa-4bbb-8ccc-ddddeeeeffff"]
SMI_OUTPUT = "".join(f"{uuid}, NVIDIA A100-SXM4-40GB, 40960 MiB\n" for uuid in UUIDS)


def _fake_nvidia_smi(folder: Path, output: str = SMI_OUTPUT, code: int = 0) -> dict[str, str]:
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat <<'END'\n{output}END\nexit {code}\n")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def _dry_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--dry-run", *args],
        capture_output=True, text=True, env=env, timeout=60,
    )


def test_dry_run_writes_a_plugin_config_naming_exactly_the_machines_gpus(tmp_path):
    out = _dry_run(_fake_nvidia_smi(tmp_path / "bin"))
    assert out.returncode == 0, out.stderr
    assert f'ids        = ["{UUIDS[0]}", "{UUIDS[1]}"]' in out.stdout, out.stdout
    assert 'model      = "NVIDIA A100-SXM4-40GB"' in out.stdout and "memory_mib = 40960" in out.stdout
    assert "count      = 2" in out.stdout
    assert "bare processes" in out.stdout and "NOMADTF_DEV_DIR" in out.stdout


def test_without_nvidia_smi_the_error_says_so(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing there
    out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--dry-run"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1 and "nvidia-smi is not on PATH" in out.stderr, out.stderr


def test_more_workers_than_gpus_is_refused(tmp_path):
    out = _dry_run(_fake_nvidia_smi(tmp_path / "bin"), "--workers", "3")
    assert out.returncode == 1 and "3 workers need 3 GPUs; this machine has 2" in out.stderr, out.stderr


def test_odd_nvidia_smi_output_is_refused():
    with pytest.raises(bench_gpu.BenchError, match="no GPUs"):
        bench_gpu.parse_nvidia_smi("\n")
    with pytest.raises(bench_gpu.BenchError, match="one model"):
        bench_gpu.parse_nvidia_smi(f"{UUIDS[0]}, A, 10 MiB\n{UUIDS[1]}, B, 10 MiB\n")
    with pytest.raises(bench_gpu.BenchError, match="memory.total"):
        bench_gpu.parse_nvidia_smi(f"{UUIDS[0]}, A, [N/A]\n")


def test_each_worker_must_see_exactly_one_distinct_gpu():
    ok = [f"visible_uuids={u}\ntf_gpus=1 /physical_device:GPU:0\n" for u in UUIDS]
    assert bench_gpu.check_device_output(ok, tuple(UUIDS)) == UUIDS
    with pytest.raises(bench_gpu.BenchError, match="same GPU"):
        bench_gpu.check_device_output([ok[0], ok[0]], tuple(UUIDS))
    with pytest.raises(bench_gpu.BenchError, match="exactly one"):
        bench_gpu.check_device_output([f"visible_uuids={UUIDS[0]}\ntf_gpus=0 \n"], tuple(UUIDS))


def test_steps_per_second_and_bare_tf_configs():
    lines = [(0.0, "starting"), (1.0, "step=10 loss=1.0"), (3.0, "step=50 loss=0.5"), (4.0, "final_accuracy=0.9")]
    assert bench_gpu.steps_per_second(lines) == 20.0
    configs = bench_gpu.bare_tf_configs(2, [2001, 2002])
    assert configs[1] == {"cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"]}, "task": {"type": "worker", "index": 1}}


def test_docker_mode_needs_the_nvidia_container_toolkit_and_says_so(tmp_path):
    env = _fake_nvidia_smi(tmp_path / "bin")
    out = _dry_run(env, "--docker", "registry.example.com/nomadtf:tf2.21.0-gpu")
    assert out.returncode == 1 and "NVIDIA Container Toolkit (nvidia-container-runtime on PATH)" in out.stderr, out.stderr
    toolkit = tmp_path / "bin" / "nvidia-container-runtime"
    toolkit.write_text("#!/bin/sh\n")
    toolkit.chmod(0o755)
    out = _dry_run(env, "--docker", "registry.example.com/nomadtf:tf2.21.0-gpu")
    assert out.returncode == 0, out.stderr
    assert f"runtime nvidia = {toolkit}" in out.stdout
    assert "in containers of registry.example.com/nomadtf:tf2.21.0-gpu (driver docker)" in out.stdout
    assert "as bare containers of registry.example.com/nomadtf:tf2.21.0-gpu" in out.stdout


def test_docker_mode_jobs_run_every_worker_in_the_image_with_the_probe_mounted(tmp_path):
    probe = bench_gpu.device_check_spec("p", tmp_path, 2, "img:gpu")
    assert probe["driver"] == {"name": "docker", "image": "img:gpu", "gpu_image": "img:gpu", "volumes": [f"{tmp_path}:{tmp_path}:ro"]}
    digits = bench_gpu.digits_spec("d", 2, 100, "img:gpu", tmp_path)
    assert digits["entrypoint"]["workdir"] == "/opt/nomadtf/examples/digits" and digits["driver"]["gpu_image"] == "img:gpu"
    assert "driver" not in bench_gpu.digits_spec("d", 2, 100)

"""The GPU memory cap (nomadtf.usercode.gpulimit): the cap is set before the user's code runs, and the
code then runs as `python script.py args` / `python -m module args` would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nomadtf.usercode import gpulimit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORD = "import json, os, sys\njson.dump({'argv': sys.argv, 'name': __name__, 'path0': sys.path[0]}, open(os.environ['SEEN'], 'w'))\n"


@pytest.fixture
def capped(monkeypatch, tmp_path):
    """TensorFlow's part played by a stand-in that records the limit and sees two GPUs."""
    limits: list[int] = []

    def cap(limit_mib):
        limits.append(limit_mib)
        return ["/physical_device:GPU:0", "/physical_device:GPU:1"]

    monkeypatch.setattr(gpulimit, "cap_gpu_memory", cap)
    monkeypatch.setenv("NOMADTF_GPU_MEMORY_LIMIT_MIB", "4096")
    monkeypatch.setenv("SEEN", str(tmp_path / "seen.json"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield limits
    sys.modules.pop("trainer_mod", None)


def test_a_script_runs_as_main_with_its_arguments_and_its_directory_first_on_the_path(capped, tmp_path, capsys):
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text(RECORD)
    gpulimit.main([str(script), "--epochs", "2"])
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": [str(script), "--epochs", "2"], "name": "__main__", "path0": str(script.parent)}
    assert capped == [4096]  # before the code ran
    assert capsys.readouterr().err == "nomadtf: TensorFlow memory capped at 4096 MiB on /physical_device:GPU:0, /physical_device:GPU:1\n"


def test_a_module_runs_as_main_with_its_arguments(capped, tmp_path, monkeypatch):
    (tmp_path / "trainer_mod.py").write_text(RECORD)
    monkeypatch.syspath_prepend(str(tmp_path))
    gpulimit.main(["-m", "trainer_mod", "--lr", "0.1"])
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["name"] == "__main__" and seen["argv"][1:] == ["--lr", "0.1"]
    assert seen["argv"][0] == str(tmp_path / "trainer_mod.py")  # as `python -m` sets it
    assert capped == [4096]


FAKE_TF = """
# A stand-in for TensorFlow's device configuration: two GPUs, and a record of each call.
import json, os
class PhysicalDevice:
    def __init__(self, name): self.name = name
class LogicalDeviceConfiguration:
    def __init__(self, memory_limit=None): self.memory_limit = memory_limit
class config:
    LogicalDeviceConfiguration = LogicalDeviceConfiguration
    calls = []
    @staticmethod
    def list_physical_devices(kind):
        return [PhysicalDevice(f"/physical_device:{kind}:{i}") for i in range(2)]
    @staticmethod
    def set_logical_device_configuration(device, logical):
        config.calls.append([device.name, [c.memory_limit for c in logical]])
        json.dump(config.calls, open(os.environ["CALLS"], "w"))
"""


def test_as_a_process_each_gpu_becomes_one_logical_device_of_the_limit_before_the_code_runs(tmp_path):
    """`python -m nomadtf.usercode.gpulimit train.py ...`, as launch.child_argv starts it; TensorFlow is a
    stand-in that records its configuration calls (this machine has no GPU to cap)."""
    (tmp_path / "tf" / "tensorflow").mkdir(parents=True)
    (tmp_path / "tf" / "tensorflow" / "__init__.py").write_text(FAKE_TF)
    (tmp_path / "train.py").write_text("import json, os, sys\nprint(json.dumps({'calls': json.load(open(os.environ['CALLS'])), 'argv': sys.argv[1:]}))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "tf"), ROOT]), "NOMADTF_GPU_MEMORY_LIMIT_MIB": "512",
           "CALLS": str(tmp_path / "calls.json")}
    done = subprocess.run([sys.executable, "-u", "-m", "nomadtf.usercode.gpulimit", str(tmp_path / "train.py"), "--steps", "3"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "calls": [["/physical_device:GPU:0", [512]], ["/physical_device:GPU:1", [512]]],  # made before the code started
        "argv": ["--steps", "3"],
    }
    assert done.stderr == "nomadtf: TensorFlow memory capped at 512 MiB on /physical_device:GPU:0, /physical_device:GPU:1\n"

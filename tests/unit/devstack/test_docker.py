"""devstack/docker.py: where a stack's private Docker daemon lives and how it is started
and wired into Nomad (the daemon itself runs in tests/stack/test_docker.py)."""

from __future__ import annotations

from pathlib import Path

from nomadtf.devstack.docker import Daemon


def test_each_stack_has_its_own_socket_exec_root_and_images(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path / "cache"))
    one, two = Daemon.for_stack(tmp_path / "a"), Daemon.for_stack(tmp_path / "b")
    assert one.socket == tmp_path / "a" / "docker.sock" and one.host == f"unix://{tmp_path / 'a' / 'docker.sock'}"
    assert one.exec_root != two.exec_root and one.data_root != two.data_root
    assert one.data_root.is_relative_to(tmp_path / "cache")  # images outlive the stack's state
    # containerd's socket lies under the exec root: a unix socket path holds 107 bytes at most.
    assert len(str(one.exec_root / "containerd" / "containerd-debug.sock")) < 100
    assert Daemon.for_stack(tmp_path / "a") == one


def test_no_bridge_no_iptables_and_nvidia_for_the_fake_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/sbin/{name}" if name == "dockerd" else None)
    argv = Daemon.for_stack(tmp_path).argv()
    assert argv[0] == "/usr/sbin/dockerd"
    assert {"--bridge=none", "--iptables=false", "--ip6tables=false"} <= set(argv)
    assert argv[argv.index("--add-runtime") + 1] == "nvidia=runc"  # no toolkit here: the fake GPUs need no hook
    assert argv[argv.index("--host") + 1] == f"unix://{tmp_path / 'docker.sock'}"


def test_with_the_nvidia_container_toolkit_the_nvidia_runtime_is_its(tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    argv = Daemon.for_stack(tmp_path).argv()
    assert argv[argv.index("--add-runtime") + 1] == "nvidia=/usr/bin/nvidia-container-runtime"


def test_nomad_s_docker_plugin_points_at_it_and_keeps_images(tmp_path):
    hcl = Daemon.for_stack(tmp_path).plugin_hcl()
    assert f'endpoint = "unix://{Path(tmp_path) / "docker.sock"}"' in hcl
    assert "volumes {\n      enabled = false" in hcl  # no job bind-mounts a host path: host volumes instead
    assert "gc {\n      image = false" in hcl

"""A local stack's private Docker daemon (`nomadtf dev up --docker`): Debian's `dockerd`
with a data root, exec root and socket of its own, so it never meets the machine's own
Docker (if any) and the stack's `down` stops exactly it.

Network rule: no default bridge (Docker's 172.17.0.0/16 is a private range) and no
iptables rules; containers use the host network (`network_mode = "host"` in the jobs
nomadtf renders), so TensorFlow's ports are the client's, as under raw_exec.

    <state>/docker.sock                       the daemon's API (DOCKER_HOST=unix://...)
    <state>/docker.pid                        its pidfile
    /run/nomadtf-docker/<key>/                its exec root (containerd's socket: a short path)
    ~/.cache/nomadtf/docker/<key>/            its data root: images outlive `dev down`, so
                                              `nomadtf dev image build` runs once per machine

<key> names the stack's state directory, so each stack keeps its own images.

`nvidia` is registered as a runtime: Nomad's docker driver asks for it whenever a task holds
NVIDIA devices (the fake GPUs too). It is the NVIDIA Container Toolkit's
`nvidia-container-runtime` where that is installed (a machine with real GPUs: the container
then sees exactly the GPUs in NVIDIA_VISIBLE_DEVICES), else a second name for runc (the fake
GPUs need no hook).

Usage:
    daemon = Daemon.for_stack(state_dir)
    component = daemon.start()
    daemon.wait_ready(timeout=60, log=component.log)
    daemon.client().containers.list()      # the Docker SDK for Python
    daemon.plugin_hcl()                    # the Nomad client's `plugin "docker"` block
    daemon.remove_containers()             # before the daemon stops
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from nomadtf.devstack import agents, taskhost
from nomadtf.devstack.gobuild import cache_dir
from nomadtf.devstack.probes import wait_for
from nomadtf.devstack.record import Component
from nomadtf.errors import DevStackError

EXEC_ROOTS = Path("/run/nomadtf-docker")
# Debian's docker.io (scripts/setup installs it); `dockerd` on PATH otherwise.
DOCKERD = "dockerd"


def nvidia_runtime() -> str:
    """What the daemon's `nvidia` runtime runs: the NVIDIA Container Toolkit's when it is
    installed, else runc."""
    return shutil.which("nvidia-container-runtime") or "runc"


def _key(state_dir: Path) -> str:
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Daemon:
    """Where one stack's Docker daemon keeps its socket, state and images."""

    state_dir: Path
    socket: Path
    exec_root: Path
    data_root: Path

    @classmethod
    def for_stack(cls, state_dir: Path) -> Daemon:
        key = _key(state_dir)
        return cls(state_dir, state_dir / "docker.sock", EXEC_ROOTS / key, cache_dir() / "docker" / key)

    @property
    def host(self) -> str:
        """DOCKER_HOST for it."""
        return f"unix://{self.socket}"

    def argv(self) -> list[str]:
        binary = shutil.which(DOCKERD)
        if binary is None:
            raise DevStackError("`dev up --docker` needs dockerd: install Debian's docker.io (scripts/setup does)")
        return [
            binary,
            "--data-root", str(self.data_root),
            "--exec-root", str(self.exec_root),
            "--host", self.host,
            "--pidfile", str(self.state_dir / "docker.pid"),
            "--bridge=none", "--iptables=false", "--ip6tables=false",
            "--add-runtime", f"nvidia={nvidia_runtime()}",
        ]  # fmt: skip

    def start(self, namespace: str | None = None, name: str = "docker") -> Component:
        """Start the daemon (in the network namespace `namespace`: a client of the
        several-client stack, whose host network its containers then share)."""
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.exec_root.mkdir(parents=True, exist_ok=True)
        return agents.spawn(self.state_dir, name, self.argv(), agents.base_env(), namespace, host_sys=namespace is not None)

    def client(self, timeout: float = 60.0):
        """The Docker SDK for Python, on this daemon only (never DOCKER_HOST of the caller)."""
        import docker

        return docker.DockerClient(base_url=self.host, timeout=timeout)

    def answers(self) -> bool:
        try:
            return bool(self.client(timeout=3).ping())
        except Exception:  # noqa: BLE001 (not up yet: a missing socket, a refused connection)
            return False

    def wait_ready(self, timeout: float, log: str) -> None:
        wait_for(self.answers, timeout, "docker", log)

    def remove_containers(self) -> int:
        """Remove every container of this daemon (running ones are killed). The number removed."""
        if not self.socket.exists() or not self.answers():
            return 0
        containers = self.client().containers.list(all=True)
        for container in containers:
            container.remove(force=True)
        return len(containers)

    def plugin_hcl(self) -> str:
        """The Nomad client's `plugin "docker"` block, pointed at this daemon."""
        return taskhost.docker_plugin_hcl(self.host)

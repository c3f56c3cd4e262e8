"""What a local stack's Nomad clients give the tasks they run, beside the agent itself: the
checkpoint host volumes (one per namespace, and the public CA's directory) and the docker
driver's configuration (a stack's own daemon, no bind mounts). `wiring.py` puts both into
the agents' files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nomadtf import wire
from nomadtf.devstack.gpu_plugin import hcl_string

# The namespaces whose docker tasks the local stacks can place: each has its checkpoint
# folder declared as a host volume (wire.checkpoint_volume) under the default model_dir's root.
CHECKPOINT_ROOT = Path("/tmp/nomadtf")
VOLUME_NAMESPACES = ("default", "team-a", "team-b")


def host_volumes(ca_dir: Path | None = None) -> dict[str, tuple[Path, bool]]:
    """The client's host volumes, name -> (path, read-only): each namespace's checkpoint
    folder, read-write, and the directory of the public CA file, read-only. The folders are
    made here (Nomad refuses to start a client whose host volume path is missing); 0711: a
    task sees no other job's folder names, each job's folder is its own (runtime/codeuser)."""
    volumes = {}
    for namespace in VOLUME_NAMESPACES:
        folder = CHECKPOINT_ROOT / namespace
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o711)
        volumes[wire.checkpoint_volume(namespace)] = (folder, False)
    if ca_dir is not None:
        volumes[wire.CA_VOLUME] = (ca_dir, True)
    return volumes


def host_volume_lines(volumes: Mapping[str, tuple[Path, bool]]) -> list[str]:
    """`host_volume` blocks, to go inside a `client` block."""
    lines = []
    for name, (path, read_only) in sorted(volumes.items()):
        lines += [f"  host_volume {hcl_string(name)} {{", f"    path      = {hcl_string(str(path))}",
                  f"    read_only = {str(read_only).lower()}", "  }"]
    return lines


def docker_plugin_hcl(endpoint: str) -> str:
    """A Nomad client's docker driver, pointed at a stack's own daemon: no bind mounts of
    host paths (`volumes.enabled = false`: checkpoints come through the client's host
    volumes, which Nomad's ACLs gate per namespace), images kept after their tasks (Nomad's
    image GC would delete the images `dev image build` made, which no registry can give
    back), and the `nvidia` runtime a task with NVIDIA devices asks for."""
    return f"""
plugin "docker" {{
  config {{
    endpoint = "{endpoint}"
    volumes {{
      enabled = false
    }}
    gc {{
      image = false
    }}
    allow_runtimes = ["runc", "nvidia"]
    # `docker ps` says which job, group and task a container is.
    extra_labels = ["job_name", "task_group_name", "task_name", "namespace"]
  }}
}}
"""

"""Training code that looks at what it should not reach (tests/stack/test_hygiene.py). Prints
one `name=value` line per check.

With `--parent-environ` (its parent: a stand-in supervisor that runs it through `Child`):
- supervisor_environ: `denied` when /proc/<parent>/environ cannot be read. The code first
  gives up CAP_SYS_PTRACE, CAP_SYS_ADMIN and CAP_PERFMON, each of which lets root read a
  non-dumpable process's environment; the test starts the parent without them too, so what
  is left is the rule for an ordinary uid (the child's uid is the supervisor's).

Without it (as a job's training code, its parent the real supervisor):
- orphan: `reaped` when a grandchild that exited (re-parented to the supervisor, its
  subreaper) was collected within a few seconds, `zombie` when it still waits.
- health_bind: the address the supervisor's health endpoint listens on, and NOMAD_IP_health.
- spec_file_approle: whether the spec file in the task directory names NOMADTF_VAULT_ROLE_ID
  (set in job.json `env` by the test), and whether our own environment has it.
"""

import ctypes
import os
import sys
import time

# Each lets the kernel's ptrace access check pass for a non-dumpable process.
CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON = 19, 21, 38
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_ptrace_capabilities() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for cap in (CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON):
        word, bit = divmod(cap, 32)
        for field in ("effective", "permitted", "inheritable"):
            setattr(data[word], field, getattr(data[word], field) & ~(1 << bit))
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def supervisor_environ(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            fh.read()
    except OSError:
        return "denied"
    return "readable"


def orphan_state() -> str:
    """Double-fork: the grandchild exits at once and is re-parented to our parent."""
    read_fd, write_fd = os.pipe()
    middle = os.fork()
    if middle == 0:
        grandchild = os.fork()
        if grandchild == 0:
            os._exit(0)
        os.write(write_fd, str(grandchild).encode())
        os._exit(0)
    os.waitpid(middle, 0)
    os.close(write_fd)
    grandchild = int(os.read(read_fd, 32))
    deadline = time.monotonic() + 5
    state = "?"
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{grandchild}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "reaped"
        time.sleep(0.1)
    return "zombie" if state == "Z" else f"still-{state}"


def health_bind() -> str:
    port = int(os.environ.get("NOMAD_PORT_health", "0"))
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            return ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return "none"


def main() -> None:
    if "--parent-environ" in sys.argv:
        drop_ptrace_capabilities()
        print(f"supervisor_environ={supervisor_environ(os.getppid())}", flush=True)
        return
    print(f"orphan={orphan_state()}", flush=True)
    print(f"health_bind={health_bind()} nomad_ip_health={os.environ.get('NOMAD_IP_health', '')}", flush=True)
    spec_file = os.path.join(os.environ.get("NOMAD_TASK_DIR", "."), "nomadtf-spec.json")
    held = "NOMADTF_VAULT_ROLE_ID" in open(spec_file).read()
    print(f"spec_file_approle={held} child_env_approle={'NOMADTF_VAULT_ROLE_ID' in os.environ}", flush=True)


main()

"""`nomadtf task`: the supervisor inside every allocation.

    1. serve /health on the `health` port (Nomad's service check; the service itself,
       with the TensorFlow port and tags, is registered in Consul by Nomad)
    2. claim a unique, stable index (Consul lock; NOMAD_ALLOC_INDEX is only a preference)
    3. rendezvous: blocking queries until every member is registered and passing
    4. build TF_CONFIG; read secrets from Vault
    5. run the child: user code, a bare TF server, or the legacy main()
    6. watch: a peer moved or lost its state -> one new generation for the whole job (CAS
       in Consul KV); the roles that must restart restart their child with the new TF_CONFIG
    7. end cleanly: chief exits 0 -> job state "succeeded"; everyone else stops and exits 0

What restarts when (the policy, see README "Recovery"):
    parameter_server  chief: a peer's address changed, or a parameter server lost its state
                      worker / ps: never for a peer (TensorFlow's coordinator re-connects)
    multi_worker_mirrored  every worker and the chief: any peer changed (all-reduce needs all)
    legacy_server     every user-code task: an address changed or a ps lost its state
    own child crashed (signal, >= 128)    restarted in place, from the last checkpoint
    own child exited with a permanent code   the task exits with it; Nomad's policy applies
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from nomadtf import cluster
from nomadtf import secrets as secrets_mod
from nomadtf.cluster import Member
from nomadtf.discovery import ConsulDiscovery
from nomadtf.errors import NomadtfError, RendezvousTimeout, ServerError, TaskError
from nomadtf.progress import read as read_progress
from nomadtf.spec import duration_seconds, role_counts

log = logging.getLogger("nomadtf.task")

DEBOUNCE_S = 1.5  # a change must hold this long before anyone acts on it
SETTLE_S = 12.0  # after a child failure, how long to look for a peer change that explains it
STOP_GRACE_S = 8.0  # SIGTERM -> SIGKILL for our child (below Nomad's kill_timeout)
STRAGGLER_GRACE_S = 30.0  # after success, how long a still-running peer gets to finish
SAFETY_LOOK_S = 10.0  # read Consul at least this often even when no watch fired


@dataclass
class AllocInfo:
    """What Nomad tells the task about itself through its environment."""

    job_id: str
    alloc_id: str
    alloc_index: int
    tf_port: int
    health_port: int
    task_dir: Path
    secrets_dir: Path

    @classmethod
    def from_environ(cls, env: dict[str, str]) -> AllocInfo:
        try:
            return cls(
                job_id=env["NOMAD_JOB_ID"],
                alloc_id=env["NOMAD_ALLOC_ID"],
                alloc_index=int(env.get("NOMAD_ALLOC_INDEX", "0")),
                tf_port=int(env["NOMAD_PORT_tf"]),
                health_port=int(env["NOMAD_PORT_health"]),
                task_dir=Path(env.get("NOMAD_TASK_DIR", ".")),
                secrets_dir=Path(env.get("NOMAD_SECRETS_DIR", ".")),
            )
        except KeyError as exc:
            raise TaskError(f"{exc.args[0]} is not set: `nomadtf task` runs inside a Nomad allocation of a rendered job") from None


# ---- pure decisions (unit-tested) ------------------------------------------------------------


def fingerprint(members: list[Member]) -> str:
    return json.dumps(sorted((m.role, m.index, m.address, m.alloc_id) for m in members))


def must_restart(strategy: str, role: str, index: int, old: list[Member], new: list[Member]) -> bool:
    """Does this task's child need the new cluster? See the module docstring for the policy."""
    if not cluster.runs_user_code(strategy, role) and strategy != "multi_worker_mirrored":
        return False
    if role == "evaluator":
        return False  # it reads checkpoints; it does not talk to the cluster
    before = {(m.role, m.index): m for m in old}
    after = {(m.role, m.index): m for m in new}
    changed = [slot for slot in set(before) | set(after) if before.get(slot) != after.get(slot)]
    moved = [s for s in changed if (before.get(s) and after.get(s) and before[s].address != after[s].address)]
    if strategy == "multi_worker_mirrored":
        return any(s != (role, index) and s[0] in ("chief", "worker") for s in changed)
    if moved:
        return True
    return any(s[0] == "ps" for s in changed)


def exit_class(code: int, permanent: list[int]) -> str:
    """"ok", "permanent" (the code is broken: stop), or "retryable" (crash, signal, OOM)."""
    if code == 0:
        return "ok"
    if code < 0 or code >= 128:
        return "retryable"
    return "permanent" if code in permanent else "retryable"


def completes_job(strategy: str, role: str, index: int, counts: dict[str, int]) -> bool:
    """Whose clean exit means the training is done."""
    if counts.get("chief"):
        return role == "chief"
    return strategy != "parameter_server" and role == "worker" and index == 0


class Settled:
    """A change counts once it has held for `hold_s` (consul-template's debounce): a
    registration that flaps, or peers seen in a different order, causes no restart."""

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self.value: str | None = None
        self.since = 0.0

    def observe(self, value: str, now: float) -> bool:
        if value != self.value:
            self.value, self.since = value, now
            return False
        return now - self.since >= self.hold_s


# ---- the health endpoint ---------------------------------------------------------------------


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass  # Nomad checks every 2 s; not worth a log line each


def start_health_server(port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("0.0.0.0", port), _Health)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


# ---- the child process -----------------------------------------------------------------------


def _die_with_parent() -> None:
    # If `nomadtf task` is killed -9, its TensorFlow child must not keep the port.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    proc: subprocess.Popen
    members: list[Member]
    generation: int


class Supervisor:
    def __init__(self, spec: dict[str, Any], role: str, alloc: AllocInfo, discovery: ConsulDiscovery):
        self.spec = spec
        self.role = role
        self.alloc = alloc
        self.discovery = discovery
        self.strategy = spec["strategy"]
        self.counts = role_counts(spec)
        self.index = -1
        self.incarnation = uuid.uuid4().hex[:12]
        self.events: queue.Queue[str] = queue.Queue()
        self.stop_signal: int | None = None
        self.child: Child | None = None
        self.secret_env: dict[str, str] = {}
        self.renewer: secrets_mod.LeaseRenewer | None = None
        self.recoveries: list[float] = []
        self.progress_file = alloc.task_dir / "nomadtf-progress.json"
        self.last_progress: dict[str, Any] | None = None
        self.last_step_change = time.monotonic()
        self.template_file = alloc.task_dir / "nomadtf-cluster.json"
        self.rendezvous_timeout = duration_seconds(spec["discovery"]["rendezvous_timeout"])
        self.hang_timeout = duration_seconds(spec["recovery"]["hang_timeout"])
        self.permanent = list(spec["recovery"]["permanent_exit_codes"])

    # ---- lifecycle ----------------------------------------------------------------------

    def run(self) -> int:
        self._install_signal_handlers()
        health = start_health_server(self.alloc.health_port)
        try:
            return self._run()
        finally:
            self._stop_child()
            if self.renewer:
                self.renewer.stop_event.set()
            self.discovery.close()
            health.shutdown()

    def _run(self) -> int:
        if self.discovery.job_state() == "succeeded":
            log.info("the job already succeeded; nothing to do")
            return 0
        self.discovery.open_session(f"nomadtf {self.alloc.job_id} {self.role} {self.alloc.alloc_id[:8]}")
        self._claim_index()
        self._start_watchers()
        if self.role == "tensorboard":
            return self._run_tensorboard()
        members = self._rendezvous()
        generation = self.discovery.bump_generation(fingerprint(members))
        if cluster.runs_user_code(self.strategy, self.role) and self.spec["secrets"]:
            self._fetch_secrets()
        self._start_child(members, generation.get("generation", 1))
        return self._supervise()

    def _install_signal_handlers(self) -> None:
        def on_stop(signum: int, _frame: Any) -> None:
            self.stop_signal = signum
            self.events.put("stop")

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, lambda *_: self.events.put("template"))

    # ---- index and rendezvous -------------------------------------------------------------

    def _claim_index(self) -> None:
        count = self.counts.get(self.role, 1)
        deadline = time.monotonic() + self.rendezvous_timeout
        while True:
            index = self.discovery.claim_slot(self.role, count, self.alloc.alloc_id, self.alloc.alloc_index, self.incarnation)
            if index is not None:
                if index != self.alloc.alloc_index:
                    log.warning("NOMAD_ALLOC_INDEX=%d is held by another allocation; using index %d", self.alloc.alloc_index, index)
                self.index = index
                log.info("holding %s[%d] (alloc %s, incarnation %s)", self.role, index, self.alloc.alloc_id[:8], self.incarnation)
                return
            if time.monotonic() > deadline:
                raise TaskError(f"every {self.role} index (0..{count - 1}) is held by a live task; is a previous run still stopping?")
            time.sleep(1.0)

    def _ensure_slot(self, slots: dict) -> None:
        """After a Consul restart (dev agents forget everything) take our slot back."""
        slot = slots.get((self.role, self.index))
        if slot and slot.alloc_id == self.alloc.alloc_id and slot.session == self.discovery.session:
            return
        log.warning("our slot %s[%d] is gone (Consul restarted?); claiming it again", self.role, self.index)
        self.discovery.close()
        self.discovery.open_session(f"nomadtf {self.alloc.job_id} {self.role} {self.alloc.alloc_id[:8]}")
        self.alloc.alloc_index = self.index
        self._claim_index()

    def _members(self, slots: dict | None = None) -> list[Member]:
        slots = self.discovery.slots() if slots is None else slots
        if self.spec["discovery"]["reconfigure"] == "template":
            return self._members_from_template(slots)
        return self.discovery.members(self.counts, slots)

    def _members_from_template(self, slots: dict) -> list[Member]:
        """The file Nomad's template block renders from the Consul catalog (reconfigure=template)."""
        try:
            data = json.loads(self.template_file.read_text())
        except (OSError, ValueError):
            return []
        members = []
        for group in data.get("members", []):
            by_alloc = {}
            for inst in group.get("instances", []):
                tags = dict(t.split("=", 1) for t in inst.get("tags", []) if "=" in t)
                by_alloc[tags.get("alloc", "")] = inst["address"]
            for (role, index), slot in slots.items():
                if role == group["role"] and slot.alloc_id in by_alloc and index < self.counts.get(role, 0):
                    members.append(Member(role, index, by_alloc[slot.alloc_id], f"{slot.alloc_id}/{slot.incarnation}"))
        return sorted(members)

    def _rendezvous(self) -> list[Member]:
        started = time.monotonic()
        deadline = started + self.rendezvous_timeout
        last_missing: list[str] = []
        while True:
            members = self._safe_members()
            missing = cluster.missing_members(self.counts, members)
            if not missing:
                log.info("cluster complete after %.1fs: %s", time.monotonic() - started, _describe(members))
                return members
            if missing != last_missing:
                log.info("waiting for %s", ", ".join(missing))
                last_missing = missing
            if time.monotonic() > deadline:
                raise RendezvousTimeout(missing, self.rendezvous_timeout)
            self._wait_event(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            if self.stop_signal:
                raise TaskError("stopped while waiting for the cluster")

    def _safe_members(self) -> list[Member]:
        try:
            return self._members()
        except ServerError as exc:
            log.warning("cannot read the catalog (%s); retrying", exc)
            return []

    # ---- watchers -------------------------------------------------------------------------

    def _start_watchers(self) -> None:
        for name, blocking_query in (("catalog", self.discovery.wait_for_change), ("kv", self.discovery.wait_for_kv_change)):
            threading.Thread(target=self._watch, args=(name, blocking_query), name=f"watch-{name}", daemon=True).start()

    def _watch(self, name: str, blocking_query: Any) -> None:
        """Turn one Consul blocking query into events on our queue, for ever."""
        index = 0
        while True:
            try:
                new_index = blocking_query(index, wait_s=30)
                if new_index != index:
                    self.events.put(name)
                # An index that goes backwards means Consul restarted: start over.
                index = new_index if new_index >= index else 0
            except NomadtfError:
                index = 0
                time.sleep(1.0)  # Consul is restarting; the next blocking query resumes

    def _wait_event(self, timeout: float) -> str | None:
        """The next watch event (several queued ones count as one), or None after `timeout`."""
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        while not self.events.empty():
            event = self.events.get_nowait()
        return event

    # ---- secrets --------------------------------------------------------------------------

    def _fetch_secrets(self) -> None:
        client = secrets_mod.login(self.spec["vault"])
        fetched = secrets_mod.fetch_secrets(client, self.spec["secrets"], self.alloc.secrets_dir)
        self.secret_env = fetched.env
        log.info("read %d secret(s) for the training process (%s)", len(self.spec["secrets"]), ", ".join(
            s.get("env") or f"file {s['file']}" for s in self.spec["secrets"]))
        if fetched.leases:
            self.renewer = secrets_mod.LeaseRenewer(client, fetched.leases, on_error=log.warning)
            self.renewer.start()

    # ---- the child ------------------------------------------------------------------------

    def child_argv(self) -> list[str]:
        entry = self.spec["entrypoint"]
        python = sys.executable
        if self.strategy == "legacy_server":
            return [python, "-m", "nomadtf.tfserver", "legacy", entry["function"]]
        if not cluster.runs_user_code(self.strategy, self.role):
            return [python, "-m", "nomadtf.tfserver", "server"]
        if "module" in entry:
            return [python, "-u", "-m", entry["module"], *entry["args"]]
        return [python, "-u", entry["script"], *entry["args"]]

    def child_env(self, members: list[Member], generation: int) -> dict[str, str]:
        tf_config = cluster.build_tf_config(cluster.build_cluster_spec(self.strategy, self.counts, members), self.role, self.index)
        env = {k: v for k, v in os.environ.items() if k not in ("VAULT_TOKEN", "NOMADTF_SPEC", "NOMAD_TOKEN")}
        entry = self.spec["entrypoint"]
        extra_path = [p for p in [entry.get("workdir"), *entry.get("pythonpath", [])] if p]
        if extra_path:
            env["PYTHONPATH"] = os.pathsep.join([*extra_path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(
            {
                "TF_CONFIG": cluster.tf_config_json(tf_config),
                "NOMADTF_ROLE": self.role,
                "NOMADTF_INDEX": str(self.index),
                "NOMADTF_JOB_ID": self.alloc.job_id,
                "NOMADTF_MODEL_DIR": self.spec["model_dir"],
                "NOMADTF_CONTEXT": json.dumps(self.spec["context"], sort_keys=True),
                "NOMADTF_GENERATION": str(generation),
                "NOMADTF_PROGRESS_FILE": str(self.progress_file),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.secret_env)
        return env

    def _start_child(self, members: list[Member], generation: int) -> None:
        Path(self.spec["model_dir"]).mkdir(parents=True, exist_ok=True)
        env = self.child_env(members, generation)
        cwd = self.spec["entrypoint"].get("workdir") or str(self.alloc.task_dir)
        log.info("generation %d: starting %s with TF_CONFIG %s", generation, self.child_argv()[2:4], env["TF_CONFIG"])
        proc = subprocess.Popen(self.child_argv(), env=env, cwd=cwd, preexec_fn=_die_with_parent, start_new_session=True)
        self.child = Child(proc, members, generation)
        self.last_step_change = time.monotonic()

    def _stop_child(self, grace: float = STOP_GRACE_S) -> int | None:
        if not self.child or self.child.proc.poll() is not None:
            return self.child.proc.returncode if self.child else None
        proc = self.child.proc
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            # MWMS workers ignore SIGTERM (TensorFlow's preemption handler), hence the hard stop.
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def _restart_child(self, members: list[Member], generation: int, why: str) -> None:
        log.info("restarting our child: %s", why)
        self._stop_child()
        self._start_child(members, generation)

    # ---- supervision ----------------------------------------------------------------------

    def _supervise(self) -> int:
        done_since: float | None = None
        settled = Settled(DEBOUNCE_S)
        state: str | None = None
        next_look = 0.0  # when to read Consul without a watch event (debounce, safety net)
        while True:
            # Consul is read when a blocking-query watcher reports a change; the 1 s tick only
            # looks at local things: our child, its progress file, the hang clock.
            event = self._wait_event(timeout=1.0)
            if self.stop_signal:
                log.info("received signal %d; stopping", self.stop_signal)
                code = self._stop_child()
                return 0 if code in (None, 0, -signal.SIGTERM, -signal.SIGKILL) else code
            assert self.child is not None
            self._publish_progress()
            look = event is not None or time.monotonic() >= next_look
            if look:
                state = self._job_state()
                next_look = time.monotonic() + SAFETY_LOOK_S
            code = self.child.proc.poll()
            if code is not None:
                outcome = self._on_child_exit(code, self._job_state())
                if outcome is not None:
                    return outcome
                continue
            if state == "succeeded" and not completes_job(self.strategy, self.role, self.index, self.counts):
                if not cluster.runs_user_code(self.strategy, self.role) or self.role == "tensorboard":
                    log.info("the job succeeded; stopping our TensorFlow server")
                    self._stop_child()
                    return 0
                done_since = done_since or time.monotonic()
                next_look = min(next_look, time.monotonic() + 1.0)
                if time.monotonic() - done_since > STRAGGLER_GRACE_S:
                    log.info("the job succeeded %.0fs ago and our code is still running; stopping it", STRAGGLER_GRACE_S)
                    self._stop_child()
                    return 0
                continue
            if self._hung():
                outcome = self._recover(f"no training step for {self.hang_timeout:.0f}s (hang)")
                if outcome is not None:
                    return outcome
                continue
            if look and self._reconfigure(settled):
                next_look = min(next_look, time.monotonic() + DEBOUNCE_S)

    def _job_state(self) -> str | None:
        try:
            return self.discovery.job_state()
        except ServerError:
            return None

    def _reconfigure(self, settled: Settled) -> bool:
        """Act on a real, settled change of the complete cluster; ignore everything else.
        Returns True while a change is waiting to settle (look again after the debounce)."""
        assert self.child is not None
        try:
            slots = self.discovery.slots()
            self._ensure_slot(slots)
            members = self._members(slots)
            if cluster.missing_members(self.counts, members):
                return False  # a peer is away; act once it is back (and only if it changed)
            current = fingerprint(members)
            generation, _ = self.discovery.generation()
        except ServerError as exc:
            log.warning("catalog unavailable (%s); keeping the current cluster", exc)
            return False
        if generation.get("fingerprint") != current:
            if not settled.observe(current, time.monotonic()):
                return True
            generation = self.discovery.bump_generation(current)
            log.info("cluster changed: generation %d: %s", generation["generation"], _describe(members))
        if generation.get("generation", 0) != self.child.generation and generation.get("fingerprint") == current:
            if must_restart(self.strategy, self.role, self.index, self.child.members, members):
                self._restart_child(members, generation["generation"], f"generation {generation['generation']} changed peers we depend on")
            else:
                self.child.generation = generation["generation"]
                self.child.members = members
        return False

    def _on_child_exit(self, code: int, state: str | None) -> int | None:
        """Return the task's exit code, or None when the child was restarted."""
        kind = exit_class(code, self.permanent)
        if kind == "ok":
            if completes_job(self.strategy, self.role, self.index, self.counts):
                self.discovery.set_job_state("succeeded")
                log.info("training finished; job marked succeeded")
            else:
                log.info("our code exited 0")
            return 0
        if state == "succeeded":
            log.info("our child exited %d after the job succeeded; done", code)
            return 0
        if code < 0:  # killed by a signal from outside: our own crash, no peer to wait for
            return self._recover(f"crashed ({_describe_code(code)})", own_crash=True)
        explained = self._peer_change_explains_failure()
        if explained is not None:
            self._recover(f"exit {code} after {explained}", members=self._members())
            return None
        if kind == "retryable":
            return self._recover(f"crashed ({_describe_code(code)})", own_crash=True)
        log.error("our code failed with exit %d (permanent); leaving it to Nomad's restart policy", code)
        return code

    def _peer_change_explains_failure(self) -> str | None:
        """After our child failed, did a peer move or lose its state? Wait a little to see."""
        assert self.child is not None
        deadline = time.monotonic() + SETTLE_S
        rendezvous_deadline = time.monotonic() + self.rendezvous_timeout
        while True:
            members = self._safe_members()
            missing = cluster.missing_members(self.counts, members)
            if not missing and fingerprint(members) != fingerprint(self.child.members):
                return "a peer changed"
            if missing and time.monotonic() > rendezvous_deadline:
                raise RendezvousTimeout(missing, self.rendezvous_timeout)
            if not missing and time.monotonic() > deadline:
                return None
            self._wait_event(timeout=1.0)
            if self.stop_signal:
                return None

    def _recover(self, why: str, members: list[Member] | None = None, own_crash: bool = False) -> int | None:
        """Restart our child in place, bounded by recovery.restart_attempts per restart_interval."""
        now = time.monotonic()
        window = duration_seconds(self.spec["recovery"]["restart_interval"])
        self.recoveries = [t for t in self.recoveries if now - t < window] + [now]
        if len(self.recoveries) > self.spec["recovery"]["restart_attempts"]:
            log.error("giving up after %d recoveries in %.0fs (%s)", len(self.recoveries) - 1, window, why)
            self._stop_child()  # a hung child is still running
            return 1
        if own_crash:
            self.incarnation = uuid.uuid4().hex[:12]
            self.discovery.update_incarnation(self.role, self.index, self.alloc.alloc_id, self.incarnation)
        members = members or self._rendezvous()
        generation = self.discovery.bump_generation(fingerprint(members)) if not own_crash else self.discovery.generation()[0]
        self._restart_child(members, int(generation.get("generation", 1)), why)
        return None

    def _publish_progress(self) -> None:
        progress = read_progress(str(self.progress_file))
        if not progress or progress == self.last_progress:
            return
        if not self.last_progress or progress.get("step") != self.last_progress.get("step"):
            self.last_step_change = time.monotonic()
        self.last_progress = progress
        try:
            self.discovery.publish_progress({**progress, "role": self.role, "index": self.index})
        except ServerError:
            pass  # progress is best effort

    def _hung(self) -> bool:
        # Only code that reports progress can be judged; silence from the start is not a hang.
        return bool(self.last_progress) and time.monotonic() - self.last_step_change > self.hang_timeout

    # ---- tensorboard ----------------------------------------------------------------------

    def _run_tensorboard(self) -> int:
        argv = [sys.executable, "-m", "tensorboard.main", "--logdir", self.spec["model_dir"], "--port", str(self.alloc.tf_port), "--bind_all"]
        Path(self.spec["model_dir"]).mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(argv, preexec_fn=_die_with_parent, start_new_session=True)
        self.child = Child(proc, [], 0)
        while True:
            event = self._wait_event(timeout=2.0)
            if self.stop_signal or (event is not None and self._job_state() == "succeeded"):
                self._stop_child()
                return 0
            if proc.poll() is not None:
                return proc.returncode or 0


def _describe(members: list[Member]) -> str:
    return ", ".join(f"{m.role}[{m.index}]={m.address}" for m in sorted(members))


def _describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def run_task(role: str) -> int:
    spec_text = os.environ.get("NOMADTF_SPEC")
    if not spec_text:
        raise TaskError("NOMADTF_SPEC is not set: `nomadtf task` runs inside a job rendered by nomadtf")
    spec = json.loads(spec_text)
    alloc = AllocInfo.from_environ(dict(os.environ))
    discovery = ConsulDiscovery(alloc.job_id)
    return Supervisor(spec, role, alloc, discovery).run()

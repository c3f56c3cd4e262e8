"""The admission service: admits runs that wait in the queue with nobody following them
(`nomadtf run --detach`, or Ctrl-C with `--on-interrupt leave`), in their turn.

Any number of replicas run `nomadtf admission serve`; one leads. The lead is a Consul lock
(`nomadtf/_admission/leader`) held through the replica's session: a replica that dies (or
whose client dies) stops renewing it, Consul ends the session within its TTL, and another
replica takes the lead. Only the leader admits, and it admits through the same lock,
plan, registration and gang rules as a submitter (admission.Admission), so two replicas
never admit one run twice: a run whose job already runs with its run id is only taken out
of the queue.

`nomadtf admission deploy` runs the service in the cluster itself, as a Nomad service job
(`service_job`) of two replicas.

Usage:
    AdmissionService(NomadAPI.from_env(), on_event=log).serve(stop_event)
    api.register(service_job(python="/opt/venv/bin/python", env={"NOMAD_ADDR": ...}))
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nomadtf import queue, wire
from nomadtf.admission import Admission
from nomadtf.discovery import AdmissionQueue, ConsulDiscovery
from nomadtf.errors import ServerError
from nomadtf.nomad import NomadAPI

SERVICE_TOKENS_VAR = f"nomad/jobs/{wire.ADMISSION_SERVICE_JOB}"  # its tasks may read it (workload identity)
LEAD_WAIT_S = 30.0  # a standby re-asks for the lead at least this often
QUEUE_WAIT_S = 30.0  # the leader looks at the queue at least this often


class AdmissionService:
    """One replica: waits for the lead, then admits the unattended run at the head.

    Usage:
        AdmissionService(api, on_event=print).serve(threading.Event())
    """

    def __init__(
        self,
        api: NomadAPI,
        queue_kv: AdmissionQueue | None = None,
        *,
        on_event: Callable[[str], None] = lambda line: None,
        name: str | None = None,
    ):
        self.api = api
        self.queue = queue_kv or AdmissionQueue()
        self.on_event = on_event
        # In the cluster, the allocation too: `admission status` (and a test) can tell whose
        # client the leader runs on.
        alloc = f" alloc {os.environ['NOMAD_ALLOC_ID'][:8]}" if os.environ.get("NOMAD_ALLOC_ID") else ""
        self.name = name or f"{socket.gethostname()} pid {os.getpid()}{alloc}"

    def serve(self, stop: threading.Event | None = None) -> None:
        """Until `stop` is set: stand by, lead when the lead is free, admit while leading.

        PUT /v1/session/create ; PUT /v1/kv/nomadtf/_admission/leader?acquire= ;
        blocking GET /v1/kv/nomadtf/_admission/leader ; then what `_lead` calls"""
        stop = stop or threading.Event()
        holder = ConsulDiscovery(wire.ADMISSION_SERVICE_JOB, wire.DEFAULT_NAMESPACE, client=self.queue.consul)
        holder.open_session(f"nomadtf-admission service {self.name}")
        try:
            while not stop.is_set():
                try:
                    if self.queue.acquire_leader(holder.session or "", self.name):
                        self.on_event(f"{self.name} leads admission")
                        self._lead(holder, stop)
                        continue
                    index, leader = self.queue.leader()
                    if leader:
                        self.queue.leader(index, wait_s=LEAD_WAIT_S)  # until the lead changes
                except ServerError as exc:  # Consul or Nomad away a while: keep standing by
                    self.on_event(f"{self.name}: {exc}")
                    stop.wait(2.0)
                    if not self.queue.session_alive(holder.session or ""):
                        holder.reopen_session()
        finally:
            holder.close()  # gives the lead (and the admission lock) up at once

    def _lead(self, holder: ConsulDiscovery, stop: threading.Event) -> None:
        """Admit unattended runs at the head of the queue until the lead is lost (our
        session ended) or `stop`.

        blocking GET /v1/kv/nomadtf/_admission/queue/?recurse ; GET .../runs/<ns>/<ticket> ;
        GET /v1/session/info/:id ; Admission.admit_unattended's calls"""
        index = 0
        while not stop.is_set():
            if not self.queue.session_alive(holder.session or ""):
                self.on_event(f"{self.name} lost the lead (its Consul session ended)")
                holder.reopen_session()
                return
            index, entries = self.queue.entries(index, wait_s=QUEUE_WAIT_S)
            if not entries:
                continue
            head = queue.ordered(entries)[0]
            if head.attended:
                continue  # its submitter admits it; the next change of the queue wakes us
            record = self.queue.record(head.namespace, head.ticket)
            if record is None or record.job is None:  # withdrawn (nomadtf stop) since we read the queue, or left incomplete
                self.on_event(f"dropped queue entry {head.ticket} of namespace {head.namespace}: no job to register (withdrawn?)")
                self.queue.remove(head.namespace, head.ticket)
                continue
            admission = Admission(self.api.in_namespace(record.namespace), self.queue, on_event=self.on_event)
            admission.admit_unattended(record, head, holder.session or "", holder)
            index = 0  # look again at once: the queue may have moved while we admitted


def service_job(
    count: int = 2,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    namespace: str = wire.DEFAULT_NAMESPACE,
    datacenters: tuple[str, ...] = ("*",),
    clients: int = 0,
    tokens: bool = False,
) -> dict[str, Any]:
    """The Nomad service job of the admission service (the body of POST /v1/jobs). Pure.

    `python`: the interpreter on the clients that has nomadtf installed (default: this one;
    then the task also gets this process's PYTHONPATH, so a checkout deploys its own code).
    `env`: what the replicas need to reach Nomad and Consul (addresses, never tokens).
    `clients`: the eligible client nodes (0: unknown), for where the replicas go.
    `tokens`: the replicas read their Nomad and Consul tokens from the Nomad variable
    SERVICE_TOKENS_VAR (`deploy --tokens` writes it), rendered into their environment by a
    template: a job's tasks may read their own job's variables through their workload
    identity, so no token is written into the job itself."""
    environment = dict(env or {})
    if python is None:
        import nomadtf

        python = sys.executable
        environment.setdefault("PYTHONPATH", str(Path(nomadtf.__file__).resolve().parent.parent))
    task = {
        "Name": "admission",
        "Driver": "raw_exec",
        "Config": {"command": python, "args": ["-m", "nomadtf", "admission", "serve"]},
        "Env": environment,
        "Resources": {"CPU": 100, "MemoryMB": 128},
        "KillTimeout": 5_000_000_000,
    }
    if tokens:
        task["Templates"] = [
            {
                "EmbeddedTmpl": (
                    f'{{{{ with nomadVar "{SERVICE_TOKENS_VAR}" }}}}'
                    "NOMAD_TOKEN={{ .nomad_token }}\nCONSUL_HTTP_TOKEN={{ .consul_token }}\n{{ end }}"
                ),
                "DestPath": "secrets/tokens.env",
                "Envvars": True,
                "ChangeMode": "restart",  # new tokens: the replica starts again with them
            }
        ]
    group = {
        "Name": "admission",
        "Count": count,
        "Tasks": [task],
        "RestartPolicy": {"Attempts": 10, "Interval": 600_000_000_000, "Delay": 2_000_000_000, "Mode": "delay"},
    }
    # A standby on its leader's client dies with it. distinct_hosts keeps the replicas on
    # different clients, but it is a hard constraint: with fewer clients than replicas Nomad
    # leaves the rest unplaced (blocked), so a one-client cluster could not deploy two. There
    # (or when the nodes could not be counted) a spread asks for distinct clients where it
    # can and still places every replica.
    if count > 1 and clients >= count:
        group["Constraints"] = [{"Operand": "distinct_hosts", "RTarget": "true"}]
    elif count > 1:
        group["Spreads"] = [{"Attribute": "${node.unique.id}", "Weight": 100}]
    return {
        "Job": {
            "ID": wire.ADMISSION_SERVICE_JOB,
            "Name": wire.ADMISSION_SERVICE_JOB,
            "Type": "service",
            "Namespace": namespace,
            "Datacenters": list(datacenters),
            "Priority": 90,
            "Meta": {wire.META_SERVICE: "admission"},
            "TaskGroups": [group],
        }
    }


def service_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The deployer's way to Nomad and Consul, for the replicas (no tokens)."""
    names = ("NOMAD_ADDR", "NOMAD_REGION", "NOMAD_CACERT", "NOMAD_TLS_SERVER_NAME", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL", "CONSUL_CACERT")
    return {name: environ[name] for name in names if environ.get(name)}

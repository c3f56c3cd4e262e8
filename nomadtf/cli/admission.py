"""`nomadtf admission`: the admission service that admits queued runs nobody follows
(docs/guide/queueing.md)."""

from __future__ import annotations

import os
import signal
import threading
from typing import Annotated, Optional

import typer

from nomadtf.cli.common import Namespace, stamp

admission_app = typer.Typer(no_args_is_help=True, help="The admission service: admits queued runs that nobody follows.")


@admission_app.command()
def serve() -> None:
    """Run one replica of the admission service here (what `deploy` runs in the cluster).
    One replica leads and admits; the others stand by. SIGTERM or Ctrl-C ends it."""
    from nomadtf.admission_service import AdmissionService
    from nomadtf.nomad import NomadAPI

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # also out of a blocking query: the lead is handed on at once

    signal.signal(signal.SIGTERM, interrupt)
    try:
        AdmissionService(NomadAPI.from_env(), on_event=stamp).serve(threading.Event())
    except KeyboardInterrupt:
        pass
    stamp("admission service replica stopped")


@admission_app.command()
def deploy(
    count: Annotated[int, typer.Option("--count", min=1, help="Replicas (one leads, the others stand by)")] = 2,
    python: Annotated[Optional[str], typer.Option("--python", help="Interpreter on the clients with nomadtf installed; default: this one, with this checkout's code")] = None,
    tokens: Annotated[bool, typer.Option("--tokens", help="ACL cluster: hand this shell's NOMAD_TOKEN and CONSUL_HTTP_TOKEN to the replicas through a Nomad variable (give it tokens made for the service)")] = False,
    namespace: Namespace = None,
) -> None:
    """Run the admission service in the cluster as a Nomad service job (nomadtf-admission);
    it reaches Nomad and Consul at the addresses this shell uses. Replicas go to different
    clients when there are enough."""
    from nomadtf import wire
    from nomadtf.admission import readable_nodes
    from nomadtf.admission_service import SERVICE_TOKENS_VAR, service_env, service_job
    from nomadtf.errors import SpecError
    from nomadtf.nomad import NomadAPI

    api = NomadAPI.from_env(namespace=namespace)
    # Not countable with this token (0): the replicas are spread, not bound apart.
    clients = len(readable_nodes(api, {"Datacenters": ["*"]})[0])
    if tokens:
        missing = [name for name in ("NOMAD_TOKEN", "CONSUL_HTTP_TOKEN") if not os.environ.get(name)]
        if missing:
            raise SpecError(f"--tokens: {' and '.join(missing)} not set in this shell")
        api.put_variable(SERVICE_TOKENS_VAR, {"nomad_token": os.environ["NOMAD_TOKEN"], "consul_token": os.environ["CONSUL_HTTP_TOKEN"]})
        stamp(f"wrote the replicas' tokens to the Nomad variable {SERVICE_TOKENS_VAR} in namespace {api.namespace}")
    job = service_job(count, python, service_env(os.environ), namespace=api.namespace, clients=clients, tokens=tokens)
    registered = api.register(job)
    stamp(f"deployed {wire.ADMISSION_SERVICE_JOB} ({count} replicas) in namespace {api.namespace} (evaluation {registered['EvalID'][:8]})")


@admission_app.command()
def status() -> None:
    """Who leads, and the runs that wait, in order, by namespace and priority (no job
    names: `nomadtf status` shows your namespace's queued runs by name; namespaces your
    token may not use are not named either)."""
    from nomadtf.admission import queue_overview
    from nomadtf.discovery import AdmissionQueue
    from nomadtf.errors import ServerError
    from nomadtf.nomad import NomadAPI

    kv = AdmissionQueue()
    _, leader = kv.leader()
    _, entries = kv.entries()
    try:
        readable = set(NomadAPI.from_env().namespaces())
    except ServerError:
        readable = set()  # Nomad unreadable: name no namespace rather than every one
    typer.echo(f"leader: {leader or 'none (no admission service runs: nomadtf admission deploy)'}")
    typer.echo(f"queued runs: {len(entries)} ({sum(not e.attended for e in entries)} unattended)")
    for line in queue_overview(entries, readable):
        typer.echo(line)

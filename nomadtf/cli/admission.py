"""`nomadtf admission`: the admission controller, the one authority that starts queued runs
(docs/guide/queueing.md)."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from nomadtf.cli.common import Namespace, stamp

admission_app = typer.Typer(no_args_is_help=True, help="The admission controller: starts the runs queued in Nomad, in their turn.")
policy_app = typer.Typer(no_args_is_help=True, help="The sharing policy: quotas per namespace, priority ceilings, fair share, backfill.")
admission_app.add_typer(policy_app, name="policy")


@admission_app.command()
def serve(
    metrics_port: Annotated[int, typer.Option("--metrics-port", help="Serve Prometheus metrics on this port (0: none)")] = 0,
    metrics_address: Annotated[str, typer.Option("--metrics-address", help="The address the metrics port listens on")] = "127.0.0.1",
) -> None:
    """Run one replica of the admission controller here (what `deploy` runs in the cluster).
    One replica leads and admits; the others stand by. SIGTERM or Ctrl-C ends it."""
    import socket

    from nomadtf.admission.controller import Controller
    from nomadtf.servers.consulhttp import consul_client
    from nomadtf.servers.nomad import NomadAPI

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # also out of a blocking query: the lead is handed on at once

    signal.signal(signal.SIGTERM, interrupt)
    try:
        alloc = f" alloc {os.environ['NOMAD_ALLOC_ID'][:8]}" if os.environ.get("NOMAD_ALLOC_ID") else ""
        name = f"{socket.gethostname()} pid {os.getpid()}{alloc}"
        metrics = None
        if metrics_port:
            from nomadtf.admission.metrics import Metrics

            metrics = Metrics()
            metrics.serve(metrics_port, metrics_address)
            stamp(f"metrics at http://{metrics_address}:{metrics_port}/metrics")
        Controller(NomadAPI.from_env(namespace="*"), consul_client(), name, on_event=stamp, metrics=metrics).serve(threading.Event())
    except KeyboardInterrupt:
        pass
    stamp("admission controller replica stopped")


@admission_app.command()
def deploy(
    count: Annotated[int, typer.Option("--count", min=1, help="Replicas (one leads, the others stand by)")] = 2,
    python: Annotated[Optional[str], typer.Option("--python", help="Interpreter on the clients with nomadtf installed; default: this one, with this checkout's code")] = None,
    tokens: Annotated[bool, typer.Option("--tokens", help="ACL cluster: hand the replicas NOMADTF_CONTROLLER_NOMAD_TOKEN and NOMADTF_CONTROLLER_CONSUL_TOKEN (made from the controller's policies in `nomadtf acl policies`) through a Nomad variable")] = False,
    namespace: Namespace = None,
    node_pool: Annotated[str, typer.Option("--node-pool", help="The node pool of the operator's own clients, where no team's code runs: the replicas' tokens go only there (docs/operations/threat-model.md)")] = "",
) -> None:
    """Run the admission controller in the cluster as a Nomad service job (nomadtf-admission);
    it reaches Nomad and Consul at the addresses this shell uses. Replicas go to different
    clients when there are enough. This shell's NOMAD_TOKEN registers the job (an operator's);
    with --tokens the replicas get the controller's own tokens, never the operator's."""
    from nomadtf.admission.deploy import deploy as deploy_controller
    from nomadtf.servers.nomad import NomadAPI

    deploy_controller(NomadAPI.from_env(namespace=namespace), count, python, tokens, os.environ, on_event=stamp, node_pool=node_pool)


@admission_app.command()
def status() -> None:
    """Who leads, and the runs that wait, in order, by namespace and priority (no job
    names: `nomadtf status` shows your namespace's queued runs by name; namespaces your
    token may not use are not named either); runs the controller could not read, and its
    last admissions and refusals, named only in the namespaces your token may use."""
    from nomadtf import wire
    from nomadtf.client.queued import controller_leader, read_board
    from nomadtf.errors import ServerError
    from nomadtf.servers.nomad import NomadAPI

    leader = controller_leader()
    board = read_board()
    names: dict[str, str] = {}  # ticket -> namespace/job, for the namespaces this token may use
    try:
        api = NomadAPI.from_env(namespace="*")
        readable = set(api.namespaces())
        for stub in api.jobs():
            names[wire.queue_ticket(stub.namespace, stub.id, stub.run_id)] = f"{stub.namespace}/{stub.id}"
    except ServerError:
        readable = set()  # Nomad unreadable: name no namespace rather than every one
    typer.echo(f"leader: {leader or 'none (no admission controller runs: nomadtf admission deploy)'}")
    if board.policy:
        typer.echo(f"sharing policy in force: {board.policy} (nomadtf admission policy show)")
    typer.echo(f"queued runs: {board.length}")
    for line in board.lines:
        where = f"namespace {line.namespace}" if line.namespace in readable else "another namespace"
        typer.echo(f"  {line.place}. {where}, priority {line.priority}, {line.note}")
    for skipped in board.skipped:
        if skipped.namespace in readable:
            typer.echo(f"  skipped {names.get(skipped.ticket, skipped.namespace + '/?')}: {skipped.why}")
        else:
            typer.echo("  skipped a run in another namespace")
    for happened in board.recent[-5:]:  # only what this token may see
        if happened.namespace in readable:
            typer.echo(f"  recent: {names.get(happened.ticket, happened.namespace + '/(gone)')} {happened.what}")


@policy_app.command("set")
def policy_set(file: Annotated[Path, typer.Argument(help="The policy as JSON (docs/guide/queueing.md: Sharing policy)", exists=True, dir_okay=False)]) -> None:
    """Check the policy file and store it where the controller reads it (it takes effect
    within 10 s). Takes an operator's Consul token: write on nomadtf/_admission/policy."""
    from nomadtf.client.sharing import store_policy
    from nomadtf.servers.consulhttp import consul_client

    parsed = store_policy(consul_client(), file.read_text())
    stamp(f"sharing policy stored: {len(parsed.namespaces)} namespace(s) listed; the controller applies it within 10s")


@policy_app.command("show")
def policy_show() -> None:
    """The policy in force, every default spelled out (the defaults when none is stored)."""
    from nomadtf.client.sharing import stored_policy
    from nomadtf.servers.consulhttp import consul_client

    parsed, stored = stored_policy(consul_client())
    stamp(f"{'stored' if stored else 'no sharing policy is stored: the defaults'}, digest {parsed.digest()} "
          "(`admission status` names the digest the controller applies)")  # fmt: skip
    typer.echo(json.dumps(parsed.to_json(), indent=2))


@policy_app.command("clear")
def policy_clear() -> None:
    """Remove the stored policy: the defaults apply again (no quota, no priority ceiling)."""
    from nomadtf.client.sharing import clear_policy
    from nomadtf.servers.consulhttp import consul_client

    clear_policy(consul_client())
    stamp("sharing policy cleared: the defaults apply")


USAGE_COLUMNS = ("namespace", "cpu_core_hours", "memory_gib_hours", "gpu_hours", "queued_hours", "admitted", "succeeded", "failed",
                 "stopped", "preempted", "refused")  # fmt: skip


def usage(
    since: Annotated[str, typer.Option("--since", help="How far back, in whole UTC days from that day on (e.g. 7d, 24h)")] = "7d",
    namespace: Namespace = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per namespace, in a list")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV with a header line")] = False,
) -> None:
    """What each namespace used and what became of its runs, from the admission controller's
    ledger (it outlives Nomad's garbage collection): CPU core-hours, memory GiB-hours,
    GPU-hours, hours queued, runs admitted, succeeded, failed, stopped, preempted, refused.
    Takes an operator's Consul token (read on nomadtf/_admission/ledger/)."""
    import csv
    import dataclasses
    import sys
    import time

    from nomadtf.client.sharing import usage_rows
    from nomadtf.durations import DurationError, parse_seconds
    from nomadtf.servers.consulhttp import consul_client

    try:
        window = parse_seconds(since)
    except DurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--since") from None
    namespace = None if namespace in (None, "*") else namespace  # every namespace unless one is named
    rows = usage_rows(consul_client(), time.time() - window, namespace)
    records = [dataclasses.asdict(row) for row in rows]
    if as_json:
        typer.echo(json.dumps(records, indent=2))
        return
    if as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=USAGE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()} for r in records)
        return
    if not rows:
        typer.echo(f"no usage recorded since {since} ago" + (f" in namespace {namespace}" if namespace else ""))
        return
    typer.echo(f"{'namespace':<16} {'cpu core-h':>10} {'mem GiB-h':>10} {'GPU-h':>8} {'queued h':>9} {'admitted':>8} {'ok':>5} "
               f"{'failed':>6} {'stopped':>7} {'preempt':>7} {'refused':>7}")  # fmt: skip
    for r in rows:
        typer.echo(f"{r.namespace:<16} {r.cpu_core_hours:>10.2f} {r.memory_gib_hours:>10.2f} {r.gpu_hours:>8.2f} {r.queued_hours:>9.2f} "
                   f"{r.admitted:>8} {r.succeeded:>5} {r.failed:>6} {r.stopped:>7} {r.preempted:>7} {r.refused:>7}")  # fmt: skip

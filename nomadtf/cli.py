"""The command line. Arguments -> core calls -> output and exit codes.

The only module that prints or exits. Every NomadtfError becomes one line (or a short
block) on stderr and its exit code; tracebacks only with --debug.
"""

from __future__ import annotations

import enum
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from nomadtf.errors import NomadtfError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Deploy and supervise distributed TensorFlow training on HashiCorp Nomad.",
    pretty_exceptions_enable=False,
)
dev_app = typer.Typer(no_args_is_help=True, help="The local Nomad + Consul + OpenBao stack for trying nomadtf.")
app.add_typer(dev_app, name="dev")
env_app = typer.Typer(no_args_is_help=True, help="The job environments cached on this Nomad client (job.json `environment`).")
app.add_typer(env_app, name="env")
acl_app = typer.Typer(no_args_is_help=True, help="The least-privilege ACL policies a job needs (Nomad, Consul, Vault).")
app.add_typer(acl_app, name="acl")

_state = {"debug": False}

JobFile = Annotated[Path, typer.Argument(help="job.json (or .yaml)", show_default=False)]
Vars = Annotated[Optional[list[str]], typer.Option("--var", help="Override a field: path=value (repeatable)")]
TemplatesDir = Annotated[
    Optional[Path],
    typer.Option(
        "--templates",
        help="Render with your own copies of the templates. They are trusted code: unsandboxed Jinja2 "
        "with nomadtf's wire module in reach, run with your tokens in the environment",
    ),
]
Namespace = Annotated[
    Optional[str], typer.Option("--namespace", help="Nomad namespace ('*' lists all); default NOMAD_NAMESPACE or default")
]
Region = Annotated[Optional[str], typer.Option("--region", help="Nomad region; default NOMAD_REGION or the agent's")]


def _err(message: str) -> None:
    typer.echo(message, err=True)


def _stamp(message: str) -> None:
    _err(f"{time.strftime('%H:%M:%S')} {message}")


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks")] = False) -> None:
    _state["debug"] = debug


# ---- dev stack -------------------------------------------------------------------------


@dev_app.command("up")
def dev_up(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each server")] = 120.0,
    gpus: Annotated[
        Optional[int], typer.Option("--gpus", min=0, help="Fake NVIDIA GPUs per Nomad client (the project's device plugin); default none, or as the running stack has")
    ] = None,
    clients: Annotated[
        int, typer.Option("--clients", min=1, help="Nomad clients; 2 or more: a cluster of network namespaces on 198.18.0.0/24")
    ] = 1,
    gpu_clients: Annotated[
        Optional[str], typer.Option("--gpu-clients", help="With --clients N: only these clients get the --gpus (e.g. 3 or 2,3); default every client")
    ] = None,
    secure: Annotated[
        bool, typer.Option("--secure", help="ACLs (default deny) and TLS on Nomad, Consul and OpenBao; runs as the several-client stack")
    ] = False,
) -> None:
    """Build or find the binaries and start Consul, OpenBao and Nomad on 127.0.0.1
    (--clients N or --secure: a server on 198.18.0.1 and N client namespaces)."""
    if clients >= 2 or secure:
        _dev_cluster_up(clients, gpus, gpu_clients, timeout, secure)
        return
    if gpu_clients is not None:
        raise NomadtfError("--gpu-clients is for the several-client stack: add --clients N (2 or more)")
    from nomadtf.devstack.stack import DevStack

    stack = DevStack.default()
    started = time.monotonic()
    if not stack.up(progress=_stamp, timeout=timeout, gpus=gpus):
        _err(f"the local stack is already up ({stack.state_dir})")
        return
    _err(f"local stack up in {time.monotonic() - started:.1f}s; state in {stack.state_dir}")
    _err('use it from a shell with: eval "$(nomadtf dev env)"')


def _dev_cluster_up(clients: int, gpus: int | None, gpu_clients: str | None, timeout: float, secure: bool) -> None:
    from nomadtf.devstack.cluster import ClusterStack, parse_client_list

    cluster = ClusterStack.default()
    started = time.monotonic()
    chosen = parse_client_list(gpu_clients) if gpu_clients is not None else None
    if not cluster.up(progress=_stamp, clients=clients, gpus=gpus, timeout=timeout, gpu_clients=chosen, secure=secure):
        _err(f"the several-client stack is already up ({cluster.state_dir})")
        return
    _err(f"several-client stack up in {time.monotonic() - started:.1f}s; state in {cluster.state_dir}")
    _err('use it from a shell with: eval "$(nomadtf dev env --cluster)"')


OnlyCluster = Annotated[bool, typer.Option("--cluster", help="Only the several-client stack (`dev up --clients N`)")]
OnlySingle = Annotated[bool, typer.Option("--single", help="Only the single-node stack")]


@dev_app.command("down")
def dev_down(cluster: OnlyCluster = False, single: OnlySingle = False) -> None:
    """Stop what `dev up` started and remove its state (every stack that runs, unless
    --cluster or --single)."""
    from nomadtf.devstack.cluster import ClusterStack
    from nomadtf.devstack.stack import DevStack

    if single or not cluster:
        DevStack.default().down(progress=_stamp)
        _err("local stack stopped")
    several = ClusterStack.default()
    if cluster or (not single and several.state_dir.exists()):
        several.down(progress=_stamp)
        _err("several-client stack stopped")


@dev_app.command("status")
def dev_status(cluster: OnlyCluster = False) -> None:
    """What runs, where, and where its log is."""
    from nomadtf.devstack.cluster import ClusterStack
    from nomadtf.devstack.stack import DevStack

    rows = [] if cluster else DevStack.default().status()
    several = ClusterStack.default()
    cluster_rows = several.status()
    if not rows and not cluster_rows:
        typer.echo("several-client stack: not running" if cluster else "local stack: not running")
        raise typer.Exit(1)
    for row in rows:
        typer.echo(f"{row['component']:<8} {row['state']:<8} pid {row['pid']:<7} {row['address']:<24} log {row['log']}")
    gpus = DevStack.default().recorded_gpus() if rows else 0
    if gpus:
        typer.echo(f"nomad client: {gpus} fake NVIDIA GPUs (device plugin nomadtf-fake-gpu)")
    if cluster_rows:
        typer.echo(f"several-client stack: {several.describe()}")
    for row in cluster_rows:
        node = f" node {row['node']}" if row["node"] else ""
        typer.echo(f"{row['component']:<16} {row['state']:<8} pid {row['pid']:<7} {row['address']:<24}{node:<14} log {row['log']}")
    broken = [r for r in rows + cluster_rows if r["state"] != "running" or r.get("node") not in ("", "ready", None)]
    if broken:
        raise typer.Exit(1)


@dev_app.command("env")
def dev_env(cluster: OnlyCluster = False) -> None:
    """Print export lines for a shell: eval "$(nomadtf dev env)" (the single-node stack
    when it runs, else the several-client one; --cluster: always that one)."""
    import shlex

    from nomadtf.devstack.cluster import ClusterStack
    from nomadtf.devstack.stack import DevStack

    single = DevStack.default()
    if not cluster and (single.components() or not ClusterStack.default().components()):
        for key, value in single.env().items():
            typer.echo(f"export {key}={value}")
        return
    for key, value in ClusterStack.default().env().items():
        typer.echo(f"export {key}={shlex.quote(value)}")


@dev_app.command("binaries")
def dev_binaries(
    names: Annotated[Optional[list[str]], typer.Argument(help="consul, nomad, bao, gpu-plugin, consul-engine (default: the first three)", show_default=False)] = None,
    go: Annotated[Optional[str], typer.Option("--go", help="First install this Go (e.g. go1.26.8) from the Go module proxy's toolchain module")] = None,
    go_root: Annotated[Path, typer.Option("--go-root", help="Where --go puts it")] = Path("/usr/local/go"),
) -> None:
    """Find or build the stack's binaries (cached in ~/.cache/nomadtf) and print their paths."""
    from nomadtf.devstack import binaries

    started = time.monotonic()
    found = binaries.ensure(names or ["consul", "nomad", "bao"], lambda m: _err(f"    {m}"), go, go_root)
    for name, path in found.items():
        typer.echo(f"{name}: {path}")
    _err(f"binaries ready in {time.monotonic() - started:.0f}s")


class MachineKind(str, enum.Enum):
    server = "server"
    client = "client"


class Agent(str, enum.Enum):
    nomad = "nomad"
    consul = "consul"


@dev_app.command("config")
def dev_config(
    kind: Annotated[MachineKind, typer.Argument(help="server (Consul and Nomad servers) or client (their client agents)")],
    agent: Annotated[Agent, typer.Option("--agent", help="nomad: the Nomad agent's HCL; consul: the Consul agent's JSON")] = Agent.nomad,
    index: Annotated[int, typer.Option("--index", min=1, help="client: its number (node client-N, node_class nomadtf-client-N)")] = 1,
    address: Annotated[Optional[str], typer.Option("--address", help="The machine's address; default: the stack's (198.18.0.1, 198.18.0.(10+N))")] = None,
    servers: Annotated[Optional[str], typer.Option("--servers", help="client: the server machine's address(es), comma-separated; default 198.18.0.1")] = None,
    interface: Annotated[str, typer.Option("--interface", help="client: the network interface its allocations advertise")] = "eth0",
    state_dir: Annotated[Optional[Path], typer.Option("--state-dir", help="Holds <machine>/nomad-data and consul-data; default: the stack's")] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="client: fake NVIDIA GPUs (the project's device plugin)")] = 0,
    no_vault: Annotated[bool, typer.Option("--no-vault", help="No vault block (a cluster without Vault)")] = False,
) -> None:
    """Print one machine's agent configuration, as `dev up --clients N` writes it (with no
    option: exactly the stack's file). vagrant/provision.sh writes the VMs' files with it."""
    from nomadtf.devstack import cluster, wiring

    machine = cluster.machine(
        kind.value,
        index,
        state_dir=state_dir,
        address=address,
        servers=[s.strip() for s in servers.split(",") if s.strip()] if servers else (),
        network_interface=interface,
        vault=not no_vault,
        gpus=gpus,
    )
    typer.echo(wiring.nomad_config(machine) if agent is Agent.nomad else wiring.consul_config(machine), nl=False)


# ---- inside an allocation ---------------------------------------------------------------


@app.command(hidden=True)
def task(role: Annotated[str, typer.Option("--role", help="chief, worker, ps, evaluator or tensorboard")]) -> None:
    """The supervisor inside every allocation of a rendered job (not for interactive use)."""
    from nomadtf.runtime import main as task_main

    raise typer.Exit(task_main(role))


# ---- running and following jobs ----------------------------------------------------------


def _view_line(view) -> str:
    roles = " | ".join(
        f"{role}: {rv.running}/{rv.wanted} running, {rv.complete} done, {rv.failed} failed, {rv.restarts} restarts"
        for role, rv in view.roles.items()
    )
    step = f" | step {view.step}" if view.step is not None else ""
    metrics = "".join(f" {k}={v:.4g}" for k, v in sorted(view.metrics.items()))
    return f"[{view.elapsed:5.0f}s] {roles}{step}{metrics}"


class _Display:
    """A live table on a terminal; timestamped lines (only on change) everywhere else."""

    def __init__(self) -> None:
        self.live = None
        self.last = ""
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(console=Console(stderr=True), refresh_per_second=4, transient=True)
            self.live.start()

    def view(self, view) -> None:
        if self.live is not None:
            self.live.update(self._table(view))
            return
        line = _view_line(view)
        key = line.split("]", 1)[1]
        if key != self.last:
            self.last = key
            _stamp(line)

    def event(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(f"{time.strftime('%H:%M:%S')} {text}")
        else:
            _stamp(text)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    @staticmethod
    def _table(view):
        from rich.table import Table

        table = Table(title=f"{view.job_id}  {view.elapsed:.0f}s  step {view.step if view.step is not None else '-'}")
        for column in ("role", "wanted", "running", "complete", "failed", "restarts"):
            table.add_column(column)
        for role, rv in view.roles.items():
            table.add_row(role, str(rv.wanted), str(rv.running), str(rv.complete), str(rv.failed), str(rv.restarts))
        if view.last_line:
            table.caption = f"chief: {view.last_line}"
        return table


@app.command()
def run(
    job_file: JobFile,
    var: Vars = None,
    detach: Annotated[bool, typer.Option("--detach", help="Return once Nomad accepted the job")] = False,
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="Give up following after this long (e.g. 30m); exit 3, the run goes on")] = None,
    templates: TemplatesDir = None,
    replace: Annotated[bool, typer.Option("--replace", help="Stop a run of this job that is still going, then start this one")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the latest checkpoint of the job's previous run")] = False,
) -> None:
    """Validate, render, submit a new run, and follow it to its outcome.

    Exit codes: 0 succeeded, 1 failed, 2 bad job.json, 3 --timeout passed (the run goes on),
    4 stopped from outside, 5 past recovery.deadline, 6 lost, 130 interrupted (the run goes on).
    """
    from nomadtf.run import Run
    from nomadtf.spec import duration_seconds

    timeout_s = duration_seconds(timeout) if timeout else None
    job_run = Run.prepare(job_file, var or [], templates)
    submitted = job_run.submit(replace=replace, resume=resume)
    for note in submitted.notes:
        _stamp(note)
    _stamp(f"submitted {submitted.job_id} run {submitted.run_id} (evaluation {submitted.eval_id[:8]}); Nomad UI: {submitted.ui_url}")
    job_id = submitted.job_id
    where = "" if submitted.namespace == "default" else f" --namespace {submitted.namespace}"
    if detach:
        typer.echo(f"follow it with: nomadtf status {job_id}{where}  |  nomadtf logs {job_id}{where} --role chief --follow")
        return
    display = _Display()
    try:
        outcome = job_run.follow(submitted, timeout_s, on_view=display.view, on_event=display.event)
    except KeyboardInterrupt:
        display.close()
        _err(f"stopped following; {job_id} keeps running (nomadtf status {job_id}{where}, nomadtf stop {job_id}{where})")
        raise typer.Exit(130) from None
    finally:
        display.close()
    for line in outcome.final_lines:
        typer.echo(line)
    _stamp(f"{job_id} succeeded in {outcome.view.elapsed:.0f}s")


@app.command()
def status(
    job_id: Annotated[Optional[str], typer.Argument(help="One job in detail")] = None,
    namespace: Namespace = None,
    region: Region = None,
) -> None:
    """The jobs nomadtf started (matched by their Meta), or one of them in detail."""
    from nomadtf.discovery import ConsulDiscovery
    from nomadtf.follow import alloc_slot, job_report, nomadtf_jobs, restarts_of
    from nomadtf.nomad import NomadAPI

    api = NomadAPI.from_env(namespace=namespace, region=region)
    if job_id is None:
        states = nomadtf_jobs(api)
        if not states:
            typer.echo("no nomadtf jobs")
            return
        for state in states:
            job, view = state.job, state.view
            age = time.time() - job["SubmitTime"] / 1e9
            roles = ", ".join(f"{r} {v.running}/{v.wanted}" + (f" ({v.restarts} restarts)" if v.restarts else "") for r, v in view.roles.items())
            name = job["ID"] if job.get("Namespace", "default") == "default" else f"{job['ID']}@{job['Namespace']}"
            typer.echo(f"{name:<24} {job['Status']:<8} {age / 60:6.1f}m  {roles}")
        return
    report = job_report(api, job_id, lambda run_id: ConsulDiscovery(job_id, api.namespace, run_id=run_id))
    state, job = report.state, report.state.job
    meta = job.get("Meta") or {}
    typer.echo(
        f"{job_id}: {job['Status']}  run {state.run_id or '-'}  {report.elapsed_s:.0f}s  "
        f"strategy {meta.get('nomadtf.strategy', '?')}  nomadtf {meta.get('nomadtf.version', '?')}"
    )
    if report.outcome:
        typer.echo(f"  outcome: {report.outcome}")
    elif report.recorded:
        typer.echo(f"  recorded: {report.recorded} (its tasks are still stopping)")
    if report.progress:
        metrics = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in (report.progress.get("metrics") or {}).items())
        typer.echo(f"  step {report.progress.get('step')}  {metrics}".rstrip())
    if report.consul_error:
        typer.echo(f"  (no outcome or progress: {report.consul_error})")
    for role, rv in state.view.roles.items():
        typer.echo(f"  {role:<11} wanted {rv.wanted}  running {rv.running}  complete {rv.complete}  failed {rv.failed}  restarts {rv.restarts}")
    for alloc in sorted(state.allocs, key=lambda a: a.get("CreateIndex", 0)):
        role, index = alloc_slot(alloc)
        typer.echo(f"    {role}[{index}] {alloc['ID'][:8]} {alloc['ClientStatus']:<9} restarts {restarts_of(alloc)}")


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument(help="Job ID")],
    role: Annotated[str, typer.Option("--role", help="Role whose task logs to show")] = "chief",
    index: Annotated[Optional[int], typer.Option("--index", help="Task index within the role")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="stderr instead of stdout")] = False,
    namespace: Namespace = None,
    region: Region = None,
) -> None:
    """A task's logs through Nomad's API (also after the job finished, until Nomad's GC)."""
    from nomadtf.follow import log_allocations
    from nomadtf.nomad import NomadAPI

    api = NomadAPI.from_env(namespace=namespace, region=region)
    # Every attempt of the slot in the current run (a replacement never hides the one that
    # trained); following streams the newest.
    allocs = log_allocations(api, job_id, role, index, newest_only=follow)
    stream = "stderr" if stderr else "stdout"
    for alloc in allocs:
        if len(allocs) > 1:
            typer.echo(f"==> {alloc['Name']} ({alloc['ID'][:8]}, {alloc.get('ClientStatus')})")
        if follow:
            for chunk in api.follow_logs(alloc["ID"], role, stream):
                typer.echo(chunk, nl=False)
        else:
            typer.echo(api.logs(alloc["ID"], role, stream), nl=False)


@app.command()
def scale(
    job_id: Annotated[str, typer.Argument(help="Job ID")],
    targets: Annotated[list[str], typer.Argument(help="ROLE=COUNT, e.g. worker=3", show_default=False)],
    namespace: Namespace = None,
    region: Region = None,
) -> None:
    """Resize the workers of a running job; the chief restarts once from its checkpoint."""
    from nomadtf.nomad import NomadAPI
    from nomadtf.run import parse_scale, scale_job

    counts = parse_scale(targets)
    before = scale_job(NomadAPI.from_env(namespace=namespace, region=region), job_id, counts)
    for role, count in counts.items():
        typer.echo(f"{job_id}: {role} {before[role]} -> {count}")


@app.command()
def stop(
    job_id: Annotated[str, typer.Argument(help="Job ID")],
    purge: Annotated[bool, typer.Option("--purge", help="Also remove it from Nomad and its keys from Consul")] = False,
    namespace: Namespace = None,
    region: Region = None,
) -> None:
    """Stop a nomadtf job; nothing else is touched."""
    from nomadtf.nomad import NomadAPI
    from nomadtf.run import stop_job

    stop_job(NomadAPI.from_env(namespace=namespace, region=region), job_id, purge=purge)
    typer.echo(f"stopped {job_id}" + (" and purged it" if purge else ""))


# ---- rendering ---------------------------------------------------------------------------


@app.command()
def render(
    job_file: JobFile,
    var: Vars = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout")] = None,
    tf_config: Annotated[bool, typer.Option("--tf-config", help="Show every task's TF_CONFIG instead")] = False,
    templates: TemplatesDir = None,
) -> None:
    """Render job.json into the Nomad job (API JSON). Offline."""
    from nomadtf import cluster
    from nomadtf import render as render_mod
    from nomadtf import spec as spec_mod

    spec = spec_mod.load_spec(job_file, var or [])
    if tf_config:
        configs = cluster.all_tf_configs(spec["name"], spec["strategy"], spec_mod.role_counts(spec))
        text = json.dumps(configs, indent=2, sort_keys=True) + "\n"
    else:
        text = render_mod.job_json(render_mod.render_job(spec, templates))
    if out:
        out.write_text(text)
        _err(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


@app.command()
def validate(job_file: JobFile, var: Vars = None, templates: TemplatesDir = None) -> None:
    """Check job.json (schema, cross-field rules), then Nomad's own validation if reachable."""
    from nomadtf.environment import docker_image_needs
    from nomadtf.errors import UnreachableError
    from nomadtf.run import Run
    from nomadtf.spec import role_counts

    job_run = Run.prepare(job_file, var or [], templates)
    typer.echo(f"{job_file}: valid ({job_run.spec['strategy']}, roles {role_counts(job_run.spec)})")
    for line in docker_image_needs(job_run.spec):
        typer.echo(line)
    try:
        warnings = job_run.api.validate(job_run.job)
    except UnreachableError as exc:
        typer.echo(f"Nomad validation skipped: {exc}")
        return
    for warning in warnings:
        typer.echo(f"Nomad warning: {warning}")
    typer.echo(f"Nomad at {job_run.api.address}: valid")


@app.command()
def plan(job_file: JobFile, var: Vars = None, templates: TemplatesDir = None) -> None:
    """Nomad's plan for the job. Exit 0: no change; 1: changes or placement problems; 255: error."""
    from nomadtf import plan as plan_mod
    from nomadtf.run import Run

    try:
        job_run = Run.prepare(job_file, var or [], templates)
        result = job_run.api.plan(job_run.job)
    except NomadtfError as exc:
        _err(str(exc) if not _state["debug"] else repr(exc))
        raise typer.Exit(255) from exc
    summary = plan_mod.describe_plan(result, job_run.job["Job"])
    typer.echo("\n".join(summary.lines))
    raise typer.Exit(1 if summary.changes or summary.failures else 0)


# ---- ACLs ------------------------------------------------------------------------------


def _acl_spec(job_file: Path, var: list[str] | None) -> dict:
    """The job's spec for `nomadtf acl`: before `acl apply`, job.json may not list the
    Vault policy it creates yet."""
    from nomadtf import acl
    from nomadtf import spec as spec_mod

    raw = spec_mod.apply_overrides(spec_mod.read_options(job_file), var or [])
    raw = spec_mod.with_namespace(raw, os.environ)
    name = acl.policy_name({"name": raw.get("name", ""), "namespace": raw["namespace"]})
    return spec_mod.load_spec(job_file, var or [], vault_policies=[name] if name else None)


@acl_app.command("policies")
def acl_policies(job_file: JobFile, var: Vars = None) -> None:
    """Print the four policies of a job: Nomad and Consul for whoever submits it, Consul and
    Vault for its tasks. Offline."""
    from nomadtf import acl

    spec = _acl_spec(job_file, var)
    policies = acl.job_policies(spec)
    namespace = spec.get("namespace", "default")
    sections = (
        (f"Nomad policy for the submitter (namespace {namespace})", policies.nomad_submitter),
        ("Consul policy for the submitter", policies.consul_submitter),
        (f"Consul policy for the job's tasks ({policies.name})", policies.consul_tasks),
        (f"Vault policy for the job's tasks ({policies.name}; list it in vault.policies)", policies.vault_tasks),
    )
    for title, text in sections:
        typer.echo(f"# --- {title}")
        typer.echo(text)


@acl_app.command("apply")
def acl_apply(job_file: JobFile, var: Vars = None) -> None:
    """Operator: create the job's task policies and its tasks' Consul token source (needs
    CONSUL_HTTP_TOKEN with acl write and a VAULT_TOKEN that may write policies)."""
    from nomadtf import acl_setup

    spec = _acl_spec(job_file, var)
    applied = acl_setup.apply(spec)
    how = "a Consul secrets engine role: one leased token per task" if applied.mode == "engine" else "one token kept in Vault's KV"
    _err(f"Consul policy and Vault policy {applied.name} written; the tasks' Consul token: {applied.token_path} ({how})")
    typer.echo("add to job.json:")
    typer.echo(json.dumps({"discovery": {"consul_token_path": applied.token_path}, "vault": {"policies": [applied.name]}}, indent=2))


@acl_app.command("revoke")
def acl_revoke(job_file: JobFile, var: Vars = None) -> None:
    """Operator: delete what `acl apply` created for the job."""
    from nomadtf import acl_setup

    acl_setup.revoke(_acl_spec(job_file, var))
    _err("removed the job's policies and Consul token source")


@app.command("convert-dcos")
def convert_dcos(
    options_file: Annotated[Path, typer.Argument(help="options.json of the DC/OS beta-tensorflow package", show_default=False)],
    out: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout")] = None,
) -> None:
    """Convert a DC/OS beta-tensorflow options file into a nomadtf job.json. Offline."""
    from nomadtf import dcos
    from nomadtf import spec as spec_mod

    conversion = dcos.convert_options(spec_mod.read_options(options_file))
    for note in conversion.notes:
        _err(f"not carried over: {note}")
    spec_mod.normalize(conversion.job)
    text = json.dumps(conversion.job, indent=2) + "\n"
    if out:
        out.write_text(text)
        _err(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


# ---- job environments on a client ---------------------------------------------------------

EnvDir = Annotated[
    Optional[Path], typer.Option("--dir", help="The cache of environments; default NOMADTF_ENV_DIR, else ~/.cache/nomadtf/envs")
]


def _env_cache(directory: Path | None):
    import os

    from nomadtf.environment import EnvCache, default_root

    return EnvCache(directory or default_root(dict(os.environ)))


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@env_app.command("list")
def env_list(directory: EnvDir = None) -> None:
    """The environments on this client: key, Python, last use, in use, requirements."""
    cache = _env_cache(directory)
    entries = cache.entries()
    if not entries:
        typer.echo(f"no environments in {cache.root}")
        return
    now = time.time()
    for entry in entries:
        marker = entry.marker
        typer.echo(
            f"{entry.key}  python {marker.get('python_version', '?')}  last used {_ago(now - entry.last_used)} ago"
            f"  {'in use' if cache.in_use(entry.key) else 'idle'}  built in {marker.get('build_s', '?')}s"
            f"  {', '.join(marker.get('requirements', []))}"
        )


@env_app.command("gc")
def env_gc(
    older_than: Annotated[str, typer.Option("--older-than", help="Remove environments unused for longer than this (7d, 12h, 30m)")] = "7d",
    directory: EnvDir = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be removed")] = False,
) -> None:
    """Remove environments unused for longer than --older-than; never one a task uses."""
    from nomadtf.environment import age_seconds

    cache = _env_cache(directory)
    removed, busy = cache.gc(age_seconds(older_than), dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for entry in removed:
        typer.echo(f"{verb} {entry.key} ({', '.join(entry.marker.get('requirements', []))})")
    for entry in busy:
        typer.echo(f"kept {entry.key}: in use by a task")
    typer.echo(f"{verb} {len(removed)} environment(s) from {cache.root}; {len(busy)} in use")


def main() -> None:
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except NomadtfError as exc:
        if _state["debug"]:
            raise
        _err(f"error: {exc}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _err("aborted")
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: a wrong option, a missing argument
        show = getattr(exc, "show", None)
        if show:
            show()
        else:
            _err(f"error: {exc}")
        sys.exit(getattr(exc, "exit_code", 2))
    except Exception as exc:  # anything unexpected: one line, the traceback only with --debug
        if _state["debug"]:
            raise
        _err(f"unexpected error: {exc.__class__.__name__}: {exc} (run with --debug for the traceback)")
        sys.exit(70)

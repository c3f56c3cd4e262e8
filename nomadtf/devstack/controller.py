"""The admission controller on a local stack: every `nomadtf dev up` deploys it, as an
operator deploys it on a real cluster (`nomadtf admission deploy`), so the test bed admits
runs the way users' clusters do.

On a stack without ACLs it runs in `default` with no token. On the secure stack it runs in
its own namespace (`ops`, which no team's token may write), with a Nomad and a Consul token
made from exactly the controller's policies `nomadtf acl policies` prints, handed to the
replicas through the job's Nomad variable (`deploy --tokens`).

Usage:
    ensure_controller(stack, progress, secure=True)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from nomadtf import wire
from nomadtf.admission.deploy import CONTROLLER_TOKEN_ENV, deploy
from nomadtf.admission.lease import leader_of
from nomadtf.errors import DevStackError
from nomadtf.job import acl
from nomadtf.servers.nomad import NomadAPI
from nomadtf.servers.nomadhttp import NomadSettings

OPS_NAMESPACE = "ops"
POLICY_NAME = "nomadtf-admission"
LEAD_TIMEOUT_S = 90.0


def _controller_tokens(stack: Any) -> dict[str, str]:
    """A Nomad and a Consul token with the controller's policies (made by the operator).

    PUT /v1/namespace/ops ; POST /v1/acl/policy/:name ; POST /v1/acl/token ;
    PUT /v1/acl/policy ; PUT /v1/acl/token"""
    api = stack.api()
    session, urls = api.session(), api.urls
    session.put(f"{urls['nomad']}/v1/namespace/{OPS_NAMESPACE}", json={"Name": OPS_NAMESPACE, "Description": "operators only: the admission controller"}, timeout=10).raise_for_status()
    session.post(f"{urls['nomad']}/v1/acl/policy/{POLICY_NAME}", json={"Name": POLICY_NAME, "Rules": acl.nomad_controller_policy()}, timeout=10).raise_for_status()
    nomad_token = session.post(f"{urls['nomad']}/v1/acl/token", json={"Type": "client", "Name": POLICY_NAME, "Policies": [POLICY_NAME]}, timeout=10)
    nomad_token.raise_for_status()
    rules = acl.consul_hcl(acl.consul_controller_rules())
    existing = {p["Name"]: p["ID"] for p in session.get(f"{urls['consul']}/v1/acl/policies", timeout=10).json()}
    if POLICY_NAME in existing:
        session.put(f"{urls['consul']}/v1/acl/policy/{existing[POLICY_NAME]}", json={"Name": POLICY_NAME, "Rules": rules}, timeout=10).raise_for_status()
    else:
        session.put(f"{urls['consul']}/v1/acl/policy", json={"Name": POLICY_NAME, "Rules": rules}, timeout=10).raise_for_status()
    consul_token = session.put(f"{urls['consul']}/v1/acl/token", json={"Description": POLICY_NAME, "Policies": [{"Name": POLICY_NAME}]}, timeout=10)
    consul_token.raise_for_status()
    return {CONTROLLER_TOKEN_ENV["nomad_token"]: nomad_token.json()["SecretID"], CONTROLLER_TOKEN_ENV["consul_token"]: consul_token.json()["SecretID"]}


def ensure_controller(stack: Any, progress: Callable[[str], None], *, secure: bool = False) -> str:
    """Deploy the controller unless its job runs already; wait until a replica leads.
    Returns the leader's name.

    GET /v1/job/nomadtf-admission ; what `deploy` calls ; GET /v1/kv/nomadtf/_admission/leader"""
    env = stack.env()
    namespace = OPS_NAMESPACE if secure else wire.DEFAULT_NAMESPACE
    operator = NomadAPI(NomadSettings.from_env(env, namespace=namespace))
    job = operator.job(wire.ADMISSION_SERVICE_JOB) if not secure or _namespace_exists(operator) else None
    if job is None or job.stop or job.dead:
        controller_env = {**env, **_controller_tokens(stack)} if secure else env
        deploy(operator, 2, sys.executable, secure, controller_env, on_event=progress)
    consul = stack.api().consul()
    deadline = time.monotonic() + LEAD_TIMEOUT_S
    while time.monotonic() < deadline:
        leader = leader_of(consul)[1]
        if leader:
            progress(f"admission controller leads ({leader})")
            return leader
        time.sleep(0.5)
    raise DevStackError(
        f"the admission controller did not take the lead within {LEAD_TIMEOUT_S:.0f}s; "
        f"see its logs: nomad alloc logs -job {wire.ADMISSION_SERVICE_JOB} -namespace {namespace}"
    )


def _namespace_exists(api: NomadAPI) -> bool:
    return OPS_NAMESPACE in api.namespaces()

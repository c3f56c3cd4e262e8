"""Reaching the several-client test bed as its operator: HTTPS with the stack's CA and the
management tokens (the secure stack), or plain HTTP (a stack started without --secure).

Tests name the cluster's addresses on every call and never change os.environ, so the
single-node stack of the other tests is never confused with this one.

Usage:
    nomad_get(cluster, "job/x/allocations")
    consul_in(cluster, 2, "/v1/agent/self")          # from inside client-2's namespace
    spec = secured(probe_job("x"), cluster, tmp_path) # what `nomadtf acl apply` adds
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import consul

from nomadtf.devstack import netns
from nomadtf.devstack.cluster import ClusterStack
from tests.helpers import nomadtf, write_job


def nomad_get(cluster: ClusterStack, path: str, **params):
    """GET <cluster Nomad>/v1/<path>"""
    api = cluster.api()
    resp = api.session().get(f"{api.nomad_url}/v1/{path}", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()


def nomad_purge(cluster: ClusterStack, job_id: str, namespace: str = "default") -> None:
    """DELETE <cluster Nomad>/v1/job/:job_id?purge=true"""
    api = cluster.api()
    api.session().delete(f"{api.nomad_url}/v1/job/{job_id}", params={"purge": "true", "namespace": namespace}, timeout=10)


def nomad_token(cluster: ClusterStack, name: str, rules: str) -> str:
    """A client token with exactly `rules`, as an operator makes one (POST /v1/acl/policy/:name, /v1/acl/token)."""
    api, found = cluster.api().session(), cluster.api().urls
    api.post(f"{found['nomad']}/v1/acl/policy/{name}", json={"Name": name, "Rules": rules}, timeout=10).raise_for_status()
    token = api.post(f"{found['nomad']}/v1/acl/token", json={"Type": "client", "Policies": [name]}, timeout=10)
    token.raise_for_status()
    return token.json()["SecretID"]


def consul_get(cluster: ClusterStack, path: str, **params):
    """GET <cluster Consul server>/v1/<path> (the response, unchecked)"""
    api = cluster.api()
    return api.session().get(f"{api.consul_url}/v1/{path}", params=params, timeout=10)


def consul_client(cluster: ClusterStack) -> consul.Consul:
    """py-consul for the Consul server, with the operator's token on the secure stack."""
    return cluster.api().consul()


def consul_in(cluster: ClusterStack, index: int, path: str):
    """GET <path> of client `index`'s own Consul agent, from inside its namespace (127.0.0.1)."""
    if cluster.shape().secure:
        ca = str(cluster.secure_state.ca_file)
        token = cluster.secure_state.tokens().consul_management
        code = (
            "import ssl,sys,urllib.request;"
            f"ctx=ssl.create_default_context(cafile={ca!r});"
            f"req=urllib.request.Request('https://127.0.0.1:8501{path}',headers={{'X-Consul-Token':sys.stdin.read()}});"
            "sys.stdout.write(urllib.request.urlopen(req,timeout=5,context=ctx).read().decode())"
        )
    else:
        token = ""
        code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:8500{path}', timeout=5).read().decode())"
    # The token goes through stdin, never argv.
    out = subprocess.run(
        ["ip", "netns", "exec", netns.namespace(index), sys.executable, "-c", code],
        input=token, capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def secured(spec: dict, cluster: ClusterStack, tmp_path: Path) -> dict:
    """`spec` made ready for the cluster, the way docs/operations/secure-stack.md says: on the
    secure stack the agents' CA for Consul and Vault, Vault's address, and what
    `nomadtf acl apply` (run here as the operator) prints: the tasks' Consul token path and
    their Vault policy. On a plain stack, unchanged."""
    if not cluster.shape().secure:
        return spec
    ca = str(cluster.secure_state.ca_file)
    spec = json.loads(json.dumps(spec))
    spec.setdefault("discovery", {}).update(consul_address="https://127.0.0.1:8501", consul_ca_file=ca)
    spec.setdefault("vault", {}).update(address=cluster.api().vault_url, ca_file=ca)
    path = write_job(tmp_path, spec)
    # The operator allows the Vault policies the test's job lists beside its own.
    allowed = [arg for policy in spec["vault"].get("policies", []) for arg in ("--allow-policy", policy)]
    applied = nomadtf("acl", "apply", str(path), *allowed, env=cluster.env(), timeout=60)
    assert applied.returncode == 0, applied.stderr
    printed = json.loads(applied.stdout.split("add to job.json:", 1)[1])
    spec["discovery"]["consul_token_path"] = printed["discovery"]["consul_token_path"]
    spec["vault"]["policies"] = sorted(set(spec["vault"].get("policies", [])) | set(printed["vault"]["policies"]))
    return spec

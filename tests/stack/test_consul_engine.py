"""The Consul secrets engine plugin (nomadtf/devstack/consul_engine.py, registered and
mounted by bootstrap.py) against a real OpenBao and a real Consul with ACLs, both started
here on free loopback ports: it builds (cached), OpenBao registers and mounts it, and
`consul/creds/<role>` hands out leased Consul tokens that do what their policy allows and
nothing else, renew, and vanish from Consul when their lease is revoked. No test prints a
token."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import hvac
import pytest
import requests

from nomadtf.devstack import binaries, bootstrap, consul_engine, plugin_builder
from nomadtf.devstack.probes import wait_for
from tests.helpers import wait_until


def _progress(message: str) -> None:
    sys.stderr.write(f"[consul-engine] {message}\n")


def _free_ports(count: int, consecutive: bool = False) -> list[int]:
    """Ports the kernel hands out for port 0 (ephemeral, so never the stacks' 4646-8600)."""
    for _ in range(50):
        sockets = []
        try:
            first = socket.socket()
            first.bind(("127.0.0.1", 0))
            sockets.append(first)
            base = first.getsockname()[1]
            for i in range(1, count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", base + i if consecutive else 0))
            return [s.getsockname()[1] for s in sockets]
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free loopback ports")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def engine() -> Path:
    # Built like every other binary of the stack; no Go is a failure, never a skip.
    return consul_engine.find_or_build(_progress)


@pytest.fixture(scope="module")
def consul(tmp_path_factory) -> Iterator[dict]:
    binary = binaries.find_or_build("consul", _progress)
    tmp = tmp_path_factory.mktemp("consul")
    management = str(uuid.uuid4())
    config = tmp / "acl.json"
    config.write_text(
        json.dumps(
            {"acl": {"enabled": True, "default_policy": "deny", "tokens": {"initial_management": management}}}
        )
    )
    http, server, lan, wan = _free_ports(4)
    cmd = [
        str(binary), "agent", "-dev", "-bind=127.0.0.1", "-client=127.0.0.1",
        f"-http-port={http}", "-dns-port=-1", f"-server-port={server}",
        f"-serf-lan-port={lan}", f"-serf-wan-port={wan}", "-grpc-port=-1", "-grpc-tls-port=-1",
        f"-data-dir={tmp / 'data'}", f"-config-file={config}",
    ]  # fmt: skip
    log = (tmp / "consul.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}"
    api = requests.Session()
    api.trust_env = False
    api.headers["X-Consul-Token"] = management
    try:
        wait_for(lambda: proc.poll() is None and api.get(f"{url}/v1/status/leader", timeout=2).json(), 60, "consul", str(tmp / "consul.log"))
        yield {"url": url, "address": f"127.0.0.1:{http}", "api": api, "management": management}
    finally:
        _stop(proc)
        log.close()


@pytest.fixture(scope="module")
def openbao(engine, tmp_path_factory) -> Iterator[dict]:
    bao = binaries.find_bao()
    tmp = tmp_path_factory.mktemp("openbao")
    config = tmp / "openbao.hcl"
    config.write_text(consul_engine.openbao_config(engine.parent))
    root = str(uuid.uuid4())
    port, _cluster = _free_ports(2, consecutive=True)  # -dev listens on port and port+1
    cmd = [
        str(bao), "server", "-dev", f"-dev-root-token-id={root}", "-dev-no-store-token",
        f"-dev-listen-address=127.0.0.1:{port}", f"-config={config}",
    ]  # fmt: skip
    log = (tmp / "openbao.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    api = requests.Session()
    api.trust_env = False
    api.headers["X-Vault-Token"] = root
    try:
        wait_for(lambda: proc.poll() is None and api.get(f"{url}/v1/sys/health", timeout=2).ok, 60, "openbao", str(tmp / "openbao.log"))
        yield {"url": url, "api": api, "vault": hvac.Client(url=url, token=root)}
    finally:
        _stop(proc)
        log.close()


@pytest.fixture(scope="module")
def mounted(engine, openbao, consul) -> dict:
    """The engine registered, mounted at consul/, given Consul's management token, and a
    role `kv-app` whose tokens may write keys under app/ only."""
    bao, cons = openbao["api"], consul["api"]
    bootstrap.register_consul_engine(openbao["vault"], engine)
    policy = cons.put(
        f"{consul['url']}/v1/acl/policy",
        json={"Name": "kv-app", "Rules": 'key_prefix "app/" { policy = "write" }'},
        timeout=10,
    )
    assert policy.ok, policy.status_code
    access = bao.post(
        f"{openbao['url']}/v1/consul/config/access",
        json={"address": consul["address"], "scheme": "http", "token": consul["management"]},
        timeout=10,
    )
    assert access.ok, access.status_code
    role = bao.post(
        f"{openbao['url']}/v1/consul/roles/kv-app",
        json={"consul_policies": ["kv-app"], "ttl": "60s", "max_ttl": "300s"},
        timeout=10,
    )
    assert role.ok, role.status_code
    return {"bao": bao, "bao_url": openbao["url"], "vault": openbao["vault"], "consul": cons, "consul_url": consul["url"]}


def _creds(m: dict) -> dict:
    resp = m["bao"].get(f"{m['bao_url']}/v1/consul/creds/kv-app", timeout=30)
    assert resp.ok, resp.status_code
    return resp.json()


def _kv_put(m: dict, token: str, key: str) -> int:
    return requests.put(
        f"{m['consul_url']}/v1/kv/{key}", data=b"x", headers={"X-Consul-Token": token}, timeout=10
    ).status_code


def _token_exists(m: dict, accessor: str) -> bool:
    resp = m["consul"].get(f"{m['consul_url']}/v1/acl/token/{accessor}", timeout=10)
    if resp.status_code in (403, 404) and "not found" in resp.text.lower():
        return False
    assert resp.ok, resp.status_code
    return True


def test_the_plugin_is_cached_with_its_sources_stamp(engine):
    assert engine == consul_engine.PLUGIN.path()
    assert plugin_builder.is_current(engine, plugin_builder.source_hash(consul_engine.SOURCE_DIR))
    directory, sha256 = consul_engine.plugin(_progress)
    assert directory == engine.parent
    assert sha256 == consul_engine.binary_sha256(engine) and len(sha256) == 64


def test_openbao_config_names_the_plugin_directory(tmp_path):
    assert consul_engine.openbao_config(tmp_path) == f'plugin_directory = "{tmp_path}"\n'


def test_the_engine_is_registered_and_mounted(mounted, engine):
    info = mounted["bao"].get(f"{mounted['bao_url']}/v1/sys/plugins/catalog/secret/consul", timeout=10)
    assert info.ok
    assert info.json()["data"]["sha256"] == consul_engine.binary_sha256(engine)
    assert info.json()["data"]["builtin"] is False
    mounts = mounted["bao"].get(f"{mounted['bao_url']}/v1/sys/mounts", timeout=10).json()["data"]
    assert mounts["consul/"]["type"] == "consul"


def test_registering_again_reloads_and_keeps_working(mounted, engine):
    bootstrap.register_consul_engine(mounted["vault"], engine)
    creds = _creds(mounted)
    assert _kv_put(mounted, creds["data"]["token"], "app/again") == 200


def test_creds_are_leased_tokens_that_the_policy_bounds(mounted):
    creds = _creds(mounted)
    assert creds["lease_id"].startswith("consul/creds/kv-app/")
    assert creds["renewable"] is True
    assert 0 < creds["lease_duration"] <= 60
    token = creds["data"]["token"]
    assert _kv_put(mounted, token, "app/allowed") == 200
    assert _kv_put(mounted, token, "other/denied") == 403
    assert _token_exists(mounted, creds["data"]["accessor"])


def test_a_lease_renews_and_its_revocation_deletes_the_token(mounted):
    creds = _creds(mounted)
    bao, url = mounted["bao"], mounted["bao_url"]
    renewed = bao.put(
        f"{url}/v1/sys/leases/renew", json={"lease_id": creds["lease_id"], "increment": 120}, timeout=30
    )
    assert renewed.ok, renewed.status_code
    assert renewed.json()["lease_duration"] == 120
    revoked = bao.put(f"{url}/v1/sys/leases/revoke", json={"lease_id": creds["lease_id"]}, timeout=30)
    assert revoked.ok, revoked.status_code
    wait_until(lambda: not _token_exists(mounted, creds["data"]["accessor"]), 30, "the token's deletion")
    assert _kv_put(mounted, creds["data"]["token"], "app/after-revoke") == 403

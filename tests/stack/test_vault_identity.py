"""The Vault side of Nomad 1.7+ workload identities, on the real OpenBao: the JWT auth
method and per-job role that `nomadtf acl apply` writes, fed identities signed here the way
Nomad 2.0 signs a task's `vault_default` identity (a JWKS served by this test stands in for
Nomad's /.well-known/jwks.json; Nomad 1.7+ is never run here).

A job's identity logs in and reads that job's secrets and nothing else; the identity of
another job, of the same job in another namespace, for another audience, expired, or signed
by another key is refused. `nomadtf acl apply --nomad-version 2.0.5` itself, as an operator
runs it, writes a role that such an identity logs in with, granting the policies job.json
lists too, and refuses, naming --configure-auth, where the auth method is missing."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
import uuid

import hvac
import hvac.exceptions
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from nomadtf import wire
from nomadtf.client import acl_setup
from nomadtf.devstack import stack as stack_mod
from nomadtf.errors import AclConflict
from nomadtf.job import acl
from nomadtf.job.spec import parse_spec
from nomadtf.servers import vault as vault_api
from tests.helpers import nomadtf, probe_job, write_job

pytestmark = pytest.mark.stack


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int_b64(value: int) -> str:
    return _b64(value.to_bytes((value.bit_length() + 7) // 8, "big"))


class Signer:
    """An RS256 key as Nomad's keyring holds one: signs identities, publishes its JWKS."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = uuid.uuid4().hex

    def jwks(self) -> dict:
        numbers = self.key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self.kid, "n": _int_b64(numbers.n), "e": _int_b64(numbers.e)}]}

    def sign(self, claims: dict) -> str:
        header = {"alg": "RS256", "kid": self.kid, "typ": "JWT"}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"


def vault_identity(namespace: str, job: str, role: str, audience: str = "vault.io", lifetime_s: int = 3600, task: str = "chief") -> dict:
    """The claims of a task's vault_default identity as Nomad 2.0 documents them."""
    now = int(time.time())
    return {
        "aud": [audience],
        "iat": now,
        "nbf": now,
        "exp": now + lifetime_s,
        "jti": str(uuid.uuid4()),
        "sub": f"global:{namespace}:{job}:{task}:{task}:vault_default",
        "nomad_namespace": namespace,
        "nomad_job_id": job,
        "nomad_allocation_id": str(uuid.uuid4()),
        "nomad_task": task,
        "vault_role": role,
    }


@pytest.fixture
def jwks_server():
    """Nomad's JWKS endpoint, as Vault fetches it: GET /.well-known/jwks.json on 127.0.0.1."""
    signer = Signer()
    body = json.dumps(signer.jwks()).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            if self.path != "/.well-known/jwks.json":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield signer, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def root(stack):
    return hvac.Client(url=stack_mod.VAULT_ADDR, token=stack.root_token())


def job_spec(namespace: str, name: str, secret_path: str) -> dict:
    return parse_spec({
        "name": name,
        "namespace": namespace,
        "strategy": "parameter_server",
        "entrypoint": {"script": "train.py"},
        "roles": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}},
        "secrets": [{"path": secret_path, "key": "value", "env": "JOB_SECRET"}],
        "vault": {"policies": [wire.acl_name(namespace, name)]},  # what the cluster profile fills in
    })


def test_a_jobs_identity_reads_its_secrets_and_nothing_else(root, jwks_server, tmp_path, monkeypatch):
    signer, nomad_address = jwks_server
    tag = uuid.uuid4().hex[:6]
    mount = f"jwt-nomadtf-{tag}"
    jobs = {"a": ("default", f"jwt-a-{tag}"), "b": ("team-b", f"jwt-b-{tag}")}
    specs, values = {}, {}
    try:
        for key, (namespace, name) in jobs.items():
            path = f"nomadtf-jwt/{tag}/{key}"
            values[key] = f"secret-of-{key}-{uuid.uuid4().hex}"
            root.secrets.kv.v2.create_or_update_secret(path=path, secret={"value": values[key]}, mount_point="secret")
            specs[key] = job_spec(namespace, name, f"secret/{path}")
            # What `acl apply` writes on Vault (the token path here: KV; the plain stack's
            # Consul has no ACLs for the Consul half). The first call also sets up the method.
            config = acl.jwt_auth_config(nomad_address) if key == "a" else None
            written = acl_setup.write_vault_side(root, specs[key], acl_setup.kv_token_path(specs[key]), acl_setup.JwtSetup(mount, config))
            assert written == f"auth/{mount}/role/{acl.policy_name(specs[key])}"
        stored = root.read(f"auth/{mount}/config")["data"]
        assert stored["jwks_url"] == f"{nomad_address}/.well-known/jwks.json"
        assert stored["default_role"] == acl.JWT_DEFAULT_ROLE

        def login(claims: dict, role: str, key: Signer = signer) -> hvac.Client:
            client = hvac.Client(url=stack_mod.VAULT_ADDR)
            client.auth.jwt.jwt_login(role=role, jwt=key.sign(claims), path=mount)
            return client

        role_a, role_b = acl.policy_name(specs["a"]), acl.policy_name(specs["b"])
        namespace_a, job_a = jobs["a"]
        namespace_b, job_b = jobs["b"]
        task_a = login(vault_identity(namespace_a, job_a, role_a), role_a)
        assert task_a.lookup_token()["data"]["policies"] == ["default", role_a]
        assert task_a.lookup_token()["data"]["meta"]["nomad_job_id"] == job_a
        assert task_a.secrets.kv.v2.read_secret_version(path=f"nomadtf-jwt/{tag}/a", mount_point="secret", raise_on_deleted_version=True)["data"]["data"]["value"] == values["a"]
        with pytest.raises(hvac.exceptions.Forbidden):
            task_a.secrets.kv.v2.read_secret_version(path=f"nomadtf-jwt/{tag}/b", mount_point="secret", raise_on_deleted_version=True)
        with pytest.raises(hvac.exceptions.Forbidden):  # read only, even on its own secret
            task_a.secrets.kv.v2.create_or_update_secret(path=f"nomadtf-jwt/{tag}/a", secret={"value": "x"}, mount_point="secret")

        # What `nomadtf task` does with the VAULT_TOKEN Nomad hands it is unchanged: the
        # job's secrets into the code's environment, read with that token.
        monkeypatch.setenv("VAULT_TOKEN", task_a.token)
        session = vault_api.VaultSession({"auth": "nomad", "address": stack_mod.VAULT_ADDR})
        try:
            fetched = session.fetch(list(specs["a"].secrets), tmp_path)
        finally:
            session.close()
        assert fetched.env == {"JOB_SECRET": values["a"]}

        job_b_task = login(vault_identity(namespace_b, job_b, role_b), role_b)
        assert job_b_task.secrets.kv.v2.read_secret_version(path=f"nomadtf-jwt/{tag}/b", mount_point="secret", raise_on_deleted_version=True)["data"]["data"]["value"] == values["b"]

        refused = {
            "another job of the same namespace": (vault_identity(namespace_a, f"jwt-c-{tag}", role_a), signer),
            "another job's claims": (vault_identity(namespace_b, job_b, role_a), signer),
            "the same job in another namespace": (vault_identity("team-b", job_a, role_a), signer),
            "another audience": (vault_identity(namespace_a, job_a, role_a, audience="consul.io"), signer),
            "an expired identity": (vault_identity(namespace_a, job_a, role_a, lifetime_s=-120), signer),
            "a key Nomad does not publish": (vault_identity(namespace_a, job_a, role_a), Signer()),
        }
        for what, (claims, key) in refused.items():
            try:
                login(claims, role_a, key)
            except (hvac.exceptions.InvalidRequest, hvac.exceptions.Forbidden):
                continue
            pytest.fail(f"{what} logged in as job a")
    finally:
        if f"{mount}/" in root.sys.list_auth_methods()["data"]:
            root.sys.disable_auth_method(mount)
        for key, spec in specs.items():
            root.sys.delete_policy(acl.policy_name(spec))
            root.secrets.kv.v2.delete_metadata_and_all_versions(path=f"nomadtf-jwt/{tag}/{key}", mount_point="secret")


def test_apply_refuses_a_role_of_the_jobs_name_bound_to_another_job(root, jwks_server):
    _signer, nomad_address = jwks_server
    tag = uuid.uuid4().hex[:6]
    mount = f"jwt-nomadtf-{tag}"
    spec = job_spec("default", f"jwt-owner-{tag}", f"secret/nomadtf-jwt/{tag}/x")
    try:
        acl_setup.ensure_jwt_auth(root, mount, acl.jwt_auth_config(nomad_address))
        intruder = {**acl.vault_jwt_role(spec), "bound_claims": {"nomad_namespace": "default", "nomad_job_id": "someone-else"}}
        root.write(f"auth/{mount}/role/{acl.policy_name(spec)}", **intruder)
        with pytest.raises(AclConflict, match="bound to other claims"):
            acl_setup.check_jwt_role_owner(spec, acl_setup._jwt_role(root, mount, acl.policy_name(spec)))
        assert acl_setup._jwt_role(root, mount, "no-such-role") is None
    finally:
        root.sys.disable_auth_method(mount)



def test_acl_apply_from_the_command_line_writes_the_role_a_jobs_identity_logs_in_with(stack, root, jwks_server, tmp_path):
    """The operator's commands as docs/nomad-versions.md shows them, against the real OpenBao
    (the plain stack's Consul has no ACLs: only the Vault half is written)."""
    signer, nomad_address = jwks_server
    tag = uuid.uuid4().hex[:6]
    mount, name = f"jwt-nomadtf-{tag}", f"jwt-cli-{tag}"
    role = wire.acl_name("default", name)
    extra = f"nomadtf-jwt-extra-{tag}"  # a policy job.json lists: on 1.10+ only the role can grant it
    values = {key: f"{key}-{uuid.uuid4().hex}" for key in ("own", "extra")}
    for key, value in values.items():
        root.secrets.kv.v2.create_or_update_secret(path=f"nomadtf-jwt/{tag}/{key}", secret={"value": value}, mount_point="secret")
    root.sys.create_or_update_policy(extra, f'path "secret/data/nomadtf-jwt/{tag}/extra" {{\n  capabilities = ["read"]\n}}\n')
    job = write_job(tmp_path, {
        **probe_job(name),
        "secrets": [{"path": f"secret/nomadtf-jwt/{tag}/own", "key": "value", "env": "JOB_SECRET"}],
        "vault": {"policies": [extra]},
    })
    env = {"VAULT_ADDR": stack_mod.VAULT_ADDR, "VAULT_TOKEN": stack.root_token(), "NOMAD_CACERT": "", "NOMADTF_CLUSTER_PROFILE": ""}
    apply = ["acl", "apply", str(job), "--nomad-version", "2.0.5", "--jwt-mount", mount, "--allow-policy", extra]
    try:
        missing = nomadtf(*apply, env=env, timeout=60)
        assert missing.returncode == 1, missing.stdout + missing.stderr
        assert f"no JWT auth method at {mount}/" in missing.stderr and "--configure-auth" in missing.stderr, missing.stderr
        assert "unexpected error" not in missing.stderr and "Traceback" not in missing.stderr
        with pytest.raises(hvac.exceptions.InvalidPath):  # nothing was written
            root.sys.read_policy(role)

        applied = nomadtf(*apply, "--configure-auth", "--jwks-url", nomad_address, env=env, timeout=60)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert f"auth/{mount}/role/{role} written" in applied.stderr and extra in applied.stderr, applied.stderr
        again = nomadtf(*apply, env=env, timeout=60)  # the method is there now: the role alone is rewritten
        assert again.returncode == 0, again.stdout + again.stderr

        task = hvac.Client(url=stack_mod.VAULT_ADDR)
        task.auth.jwt.jwt_login(role=role, jwt=signer.sign(vault_identity("default", name, role)), path=mount)
        assert task.lookup_token()["data"]["policies"] == sorted(["default", role, extra])
        for key, value in values.items():
            read = task.secrets.kv.v2.read_secret_version(path=f"nomadtf-jwt/{tag}/{key}", mount_point="secret", raise_on_deleted_version=True)
            assert read["data"]["data"]["value"] == value, key

        revoked = nomadtf("acl", "revoke", str(job), "--nomad-version", "2.0.5", "--jwt-mount", mount, env=env, timeout=60)
        assert revoked.returncode == 0, revoked.stdout + revoked.stderr
        assert acl_setup._jwt_role(root, mount, role) is None
        assert f"{mount}/" in root.sys.list_auth_methods()["data"]  # the cluster's method stays
    finally:
        if f"{mount}/" in root.sys.list_auth_methods()["data"]:
            root.sys.disable_auth_method(mount)
        for policy in (role, extra):
            root.sys.delete_policy(policy)
        for key in values:
            root.secrets.kv.v2.delete_metadata_and_all_versions(path=f"nomadtf-jwt/{tag}/{key}", mount_point="secret")

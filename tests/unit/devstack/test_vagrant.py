"""vagrant/: the several-client stack's configuration on VMs. No VM can start here (no
hypervisor), so this checks what can be checked without one: Vagrant (Debian's `vagrant`,
which scripts/setup installs) accepts the Vagrantfile, the provisioning script parses, and
the agent configs the provisioning writes are byte for byte what nomadtf/devstack/wiring.py
gives, for the VMs and, with no option, for the stack of `nomadtf dev up --clients N`.
Nothing is installed here; a missing `vagrant` fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nomadtf.devstack import binaries, gobuild, layout, wiring
from nomadtf.errors import BinaryError
from tests.docs_commands import shown_argv
from tests.helpers import REPO, nomadtf

VAGRANT_DIR = REPO / "vagrant"
SERVER = "192.168.56.10"
STATE = Path("/var/lib/nomadtf")  # provision.sh's STATE


def vagrant_env(tmp_path: Path) -> dict[str, str]:
    # Vagrant's own state (boxes, the machines' index) in the test's folder, never in vagrant/.
    return {**os.environ, "VAGRANT_HOME": str(tmp_path / "vagrant.d"), "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot")}


def vagrant() -> str:
    path = shutil.which("vagrant")
    if path is None:
        pytest.fail("vagrant is not installed; scripts/setup installs Debian's `vagrant` package (apt-get install vagrant)")
    return path


def validate(vagrantfile_dir: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    # --ignore-provider: VirtualBox is not installed here; everything else is checked.
    return subprocess.run(
        [vagrant(), "validate", "--ignore-provider"],
        cwd=vagrantfile_dir,
        capture_output=True,
        text=True,
        timeout=120,
        env={**vagrant_env(tmp_path), **env},
    )


def test_vagrant_validates_the_vagrantfile(tmp_path):
    out = validate(VAGRANT_DIR, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Vagrantfile validated successfully" in out.stdout
    machines = [line.split()[1].rstrip(":") for line in out.stdout.splitlines() if line.startswith("==> ")]
    assert machines == ["server", "client-1", "client-2", "client-3"]
    assert not (VAGRANT_DIR / ".vagrant").exists()


def test_the_client_count_comes_from_the_environment(tmp_path):
    out = validate(VAGRANT_DIR, tmp_path, NOMADTF_CLIENTS="2", NOMADTF_GPUS="2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "client-2" in out.stdout and "client-3" not in out.stdout


def test_validation_has_teeth(tmp_path):
    """A misspelt setting fails `vagrant validate`: passing above means something."""
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(VAGRANT_DIR / "provision.sh", broken)
    text = (VAGRANT_DIR / "Vagrantfile").read_text().replace("node.vm.hostname =", "node.vm.hostnme =", 1)
    (broken / "Vagrantfile").write_text(text)
    out = validate(broken, tmp_path)
    assert out.returncode != 0
    assert "hostnme" in out.stdout + out.stderr


def test_the_provisioning_script_parses():
    out = subprocess.run(["bash", "-n", str(VAGRANT_DIR / "provision.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ---- the configs the provisioning writes ----------------------------------------------------


def provision_configs(tmp_path: Path, *args: str) -> dict[str, str]:
    """Run provision.sh's `configs` step, writing under tmp_path instead of /."""
    root = tmp_path / args[0] / args[1]
    env = {
        **os.environ,
        "NOMADTF_PROVISION_STEPS": "configs",
        "NOMADTF_PROVISION_ROOT": str(root),
        "NOMADTF": str(Path(sys.executable).parent / "nomadtf"),
    }
    out = subprocess.run(["bash", str(VAGRANT_DIR / "provision.sh"), *args], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return {name: (root / "etc" / "nomadtf" / name).read_text() for name in ("nomad.hcl", "consul.json")}


def vm(kind: str, index: int = 0, gpus: int = 0) -> wiring.Machine:
    """The VM as wiring.py describes it: Vagrant's private network on eth1, no Vault."""
    address = SERVER if kind == "server" else f"192.168.56.{10 + index}"
    return wiring.Machine(
        kind,
        address,
        (address,) if kind == "server" else (SERVER,),
        STATE / ("server" if kind == "server" else f"client-{index}"),
        index=index,
        network_interface="eth1",
        vault=False,
        gpus=gpus,
        plugin_dir=Path("/nomadtf-shared/cache/plugins") if gpus else None,
    )


@pytest.mark.parametrize(
    ("args", "machine"),
    [
        (("server", "0", SERVER, SERVER, "0"), vm("server")),
        (("client", "1", "192.168.56.11", SERVER, "0"), vm("client", 1)),
        (("client", "3", "192.168.56.13", SERVER, "2"), vm("client", 3, gpus=2)),
    ],
    ids=["server", "client-1", "client-3-gpus"],
)
def test_provisioned_configs_are_what_wiring_writes(tmp_path, args, machine):
    written = provision_configs(tmp_path, *args)
    assert written["nomad.hcl"] == wiring.nomad_config(machine)
    assert written["consul.json"] == wiring.consul_config(machine)
    assert f'bind_addr = "{args[2]}"' in written["nomad.hcl"]
    assert "vault" not in written["nomad.hcl"]  # the VMs run no Vault


@pytest.mark.parametrize(("kind", "index"), [("server", 0), ("client", 1), ("client", 2)])
def test_dev_config_without_options_is_the_stacks_own_file(kind, index):
    """`nomadtf dev config` both ways: with no option it prints what `dev up --clients N`
    writes for that machine (the stack calls the same wiring with layout.machine)."""
    args = [kind] + (["--index", str(index)] if kind == "client" else [])
    machine = layout.machine(kind, index)
    for agent, expected in (("nomad", wiring.nomad_config(machine)), ("consul", wiring.consul_config(machine))):
        out = nomadtf("dev", "config", *args, "--agent", agent, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout == expected
    assert f"198.18.0.{1 if kind == 'server' else 10 + index}" in expected


def test_the_vm_configs_are_accepted_by_nomad_and_consul(tmp_path):
    nomad = gobuild.cache_dir() / "bin" / "nomad"
    consul = gobuild.cache_dir() / "bin" / "consul"
    if not (nomad.is_file() and consul.is_file()):
        pytest.fail(f"the cached nomad and consul binaries are missing in {nomad.parent}; run scripts/setup")
    for args in (("server", "0", SERVER, SERVER, "0"), ("client", "2", "192.168.56.12", SERVER, "0")):
        written = provision_configs(tmp_path, *args)
        hcl = tmp_path / f"{args[0]}-{args[1]}.hcl"
        hcl.write_text(written["nomad.hcl"])
        check = subprocess.run([str(nomad), "config", "validate", str(hcl)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        js = tmp_path / f"{args[0]}-{args[1]}.json"
        js.write_text(written["consul.json"])
        check = subprocess.run([str(consul), "validate", str(js)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_dev_config_refuses_what_makes_no_sense():
    out = nomadtf("dev", "config", "server", "--servers", "192.168.56.10", timeout=60)
    assert out.returncode == 1 and "--servers is for a client" in out.stderr
    out = nomadtf("dev", "config", "server", "--gpus", "2", timeout=60)
    assert out.returncode == 1 and "fake GPUs go on clients" in out.stderr


# ---- Go and the binaries, as the VMs get them -----------------------------------------------


def _go_on_path(tmp_path, monkeypatch, version: str) -> None:
    """A go command on PATH that says it is `version` (`go env GOVERSION`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "go").write_text(f"#!/bin/sh\necho {version}\n")
    (bin_dir / "go").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_go_version_is_read_as_the_go_command_prints_it():
    assert binaries.go_command_version("go1.23.5") == (1, 23)
    assert binaries.go_command_version("go1.26.8\n") == (1, 26)
    assert binaries.go_command_version("devel go1.27-abc") is None


def test_a_go_too_old_to_fetch_another_or_no_go_version_is_refused_naming_the_fix(tmp_path, monkeypatch):
    _go_on_path(tmp_path, monkeypatch, "go1.19.8")  # Debian 12's
    with pytest.raises(BinaryError, match=r"go1\.19\.8, which cannot fetch go1\.26\.8 itself .* golang-1\.23-go from bookworm-backports"):
        binaries.ensure([], lambda _m: None, "go1.26.8")
    with pytest.raises(BinaryError, match="not a Go version; write e.g. go1.26.8"):
        binaries.ensure([], lambda _m: None, "1.26")


def test_with_go_named_every_go_command_fetches_that_go_and_without_it_none(tmp_path, monkeypatch):
    monkeypatch.setattr(gobuild, "_toolchain", ["local"])
    assert gobuild.go_environment()["GOTOOLCHAIN"] == "local"  # the machine's Go, never another downloaded
    _go_on_path(tmp_path, monkeypatch, "go1.23.5")  # bookworm-backports'
    said = []
    assert binaries.ensure([], said.append, "go1.26.8") == {}
    assert gobuild.go_environment()["GOTOOLCHAIN"] == gobuild.go_environment(mod_readonly=False)["GOTOOLCHAIN"] == "go1.26.8"
    assert said == ["go: building with go1.26.8 (GOTOOLCHAIN: the go command fetches and checks it)"]


def test_dev_binaries_finds_what_dev_up_uses():
    out = nomadtf(*shown_argv(r"nomadtf dev binaries"), timeout=120)
    assert out.returncode == 0, out.stderr
    found = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert sorted(found) == ["bao", "consul", "nomad"]
    assert all(Path(path).is_file() for path in found.values())
    bad = nomadtf("dev", "binaries", "vault", timeout=60)
    assert bad.returncode == 1 and "unknown binary 'vault'" in bad.stderr

"""Go as the builds use it (nomadtf/devstack/gobuild.py): a go.mod read by the go command
itself (`go mod edit -json`), and the licence check."""

from __future__ import annotations

import pytest

from nomadtf.devstack import gobuild
from nomadtf.errors import BinaryError

GO_MOD = """module github.com/hashicorp/nomad

go 1.20

// github.com/not/a/directive => ./nowhere
replace (
\tgithub.com/hashicorp/nomad/api => ./api
\tgithub.com/old/thing v1.0.0 => github.com/new/thing v1.2.0
)

replace github.com/hashicorp/nomad/plugins => ./plugins // trailing comment

require (
\tgithub.com/hashicorp/nomad/api v0.0.0-20230103221135-ce00d683f9be
\tgithub.com/hashicorp/consul/api v1.20.0 // indirect
)

require github.com/stretchr/testify v1.8.4
"""


def test_go_mod_is_read_by_the_go_command(tmp_path):
    (tmp_path / "go.mod").write_text(GO_MOD)
    go_mod = gobuild.read_go_mod(tmp_path / "go.mod")
    assert gobuild.local_replacements(go_mod) == {
        "github.com/hashicorp/nomad/api": "./api",
        "github.com/hashicorp/nomad/plugins": "./plugins",
    }
    assert gobuild.required_versions(go_mod) == {
        "github.com/hashicorp/nomad/api": "v0.0.0-20230103221135-ce00d683f9be",
        "github.com/hashicorp/consul/api": "v1.20.0",
        "github.com/stretchr/testify": "v1.8.4",
    }


def test_a_broken_go_mod_is_a_binary_error(tmp_path):
    (tmp_path / "go.mod").write_text("module x\nrequire (\n")
    with pytest.raises(BinaryError, match="cannot read .*go.mod"):
        gobuild.read_go_mod(tmp_path / "go.mod")


def test_only_mpl2_passes_the_licence_check(tmp_path):
    (tmp_path / "LICENSE").write_text("Mozilla Public License Version 2.0\n==================================\n")
    assert gobuild.check_license(tmp_path, "m@v1") == "MPL-2.0"
    (tmp_path / "LICENSE").write_text("Business Source License 1.1\n\nMozilla Public License Version 2.0 (change licence)\n")
    with pytest.raises(BinaryError, match="m@v1: LICENSE is not MPL-2.0"):
        gobuild.check_license(tmp_path, "m@v1")
    (tmp_path / "LICENSE").unlink()
    with pytest.raises(BinaryError, match="no LICENSE file"):
        gobuild.check_license(tmp_path, "m@v1")


def test_go_commands_never_fetch_a_toolchain_nor_rewrite_go_mod():
    assert gobuild.go_environment()["GOTOOLCHAIN"] == "local"
    assert "-mod=readonly" in gobuild.go_environment()["GOFLAGS"]
    assert "-mod=readonly" not in gobuild.go_environment(mod_readonly=False)["GOFLAGS"]

"""The fake-GPU plugin's Python side, with no server and no Go: the client config it writes
and the source hash that decides when the plugin is rebuilt. (Loading the plugin into a
real Nomad client is the stack tests' business.)"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nomadtf.devstack import gpu_plugin, plugin_builder
from nomadtf.devstack.gpu_plugin import GpuGroup, client_plugin_hcl


def _config_body(hcl: str) -> dict[str, str]:
    """key -> raw value of the top-level assignments inside `config { ... }`."""
    body = hcl.split("config {", 1)[1]
    top = re.sub(r"models \{.*?\n    \}", "", body, flags=re.S)
    return dict(re.findall(r"^    (\w+)\s*=\s*(.+)$", top, flags=re.M))


# --- client_plugin_hcl -------------------------------------------------------------------


def test_hcl_has_plugin_dir_and_named_block():
    hcl = client_plugin_hcl(Path("/cache/plugins"), 4)
    assert hcl.splitlines()[0] == 'plugin_dir = "/cache/plugins"'
    assert 'plugin "nomadtf-fake-gpu" {' in hcl
    assert hcl.count("{") == hcl.count("}")
    assert hcl.endswith("}\n")


def test_hcl_defaults_are_written_out():
    config = _config_body(client_plugin_hcl(Path("/p"), 4))
    assert config == {
        "count": "4",
        "model": f'"{gpu_plugin.DEFAULT_MODEL}"',
        "memory_mib": str(gpu_plugin.DEFAULT_MEMORY_MIB),
    }


def test_hcl_carries_every_argument():
    hcl = client_plugin_hcl(
        Path("/p"), 2, model="A100-SXM4-40GB", memory_mib=40960, seed="client-2", driver_version="550.54"
    )
    assert _config_body(hcl) == {
        "count": "2",
        "model": '"A100-SXM4-40GB"',
        "memory_mib": "40960",
        "seed": '"client-2"',
        "driver_version": '"550.54"',
    }


def test_hcl_empty_seed_is_left_to_the_plugin():
    assert "seed" not in client_plugin_hcl(Path("/p"), 1, seed="")


def test_hcl_zero_gpus_is_allowed():
    assert _config_body(client_plugin_hcl(Path("/p"), 0))["count"] == "0"


def test_hcl_quotes_strings():
    hcl = client_plugin_hcl(Path('/odd "dir"/p\\x'), 1, model='Tesla "V100"', seed="a\\b")
    assert r'plugin_dir = "/odd \"dir\"/p\\x"' in hcl
    assert r'model      = "Tesla \"V100\""' in hcl
    assert r'seed       = "a\\b"' in hcl


def test_hcl_models_give_one_block_each():
    hcl = client_plugin_hcl(
        Path("/p"),
        0,
        models=[GpuGroup("Tesla-V100-SXM2-16GB", 2, 16160), GpuGroup("A100-SXM4-40GB", 1, 40960)],
    )
    blocks = re.findall(r"models \{(.*?)\n    \}", hcl, flags=re.S)
    assert len(blocks) == 2
    assert 'model      = "Tesla-V100-SXM2-16GB"' in blocks[0] and "count      = 2" in blocks[0]
    assert 'model      = "A100-SXM4-40GB"' in blocks[1] and "memory_mib = 40960" in blocks[1]
    assert hcl.count("{") == hcl.count("}")


def test_a_stack_with_mig_slices_offers_them_as_a_group_of_their_own(tmp_path):
    """`dev up --gpus 6 --mig 2`: the whole GPUs as before (same model, so the same seeded
    ids), and the slices as nomad-device-nvidia 1.1 names them, with the slice's memory."""
    from nomadtf.devstack.stack import DevStack

    assert gpu_plugin.mig_model() == "Tesla-V100-SXM2-16GB MIG 1g.5gb"
    assert gpu_plugin.mig_model("NVIDIA A100-SXM4-40GB", "2g.10gb") == "NVIDIA A100-SXM4-40GB MIG 2g.10gb"
    dev = DevStack(tmp_path)
    dev.gpus, dev.mig = 6, 2
    hcl = dev.plugin_hcl(Path("/p"))
    blocks = re.findall(r"models \{(.*?)\n    \}", hcl, flags=re.S)
    assert len(blocks) == 2
    assert f'model      = "{gpu_plugin.DEFAULT_MODEL}"' in blocks[0] and "count      = 6" in blocks[0]
    assert f"memory_mib = {gpu_plugin.DEFAULT_MEMORY_MIB}" in blocks[0]
    assert 'model      = "Tesla-V100-SXM2-16GB MIG 1g.5gb"' in blocks[1] and "count      = 2" in blocks[1]
    assert f"memory_mib = {gpu_plugin.MIG_MEMORY_MIB}" in blocks[1]
    assert _config_body(hcl)["seed"] == '"nomadtf-dev"'
    # Without slices the config is what it always was: one group, no models blocks.
    dev.mig = 0
    assert "models" not in dev.plugin_hcl(Path("/p")) and _config_body(dev.plugin_hcl(Path("/p")))["count"] == "6"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"count": -1},
        {"count": True},
        {"count": 1.5},
        {"count": 1, "model": ""},
        {"count": 1, "model": "nvidia/gpu"},
        {"count": 1, "memory_mib": 0},
        {"count": 1, "seed": "a\nb"},
        {"count": 1, "models": [GpuGroup("ok", -2)]},
        {"count": 1, "models": [GpuGroup("ok", 1, 0)]},
        {"count": 1, "ids": []},
        {"count": 1, "ids": ["GPU-a", "GPU-a"]},
        {"count": 1, "ids": ["GPU-a", ""]},
        {"count": 1, "ids": ["GPU-a"], "models": [GpuGroup("ok", 1)]},
    ],
)
def test_hcl_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        client_plugin_hcl(Path("/p"), **kwargs)


def test_hcl_ids_name_the_instances_and_replace_count():
    ids = ["GPU-0f3c9a2e-1111-4222-8333-444455556666", "GPU-8a21b7c4-aaaa-4bbb-8ccc-ddddeeeeffff"]
    hcl = client_plugin_hcl(Path("/p"), 7, "NVIDIA A100-SXM4-40GB", 40960, ids=ids)
    body = _config_body(hcl)
    assert body["ids"] == f'["{ids[0]}", "{ids[1]}"]'
    assert body["count"] == "2" and body["model"] == '"NVIDIA A100-SXM4-40GB"' and body["memory_mib"] == "40960"
    assert "ids" not in _config_body(client_plugin_hcl(Path("/p"), 2))


def test_an_inventory_of_real_gpus_writes_their_ids_model_and_memory():
    inventory = gpu_plugin.GpuInventory(ids=("GPU-1", "GPU-2", "GPU-3"), model="NVIDIA H100 80GB HBM3", memory_mib=81559)
    body = _config_body(inventory.plugin_hcl(Path("/p")))
    assert body["ids"] == '["GPU-1", "GPU-2", "GPU-3"]' and body["count"] == "3"
    assert body["model"] == '"NVIDIA H100 80GB HBM3"' and body["memory_mib"] == "81559"


def test_the_plugin_declares_ids_and_sources_without_them_are_rebuilt(tmp_path, monkeypatch):
    """The `ids` attribute is in the Go config schema, and a plugin built before it (its
    stamp the hash of the sources without it) is rebuilt, not reused."""
    plugin_go = (gpu_plugin.SOURCE_DIR / "plugin.go").read_text()
    assert '"ids": hclspec.NewAttr("ids", "list(string)", false)' in plugin_go
    assert 'IDs               []string      `codec:"ids"`' in plugin_go
    old = tmp_path / "old"
    old.mkdir()
    for path in plugin_builder.source_files(gpu_plugin.SOURCE_DIR):
        text = path.read_text()
        if path.name == "plugin.go":
            text = "\n".join(line for line in text.splitlines() if '"ids"' not in line)
        (old / path.name).write_text(text)
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path / "cache"))
    binary = gpu_plugin.PLUGIN.path()
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    plugin_builder.stamp_path(binary).write_text(plugin_builder.source_hash(old) + "\n")
    calls = []
    monkeypatch.setattr(plugin_builder, "build", lambda plugin, progress, digest: calls.append(digest) or binary)
    gpu_plugin.find_or_build(lambda m: None)
    shipped = plugin_builder.source_hash(gpu_plugin.SOURCE_DIR)
    assert calls == [shipped] != [plugin_builder.source_hash(old)]


def test_shipped_sources_hash():
    names = [p.name for p in plugin_builder.source_files(gpu_plugin.SOURCE_DIR)]
    assert {"go.mod", "go.sum", "main.go"} <= set(names)
    assert re.fullmatch(r"[0-9a-f]{64}", plugin_builder.source_hash(gpu_plugin.SOURCE_DIR))


def test_plugin_dir_follows_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path / "c"))
    assert gpu_plugin.plugin_dir() == tmp_path / "c" / "plugins"
    assert os.path.basename(gpu_plugin.PLUGIN.path()) == "nomadtf-fake-gpu"

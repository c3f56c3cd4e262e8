"""Registrations -> ClusterSpec -> TF_CONFIG, for every strategy and role."""

from __future__ import annotations

import json
import random

import pytest

from nomadtf.tfconfig import (
    Member,
    all_tf_configs,
    build_cluster_spec,
    build_tf_config,
    expected_members,
    missing_members,
    runs_user_code,
    tf_config_json,
)


def members(**counts):
    """Registered members with distinct addresses: chief 10.0.0.1x, worker 10.0.1.x, ..."""
    subnet = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}
    out = [
        Member(role, i, f"10.0.{subnet[role]}.{10 + i}:{2222 + i}", alloc_id=f"{role}-{i}")
        for role, count in counts.items()
        for i in range(count)
    ]
    random.Random(7).shuffle(out)  # Consul returns them in no particular order
    return out


def test_parameter_server_cluster_has_chief_workers_and_ps():
    counts = {"chief": 1, "worker": 2, "ps": 2}
    cluster = build_cluster_spec("parameter_server", counts, members(**counts))
    assert cluster == {
        "chief": ["10.0.0.10:2222"],
        "worker": ["10.0.1.10:2222", "10.0.1.11:2223"],
        "ps": ["10.0.2.10:2222", "10.0.2.11:2223"],
    }
    assert build_tf_config(cluster, "ps", 1) == {"cluster": cluster, "task": {"type": "ps", "index": 1}}
    assert build_tf_config(cluster, "chief", 0)["task"] == {"type": "chief", "index": 0}


def test_mirrored_cluster_has_workers_only():
    counts = {"worker": 3}
    cluster = build_cluster_spec("multi_worker_mirrored", counts, members(**counts))
    assert cluster == {"worker": ["10.0.1.10:2222", "10.0.1.11:2223", "10.0.1.12:2224"]}
    assert build_tf_config(cluster, "worker", 2)["task"] == {"type": "worker", "index": 2}


def test_mirrored_cluster_includes_a_chief_when_there_is_one():
    counts = {"chief": 1, "worker": 2}
    cluster = build_cluster_spec("multi_worker_mirrored", counts, members(**counts))
    assert list(cluster) == ["chief", "worker"]
    assert cluster["chief"] == ["10.0.0.10:2222"]


def test_legacy_cluster_is_every_training_role_present():
    counts = {"worker": 2, "ps": 1}
    cluster = build_cluster_spec("legacy_server", counts, members(**counts))
    assert cluster == {"worker": ["10.0.1.10:2222", "10.0.1.11:2223"], "ps": ["10.0.2.10:2222"]}


@pytest.mark.parametrize(
    "strategy, counts",
    [
        ("parameter_server", {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}),
        ("multi_worker_mirrored", {"worker": 2, "evaluator": 1}),
        ("legacy_server", {"worker": 2, "ps": 1, "evaluator": 1}),
    ],
)
def test_evaluator_gets_its_task_but_is_not_in_the_cluster(strategy, counts):
    cluster = build_cluster_spec(strategy, counts, members(**counts))
    assert "evaluator" not in cluster
    assert "10.0.3.10:2222" not in json.dumps(cluster)
    assert build_tf_config(cluster, "evaluator", 0) == {
        "cluster": cluster,
        "task": {"type": "evaluator", "index": 0},
    }


def test_a_missing_evaluator_does_not_hold_up_the_training_cluster():
    counts = {"chief": 1, "worker": 1, "ps": 1, "evaluator": 1}
    present = members(chief=1, worker=1, ps=1)
    assert missing_members(counts, present) == ["evaluator[0]"]
    assert build_cluster_spec("parameter_server", counts, present)["ps"] == ["10.0.2.10:2222"]


def test_missing_members_lists_who_is_not_there_in_role_order():
    counts = {"chief": 1, "worker": 3, "ps": 2, "evaluator": 1, "tensorboard": 1}
    present = [
        m for m in members(chief=1, worker=3, ps=2) if (m.role, m.index) not in {("worker", 1), ("ps", 0)}
    ]
    assert missing_members(counts, present) == ["worker[1]", "ps[0]", "evaluator[0]"]
    assert missing_members(counts, members(chief=1, worker=3, ps=2, evaluator=1)) == []


def test_tensorboard_is_not_a_tensorflow_task():
    counts = {"worker": 1, "tensorboard": 1}
    assert expected_members(counts) == [("worker", 0)]
    assert sorted(all_tf_configs("job", "multi_worker_mirrored", counts)) == ["worker[0]"]


def test_an_incomplete_cluster_names_who_is_missing():
    counts = {"chief": 1, "worker": 2, "ps": 1}
    with pytest.raises(ValueError, match=r"missing worker\[1\], ps\[0\]"):
        build_cluster_spec("parameter_server", counts, members(chief=1, worker=1))


def test_all_tf_configs_uses_placeholder_addresses():
    configs = all_tf_configs("mnist", "parameter_server", {"chief": 1, "worker": 1, "ps": 1})
    assert sorted(configs) == ["chief[0]", "ps[0]", "worker[0]"]
    assert configs["ps[0]"]["cluster"]["ps"] == ["<mnist-ps[0] address>:<port>"]
    assert configs["worker[0]"]["task"] == {"type": "worker", "index": 0}


def test_tf_config_json_is_compact_and_stable():
    config = build_tf_config({"worker": ["a:1"], "chief": ["b:2"]}, "worker", 0)
    assert (
        tf_config_json(config)
        == '{"cluster":{"chief":["b:2"],"worker":["a:1"]},"task":{"index":0,"type":"worker"}}'
    )


@pytest.mark.parametrize(
    "strategy, runs",
    [
        ("parameter_server", {"chief", "evaluator"}),
        ("multi_worker_mirrored", {"chief", "worker", "evaluator"}),
        ("legacy_server", {"chief", "worker", "evaluator"}),
    ],
)
def test_who_runs_the_users_code(strategy, runs):
    roles = ("chief", "worker", "ps", "evaluator", "tensorboard")
    assert {role for role in roles if runs_user_code(strategy, role)} == runs

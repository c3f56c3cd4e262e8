"""Placement options of a role (`distinct_hosts`, `spread`, `node_class`): what they
render to, what the schema refuses, and how a placement they make impossible is explained.
Pure: no servers. The scenarios on real clients are in tests/stack/test_multiclient.py."""

from __future__ import annotations

import pytest

from nomadtf.errors import SpecError
from nomadtf.plan import describe_plan, explain_placement_failure
from nomadtf.render import render_job
from nomadtf.spec import normalize, parse_spec


def job(**worker):
    spec = {
        "name": "place",
        "entrypoint": {"script": "train.py"},
        "roles": {"chief": {}, "worker": {"count": 3, **worker}, "ps": {}},
    }
    return spec


def groups(spec):
    return {g["Name"]: g for g in render_job(parse_spec(spec))["Job"]["TaskGroups"]}


def test_defaults_render_no_extra_constraint_and_no_spread():
    worker = groups(job())["worker"]
    assert worker["Constraints"] == [] and worker["Spreads"] == []
    assert normalize(job())["roles"]["worker"]["distinct_hosts"] is False
    assert "node_class" not in normalize(job())["roles"]["worker"]


def test_distinct_hosts_and_node_class_become_group_constraints_after_the_users_own():
    rendered = groups(
        job(
            distinct_hosts=True,
            node_class="gpu-a100",
            constraints=[{"attribute": "${attr.kernel.name}", "value": "linux"}],
        )
    )
    assert rendered["worker"]["Constraints"] == [
        {"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="},
        {"LTarget": "${node.class}", "RTarget": "gpu-a100", "Operand": "="},
        {"LTarget": "", "RTarget": "true", "Operand": "distinct_hosts"},
    ]
    # Per role: the other groups are untouched.
    assert rendered["chief"]["Constraints"] == [] and rendered["ps"]["Constraints"] == []


def test_spread_becomes_nomad_spreads_with_the_default_weight():
    rendered = groups(
        job(
            spread=[
                {"attribute": "${node.datacenter}"},
                {"attribute": "${meta.rack}", "weight": 80, "targets": [{"value": "r1", "percent": 70}, {"value": "r2", "percent": 30}]},
            ]
        )
    )
    assert rendered["worker"]["Spreads"] == [
        {"Attribute": "${node.datacenter}", "Weight": 50, "SpreadTarget": []},
        {
            "Attribute": "${meta.rack}",
            "Weight": 80,
            "SpreadTarget": [{"Value": "r1", "Percent": 70}, {"Value": "r2", "Percent": 30}],
        },
    ]


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        ({"distinct_hosts": "yes"}, "roles.worker.distinct_hosts: 'yes' is not of type 'boolean'"),
        ({"node_class": ""}, "roles.worker.node_class: '' should be non-empty"),
        ({"spread": [{"attribute": "${meta.rack}", "weight": 0}]}, "roles.worker.spread[0].weight: 0 is less than the minimum of 1"),
        ({"spread": [{"atribute": "${meta.rack}"}]}, "roles.worker.spread[0].atribute: unknown key 'atribute'; did you mean 'attribute'?"),
        (
            {"spread": [{"attribute": "a", "targets": [{"value": "x", "percent": 60}, {"value": "y", "percent": 50}]}]},
            "roles.worker.spread[0].targets: the percentages add up to 110; at most 100",
        ),
        (
            {"spread": [{"attribute": "a", "targets": [{"value": "x", "percent": 10}, {"value": "x", "percent": 10}]}]},
            "roles.worker.spread[0].targets: value 'x' is listed more than once",
        ),
    ],
)
def test_bad_placement_options_are_named_with_their_path(worker, expected):
    with pytest.raises(SpecError) as caught:
        normalize(job(**worker))
    assert expected in caught.value.problems


# ---- explained in words ------------------------------------------------------------------


def distinct_hosts_metric(filtered: int, exhausted: int = 0, nodes: int = 3) -> dict:
    """The AllocMetric Nomad 1.6.1 returns for the allocation of a distinct_hosts group that
    found no node left (read from the several-client stack's plan endpoint)."""
    return {
        "NodesEvaluated": nodes,
        "NodesFiltered": filtered,
        "NodesInPool": nodes,
        "NodesAvailable": {"dc1": nodes},
        # Nomad counts every filtered node under its class too (the stack's clients have one each).
        "ClassFiltered": {f"nomadtf-client-{i}": 1 for i in range(1, filtered + 1)},
        "ConstraintFiltered": {"distinct_hosts": filtered},
        "NodesExhausted": exhausted,
        "ClassExhausted": None,
        "DimensionExhausted": {"memory": exhausted} if exhausted else None,
        "QuotaExhausted": None,
        "ResourcesExhausted": None,
        "Scores": None,
        "ScoreMetaData": None,
        "AllocationTime": 61234,
        "CoalescedFailures": 0,
    }


def test_more_distinct_hosts_than_eligible_nodes_is_said_in_words():
    line = explain_placement_failure("worker", distinct_hosts_metric(3), wanted=4)
    assert line == "worker: cannot be placed: distinct_hosts asks for 4 different nodes, only 3 are eligible"


def test_a_node_that_passed_distinct_hosts_but_is_full_counts_as_eligible():
    line = explain_placement_failure("worker", distinct_hosts_metric(2, exhausted=1), wanted=4)
    assert line.startswith("worker: cannot be placed: distinct_hosts asks for 4 different nodes, only 3 are eligible; ")
    assert "1 of 3 nodes have too little memory" in line


def test_the_plan_takes_the_count_from_the_rendered_job():
    spec = job(count=4, distinct_hosts=True)
    rendered = render_job(parse_spec(spec))["Job"]
    result = {
        "Diff": {"Type": "Added"},
        "Annotations": {"DesiredTGUpdates": {"worker": {"Place": 4}}},
        "FailedTGAllocs": {"worker": distinct_hosts_metric(3)},
    }
    summary = describe_plan(result, rendered)
    assert summary.failures
    assert "worker: cannot be placed: distinct_hosts asks for 4 different nodes, only 3 are eligible" in summary.lines


def test_node_class_with_distinct_hosts_as_nomad_reports_it():
    """Worker count 3, node_class naming one client of three, distinct_hosts: the metric
    Nomad 1.6.1's plan returned on the several-client stack."""
    metric = {
        **distinct_hosts_metric(1),
        "ClassFiltered": {"nomadtf-client-3": 1, "nomadtf-client-2": 1, "nomadtf-client-1": 1},
        "NodesFiltered": 3,
        "ConstraintFiltered": {"computed class ineligible": 2, "distinct_hosts": 1},
        "CoalescedFailures": 1,
    }
    line = explain_placement_failure("worker", metric, wanted=3)
    assert line == (
        "worker: cannot be placed: 2 of 3 nodes do not meet the group's constraints (node_class, constraints); "
        "distinct_hosts asks for 3 different nodes, only 1 is eligible; 2 allocations affected"
    )

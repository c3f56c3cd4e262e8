"""The operator's sharing policy (nomadtf/admission/policy.py): parsed with every problem
named by its field, quotas, ceilings and priorities. Pure."""

from __future__ import annotations

import json

import pytest

from nomadtf.admission import policy
from nomadtf.errors import PolicyError
from nomadtf.job.capacity import Resources

GPU = "nvidia/gpu/Tesla-V100-SXM2-16GB"


def parse(value: dict) -> policy.Policy:
    return policy.parse(json.dumps(value))


def test_no_policy_limits_nothing_and_caps_no_priority():
    share = policy.Policy().of("team-a")
    assert (share.nominal, share.ceiling, share.priority(100), share.weight) == (None, None, 100, 1.0)
    assert share.never(Resources(10**9, 10**9, {GPU: 1000})) == "" and share.over(Resources(10**9), Resources(10**9)) == []


def test_a_full_policy_parses_with_units_and_defaults_for_namespaces_not_listed():
    parsed = parse({
        "half_life": "2h", "reserve_after": "90s", "backfill": False, "preemption": True, "default": {"max_priority": 50},
        "namespaces": {"team-a": {"nominal": {"cpu": 8000, "memory": 16384, "gpus": 2, "devices": {GPU: 1}},
                                  "borrowing_limit": {"cpu": 4000, "gpus": 1}, "max_priority": 70, "weight": 2}},
    })  # fmt: skip
    assert (parsed.half_life_s, parsed.reserve_after_s, parsed.backfill, parsed.preemption) == (7200.0, 90.0, False, True)
    assert policy.Policy().preemption is False  # off unless the operator says so
    team_a = parsed.of("team-a")
    assert team_a.nominal == policy.Limit(8000, 16384, {"nvidia/gpu": 2, GPU: 1})
    # The ceiling adds borrowing where both give a dimension; memory and the model's GPUs,
    # which the borrowing limit leaves out, may be borrowed without a limit.
    assert team_a.ceiling == policy.Limit(12000, None, {"nvidia/gpu": 3})
    assert (team_a.priority(90), team_a.priority(60), team_a.weight) == (70, 60, 2.0)
    assert parsed.of("team-b").priority(90) == 50 and parsed.of("team-b").nominal is None


def test_every_problem_is_named_by_its_field():
    with pytest.raises(PolicyError) as caught:
        parse({
            "half_life": "soon", "reserve_after": -1, "backfill": "yes", "extra": 1,
            "namespaces": {"team-a": {"nominal": {"cpu": -1, "memory": 1.5, "gpus": True, "disk": 1, "devices": {"a//b": 1}},
                                      "max_priority": 101, "weight": 0, "colour": "red"},
                           "team-b": {"borrowing_limit": {"cpu": 1}}, "team-c": []},
        })  # fmt: skip
    problems = "\n".join(caught.value.problems)
    for expected in ("half_life: 'soon' is not a duration", "reserve_after: a duration", "backfill: true or false",
                     "extra: unknown field", "namespaces.team-a.nominal.cpu: a whole number of 0 or more, got -1",
                     "namespaces.team-a.nominal.memory: a whole number", "namespaces.team-a.nominal.gpus: a whole number",
                     "namespaces.team-a.nominal.disk: unknown field", "'a//b' is not a device name",
                     "namespaces.team-a.max_priority: a whole number from 1 to 100, got 101",
                     "namespaces.team-a.weight: a number above 0, got 0", "namespaces.team-a.colour: unknown field",
                     "namespaces.team-b.borrowing_limit: is beyond a nominal quota; give namespaces.team-b.nominal too",
                     "namespaces.team-c: an object with"):  # fmt: skip
        assert expected in problems, expected
    assert len(caught.value.problems) == 14
    assert caught.value.exit_code == 2 and str(caught.value).startswith("the sharing policy is invalid:\n  - ")


@pytest.mark.parametrize("text", ["", "not json", "[]", "3"])
def test_what_is_not_a_json_object_is_refused(text):
    with pytest.raises(PolicyError):
        policy.parse(text)


def test_a_run_beyond_nominal_plus_borrowing_can_never_start_and_the_reason_names_the_dimension():
    share = parse({"namespaces": {"a": {"nominal": {"cpu": 4000, "gpus": 1}, "borrowing_limit": {"cpu": 1000, "gpus": 1}}}}).of("a")
    assert share.never(Resources(5000, 10**6, {"nvidia/gpu": 2})) == ""
    why = share.never(Resources(5001, 0, {"nvidia/gpu": 3}))
    assert "cpu 5001 > 5000 MHz" in why and "nvidia/gpu 3 > 2" in why and "nominal quota plus borrowing limit" in why


def test_over_counts_what_the_namespace_holds_and_tells_borrowing_from_the_limit():
    share = parse({"namespaces": {"a": {"nominal": {"cpu": 4000}, "borrowing_limit": {"cpu": 2000}}}}).of("a")
    held = Resources(3000, 0, {})
    assert share.over(held, Resources(1000)) == [] and share.over(held, Resources(1000), nominal_only=True) == []
    assert share.over(held, Resources(2000), nominal_only=True) == ["cpu 5000 > 4000 MHz"]  # borrows
    assert share.over(held, Resources(2000)) == []
    assert share.over(held, Resources(3001)) == ["cpu 6001 > 6000 MHz"]


@pytest.mark.parametrize(("quota", "device", "counted"), [
    ("nvidia/gpu", "nvidia/gpu", True), ("nvidia/gpu", f"{GPU}", True), ("nvidia/gpu", "amd/gpu/MI300", False),
    (GPU, "nvidia/gpu/Tesla-T4", False), (GPU, GPU, True), ("gpu", "amd/gpu/MI300", True), ("gpu", "gpu", True),
    ("nvidia/gpu", "gpu", True), ("nvidia/fpga", "gpu", False), (GPU, "nvidia/gpu", False),
])  # fmt: skip
def test_a_device_quota_counts_the_devices_its_name_covers(quota, device, counted):
    assert policy.covers(quota, device) is counted


def test_to_json_spells_out_every_default_and_parses_back_to_the_same_policy():
    parsed = parse({"namespaces": {"a": {"nominal": {"cpu": 1, "gpus": 1}, "max_priority": 40}}})
    shown = parsed.to_json()
    assert shown["half_life"] == "3600s" and shown["backfill"] is True and shown["default"]["nominal"] is None
    assert policy.parse(json.dumps(shown)) == parsed

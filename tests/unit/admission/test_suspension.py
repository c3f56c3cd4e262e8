"""A run registered suspended, read back, and judged (nomadtf/admission/suspension.py).
Pure: the jobs are Nomad's JSON shapes, no server."""

from __future__ import annotations

import copy
import json

import pytest

from nomadtf.admission import suspension
from nomadtf.admission.suspension import (
    ADMITTED,
    ADMITTING,
    META_ADMISSION,
    META_COUNTS,
    META_GANG_TIMEOUT,
    PLACEHOLDER_CONSTRAINT,
    PLACEHOLDER_GROUP,
    PLAIN,
    QUEUED,
    REFUSED,
    SUSPENDED,
    Malformed,
    Suspension,
)


def _group(name: str, count: int) -> dict:
    return {"Name": name, "Count": count, "Tasks": [{"Name": name, "Driver": "raw_exec", "Resources": {"CPU": 500, "MemoryMB": 256}}]}


def _body() -> dict:
    """The body of POST /v1/jobs for a chief and two workers."""
    return {"Job": {"ID": "digits", "Namespace": "team-a", "Type": "batch", "Meta": {"nomadtf.run": "3f2a9c1e"},
                    "TaskGroups": [_group("chief", 1), _group("worker", 2)]}}  # fmt: skip


def _suspended(**meta) -> dict:
    """A suspended job (as GET /v1/job/:id returns it: no "Job" wrapper), its Meta changed by `meta`
    (a value None removes the key)."""
    job = suspension.suspend(_body(), gang_timeout_s=30)["Job"]
    for key, value in meta.items():
        if value is None:
            job["Meta"].pop(key, None)
        else:
            job["Meta"][key] = value
    return job


def _counts(job: dict) -> dict:
    return {g["Name"]: g["Count"] for g in job["TaskGroups"]}


def _scaled(job: dict, **counts) -> dict:
    job = copy.deepcopy(job)
    for group in job["TaskGroups"]:
        group["Count"] = counts.get(group["Name"], group["Count"])
    return job


# ---- suspend -----------------------------------------------------------------------------


def test_suspend_leaves_the_original_body_untouched():
    body = _body()
    before = copy.deepcopy(body)
    suspended = suspension.suspend(body, gang_timeout_s=30)
    assert body == before
    suspended["Job"]["TaskGroups"][0]["Tasks"][0]["Resources"]["CPU"] = 1  # a deep copy: nothing shared
    suspended["Job"]["Meta"]["extra"] = "x"
    assert body == before


def test_suspend_sets_every_group_to_zero_and_adds_the_placeholder_last():
    job = suspension.suspend(_body(), gang_timeout_s=30)["Job"]
    assert _counts(job) == {"chief": 0, "worker": 0, PLACEHOLDER_GROUP: 1}
    assert [g["Name"] for g in job["TaskGroups"]][-1] == PLACEHOLDER_GROUP


def test_the_placeholder_carries_the_constraint_no_node_meets():
    placeholder = suspension.suspend(_body(), gang_timeout_s=30)["Job"]["TaskGroups"][-1]
    assert placeholder["Constraints"] == [PLACEHOLDER_CONSTRAINT]
    assert placeholder["Constraints"][0]["Operand"] == "=" and placeholder["Constraints"][0]["RTarget"] == "never-placed"
    placeholder["Constraints"][0]["RTarget"] = "changed"  # each job gets its own copy of the constraint
    assert PLACEHOLDER_CONSTRAINT["RTarget"] == "never-placed"


def test_suspend_writes_the_wanted_counts_and_gang_timeout_into_meta_beside_the_job_s_own():
    meta = suspension.suspend(_body(), gang_timeout_s=2.5)["Job"]["Meta"]
    assert meta[META_ADMISSION] == SUSPENDED
    assert json.loads(meta[META_COUNTS]) == {"chief": 1, "worker": 2}
    assert meta[META_GANG_TIMEOUT] == "2.5"
    assert meta["nomadtf.run"] == "3f2a9c1e"


# ---- Suspension.of -----------------------------------------------------------------------


def test_a_plain_job_has_no_suspension():
    assert Suspension.of(_body()) is None
    assert Suspension.of(_body()["Job"]) is None


def test_a_suspended_job_reads_back_its_counts_and_gang_timeout():
    assert Suspension.of(suspension.suspend(_body(), gang_timeout_s=45)) == Suspension({"chief": 1, "worker": 2}, 45.0)
    assert Suspension.of(_suspended()) == Suspension({"chief": 1, "worker": 2}, 30.0)


def test_counts_at_the_bounds_are_accepted():
    assert Suspension.of(_suspended(**{META_COUNTS: '{"chief": 0, "worker": 1000}'})).counts == {"chief": 0, "worker": 1000}


@pytest.mark.parametrize(
    "counts",
    [
        pytest.param("{chief: 1", id="not-json"),
        pytest.param(None, id="missing"),
        pytest.param("[1, 2]", id="a-list"),
        pytest.param('"chief"', id="a-string"),
        pytest.param("{}", id="empty"),
        pytest.param('{"ps": 1}', id="unknown-group"),
        pytest.param(json.dumps({PLACEHOLDER_GROUP: 1}), id="the-placeholder"),
        pytest.param('{"chief": true}', id="a-bool"),
        pytest.param('{"chief": -1}', id="negative"),
        pytest.param('{"chief": 1001}', id="huge"),
        pytest.param('{"chief": 10000000000000000000000}', id="very-huge"),
        pytest.param('{"chief": 1.5}', id="a-fraction"),
        pytest.param('{"chief": "1"}', id="a-string-count"),
        pytest.param('{"chief": null}', id="null"),
    ],
)
def test_counts_that_cannot_be_trusted_are_malformed(counts):
    with pytest.raises(Malformed):
        Suspension.of(_suspended(**{META_COUNTS: counts}))


def test_a_suspended_job_without_its_placeholder_is_malformed():
    job = _suspended()
    job["TaskGroups"] = [g for g in job["TaskGroups"] if g["Name"] != PLACEHOLDER_GROUP]
    with pytest.raises(Malformed, match="no 'queued' group"):
        Suspension.of(job)


@pytest.mark.parametrize("gang", ["soon", "nan", "NaN", "inf", "-inf", "Infinity"])
def test_a_gang_timeout_that_is_not_a_number_of_seconds_is_malformed(gang):
    with pytest.raises(Malformed, match="not a number of seconds"):
        Suspension.of(_suspended(**{META_GANG_TIMEOUT: gang}))


@pytest.mark.parametrize(("gang", "clamped"), [("0", 1.0), ("0.2", 1.0), ("-30", 1.0), ("1", 1.0), ("600", 600.0), ("86400", 600.0), ("1e300", 600.0), ("45.5", 45.5)])
def test_the_gang_timeout_is_clamped_to_one_second_to_ten_minutes(gang, clamped):
    assert Suspension.of(_suspended(**{META_GANG_TIMEOUT: gang})).gang_timeout_s == clamped


def test_a_missing_gang_timeout_is_thirty_seconds():
    assert Suspension.of(_suspended(**{META_GANG_TIMEOUT: None})).gang_timeout_s == 30.0


# ---- state -------------------------------------------------------------------------------


def test_a_job_registered_as_it_is_is_plain():
    assert suspension.state(_body()) == PLAIN
    assert not suspension.is_waiting(_body())


def test_a_suspended_job_is_queued():
    assert suspension.state(_suspended()) == QUEUED
    assert suspension.state(suspension.suspend(_body(), gang_timeout_s=30)) == QUEUED  # the body's "Job" wrapper too
    assert suspension.is_waiting(_suspended())


def test_some_groups_up_with_the_placeholder_still_up_is_admitting():
    job = _scaled(_suspended(), chief=1)
    assert suspension.state(job) == ADMITTING
    assert suspension.is_waiting(job)


def test_groups_up_and_the_placeholder_down_is_admitted():
    job = _scaled(_suspended(), chief=1, worker=2, **{PLACEHOLDER_GROUP: 0})
    assert suspension.state(job) == ADMITTED
    assert not suspension.is_waiting(job)
    assert suspension.state(_scaled(job, worker=0)) == ADMITTED  # scaled down since: still admitted


def test_everything_at_zero_is_refused():
    job = _scaled(_suspended(), **{PLACEHOLDER_GROUP: 0})
    assert suspension.state(job) == REFUSED
    assert not suspension.is_waiting(job)


def test_a_suspended_job_with_unreadable_counts_is_judged_by_its_groups():
    assert suspension.state(_suspended(**{META_COUNTS: "junk"})) == QUEUED


# ---- wanted_job --------------------------------------------------------------------------


def test_the_wanted_job_drops_the_placeholder_and_sets_the_counts():
    job = _suspended()
    wanted = suspension.wanted_job(job, {"chief": 1, "worker": 2})
    assert _counts(wanted) == {"chief": 1, "worker": 2}
    assert wanted["ID"] == "digits" and wanted["TaskGroups"][0]["Tasks"] == job["TaskGroups"][0]["Tasks"]


def test_the_wanted_job_puts_a_group_the_counts_do_not_name_at_zero_and_leaves_the_job_alone():
    job = _suspended()
    before = copy.deepcopy(job)
    assert _counts(suspension.wanted_job({"Job": job}, {"worker": 3})) == {"chief": 0, "worker": 3}
    assert job == before

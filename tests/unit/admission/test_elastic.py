"""Elastic runs' sizes (nomadtf/admission/elastic.py, the helpers in suspension, fit and
preemption it leans on, and job.json's elastic count). Pure."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nomadtf.admission import elastic, fit, preemption, suspension
from nomadtf.admission.preemption import Candidate
from nomadtf.errors import SpecError
from nomadtf.job.capacity import Resources
from nomadtf.job.spec import parse_spec
from tests.unit.admission.test_fit import alloc, ask, group, node


def test_the_largest_size_that_fits_is_found_between_the_most_and_the_fewest():
    tried = []

    def fits(counts: dict[str, int]) -> bool:
        tried.append(counts["worker"])
        return counts["worker"] <= 5

    assert elastic.largest({"chief": 1, "worker": 16}, {"worker": 2}, fits) == {"chief": 1, "worker": 5}
    assert len(tried) <= 5  # bisection: log2(14) packings, not one per size
    assert elastic.largest({"worker": 16}, {"worker": 2}, lambda c: False) is None
    assert elastic.largest({"worker": 3}, {"worker": 3}, lambda c: True) == {"worker": 3}  # min == max: one size


def test_a_growth_is_at_least_one_task_above_now_and_at_most_the_most():
    assert elastic.largest({"worker": 4}, {"worker": 1}, lambda c: c["worker"] <= 3, above_bottom=True) == {"worker": 3}
    assert elastic.largest({"worker": 4}, {"worker": 1}, lambda c: c["worker"] <= 1, above_bottom=True) is None  # nothing more fits
    assert elastic.largest({"worker": 1}, {"worker": 1}, lambda c: True, above_bottom=True) is None  # at its most
    assert elastic.extra({"worker": 1}, {"worker": 3}) == {"worker": 2}


def test_shrinking_takes_from_the_largest_elastic_group_and_never_below_a_minimum():
    assert suspension.shrinkable({"chief": 1, "worker": 4}, {"worker": 2}) == 2
    assert suspension.shrunk({"chief": 1, "worker": 4}, {"worker": 2}, 5) == {"chief": 1, "worker": 2}
    assert suspension.shrunk({"a": 4, "b": 3}, {"a": 1, "b": 1}, 3) == {"a": 2, "b": 2}


def test_an_ask_with_fewer_counts_keeps_only_that_many_of_each_group():
    run = ask(group("chief", 1, 500), group("worker", 3, 1000))
    smaller = run.with_counts({"chief": 1, "worker": 1})
    assert [s.group for s in smaller.slots] == ["chief", "worker"]
    assert smaller.needs.cpu == 1500
    rooms = fit.node_rooms([node("n1", 2000)], [])
    assert not fit.fits(run, rooms) and fit.fits(smaller, rooms)
    assert rooms[0].cpu == 2000  # fits() takes nothing


def _body(minimum: dict | None) -> dict:
    job = {"Job": {"ID": "e", "TaskGroups": [{"Name": "chief", "Count": 1}, {"Name": "worker", "Count": 4}]}}
    return suspension.suspend(job, gang_timeout_s=30, elastic=minimum)


def test_a_suspended_run_carries_its_elastic_minimums_and_a_forged_one_is_refused():
    assert suspension.Suspension.of(_body({"worker": 2})).minimum == {"worker": 2}
    assert suspension.Suspension.of(_body(None)).minimum == {}
    for forged in ({"worker": 5}, {"worker": 0}, {"nope": 1}, {"worker": True}):
        body = _body(None)
        body["Job"]["Meta"][suspension.META_ELASTIC] = json.dumps(forged)
        with pytest.raises(suspension.Malformed, match="nomadtf.elastic"):
            suspension.Suspension.of(body)


def test_an_elastic_victim_offers_only_its_tasks_above_the_minimum():
    allocs = [replace(alloc("n1", 1000, job="e", group="worker"), name=f"e.worker[{i}]") for i in range(3)]
    allocs.append(replace(alloc("n2", 500, job="e", group="chief"), name="e.chief[0]"))
    whole = Candidate("team-a", "e", "r1", 30, tuple((a.node_id, Resources(1000, 1000)) for a in allocs))
    shrink = preemption.as_shrink(whole, allocs, {"chief": 1, "worker": 3}, {"worker": 1})
    assert shrink is not None and shrink.shrink_to == (("worker", 1),)
    assert [cpu for _, r in shrink.held for cpu in [r.cpu]] == [1000, 1000]  # workers 1 and 2, not 0, not the chief
    assert preemption.as_shrink(whole, allocs, {"chief": 1, "worker": 1}, {"worker": 1}) is None  # at its minimum
    # Once scaled down, the tasks beyond the new count hold room until they have stopped.
    assert [a.name for a in preemption.beyond(allocs, {"worker": 1})] == ["e.worker[1]", "e.worker[2]"]
    allocs[1] = replace(allocs[1], client_status="complete")
    allocs[2] = replace(allocs[2], client_status="complete")
    assert preemption.beyond(allocs, {"worker": 1}) == []


def _job(count) -> dict:
    return {"name": "e", "strategy": "multi_worker_mirrored", "roles": {"worker": {"count": count}}, "entrypoint": {"script": "t.py"}}


def test_job_json_takes_an_elastic_worker_count_and_names_what_is_wrong_with_one():
    spec = parse_spec(_job({"min": 1, "max": 3}))
    assert spec.counts == {"worker": 3} and spec.elastic == {"worker": (1, 3)}
    assert parse_spec(_job(2)).elastic == {}
    for bad, said in (({"min": 3, "max": 1}, "min (3) is more than max (1)"), ({"min": 0, "max": 2}, "roles.worker.count.min"),
                      ({"min": 1}, "'max' is a required property"), ({"mn": 1, "max": 2}, "did you mean 'min'")):  # fmt: skip
        with pytest.raises(SpecError, match=r"roles\.worker\.count") as caught:
            parse_spec(_job(bad))
        assert said in str(caught.value)
    ps = {"name": "e", "strategy": "parameter_server", "entrypoint": {"script": "t.py"},
          "roles": {"chief": {"count": {"min": 1, "max": 1}}, "worker": {"count": 1}, "ps": {"count": 1}}}  # fmt: skip
    with pytest.raises(SpecError, match="roles.chief.count: only worker may be elastic"):
        parse_spec(ps)

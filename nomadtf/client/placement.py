"""Never, not now, or fits: the submitter's verdict from Nomad's plan, before anything is
registered (`run`, `plan`, `validate`).

Usage:
    placement = check(api, job)          # plan.Placement: FITS, NOT_NOW or NEVER
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from nomadtf.admission import fit
from nomadtf.errors import NomadError
from nomadtf.job import capacity, plan
from nomadtf.job.answers import PlanResult
from nomadtf.servers.nomad import NomadAPI


def readable_nodes(api: NomadAPI, job: dict[str, Any], *, coming_back: bool = False) -> tuple[list[capacity.NodeCapacity], bool]:
    """(the ready nodes that may take `job`, whether the token may list nodes at all);
    `coming_back`: also the nodes drained, ineligible or down for less than a grace period
    (what "never" is measured against: they return).

    GET /v1/nodes?resources=true"""
    try:
        nodes = api.nodes()
    except NomadError as exc:
        if exc.status == 403:
            return [], False
        raise
    if coming_back:
        now = time.time()
        nodes = [replace(n, status="ready", eligibility="eligible", drain=False) for n in nodes if fit.may_return(n, now)]
    return capacity.node_capacities(nodes, job), True


def classify(api: NomadAPI, result: PlanResult, job: dict[str, Any]) -> plan.Placement:
    """plan.classify of a plan `result`. Without node:read only the plan's own feasibility
    can say "never" (a token that may not read nodes is told "not now", never a wrong
    "never").  GET /v1/nodes?resources=true when the plan did not place everything"""
    if not result.failed_groups:
        return plan.Placement(plan.FITS)
    nodes, readable = readable_nodes(api, job, coming_back=True)
    return plan.classify(result, job, nodes if readable else None)


def check(api: NomadAPI, job: dict[str, Any]) -> plan.Placement:
    """POST /v1/job/:job_id/plan ; GET /v1/nodes?resources=true when it does not fit"""
    return classify(api, api.plan(job), job)

"""Who admitted what: the record in Consul of the run each job was admitted for, checked
before any run is suspended again for having been resumed out of turn.

One part of the admission controller (controller.py): its methods run on the leader's
`Controller`, whose state (the runs in flight, forming, preempting, growing) they share."""

from __future__ import annotations

from nomadtf import wire
from nomadtf.admission import suspension
from nomadtf.errors import NomadError, ServerError
from nomadtf.job.answers import Job


class KnowsWhoAdmitted:
    """The record of who admitted which run."""

    def _read_admitted(self) -> dict[tuple[str, str], str]:
        """GET /v1/kv/nomadtf/_admission/admitted/?recurse"""
        from nomadtf.servers.consulhttp import consul_call

        _, items = consul_call("reading the admitted runs", self.consul.kv.get, wire.KV_ADMISSION_ADMITTED, recurse=True)
        self.requests += 1
        out = {}
        for item in items or []:
            namespace, _, job_id = item["Key"].removeprefix(wire.KV_ADMISSION_ADMITTED).partition("/")
            out[(namespace, job_id)] = (item.get("Value") or b"").decode(errors="replace")
        return out

    def _admitted_by_us(self, key: tuple[str, str], run_id: str) -> bool:
        """Whether a controller recorded this run as the one it admits (memory first; the key
        again before calling anything out of turn: a predecessor may have written it late).

        GET /v1/kv/nomadtf/_admission/admitted/<ns>/<job>"""
        from nomadtf.servers.consulhttp import consul_call

        if self.admitted.get(key) == run_id:
            return True
        _, item = consul_call("reading an admitted run", self.consul.kv.get, wire.kv_admitted(*key), consistency="consistent")
        self.requests += 1
        if item and (item.get("Value") or b"").decode(errors="replace") == run_id:
            self.admitted[key] = run_id
            return True
        # The record can be lost with Consul's data (a -dev agent restarted, a restore): the
        # placeholder's scaling events in Nomad still say who lowered it. A submitter could
        # write such an event for its own run; that only lets its own run keep its place.
        try:
            events = self._api(key[0]).scaling_events(key[1]).get(suspension.PLACEHOLDER_GROUP) or []
        except NomadError:
            return True  # cannot tell: never stop a run on a guess
        self.requests += 1
        for event in events:
            if event.meta.get(suspension.META_ADMISSION) == "admitted" and event.meta.get(wire.META_RUN) == run_id:
                self.admitted[key] = run_id
                self._record_admitted(key, run_id)
                return True
        return False

    def _record_admitted(self, key: tuple[str, str], run_id: str) -> None:
        """PUT /v1/kv/nomadtf/_admission/admitted/<ns>/<job> (lost with Consul's data: written again)"""
        try:
            self.lease.publish(wire.kv_admitted(*key), run_id)
        except ServerError as exc:
            self.on_event(f"could not record {key[0]}/{key[1]} run {run_id} as admitted: {exc}")

    def _forget_admitted(self, jobs: dict[tuple[str, str], Job]) -> None:
        """A job gone from Nomad (purged) needs no record.  DELETE .../admitted/<ns>/<job>"""
        from nomadtf.servers.consulhttp import consul_call

        for key in [k for k in self.admitted if k not in self.seen]:
            consul_call("forgetting an admitted run", self.consul.kv.delete, wire.kv_admitted(*key))
            self.requests += 1
            del self.admitted[key]

    def _suspend_again(self, job: Job) -> None:
        """A run someone other than the controller resumed (Nomad CE lets a token with
        scale-job scale its own jobs): placeholder up, groups to 0; it waits its turn."""
        run = self._queued_run(job)
        if run is None:
            return
        message = f"nomadtf admission: run {run.run_id} was resumed out of turn; suspended again (only the admission controller resumes a queued run)"
        try:
            # Every group, whatever the job read said: its submitter may be scaling it still.
            index = self._scale(run, suspension.PLACEHOLDER_GROUP, 1, run.job_modify_index, message, "suspended")
            for group in sorted(run.counts):
                index = self._scale(run, group, 0, index, message, "suspended")
        except NomadError as exc:
            self.on_event(f"could not suspend {run.namespace}/{run.job_id} again: {exc}")
            return
        self._note(run, "resumed out of turn: suspended again")

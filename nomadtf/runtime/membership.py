"""Who this task is among its peers, and every Consul step that says so: our session and
index claim, the cluster as Consul (or the template-rendered file) sees it, the generation,
the role counts `nomadtf scale` sets, and the run's recorded outcome.

A read is one non-blocking step (waiting is the event loop's job, so a SIGTERM is handled
at once, in any phase). The writes a decision depends on (the session, the outcome, a new
incarnation) are `recording.py`'s, retried with bounded backoff.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nomadtf import roles, tfconfig, wire
from nomadtf.job.spec import JobSpec
from nomadtf.runtime.loop import CATALOG, CLUSTER_FILE, CLUSTER_KV, Event
from nomadtf.runtime.policy import Debounce, SlotState, fingerprint, slot_state
from nomadtf.runtime.recording import Identity, Recording
from nomadtf.runtime.watches import WATCH_WAIT_S, FileWatch, Watch
from nomadtf.servers.consul import ConsulDiscovery, Slot
from nomadtf.tfconfig import Member

log = logging.getLogger("nomadtf.task")

CLOSER_AFTER_S = 2 * WATCH_WAIT_S  # a waiting task watches the checks itself after this long


@dataclass(frozen=True)
class Settled:
    """Where a complete cluster stands against the run's generation."""

    generation: int  # the generation Consul holds now
    ours: bool  # it was made for exactly these members
    look_again_at: float | None = None  # a change that has not held for discovery.debounce yet


class Membership(Recording):
    """Usage (the supervisor's loop, one thread):
    membership = Membership(spec, identity, discovery, cluster_file, should_stop=lambda: loop.stop_requested)
    membership.open_session(); membership.start_watches(loop.post)
    membership.try_claim(); members = membership.members(); membership.missing(members)
    membership.record(wire.STATE_SUCCEEDED, "marking the job succeeded")
    membership.close()
    """

    def __init__(
        self, spec: JobSpec, identity: Identity, discovery: ConsulDiscovery, cluster_file: Path,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        super().__init__(spec, identity, discovery, should_stop)
        self.base_counts = dict(spec.counts)  # as submitted; `nomadtf scale` may change them
        self.cluster_file = cluster_file
        self.debounce = Debounce(spec.discovery.debounce_s)
        self.watches: list[Watch] = []
        self.file_watch: FileWatch | None = None
        self.forming = False  # waiting on the generation key alone (start_watches)
        self.all_claimed_since: float | None = None  # monotonic: when we first saw every slot claimed
        self.post: Callable[[Event], None] = lambda event: None

    # the roles whose registrations matter to us
    @property
    def watched_roles(self) -> tuple[str, ...]:
        return tuple(r for r in tfconfig.RENDEZVOUS_ROLES if self.spec.counts.get(r))

    @property
    def completes_job(self) -> bool:
        """Whether our clean exit decides that the training is done (job.json `success`)."""
        return roles.completes_job(self.spec.strategy, self.me.role, self.me.index, self.spec.counts, self.spec.success)

    @property
    def awaited_roles(self) -> tuple[str, ...]:
        """The roles our rendezvous waits for (every task of each), from the strategy's table."""
        return roles.rendezvous_roles(self.spec.strategy, self.me.role)

    def start_watches(self, post: Callable[[Event], None]) -> None:
        """While the run's cluster forms for the first time, a task waits on one key, the
        generation, which the task that completes the cluster writes once (`forming`; the
        last to claim its slot watches everything, `watch_closely_if_needed`): formation then
        costs each task the same whatever the job's size. Otherwise (a task that joins a
        formed cluster, template mode) it watches everything at once.

        PUT .../cluster/generation?cas=0 ; GET .../cluster/generation
        """
        self.post = post
        if self.spec.discovery.reconfigure == "template":
            self.file_watch = FileWatch(self.cluster_file, CLUSTER_FILE, post).start()
        elif self.awaited_roles:
            generation, index = self.consul_or_give_up(self.discovery.open_generation, "reading the generation")
            if generation == 0:
                self.forming = True
                # Every answer is a look, also a wait that passed with no change (WATCH_WAIT_S):
                # a cluster whose last arrival died still forms, at a constant cost per task.
                # The first query blocks from the index just read: the claim's step looks next.
                self.watches = [Watch(CLUSTER_KV, self.discovery.wait_for_generation_change, post, every_answer=True, index=index).start()]
                return
        self.watch_everything()

    def watch_everything(self) -> None:
        """One blocking query per role we may depend on (each wakes only on its own service),
        and one on the run's cluster keys; the formation wait, if any, ends."""
        if self.watches and not self.forming:
            return
        for watch in self.watches:
            watch.stop.set()
        self.forming = False
        self.watches = [
            *(Watch(CATALOG, lambda i, w, role=role: self.discovery.wait_for_service_change(role, i, w), self.post).start()
              for role in self.watched_roles),
            Watch(CLUSTER_KV, self.discovery.wait_for_cluster_kv_change, self.post).start(),
        ]

    def watch_closely_if_needed(self, slots: dict[tuple[str, int], Slot]) -> None:
        """While the cluster forms: once every slot we wait for is claimed, the task whose
        claim came last (Consul's index orders them; exactly one) watches the catalog until
        every member passes its checks, and the generation it then writes wakes every other
        task. A task that has seen every slot claimed for two blocking waits watches too (the
        last arrival died or hangs), and so does every task once the cluster has formed.
        Costs no request inside a step's one read (the claim's own step reads the generation)."""
        if not self.forming:
            return
        if int(self.discovery.generation()[0].get("generation", 0)) >= 1:
            # Formed, yet a peer is missing as we look (its check failed since): from now on
            # we watch, to see it come back.
            log.info("the cluster formed; watching it")
            self.watch_everything()
            return
        awaited = [slots.get((role, index)) for role in self.awaited_roles for index in range(self.spec.counts.get(role, 0))]
        ours = slots.get((self.me.role, self.me.index))
        if ours is None or any(slot is None for slot in awaited):
            self.all_claimed_since = None
            return
        if self.all_claimed_since is None:
            self.all_claimed_since = time.monotonic()
        last = max(slot.claimed_at for slot in awaited if slot is not None)
        if ours.claimed_at >= last:
            log.info("every task has claimed its slot, ours last; watching their checks until the cluster is complete")
        elif time.monotonic() - self.all_claimed_since >= CLOSER_AFTER_S:
            log.info("every slot has been claimed for %.0fs and the cluster has not formed; watching their checks too", CLOSER_AFTER_S)
        else:
            return
        self.watch_everything()

    def close(self) -> None:
        for watch in self.watches:
            watch.stop.set()
        if self.file_watch is not None:
            self.file_watch.close()
        self.discovery.close()

    # ---- index claim ------------------------------------------------------------------------

    def try_claim(self) -> bool:
        """One attempt at a unique index; True once we hold one."""
        count = self.spec.counts.get(self.me.role, 1)
        index = self.discovery.claim_slot(self.me.role, count, self.me.alloc_id, self.me.alloc_index, self.me.incarnation)
        if index is None:
            return False
        if index != self.me.alloc_index:
            log.warning("NOMAD_ALLOC_INDEX=%d is held by another allocation; using index %d", self.me.alloc_index, index)
        self.me.index = index
        log.info("holding %s[%d] (alloc %s, incarnation %s)", self.me.role, index, self.me.alloc_id[:8], self.me.incarnation)
        return True

    def slot_state(self, slots: dict[tuple[str, int], Slot]) -> SlotState:
        """Whether we hold our index, lost it (claim it back) or another allocation took it."""
        slot = slots.get((self.me.role, self.me.index))
        if slot is None:
            return slot_state(None, None, self.me.alloc_id, self.discovery.session)
        return slot_state(slot.alloc_id, slot.session, self.me.alloc_id, self.discovery.session)

    def holder(self, slots: dict[tuple[str, int], Slot]) -> str:
        slot = slots.get((self.me.role, self.me.index))
        return slot.alloc_id if slot else ""

    def held_members(self, read_again: bool) -> list[Member] | SlotState:
        """The cluster while we hold our index. SlotState.TAKEN: another allocation holds it
        now (Nomad placed a replacement of ours while our node was cut off, and our session
        lapsed meanwhile; two tasks of one index must never run). SlotState.LOST: Consul
        forgot our slot (restarted), which we claimed back; the claim's write wakes us again,
        unless `read_again` asks for the cluster at once.

        GET .../cluster/slots/?recurse (+ the catalog, or the template's file)
        """
        slots = self.discovery.slots()
        state = self.slot_state(slots)
        if state is SlotState.TAKEN:
            log.error("%s[%d] is held by allocation %s now, a replacement of ours (we were cut off); stopping our child",
                      self.me.role, self.me.index, self.holder(slots)[:8])
            return state
        if state is SlotState.LOST:
            self.reclaim()
            if not read_again:
                return state
            slots = self.discovery.slots()
        return self.members(slots)

    def reclaim(self) -> bool:
        """After Consul forgot us (a dev agent restarted): a new session, our index again."""
        log.warning("our slot %s[%d] is gone (Consul restarted?); claiming it again", self.me.role, self.me.index)
        self.discovery.reopen_session()
        if self.forming:
            self.discovery.open_generation()  # a restarted Consul lost it; waiting on a missing key wakes on every write
        self.me.alloc_index = self.me.index
        return self.try_claim()

    # ---- the cluster ------------------------------------------------------------------------

    def rescale(self) -> JobSpec:
        """The spec with the role counts `nomadtf scale` wrote under the watched prefix: from
        then on the cluster has that many tasks of the role (the change of members does the
        rest). GET .../cluster/counts"""
        scaled = self.discovery.counts()
        counts = {role: scaled.get(role, n) if n else 0 for role, n in self.base_counts.items()}
        if counts != self.spec.counts:
            log.info("role counts are now %s (nomadtf scale)", counts)
            self.spec = dataclasses.replace(self.spec, counts=counts)
        return self.spec

    def members(self, slots: dict[tuple[str, int], Slot] | None = None) -> list[Member]:
        slots = self.discovery.slots() if slots is None else slots
        if self.spec.discovery.reconfigure == "template":
            return members_from_template(self.cluster_file, slots, self.spec.counts)
        return self.discovery.members(self.spec.counts, slots)

    def may_be_complete(self) -> bool:
        """False when our catalog watches hold fewer passing tasks of a role we wait for than
        it counts: the cluster cannot be complete, and a look would only cost requests.
        Costs none itself. (Template mode reads a file: always worth a look.)"""
        if self.spec.discovery.reconfigure == "template":
            return True
        for role in self.awaited_roles:
            seen = self.discovery.watched_instances(role)
            if seen is not None and len(seen) < self.spec.counts.get(role, 0):
                return False
        return True

    def missing(self, members: list[Member]) -> list[str]:
        return tfconfig.missing_members(self.spec.counts, members, self.awaited_roles)

    def missing_peers(self) -> list[str]:
        """Who we wait for and is not there now, ourselves left out: our own slot lapsing (our
        session expired while Consul was away) is no peer's change."""
        me = f"{self.me.role}[{self.me.index}]"
        return [m for m in self.missing(self.members()) if m != me]

    def bump(self, members: list[Member]) -> int:
        """The generation of the complete cluster `members` (a new one when it changed), retried
        for a minute. A task that waits for nobody (TensorBoard) takes the generation as it is.

        GET .../cluster/generation ; PUT .../cluster/generation?cas=<index>
        """
        if not self.awaited_roles:
            return int(self.discovery.generation()[0].get("generation", 0))
        generation = self.retry(lambda: self.discovery.bump_generation(fingerprint(members)), "moving to a new generation")
        return int(generation.get("generation", 1))

    def settle(self, members: list[Member], now: float) -> Settled | None:
        """Where the cluster of `members` stands against the run's generation; None while a
        peer is missing (a change counts once it is back, and only if it changed). A change of
        the complete cluster moves the run to a new generation once it has held for
        discovery.debounce (consul-template's wait), one step of each task that sees it.

        GET .../cluster/generation ; PUT .../cluster/generation?cas=<index>
        """
        if not self.awaited_roles:
            # We wait for nobody (TensorBoard), so the cluster is never ours to move: a
            # generation of a cluster still forming would wake every task that waits for it.
            generation, _ = self.discovery.generation()
            return Settled(int(generation.get("generation", 0)), False)
        if self.missing(members):
            self.debounce.reset()
            return None
        current = fingerprint(members)
        generation, _ = self.discovery.generation()
        if generation.get("fingerprint") != current:
            if self.debounce.value != current:
                log.info("peers changed: %s; acting once this holds for %.1fs", describe(members), self.debounce.hold_s)
            if not self.debounce.observe(current, now):
                return Settled(0, False, self.debounce.due() or now)
            self.debounce.reset()
            generation = self.discovery.bump_generation(current)
            log.info("cluster changed: generation %d: %s", generation["generation"], describe(members))
        else:
            self.debounce.reset()
        return Settled(int(generation.get("generation", 0)), generation.get("fingerprint") == current)


def members_from_template(path: Path, slots: dict[tuple[str, int], Slot], counts: dict[str, int]) -> list[Member]:
    """The file Nomad's template block renders from the Consul catalog (reconfigure=template)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    members = []
    for group in data.get("members", []):
        by_alloc = {}
        for inst in group.get("instances", []):
            by_alloc[wire.parse_tags(inst.get("tags", [])).get(wire.TAG_ALLOC, "")] = inst["address"]
        for (role, index), slot in slots.items():
            if role == group["role"] and slot.alloc_id in by_alloc and index < counts.get(role, 0):
                members.append(Member(role, index, by_alloc[slot.alloc_id], f"{slot.alloc_id}/{slot.incarnation}"))
    return sorted(members)


def describe(members: list[Member]) -> str:
    return ", ".join(f"{m.role}[{m.index}]={m.address}" for m in sorted(members))



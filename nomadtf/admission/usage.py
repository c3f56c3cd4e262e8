"""Each namespace's recent use of the cluster, remembered with a half-life: the memory behind
the fair order. Pure (the controller feeds it what the allocations hold, step by step, and
keeps it in Consul so the next leader remembers too).

Usage of one resource is the integral of what the namespace held, each past second weighing
2^(-age / half_life). A namespace that held a fraction f of the cluster's CPU for a long
time has an average share of f: `average_share` divides by the integral of the whole
cluster over the same memory (total · half_life / ln 2). Its dominant share is the largest of
its shares of CPU, memory and GPUs (Dominant Resource Fairness).

Usage:
    usage = Usage.load(raw)                       # {} or what the last leader saved
    usage.advance(held_by_namespace, now)          # once a step
    usage.average_share("team-a", cluster_total)   # 0.0 .. 1.0 (dominant)
    raw = usage.dump()
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from nomadtf.job.capacity import Resources

GPU = "gpu"  # every device counts as GPUs: one dimension, whatever the model
FORGOTTEN = 1.0  # less than one MHz (or MB, or GPU) for one second: the namespace is forgotten


def dimensions(amount: Resources) -> dict[str, float]:
    """CPU MHz, memory MB and GPUs (any device) as one vector."""
    return {"cpu": float(amount.cpu), "memory": float(amount.memory), GPU: float(sum(amount.devices.values()))}


def dominant_share(amount: Mapping[str, float], total: Mapping[str, float]) -> float:
    """The largest of amount/total over the dimensions the cluster has."""
    return max((amount.get(k, 0.0) / v for k, v in total.items() if v > 0), default=0.0)


@dataclass
class Usage:
    half_life_s: float
    decayed: dict[str, dict[str, float]] = field(default_factory=dict)  # namespace -> dimension -> resource-seconds
    at: float = 0.0  # unix time the integrals are current to

    def advance(self, held: Mapping[str, Resources], now: float) -> None:
        """Decay everything to `now` and add what each namespace held since the last call
        (assumed held all along: steps are seconds apart)."""
        if self.at <= 0 or now <= self.at:
            self.at = max(self.at, now)
            return
        dt = now - self.at
        decay = 2.0 ** (-dt / self.half_life_s)
        # The integral of a constant h over the last dt seconds, each weighed by its age.
        gained = self.half_life_s / math.log(2) * (1.0 - decay)
        for namespace in set(self.decayed) | set(held):
            now_held = dimensions(held.get(namespace, Resources()))
            old = self.decayed.get(namespace, {})
            new = {k: old.get(k, 0.0) * decay + now_held.get(k, 0.0) * gained for k in set(old) | set(now_held)}
            if max(new.values(), default=0.0) < FORGOTTEN:
                self.decayed.pop(namespace, None)
            else:
                self.decayed[namespace] = new
        self.at = now

    def average_share(self, namespace: str, total: Resources) -> float:
        """Its dominant share of the cluster over recent time (0 when it used nothing)."""
        memory = self.half_life_s / math.log(2)
        cluster = {k: v * memory for k, v in dimensions(total).items()}
        return dominant_share(self.decayed.get(namespace, {}), cluster)

    def dump(self) -> str:
        return json.dumps({"half_life_s": self.half_life_s, "at": self.at, "decayed": self.decayed}, sort_keys=True)

    @classmethod
    def load(cls, raw: str | bytes | None, half_life_s: float, now: float) -> Usage:
        """What a previous leader saved (its half-life may differ: the numbers are kept, they
        decay with the new one from now on); a fresh memory when there is none or it is not
        readable."""
        try:
            saved = json.loads(raw or "{}")
            decayed = {str(ns): {str(k): float(v) for k, v in dims.items() if math.isfinite(float(v)) and float(v) >= 0}
                       for ns, dims in (saved.get("decayed") or {}).items()}  # fmt: skip
            at = float(saved.get("at") or now)
        except (ValueError, TypeError, AttributeError):
            return cls(half_life_s, at=now)
        return cls(half_life_s, decayed, min(at, now) if math.isfinite(at) else now)

"""The operator's sharing policy: quotas per namespace, priority ceilings, weights, how long
usage is remembered and when a waiting run gets a reservation. Pure.

The operator writes it with `nomadtf admission policy set FILE` (Consul key
`nomadtf/_admission/policy`, which only an operator's token may write: submitters read the
lead and the board, nothing else of the controller's); the controller reads it while it
leads. Without one, every namespace may use the whole cluster, no priority is capped, and
the order is fair between namespaces with the defaults below.

    {
      "half_life": "1h",            # usage is remembered with this half-life (fair order)
      "reserve_after": "10m",       # a run waiting this long gets a reservation (backfill stops
                                    # taking what it needs); "0s": never backfill past a waiting run
      "backfill": true,             # runs behind a waiting one start when they fit
      "preemption": false,          # a run may preempt running runs (priority 10 higher, or a
                                    # reclaim of nominal quota); off unless the operator says so
      "default": {...},             # for namespaces not listed below
      "namespaces": {
        "team-a": {
          "nominal": {"cpu": 8000, "memory": 16384, "gpus": 2},
          "borrowing_limit": {"cpu": 4000},    # beyond nominal; absent: up to the whole cluster
          "max_priority": 70,                  # a job's priority above it counts as 70
          "weight": 2                          # twice the share of a weight-1 namespace
        }
      }
    }

Resources: `cpu` in MHz, `memory` in MB, `gpus` (any NVIDIA GPU, "nvidia/gpu") and
`devices` ({"nvidia/gpu/Tesla-V100-SXM2-16GB": 1}: by vendor, type and model, Nomad's own
device names). A dimension a quota leaves out is not limited.

Usage:
    policy = parse(text)                       # PolicyError naming every bad field
    share = policy.of("team-a")
    share.priority(90)                          # 70: the ceiling
    share.never(needs)                          # "" or why the namespace can never hold it
    share.over(held, needs, nominal_only=True)  # would it go past its nominal quota?
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nomadtf import durations
from nomadtf.errors import PolicyError
from nomadtf.job.capacity import Resources

DEFAULT_HALF_LIFE_S = 3600.0
DEFAULT_RESERVE_AFTER_S = 600.0
NOMAD_MAX_PRIORITY = 100
RESOURCE_FIELDS = ("cpu", "memory", "gpus", "devices")
SHARE_FIELDS = ("nominal", "borrowing_limit", "max_priority", "weight")
POLICY_FIELDS = ("half_life", "reserve_after", "backfill", "preemption", "default", "namespaces")
GPU_DEVICE = "nvidia/gpu"


def covers(quota_name: str, device: str) -> bool:
    """Whether a quota on `quota_name` ("gpu", "nvidia/gpu", "nvidia/gpu/<model>") counts
    `device` (an asked name such as "nvidia/gpu", or a held "vendor/type/model")."""
    quota, name = quota_name.split("/"), device.split("/")
    if len(quota) == 1:
        return (name[1] if len(name) > 1 else name[0]) == quota[0]
    if len(name) == 1:  # asked by type alone ("gpu"): it may be any vendor's, so it counts
        return quota[1] == name[0]
    return name[: len(quota)] == quota


@dataclass(frozen=True)
class Limit:
    """A quota: CPU (MHz), memory (MB) and devices by quota name; None = not limited."""

    cpu: int | None = None
    memory: int | None = None
    devices: Mapping[str, int] = field(default_factory=dict)

    def plus(self, other: Limit | None) -> Limit | None:
        """This limit with `other` added (borrowing on top of nominal); a dimension either
        leaves open stays open. `other` None: unlimited beyond this."""
        if other is None:
            return None
        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else a + b
        names = set(self.devices) & set(other.devices)
        return Limit(add(self.cpu, other.cpu), add(self.memory, other.memory), {n: self.devices[n] + other.devices[n] for n in names})

    def excess(self, amount: Resources) -> list[str]:
        """The dimensions where `amount` is beyond this limit: ["cpu 9000 > 8000 MHz"]."""
        out = []
        if self.cpu is not None and amount.cpu > self.cpu:
            out.append(f"cpu {amount.cpu} > {self.cpu} MHz")
        if self.memory is not None and amount.memory > self.memory:
            out.append(f"memory {amount.memory} > {self.memory} MB")
        for name, limit in sorted(self.devices.items()):
            used = sum(n for device, n in amount.devices.items() if covers(name, device))
            if used > limit:
                out.append(f"{name} {used} > {limit}")
        return out

    def describe(self) -> str:
        parts = [f"cpu {self.cpu} MHz"] * (self.cpu is not None) + [f"memory {self.memory} MB"] * (self.memory is not None)
        return ", ".join(parts + [f"{name} x{n}" for name, n in sorted(self.devices.items())]) or "no limit"


@dataclass(frozen=True)
class Share:
    """One namespace's part of the policy."""

    nominal: Limit | None = None  # None: no quota (the whole cluster)
    borrowing_limit: Limit | None = None  # beyond nominal; None: up to the whole cluster
    max_priority: int = NOMAD_MAX_PRIORITY
    weight: float = 1.0

    @property
    def ceiling(self) -> Limit | None:
        """The most the namespace may ever hold: nominal plus its borrowing limit."""
        return None if self.nominal is None else self.nominal.plus(self.borrowing_limit)

    def priority(self, asked: int) -> int:
        return min(asked, self.max_priority)

    def never(self, needs: Resources) -> str:
        """Why a run of `needs` could never start in this namespace ("" when it could)."""
        ceiling = self.ceiling
        excess = ceiling.excess(needs) if ceiling is not None else []
        return f"it asks more than its namespace may ever hold ({'; '.join(excess)}: nominal quota plus borrowing limit)" if excess else ""

    def over(self, held: Resources, needs: Resources, *, nominal_only: bool = False) -> list[str]:
        """Where `held + needs` goes past the ceiling (or only the nominal quota)."""
        limit = self.nominal if nominal_only else self.ceiling
        return limit.excess(held + needs) if limit is not None else []


@dataclass(frozen=True)
class Policy:
    half_life_s: float = DEFAULT_HALF_LIFE_S
    reserve_after_s: float = DEFAULT_RESERVE_AFTER_S
    backfill: bool = True
    preemption: bool = False
    default: Share = field(default_factory=Share)
    namespaces: Mapping[str, Share] = field(default_factory=dict)

    def of(self, namespace: str) -> Share:
        return self.namespaces.get(namespace, self.default)

    def digest(self) -> str:
        """A short name for this policy (the board says which one is in force)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        """The policy as `policy show` prints it (every default spelled out)."""
        def limit(value: Limit | None) -> dict[str, Any] | None:
            if value is None:
                return None
            out: dict[str, Any] = {k: v for k, v in (("cpu", value.cpu), ("memory", value.memory)) if v is not None}
            return out | ({"devices": dict(value.devices)} if value.devices else {})

        def share(value: Share) -> dict[str, Any]:
            return {"nominal": limit(value.nominal), "borrowing_limit": limit(value.borrowing_limit),
                    "max_priority": value.max_priority, "weight": value.weight}  # fmt: skip

        return {
            "half_life": f"{self.half_life_s:g}s", "reserve_after": f"{self.reserve_after_s:g}s", "backfill": self.backfill,
            "preemption": self.preemption,
            "default": share(self.default), "namespaces": {name: share(s) for name, s in sorted(self.namespaces.items())},
        }  # fmt: skip


def parse(text: str | bytes) -> Policy:
    """The policy in `text` (JSON); PolicyError lists every problem, each naming its field."""
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PolicyError([f"not JSON: {exc}"]) from None
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise PolicyError(["the policy is a JSON object: {\"namespaces\": {...}}"])
    _unknown(raw, POLICY_FIELDS, "", problems)
    half_life = _duration(raw, "half_life", DEFAULT_HALF_LIFE_S, problems, positive=True)
    reserve_after = _duration(raw, "reserve_after", DEFAULT_RESERVE_AFTER_S, problems)
    backfill = raw.get("backfill", True)
    if not isinstance(backfill, bool):
        problems.append("backfill: true or false")
        backfill = True
    preemption = raw.get("preemption", False)
    if not isinstance(preemption, bool):
        problems.append("preemption: true or false")
        preemption = False
    default = _share(raw.get("default", {}), "default", problems)
    namespaces: dict[str, Share] = {}
    listed = raw.get("namespaces", {})
    if not isinstance(listed, dict):
        problems.append("namespaces: an object of namespace name -> its share")
        listed = {}
    for name, value in listed.items():
        namespaces[name] = _share(value, f"namespaces.{name}", problems)
    if problems:
        raise PolicyError(problems)
    return Policy(half_life, reserve_after, backfill, preemption, default, namespaces)


def _unknown(raw: Mapping[str, Any], known: tuple[str, ...], where: str, problems: list[str]) -> None:
    for key in raw:
        if key not in known:
            problems.append(f"{where}{key}: unknown field; known: {', '.join(known)}")


def _duration(raw: Mapping[str, Any], key: str, default: float, problems: list[str], positive: bool = False) -> float:
    if key not in raw:
        return default
    try:
        seconds = durations.parse_seconds(str(raw[key])) if isinstance(raw[key], str) else math.nan
    except durations.DurationError as exc:
        problems.append(f"{key}: {exc}")
        return default
    if math.isnan(seconds) or seconds < 0 or (positive and seconds == 0):
        problems.append(f"{key}: a duration such as \"30m\" or \"1h\"{' above zero' if positive else ''}, got {raw[key]!r}")
        return default
    return seconds


def _count(value: Any, where: str, problems: list[str]) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.append(f"{where}: a whole number of 0 or more, got {value!r}")
        return None
    return value


def _limit(raw: Any, where: str, problems: list[str]) -> Limit | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{where}: an object such as {{\"cpu\": 4000, \"memory\": 8192, \"gpus\": 1}}")
        return None
    _unknown(raw, RESOURCE_FIELDS, f"{where}.", problems)
    cpu = _count(raw["cpu"], f"{where}.cpu", problems) if "cpu" in raw else None
    memory = _count(raw["memory"], f"{where}.memory", problems) if "memory" in raw else None
    devices: dict[str, int] = {}
    if "gpus" in raw:
        devices[GPU_DEVICE] = _count(raw["gpus"], f"{where}.gpus", problems) or 0
    named = raw.get("devices", {})
    if not isinstance(named, dict):
        problems.append(f"{where}.devices: an object of device name -> count, e.g. {{\"nvidia/gpu/Tesla-V100-SXM2-16GB\": 1}}")
        named = {}
    for name, count in named.items():
        if not isinstance(name, str) or not name or len(name.split("/")) > 3 or "" in name.split("/"):
            problems.append(f"{where}.devices: {name!r} is not a device name (type, vendor/type or vendor/type/model)")
            continue
        if name in devices:
            problems.append(f"{where}.devices: {name!r} is given twice (\"gpus\" is {GPU_DEVICE})")
            continue
        devices[name] = _count(count, f"{where}.devices.{name}", problems) or 0
    return Limit(cpu, memory, devices)


def _share(raw: Any, where: str, problems: list[str]) -> Share:
    if not isinstance(raw, dict):
        problems.append(f"{where}: an object with {', '.join(SHARE_FIELDS)}")
        return Share()
    _unknown(raw, SHARE_FIELDS, f"{where}.", problems)
    nominal = _limit(raw.get("nominal"), f"{where}.nominal", problems)
    borrowing = _limit(raw.get("borrowing_limit"), f"{where}.borrowing_limit", problems)
    if borrowing is not None and nominal is None:
        problems.append(f"{where}.borrowing_limit: is beyond a nominal quota; give {where}.nominal too")
    max_priority = raw.get("max_priority", NOMAD_MAX_PRIORITY)
    if isinstance(max_priority, bool) or not isinstance(max_priority, int) or not 1 <= max_priority <= NOMAD_MAX_PRIORITY:
        problems.append(f"{where}.max_priority: a whole number from 1 to {NOMAD_MAX_PRIORITY}, got {max_priority!r}")
        max_priority = NOMAD_MAX_PRIORITY
    weight = raw.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
        problems.append(f"{where}.weight: a number above 0, got {weight!r}")
        weight = 1.0
    return Share(nominal, borrowing, max_priority, float(weight))

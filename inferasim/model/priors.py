"""Population priors: what every fitted anchor says about a kernel set that has none yet.

A kernel set without an anchor is priced from `steptime.default_params`, the GPU family's
datasheet-level defaults. Each anchor the project holds is one more draw of how far real kernel
sets sit from those defaults. The book below learns, per step-time parameter, the log-ratio
fitted / default across anchors, grouped by what decides kernels (engine, GPU vendor, weight
precision, dense or MoE), and shrinks each group's centre toward its parent's (the engine's, then
the whole population's, then the default itself) by how many kernel sets it holds:

    centre(group) = (n * median(group) + K * centre(parent)) / (n + K)

so a group of one anchor moves a little from its parent and a group of twenty nearly all the way.
The spread is the group's (robust) standard deviation of the same log-ratios, shrunk alike; it
sizes the interval of a measurement-free prediction.

Why log-ratios to the default and not the fitted values themselves: the default already carries
what physics and engine source say (vLLM V0's per-sequence host time, RCCL hops, AMD's lower
bandwidth share), so the population only learns what the defaults miss, and a GPU with no anchor
at all keeps its own datasheet peaks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.catalog.precision import precision_family
from inferasim.model.steptime import PARAM_BOUNDS, StepParams, default_params

# The parameters the population carries: the terms of the engine step, GPU and host. The request-
# level terms (the arrival wave share `burst`, the per-request `t_ttft` and `t_front`) stay at the
# default: an anchor pins them only at its own concurrency and lengths (a saturated sweep fits
# the wave of that sweep), and their medians across kernel sets carry those fits to sweeps unlike
# them (validate --measurement-free on shared/data/aic-silicon: TTFT 23.8% with them, 22.7%
# without; SGLang 30.8% -> 26.8%). The weight tile (m_tile) and the client cap belong to one build
# or one harness, not to a family.
LEARNED: tuple[str, ...] = ("t_fixed", "t_seq", "e_bw", "e_kv", "e_flops", "e_attn")
# Kernel sets a group's own median counts as against its parent's centre (K above).
SHRINK = 3.0
# Floor of a spread (log units): no population knows a parameter better than this.
MIN_SPREAD = 0.05
_FLOOR = {"t_seq": 1e-7, "burst": 1e-3, "t_ttft": 1e-4, "t_front": 1e-4}


def precision_class(precision: str) -> str:
    """Weight precisions that run the same GEMM kinds: 16-bit floats, 8-bit, 4-bit, or as written
    (catalog.precision.precision_family)."""
    return precision_family(precision)


@dataclass(frozen=True)
class Traits:
    """What groups kernel sets in the population, most general first."""

    engine: str
    vendor: str
    precision: str  # precision_class
    moe: bool

    @classmethod
    def of(cls, engine: str, gpu: GPU, precision: str, model: ModelSpec) -> Traits:
        return cls(engine=engine, vendor=gpu.vendor, precision=precision_class(precision),
                   moe=any(layer.mlp.n_experts for layer in model.layers))

    def levels(self) -> list[tuple[str, ...]]:
        """Group keys from the whole population down to this kernel set's most specific group."""
        return [(), (self.engine,), (self.engine, self.vendor), (self.engine, self.vendor, self.precision),
                (self.engine, self.vendor, self.precision, "moe" if self.moe else "dense")]


@dataclass(frozen=True)
class Member:
    """One fitted kernel set: its traits and its parameters' log-ratios to its own default."""

    key: tuple[str, ...]
    traits: Traits
    log_ratio: dict[str, float]


def _safe_log(value: float, name: str) -> float:
    return math.log(max(value, _FLOOR.get(name, PARAM_BOUNDS[name][0]), 1e-12))


def member(key: tuple[str, ...], engine: str, engine_version: str, model: ModelSpec, gpu: GPU, precision: str,
           params: StepParams) -> Member:
    base = default_params(gpu, engine, engine_version)
    return Member(key=key, traits=Traits.of(engine, gpu, precision, model),
                  log_ratio={n: _safe_log(getattr(params, n), n) - _safe_log(getattr(base, n), n) for n in LEARNED})


def _median(values: list[float]) -> float:
    """np.median of a short list, without numpy's per-call cost (the population takes thousands of
    them): the middle value, or the mean of the two middle ones, computed as numpy does ((a + b) / 2)."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        return math.nan
    h = n // 2
    return s[h] if n % 2 else (s[h - 1] + s[h]) / 2.0


def _robust_sd(values: np.ndarray | list[float]) -> float:
    if len(values) < 2:
        return 0.0
    v = [float(x) for x in values]
    m = _median(v)
    mad = _median([abs(x - m) for x in v])
    return 1.4826 * mad  # the MAD of a normal sample, as its standard deviation


@dataclass
class Prior:
    """A kernel set's population prior: the parameters' centres and their spreads (log units)."""

    params: StepParams
    spread: dict[str, float]
    support: dict[str, int] = field(default_factory=dict)  # kernel sets in the most specific group used

    def describe(self) -> str:
        n = max(self.support.values(), default=0)
        return f"population prior from {n} kernel set{'s' if n != 1 else ''} of its group"


class PriorBook:
    """Log-ratio statistics of a population of fitted kernel sets, by group."""

    def __init__(self, members: Iterable[Member]) -> None:
        self.members = list(members)
        # A group's statistics are computed when a prior first reads them: a leave-one-out book
        # (`without`) is asked for one kernel set's groups only, and the population builds one
        # book per member (most of `inferasim tune`'s start when it was eager).
        self._stats: dict[tuple[str, ...], dict[str, tuple[float, float, int]]] = {}
        self._groups: dict[tuple[str, ...], list[Member]] = {}
        for m in self.members:
            for level in m.traits.levels():
                self._groups.setdefault(level, []).append(m)

    def _group_stats(self, level: tuple[str, ...]) -> dict[str, tuple[float, float, int]]:
        got = self._stats.get(level)
        if got is None:
            got = self._stats[level] = {}
            ms = self._groups.get(level, ())
            if ms:
                for name in LEARNED:
                    v = [float(m.log_ratio[name]) for m in ms]
                    got[name] = (_median(v), _robust_sd(v), len(v))
        return got

    def __len__(self) -> int:
        return len(self.members)

    def without(self, key: tuple[str, ...]) -> PriorBook:
        """The book of every member but `key`'s (leave one kernel set out)."""
        return PriorBook(m for m in self.members if m.key != key)

    def _centre(self, traits: Traits, name: str) -> tuple[float, float, int]:
        centre, spread, support = 0.0, float("nan"), 0
        for level in traits.levels():
            stats = self._group_stats(level).get(name)
            if stats is None:
                break
            med, sd, n = stats
            w = n / (n + SHRINK)
            centre = w * med + (1.0 - w) * centre
            # The parent's spread, or at the root the group's own, pulled toward the group's.
            spread = sd if math.isnan(spread) else w * sd + (1.0 - w) * spread
            support = n
        return centre, spread, support

    def prior(self, engine: str, engine_version: str, model: ModelSpec, gpu: GPU, precision: str) -> Prior:
        """The centre and spread this population gives a kernel set (its default when empty)."""
        base = default_params(gpu, engine, engine_version)
        traits = Traits.of(engine, gpu, precision, model)
        changes: dict[str, float] = {}
        spread: dict[str, float] = {}
        support: dict[str, int] = {}
        for name in LEARNED:
            centre, sd, n = self._centre(traits, name)
            spread[name] = max(sd if not math.isnan(sd) else 0.0, MIN_SPREAD)
            support[name] = n
            if n == 0:  # nothing learned: the default as it is
                continue
            lo, hi = PARAM_BOUNDS[name]
            value = math.exp(_safe_log(getattr(base, name), name) + centre)
            changes[name] = float(min(max(value, max(lo, _FLOOR.get(name, lo))), hi))
        return Prior(params=replace(base, **changes), spread=spread, support=support)


def learn(members: Sequence[Member]) -> PriorBook:
    return PriorBook(members)

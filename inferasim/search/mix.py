"""Mix planner: several models and latency tiers under one GPU budget.

Each tier (a class of traffic: its SLO, its rate, its lengths) lists the models that may serve it,
best first. For every (tier, model) the search finds the deployment that serves the tier's rate
within its SLO on the fewest GPUs; the planner then picks one model per tier so that the
deployments fit the budget together, serving as many tiers as it can, each with the most
preferred model it can afford. Small plans are solved exactly (every combination is tried).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from inferasim.core.spec import SLO, Hardware, Objective, SearchSpace, StaticWorkload, TuningSpec, WorkloadSource
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import SHIPPED_ANCHORS
from inferasim.search.tune import tune

MAX_COMBINATIONS = 100_000


class Tier(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    name: str
    models: list[str] = Field(min_length=1, description="Models that may serve this tier, most preferred first.")
    request_rate: float = Field(gt=0)
    input_tokens: int = Field(1024, ge=1)
    output_tokens: int = Field(256, ge=1)
    slo: SLO = Field(default_factory=SLO)


class MixSpec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    hardware: Hardware
    engines: list[str] = Field(default_factory=lambda: ["vllm", "sglang", "atom"])
    precision: list[str] = Field(default_factory=lambda: ["auto"])
    tiers: list[Tier] = Field(min_length=1)
    search: SearchSpace = Field(default_factory=lambda: SearchSpace(disaggregation=False))

    @model_validator(mode="after")
    def _distinct_tiers(self) -> MixSpec:
        names = [t.name for t in self.tiers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tiers: each name once (the plan is reported per tier); repeated: {', '.join(twice)}")
        return self


@dataclass
class Option:
    tier: str
    model: str
    preference: int  # 0 = most preferred
    gpus: int | None  # None: cannot meet the tier's SLO and rate within the budget
    entry: dict[str, Any] | None
    why: str = ""  # why the model cannot serve the tier (gpus None)


@dataclass
class MixPlan:
    assignments: list[Option]
    unserved: list[str]
    gpus: int
    budget: int
    options: list[Option] = field(default_factory=list)

    def unserved_reasons(self) -> dict[str, list[str]]:
        """Tier -> why each of its models could not serve it (for the unserved tiers)."""
        return {t: [f"{o.model}: {o.why}" for o in self.options if o.tier == t and o.gpus is None]
                for t in self.unserved}

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus, "budget": self.budget, "unserved": self.unserved,
            "assignments": [{"tier": o.tier, "model": o.model, "preference": o.preference, "gpus": o.gpus,
                             "deployment": o.entry} for o in self.assignments],
            "options": [{"tier": o.tier, "model": o.model, "gpus": o.gpus, **({"why": o.why} if o.why else {})}
                        for o in self.options],
        }


def _option(spec: MixSpec, tier: Tier, model: str, pref: int, store: AnchorStore) -> Option:
    ts = TuningSpec(
        model=model, precision=spec.precision, hardware=spec.hardware, engines=spec.engines,
        objective=Objective(minimize="gpus", slo=tier.slo),
        workload=WorkloadSource(static=StaticWorkload(kind="poisson", request_rate=tier.request_rate,
                                                      input_tokens=tier.input_tokens,
                                                      output_tokens=tier.output_tokens)),
        search=spec.search,
    )
    result = tune(ts, store=store, stage2_top=5)
    rec = result.recommendation
    if rec is None or not rec.meets_slo:
        if not result.space.candidates:  # nothing to search: say what excluded it (precision, engine)
            ex = result.space.excluded
            why = (f"{ex[0][0]}: {ex[0][1]}" + (f" (and {len(ex) - 1} more like it)" if len(ex) > 1 else "")
                   if ex else "no deployment to search")
        else:
            why = f"no deployment meets the SLO within {spec.hardware.max_gpus} GPUs"
        return Option(tier.name, model, pref, None, None, why)
    return Option(tier.name, model, pref, rec.gpus, result.entry(rec))


def plan_mix(spec: MixSpec, anchor_dirs: list[Path] | None = None, store: AnchorStore | None = None) -> MixPlan:
    # One store for every tier's search, read once (`store`, else `anchor_dirs`, else the shipped).
    if store is None:
        store = AnchorStore(*(anchor_dirs or [SHIPPED_ANCHORS]))
    options = [_option(spec, t, m, i, store) for t in spec.tiers for i, m in enumerate(t.models)]
    per_tier = [[o for o in options if o.tier == t.name and o.gpus is not None] for t in spec.tiers]
    choices = [opts + [None] for opts in per_tier]  # None = leave the tier unserved
    n = 1
    for c in choices:
        n *= len(c)
    if n > MAX_COMBINATIONS:
        raise ValueError(f"{n} combinations of tiers and models: plan at most a few tiers with a few models each")
    best: tuple[tuple[int, int, int], tuple[Option | None, ...]] | None = None
    budget = spec.hardware.max_gpus
    for combo in itertools.product(*choices):
        used = sum(o.gpus for o in combo if o is not None and o.gpus is not None)
        if used > budget:
            continue
        served = sum(o is not None for o in combo)
        pref = -sum(o.preference for o in combo if o is not None)
        key = (served, pref, -used)
        if best is None or key > best[0]:
            best = (key, combo)
    assert best is not None  # the all-unserved combination always fits
    combo = best[1]
    chosen = [o for o in combo if o is not None]
    unserved = [t.name for t, o in zip(spec.tiers, combo, strict=True) if o is None]
    return MixPlan(chosen, unserved, sum(o.gpus or 0 for o in chosen), budget, options)

"""Measurement-free predictions for predict, tune and simulate: the population of an anchor store.

Where a kernel set has no anchor, its prediction is priced from every other kernel set the store
holds (model.population): the population prior's centre and its measured leave-one-out band. A
store of no usable anchors gives the GPU-family defaults, as before. The population of a store is
learned once per process and per set of files (their paths and modification times).
"""

from __future__ import annotations

from dataclasses import replace

from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.core.layout import Layout
from inferasim.errors import CannotPredict
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.population import FittedMember, Population
from inferasim.model.predictor import FittedAnchor, fit_points, fitted_from_anchor, unanchored

# Provenance of anchors that speak for an engine's kernel sets. PyTorch step anchors time a
# harness's kernels and synthetic ones were made up: neither joins the population.
POPULATION_METHODS = frozenset({"public-data", "harvest", "passive", "canary"})

_CACHE: dict[tuple[tuple[str, float], ...], Population] = {}


def population_of(store: AnchorStore) -> Population:
    """The population of `store`'s usable engine anchors (one member per kernel set and layout)."""
    items = [(p, a) for p, a in store.items() if a.provenance.method in POPULATION_METHODS and a.points]
    key = tuple(sorted((str(p), p.stat().st_mtime if p.exists() else 0.0) for p, _ in items))
    if key in _CACHE:
        return _CACHE[key]
    members: dict[tuple[str, ...], FittedMember] = {}
    for _, anchor in items:
        try:
            f = fitted_from_anchor(anchor)
        except (CannotPredict, ValueError):  # an anchor this version cannot price adds nothing
            continue
        members[(anchor.id,)] = FittedMember(key=(anchor.id,), fitted=f, layout=f.layout,
                                             points=fit_points(anchor.points))
    population = Population(members)
    _CACHE[key] = population
    return population


def measurement_free(store: AnchorStore, engine: str, model: ModelSpec, gpu: GPU, precision: str, layout: Layout,
                     engine_version: str = "", kv_dtype: str = "auto") -> FittedAnchor:
    """A kernel set without an anchor, priced from `store`'s population (flagged measurement-free)."""
    base = unanchored(engine, model, gpu, precision, layout, engine_version, kv_dtype)
    population = population_of(store)
    if not len(population):
        return base
    fit, spread = population.fit_for((), engine, engine_version, model, gpu, precision)
    return replace(base, fit=fit, population_spread=spread)

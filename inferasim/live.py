"""Helpers for watching a live deployment over time (what the operator needs beside
prediction_error, kept here so that the operator stays a thin adapter).

* :func:`fit_live` fits a passive anchor of a running Deployment from its Prometheus series.
* :func:`read_live` reads a Deployment for passive fits and prediction checks: a manifest that
  names no precision runs the checkpoint's own, which is how the search names that kernel set.
* :func:`search_view` is the set of anchors a search should see: a passive anchor only where no
  measurement taken on purpose (harvest, public data) of the same engine, model, GPU and precision
  exists. The search itself ranks measured anchors first (`search.tune._anchor_for`); handing it
  only what it may use also keeps a passive fit out of the status's list of anchors used.
* :func:`refit_range` is the Prometheus range a passive (re)fit may use: never before a detected
  change, since windows from before and after a change do not fit one step-time model.
* :func:`drift_transition` is the PredictionDrift condition's state machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferasim.deployment import LiveDeployment, read_deployment
from inferasim.model.anchor_store import method_rank
from inferasim.model.anchors import Anchor
from inferasim.passive import fit_passive, iso_utc

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = ["drift_transition", "fit_live", "read_live", "refit_range", "search_view", "used_provenance"]


def read_live(manifest: Mapping[str, Any] | str | Path, *, gpu: str | None = None,
              engine_version: str | None = None) -> LiveDeployment:
    """:func:`~inferasim.deployment.read_deployment`, with an unnamed precision read as the
    checkpoint's format (what the engine runs, and how the search spells that kernel set: a passive
    anchor under precision "" would never be found by it). DeploymentError as read_deployment."""
    from inferasim.catalog.models import get_model

    live = read_deployment(manifest, gpu=gpu, engine_version=engine_version)
    if live.config.precision != "auto":
        return live
    try:
        fmt = get_model(live.config.model).checkpoint_format
    except ValueError:
        return live  # a model the catalog does not know: keep the manifest's own spelling
    return read_deployment(manifest, gpu=gpu, engine_version=engine_version, precision=fmt)


def _search_key(anchor: Anchor) -> tuple[str, str, str, str]:
    """What the search matches an anchor on: engine, model, GPU, precision (any version), with
    names resolved as the anchor store resolves them (`KernelSet.normalized`) and the precision's
    aliases folded ("" is the checkpoint's own, as "auto")."""
    from inferasim.catalog.precision import normalize_precision

    engine, _version, model, gpu, precision, *_ = anchor.kernel_set.normalized()
    try:
        precision = normalize_precision(precision or "auto")
    except ValueError:
        pass  # a spelling the catalog does not know compares as given
    return engine, model, gpu, precision


def search_view(anchors: Iterable[Anchor], others: Iterable[Anchor] = ()) -> list[Anchor]:
    """``anchors`` without the passive ones whose (engine, model, GPU, precision) has a measurement
    taken on purpose among ``anchors`` or ``others`` (e.g. the shipped anchor folders). Order kept."""
    anchors = list(anchors)
    # method_rank 0: taken on purpose (harvest, public data, PyTorch); live-traffic anchors rank lower
    measured = {_search_key(a) for a in [*anchors, *others] if method_rank(a) == 0}
    return [a for a in anchors if a.provenance.method != "passive" or _search_key(a) not in measured]


def used_provenance(anchors: Iterable[Anchor], anchor_id: str) -> str:
    """Provenance method of the anchor a search used (by id), by the search's own choice among
    anchors sharing an id (most points, then newest engine version); "" when none has that id."""
    hits = [a for a in anchors if a.id == anchor_id]
    if not hits:
        return ""
    return max(hits, key=lambda a: (len(a.points), a.kernel_set.engine_version)).provenance.method


def refit_range(end: float, window_s: float, step_s: float, since: float | None) -> tuple[float, float] | None:
    """(start, end) of the range a passive fit may read: ``window_s`` back from ``end``, but never
    before ``since`` (a detected change). None while less than three steps have passed since it."""
    from inferasim.passive import MIN_WINDOWS

    start = end - window_s
    if since is not None and since > start:
        start = since
    if end - start < MIN_WINDOWS * step_s:
        return None
    # whole steps, so that the windows end at ``end``
    n = int((end - start) // step_s)
    return end - n * step_s, end


def drift_transition(previous: str | None, worst: float, threshold: float) -> tuple[str, str] | None:
    """The PredictionDrift condition after a check: (status, reason) when it changes, else None.

    ``previous`` is the condition's status ("True", "False" or None when not set yet); ``worst``
    the largest |relative error|; ``threshold`` a positive fraction. Past the threshold it is
    raised; back under it (or at the first check) it is False."""
    if not threshold > 0:
        raise ValueError(f"threshold must be a positive fraction, got {threshold!r}")
    if worst > threshold:
        return None if previous == "True" else ("True", "PredictionError")
    return None if previous == "False" else ("False", "WithinThreshold")


def fit_live(deployment: LiveDeployment | Mapping[str, Any] | str | Path, prometheus: str,
             selector: Mapping[str, str], *, window_s: float = 3600.0, step_s: float = 60.0,
             end: float | None = None, gpu: str | None = None, engine_version: str | None = None,
             timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
             clock: Callable[[], float] = time.time) -> Anchor:
    """A passive anchor of a live deployment: its manifest names the kernel set and layout, its
    Prometheus series over ``[end - window_s, end]`` (one window per ``step_s``) are the points.

    ``deployment`` is a :class:`~inferasim.deployment.LiveDeployment` or what
    :func:`~inferasim.deployment.read_deployment` reads (``gpu`` and ``engine_version`` are passed
    to it); ``selector`` picks the deployment's series (e.g. ``{"namespace": "llm", "pod": ...}``).
    Requests in flight are divided by the replicas: a window describes one replica.

    The anchor's provenance is ``passive``, with the Prometheus URL, selector, range and step in
    ``source``, the windows used in ``measured_at`` (ISO 8601 interval) and the PromQL in ``notes``.
    Raises NotIdentifiable (what is missing: usable windows, load spread, one model for all windows),
    :class:`~inferasim.observe.ObservationError` (the failing query) and
    :class:`~inferasim.deployment.DeploymentError` (the manifest field).
    """
    from inferasim.catalog.models import get_model
    from inferasim.deployment import LiveDeployment, read_deployment
    from inferasim.observe import observe_windows, range_queries, selector_matchers

    live = deployment if isinstance(deployment, LiveDeployment) else read_deployment(
        deployment, gpu=gpu, engine_version=engine_version)
    if not window_s > step_s > 0:
        raise ValueError(f"window ({window_s:g} s) must be longer than step ({step_s:g} s), and both positive")
    end = clock() if end is None else end
    start = end - window_s
    source = {"url": prometheus, "selector": dict(selector)}
    queries = range_queries(live.engine, selector, step_s)
    windows = observe_windows(source, start, end, step_s, live.engine, timeout=timeout, transport=transport)
    replicas = live.config.replicas
    if replicas > 1:
        windows = [replace(w, in_flight=w.in_flight / replicas) for w in windows]
    cfg = live.config
    anchor = fit_passive(
        live.kernel_set(), get_model(cfg.model), cfg.gpu_spec, cfg.layout, windows,
        source=(f"{prometheus} {selector_matchers(selector)} {iso_utc(start)}/{iso_utc(end)} step {step_s:g}s "
                f"({live.namespace}/{live.name}, {replicas} replica(s))"),
        queries=[q for alts in queries.values() for q in alts])
    anchor.provenance.engine_image = live.image
    return anchor

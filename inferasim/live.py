"""Helpers for watching a live deployment over time (what the operator needs beside fit_live and
prediction_error, kept here so that the operator stays a thin adapter).

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

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from inferasim.anchors import Anchor, method_rank
from inferasim.deployment import LiveDeployment, read_deployment

__all__ = ["drift_transition", "read_live", "refit_range", "search_view", "used_provenance"]


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
    from inferasim.catalog.models import normalize_precision

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

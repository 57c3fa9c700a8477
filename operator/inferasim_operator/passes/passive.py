"""Passive anchors and prediction-error tracking for a ServingTuning's live target Deployment.

The target Deployment is already a measurement of its kernel set. At each tuning the operator
reads its manifest from the API server and, when no passive anchor of its kernel set and layout
exists yet, fits one from its Prometheus series (:func:`inferasim.live.fit_live`) and writes it
as a cluster-scoped ServingAnchor (provenance passive). The search then finds an anchor for the
live kernel set, so no harvest Job is started for it; kernel sets that are not live are harvested
as before. A kernel set that also has a harvested anchor keeps both ServingAnchors, but the search
is given only the harvested one (anchor_cache.sync_anchors).

On the drift-check timer the running configuration's recent window is compared with what the
current anchors predict (:func:`inferasim.drift.prediction_error`). Past
`retune.predictionErrorThreshold` the condition PredictionDrift is raised, the passive anchor is
refitted from windows after the detection (never mixing the deployment before and after a change)
and the tuning re-tuned; back under the threshold the condition is cleared.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inferasim.core.layout import Layout
from inferasim.core.spec import TuningSpec
from inferasim.deployment import DeploymentError, LiveDeployment
from inferasim.drift import PredictionError, prediction_error
from inferasim.live import drift_transition, fit_live, read_live, refit_range
from inferasim.model.anchor_store import AnchorStore, NoCompatibleAnchor
from inferasim.model.anchors import Anchor, KernelSet
from inferasim.model.predictor import fitted_from_anchor
from inferasim.observe import ObservationError, observe_windows
from inferasim.passive import NotIdentifiable, Window
from inferasim_operator import metrics
from inferasim_operator.anchor_cache import anchor_dirs, sync_anchors
from inferasim_operator.harvest_job import anchor_object, dns_label
from inferasim_operator.kube import ApiException, Kube
from inferasim_operator.models import LABEL_KIND, MetricValues, PassiveAnchorStatus, PredictionErrorStatus, dump
from inferasim_operator.settings import Settings
from inferasim_operator.state import MEMO
from inferasim_operator.status import StatusBook, fresh_book, post_event
from inferasim_operator.times import epoch, iso, now_iso

# What the timer runs after a refit: a re-tune of the tuning (body, reason) -> its result.
Retune = Callable[[dict[str, Any], str], Awaitable[str]]

KIND = "passive"


# --------------------------------------------------------------------------------------------
# pure pieces
# --------------------------------------------------------------------------------------------


def passive_anchor_name(kernel_set: KernelSet, layout: Layout) -> str:
    """Deterministic: one passive anchor per kernel set and layout, refreshed by every fit (and
    apart from a harvested anchor of the same kernel set and layout, which it never replaces)."""
    return f"passive-{kernel_set.key()}-{dns_label(layout.label())}"[:253]


def passive_object(anchor: Anchor, name: str, deployment: str, tuning: str) -> dict[str, Any]:
    """The ServingAnchor of a passive fit: cluster-scoped (it outlives the tuning, as harvested
    anchors do), so annotations, not an owner, say where it came from."""
    obj = anchor_object(anchor)
    obj["metadata"]["name"] = name
    obj["metadata"]["labels"][LABEL_KIND] = KIND
    obj["metadata"]["annotations"] = {"inferasim.io/measured-by": tuning, "inferasim.io/deployment": deployment,
                                      "inferasim.io/window": anchor.provenance.measured_at}
    return obj


def passive_status(anchor: Anchor, name: str, deployment: str, since: str = "") -> PassiveAnchorStatus:
    fit = anchor.fit
    loads = [p.concurrency for p in anchor.points]
    rms = None if fit is None else round(fit.rms_log_error, 4)
    return PassiveAnchorStatus(
        state="Fitted", anchor=name, anchor_id=anchor.id, deployment=deployment,
        kernel_set=anchor.kernel_set.describe(), window=anchor.provenance.measured_at, windows=len(anchor.points),
        rms_log_error=rms, fitted_at=iso(time.time()), since=since,
        message=(f"{len(anchor.points)} windows, {min(loads)}-{max(loads)} requests in flight, fit rms log error "
                 f"{rms if rms is not None else 'n/a'}"))


def _metric_values(values: dict[str, float | None], digits: int = 4) -> MetricValues:
    def r(v: float | None) -> float | None:
        return None if v is None else round(float(v), digits)

    return MetricValues(ttft_ms=r(values.get("ttft")), itl_ms=r(values.get("itl")),
                        throughput=r(values.get("throughput")))


def prediction_status(err: PredictionError, threshold: float, provenance: str, window: Window) -> PredictionErrorStatus:
    return PredictionErrorStatus(
        observed=_metric_values(err.observed), predicted=_metric_values(err.predicted),
        relative=_metric_values(err.relative), worst=round(err.worst(), 4), threshold=threshold,
        anchor=err.anchor_id, provenance=provenance, concurrency=round(err.concurrency, 3),
        window=f"{iso(window.start)}/{iso(window.end)}", checked_at=iso(time.time()))


def describe_error(err: PredictionError, threshold: float) -> str:
    """`ITL +140% (observed 14.1 ms, predicted 5.9 ms), ...; threshold 50%` - the numbers, in words."""
    unit = {"ttft": " ms", "itl": " ms", "throughput": " tok/s"}
    name = {"ttft": "TTFT", "itl": "ITL", "throughput": "throughput"}
    parts = [f"{name[m]} {rel:+.0%} (observed {err.observed[m]:.3g}{unit[m]}, predicted {err.predicted[m]:.3g}"
             f"{unit[m]})" for m, rel in sorted(err.relative.items(), key=lambda kv: -abs(kv[1]))]
    return (", ".join(parts) or "nothing observed") + (f" at {err.concurrency:.1f} in flight per replica; "
                                                       f"threshold {threshold:.0%}; anchor {err.anchor_id}")


def refit_due(passive: dict[str, Any], window_s: float, now: float) -> bool:
    """While PredictionDrift is raised: refit unless a fit from after the detection exists already
    (a fresh fit that still disagrees is reported, not refitted in a loop) or it is older than a window."""
    since, fitted = epoch(passive.get("since")), epoch(passive.get("fittedAt"))
    if fitted is None or (since is not None and fitted < since):
        return True
    return now - fitted >= window_s


# --------------------------------------------------------------------------------------------
# the live target
# --------------------------------------------------------------------------------------------


async def read_target(spec: TuningSpec, namespace: str, kube: Kube) -> tuple[LiveDeployment | None, str]:
    """(what the target Deployment runs, "") or (None, why it cannot be read)."""
    if spec.target is None or spec.target.kind != "Deployment":
        return None, "the target is not a Deployment"
    dep = await asyncio.to_thread(kube.get_deployment, namespace, spec.target.name)
    if dep is None:
        return None, f"Deployment {namespace}/{spec.target.name} not found"
    try:
        return await asyncio.to_thread(read_live, dep), ""
    except DeploymentError as exc:
        first = exc
    # A manifest that does not name its GPU (no product label in the node selector or affinity)
    # runs on the tuning's hardware; the manifest's own GPU, when it names one, always wins.
    try:
        return await asyncio.to_thread(read_live, dep, gpu=spec.hardware.gpu), ""
    except DeploymentError:
        return None, f"Deployment {namespace}/{spec.target.name}: {first}"


async def fit_and_store(body: dict[str, Any], spec: TuningSpec, book: StatusBook, kube: Kube, settings: Settings,
                        live: LiveDeployment, *, since: float | None, existing: dict[str, Any] | None) -> Anchor | None:
    """Fit the passive anchor of ``live`` from windows after ``since`` and write its ServingAnchor.
    Not identifiable, no data or no Prometheus answer: a status message and None (never an error:
    the tuning goes on with the anchors it has)."""
    assert spec.workload.prometheus is not None
    prom = spec.workload.prometheus
    prev = dict(book.get("passiveAnchor") or {})
    deployment = f"{live.namespace}/{live.name}"
    ks, layout = live.kernel_set(), live.layout
    name = passive_anchor_name(ks, layout)
    base = {"deployment": deployment, "kernelSet": ks.describe(), "since": prev.get("since", "")}
    keep = {k: prev[k] for k in ("anchor", "anchorId", "window", "windows", "rmsLogError", "fittedAt") if k in prev}
    now = time.time()
    span = refit_range(now, settings.passive.window_s, settings.passive.step_s, since)
    if span is None:
        book.set(passiveAnchor={**keep, **base, "state": "Waiting",
                                "message": f"refit waits for 3 windows of {settings.passive.step_s:g} s after "
                                           f"{prev.get('since') or 'the change'}"})
        return None
    start, end = span
    try:
        anchor = await asyncio.to_thread(fit_live, live, prom.url, prom.selector, window_s=end - start,
                                         step_s=settings.passive.step_s, end=end,
                                         timeout=settings.observe.timeout_s)
    except NotIdentifiable as exc:
        metrics.PASSIVE_FITS.labels(result="not-identifiable").inc()
        message = f"no passive anchor from {iso(start)}/{iso(end)}: {exc}"
        if prev.get("message") != message:
            post_event(body, "Normal", "PassiveAnchorNotIdentifiable", message)
        book.set(passiveAnchor={**keep, **base, "state": "NotIdentifiable", "message": message[:1024]})
        return None
    except (ObservationError, ValueError) as exc:
        metrics.PASSIVE_FITS.labels(result="failed").inc()
        book.set(passiveAnchor={**keep, **base, "state": "ObservationFailed", "message": str(exc)[:1024]})
        return None
    owner = f"{book.namespace}/{book.name}"
    obj = passive_object(anchor, name, deployment, owner)
    created = await asyncio.to_thread(kube.apply_anchor, obj, existing)
    try:
        await asyncio.to_thread(kube.patch_anchor_status, name, {"harvestedBy": owner, "deployment": deployment,
                                                                 "importedAt": now_iso()})
    except ApiException:  # status is informative only
        pass
    metrics.PASSIVE_FITS.labels(result="fitted").inc()
    st = passive_status(anchor, name, deployment, since=prev.get("since", ""))
    book.set(passiveAnchor=dump(st))
    post_event(body, "Normal", "PassiveAnchor",
               f"ServingAnchor {name} {'created' if created else 'refreshed'} from Deployment {deployment} "
               f"({ks.describe()}, {layout.label()}): {st.message}; window {anchor.provenance.measured_at}")
    return anchor


async def ensure_passive_anchor(body: dict[str, Any], spec: TuningSpec, book: StatusBook, kube: Kube,
                                settings: Settings) -> bool:
    """Before a search: the passive anchor of the live target, fitted when it has none yet.
    True when a ServingAnchor was written (the caller syncs the search's anchor files)."""
    if spec.workload.prometheus is None:
        return False
    live, why = await read_target(spec, book.namespace, kube)
    if live is None:
        prev = dict(book.get("passiveAnchor") or {})
        if prev.get("message") != why:
            book.set(passiveAnchor={**prev, "state": "Unreadable", "message": why[:1024]})
        return False
    name = passive_anchor_name(live.kernel_set(), live.layout)
    existing = await asyncio.to_thread(kube.get_anchor, name)
    if existing is not None:
        return False  # refreshed by the prediction-error check when it drifts, not at every tuning
    since = epoch((book.get("passiveAnchor") or {}).get("since"))
    return await fit_and_store(body, spec, book, kube, settings, live, since=since, existing=None) is not None


# --------------------------------------------------------------------------------------------
# prediction error on the drift-check timer
# --------------------------------------------------------------------------------------------


def _anchor_for(store: AnchorStore, live: LiveDeployment, used: list[dict[str, Any]]) -> Anchor | None:
    """The anchor the running configuration is predicted with: the store's for its kernel set and
    layout (measured before passive), else the one the last search used for its engine/precision."""
    try:
        return store.find(live.kernel_set(), live.layout)
    except NoCompatibleAnchor:
        pass
    key = f"{live.engine}/{live.config.precision}"
    ids = {u.get("id") for u in used if u.get("key") == key}
    hits = [a for a in store.all() if a.id in ids]
    return max(hits, key=lambda a: len(a.points)) if hits else None


async def check_prediction(body: dict[str, Any], uid: str, spec: TuningSpec, kube: Kube, settings: Settings,
                           retune: Retune | None = None) -> str:
    """One prediction-error check of the running configuration. Returns what it did, or, when the
    passive anchor was refitted and ``retune`` is given, what ``retune`` returned."""

    assert spec.workload.prometheus is not None
    prom = spec.workload.prometheus
    threshold = spec.retune.prediction_error_threshold
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    live, why = await read_target(spec, ns, kube)
    result = "prediction: "
    refit = False
    async with MEMO.lock(uid):
        body, book = await fresh_book(body, kube)
        if live is None:
            book.set(predictionError={"message": why[:1024], "checkedAt": iso(time.time())})
            metrics.set_prediction_error(uid, ns, name, {})  # the last figures are no measurement of now
            await book.flush()
            return result + "no target"
        end = time.time()
        start = end - settings.prediction.window_s
        try:
            windows = await asyncio.to_thread(observe_windows, prom, start, end, settings.prediction.window_s,
                                              live.engine, timeout=settings.observe.timeout_s)
            await sync_anchors(kube, settings)
            store = await asyncio.to_thread(AnchorStore, *anchor_dirs(settings))
            anchor = _anchor_for(store, live, (book.get("anchors") or {}).get("used") or [])
            if not windows:
                raise ValueError(f"no request finished in {iso(start)}/{iso(end)}")
            if anchor is None:
                raise ValueError(f"no anchor of the running kernel set {live.kernel_set().describe()} "
                                 f"({live.layout.label()}) to predict with")
            err = prediction_error(live, windows[-1], fitted_from_anchor(anchor),
                                   speedup=settings.prediction.engine_speedup)
        except (ObservationError, ValueError) as exc:
            book.set(predictionError={"message": str(exc)[:1024], "threshold": threshold, "checkedAt": iso(end)})
            metrics.set_prediction_error(uid, ns, name, {})
            await book.flush()
            return result + "not computed"
        status = prediction_status(err, threshold, anchor.provenance.method, windows[-1])
        book.set(predictionError=dump(status))
        metrics.set_prediction_error(uid, ns, name, dict(err.relative))
        cond = book.cond("PredictionDrift")
        change = drift_transition(cond.get("status") if cond else None, err.worst(), threshold)
        words = describe_error(err, threshold)
        passive = dict(book.get("passiveAnchor") or {})
        if change is not None:
            state, reason = change
            book.condition("PredictionDrift", state, reason, words)
            if state == "True":
                # Refits read only windows from now on: the deployment changed within the last window.
                passive["since"] = iso(end)
                book.set(passiveAnchor=passive)
                post_event(body, "Warning", "PredictionDrift", words)
            elif cond is not None:
                post_event(body, "Normal", "PredictionWithinThreshold", words)
        drifted = err.worst() > threshold
        if drifted and refit_due(passive, settings.passive.window_s, end):
            name_ = passive_anchor_name(live.kernel_set(), live.layout)
            existing = await asyncio.to_thread(kube.get_anchor, name_)
            refit = await fit_and_store(body, spec, book, kube, settings, live, since=epoch(passive.get("since")),
                                        existing=existing) is not None
        await book.flush()
    result += f"worst {err.worst():.0%} ({'over' if drifted else 'within'} {threshold:.0%})"
    if refit:
        await sync_anchors(kube, settings)
        if retune is not None:
            return await retune(body, f"prediction error {err.worst():.0%}: passive anchor refreshed")
        result += "; passive anchor refitted"
    return result

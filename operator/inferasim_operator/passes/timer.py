"""The re-tune timer's pass for one ServingTuning: harvest progress, confirmation, the schedule,
new anchors, workload drift and the prediction error. Whatever it decides to re-tune runs as a
tuning pass (tune.reconcile); a timer pass that raises is Degraded and backs off like one.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import kopf

from inferasim.core.spec import SpecError, TuningSpec
from inferasim.model.anchors import Anchor
from inferasim.observe import ObservationError, observe
from inferasim.observed import drift
from inferasim_operator import metrics
from inferasim_operator.harvest import refresh_harvests
from inferasim_operator.kube import Kube
from inferasim_operator.passes.confirm import confirm_progress
from inferasim_operator.passes.passive import check_prediction
from inferasim_operator.passes.tune import pass_failed, reconcile
from inferasim_operator.search import pool as search_pool
from inferasim_operator.settings import Settings, backoff
from inferasim_operator.spec_rules import parse_duration, parse_tuning_spec
from inferasim_operator.state import MEMO
from inferasim_operator.status import fresh_book, post_event
from inferasim_operator.times import age_s


async def tick(body: dict[str, Any], kube: Kube, settings: Settings) -> str:
    """The re-tune timer: harvest progress, confirmation, schedule, drift. Returns what it did."""
    body = json.loads(json.dumps(dict(body)))
    meta = body["metadata"]
    uid = meta.get("uid", f"{meta['namespace']}/{meta['name']}")
    status = body.get("status") or {}
    phase = status.get("phase")
    if phase in (None, "Invalid", "Pending", "Observing", "Queued", "Searching"):
        return "idle"  # the create/update handler owns these (and retries them with backoff)
    if MEMO.backing_off(uid):
        return "backoff"
    try:
        try:
            result = await run_tick(body, uid, phase, kube, settings)
        except (kopf.TemporaryError, kopf.PermanentError):
            raise
        except Exception as exc:  # noqa: BLE001 - a timer pass ends in a condition too (reconcile's are already)
            failures = MEMO.timer_failed(uid)
            async with MEMO.lock(uid):
                body, book = await fresh_book(body, kube)
                raise await pass_failed(body, book, kube, settings, exc, timer_failures=failures) from exc
        if MEMO.timer_recovered(uid):
            # The timer's pass works again: Degraded, which its failure set, is lifted.
            async with MEMO.lock(uid):
                body, book = await fresh_book(body, kube)
                if (book.cond("Degraded") or {}).get("status") == "True":
                    book.condition("Degraded", "False", "PassCompleted", "the timer's last pass completed")
                    await book.flush()
        return result
    except kopf.TemporaryError as exc:
        retries = int(((await asyncio.to_thread(kube.get_tuning, meta["namespace"], meta["name"])).get("status")
                       or {}).get("retries") or 1)
        MEMO.retry_at(uid, time.monotonic() + (exc.delay or backoff(settings, retries)))
        return "retry"
    except kopf.PermanentError:
        return "invalid"


async def run_tick(body: dict[str, Any], uid: str, phase: str, kube: Kube, settings: Settings) -> str:
    """The timer's pass itself (no guard: :func:`tick` turns what it raises into Degraded and a backoff)."""
    if phase == "Harvesting":
        async with MEMO.lock(uid):
            body, book = await fresh_book(body, kube)
            if book.get("phase") != "Harvesting":
                return "superseded"  # a reconcile moved on while this pass waited for the lock
            active, imported, failed = await refresh_harvests(body, book, kube)
            await book.flush()
        if active:
            return "harvesting"
        return await reconcile(body, kube, settings, trigger="timer", force=True,
                               reason=f"harvest finished ({imported} anchor(s), {failed} failed)")
    try:
        spec = parse_tuning_spec(body.get("spec") or {}, settings.observe.prometheus_url)
    except SpecError:
        return "idle"
    status = body.get("status") or {}
    if phase == "Confirming":
        async with MEMO.lock(uid):
            body, book = await fresh_book(body, kube)
            if book.get("phase") != "Confirming":
                return "superseded"
            try:
                spec = parse_tuning_spec(body.get("spec") or {}, settings.observe.prometheus_url)
            except SpecError:
                return "idle"
            done = await confirm_progress(body, spec, book, kube, settings)
            await book.flush()
        if not done:
            return "confirming"
    if int(status.get("retries") or 0) > 0:
        # A timer-started pass (drift, schedule, new anchors) failed and tick() waited out its backoff:
        # nothing else would run it again (the drift baseline may already be the workload it failed on).
        return await reconcile(body, kube, settings, trigger="retry", force=True,
                               reason=f"retry {status.get('retries')} of a failed pass")
    if (status.get("search") or {}).get("quick") and phase in ("Recommended", "Confirmed") and \
            search_pool(settings.search.workers, settings.search.burst_stage2_top).idle():
        # Searched under a burst with a smaller stage 2: refined with the full one, now that no other
        # search waits (in the background: any new tuning's search goes first).
        return await reconcile(body, kube, settings, trigger="refine", force=True, background=True,
                               reason="refining a quick search (the search queue is empty)")
    every = parse_duration(spec.retune.every, "retune.every")
    age = age_s(status.get("lastTuneTime"))
    if every and age is not None and age >= every:
        return await reconcile(body, kube, settings, trigger="schedule", force=True,
                               reason=f"scheduled re-tune (every {spec.retune.every})")
    missing = (status.get("anchors") or {}).get("missing") or []
    if missing and await missing_now_available(missing, kube, uid):
        return await reconcile(body, kube, settings, trigger="anchors", force=True, reason="new anchors available")
    if spec.workload.prometheus is not None:
        since = MEMO.since_observed(uid)
        if since is None or since >= settings.timer.drift_check_s:
            return await _check_drift(body, uid, spec, kube, settings)
    return "steady"


async def missing_now_available(missing: list[dict[str, Any]], kube: Kube, uid: str) -> bool:
    """Whether a ServingAnchor for one of the missing kernel sets arrived that no earlier pass of this
    tuning was re-tuned for. Anchors are read as the search reads them (an object that fails
    validation, say one written by a newer operator, is skipped there too), and each anchor
    object (name and resourceVersion) triggers at most one re-tune: one the search still does not
    match (another engine version or KV dtype) would otherwise re-tune the tuning on every tick."""
    from inferasim.catalog.engines import normalize_engine
    from inferasim.catalog.gpus import get_gpu
    from inferasim.catalog.models import resolve_model_name
    from inferasim.catalog.precision import normalize_precision

    anchors = await asyncio.to_thread(kube.list_anchors)
    have: dict[tuple[str, ...], set[str]] = {}
    for obj in anchors:
        try:
            ks = Anchor.model_validate(obj.get("spec") or {}).kernel_set
            key = (normalize_engine(ks.engine), resolve_model_name(ks.model), get_gpu(ks.gpu).name,
                   normalize_precision(ks.precision or "auto"))
        except ValueError:
            continue
        meta = obj.get("metadata") or {}
        have.setdefault(key, set()).add(f"{meta.get('name')}@{meta.get('resourceVersion', '')}")
    seen = MEMO.retuned_for(uid)
    for m in missing:
        try:
            key = (normalize_engine(m["engine"]), resolve_model_name(m["model"]), get_gpu(m["gpu"]).name,
                   m["precision"])
        except (KeyError, ValueError):
            continue
        new = have.get(key, set()) - seen
        if new:
            seen |= new
            return True
    return False


async def _check_drift(body: dict[str, Any], uid: str, spec: TuningSpec, kube: Kube, settings: Settings) -> str:
    assert spec.workload.prometheus is not None
    MEMO.observed(uid)
    baseline = (body.get("status") or {}).get("observedWorkload")
    try:
        now = await asyncio.to_thread(observe, spec.workload.prometheus, "auto", timeout=settings.observe.timeout_s)
    except ObservationError as exc:
        async with MEMO.lock(uid):
            body, book = await fresh_book(body, kube)
            metrics.OBSERVE_FAILURES.labels(reason=exc.reason).inc()
            book.condition("WorkloadObserved", "False", exc.reason, str(exc))
            await book.flush()
        post_event(body, "Warning", "WorkloadNotObserved", str(exc))
        return "observe-failed"
    if not baseline:
        return await reconcile(body, kube, settings, trigger="drift", force=True, reason="no baseline workload")
    moved = drift(baseline, now)
    if moved >= spec.retune.drift_threshold:
        post_event(body, "Normal", "WorkloadDrifted",
                   f"the workload moved {moved:.0%} (threshold {spec.retune.drift_threshold:.0%}): {now.describe()}")
        return await reconcile(body, kube, settings, trigger="drift", force=True,
                               reason=f"workload drifted {moved:.0%}")
    cond = next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "WorkloadObserved"),
                None)
    if cond and cond.get("status") != "True":
        async with MEMO.lock(uid):
            body, book = await fresh_book(body, kube)
            book.condition("WorkloadObserved", "True", "MetricsAvailable", now.describe())
            await book.flush()
    # The workload is steady: is the running configuration still what its anchors predict? A
    # passive anchor refitted for a drifted prediction re-tunes the tuning (the timer decides
    # re-tunes; the check itself does not import the tuning pass).

    async def retune(body: dict[str, Any], reason: str) -> str:
        return await reconcile(body, kube, settings, trigger="prediction-drift", force=True, reason=reason)

    done = await check_prediction(body, uid, spec, kube, settings, retune=retune)
    return done if not done.startswith("prediction: ") else f"steady (drift {moved:.0%}; {done})"

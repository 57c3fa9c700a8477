"""The tuning pass for one ServingTuning: spec, workload, anchors, search, harvests, the
recommendation, then what is published (ConfigMap, AnalysisTemplate, canaries).

:func:`reconcile` runs it under the tuning's lock for the create, update and resume handlers and
for the timer's re-tunes. Every step writes the status and posts an Event; a pass that raises ends
in a condition (Invalid for a spec error, Degraded otherwise) and a retry with backoff. Blocking
API calls run in threads; the search runs in a child process (search.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import kopf

from inferasim.core.spec import SpecError, TuningSpec, WorkloadSource
from inferasim.observe import ObservationError, observe
from inferasim.observed import ObservedWorkload
from inferasim_operator import metrics
from inferasim_operator.anchor_cache import anchor_dirs, sync_anchors
from inferasim_operator.harvest import plan_harvests
from inferasim_operator.kube import ApiException, Kube, NotManaged
from inferasim_operator.models import (
    HISTORY_SIZE,
    LABEL_KIND,
    LABEL_TUNING,
    AnchorRef,
    HistoryEntry,
    dump,
    label_value,
)
from inferasim_operator.passes.confirm import start_confirmation
from inferasim_operator.passes.passive import ensure_passive_anchor
from inferasim_operator.pricing import resolve_price
from inferasim_operator.results import (
    config_map_for,
    config_map_name,
    infeasible_reason,
    recommendation_of,
    shortlist_of,
)
from inferasim_operator.search import SearchFailed, SearchTimeout, run_search
from inferasim_operator.search import pool as search_pool
from inferasim_operator.settings import Settings, backoff
from inferasim_operator.spec_rules import parse_duration, parse_tuning_spec, render_name
from inferasim_operator.state import MEMO
from inferasim_operator.status import StatusBook, StatusNotWritable, post_event
from inferasim_operator.times import now_iso

log = logging.getLogger("inferasim_operator")

DONE_PHASES = ("Recommended", "Harvesting", "Confirming", "Confirmed", "Invalid")


class Invalid(kopf.PermanentError):
    """A spec the operator cannot use: reported as a condition, never retried until it changes."""


async def park_invalid(body: dict[str, Any], book: StatusBook, kube: Kube, message: str, *,
                       condition: tuple[str, str], event: str) -> Invalid:
    """Phase Invalid, and nothing of the last recommendation left running or published: the timer
    skips Invalid tunings, so canaries left now would hold their GPUs (and take live traffic), and
    a ConfigMap or AnalysisTemplate would keep serving a recommendation for a spec that no longer
    holds, until someone fixes the spec. Returns the exception for the caller to raise."""
    book.set(phase="Invalid", observedGeneration=book.generation, message=message, recommendation=None,
             shortlist=[])
    book.condition(condition[0], "False", condition[1], message)
    if condition[0] != "Recommended":  # the recommendation is gone too: no SpecChanged or True left behind
        book.condition("Recommended", "False", "InvalidSpec", message)
    await _withdraw_config_map(body, book, kube, config_map_name(book.name), "the spec is invalid")
    await retire_canaries(body, book, kube, set())
    await _withdraw_analysis_template(body, book, kube)
    await book.flush()
    post_event(body, "Warning", event, message)
    return Invalid(message)


async def observe_workload(spec: TuningSpec, book: StatusBook, body: dict[str, Any], kube: Kube, settings: Settings,
                           has_recommendation: bool) -> tuple[dict[str, Any], ObservedWorkload | None]:
    """The workload for the search (a static workload dict) and what was observed (prometheus)."""
    if spec.workload.static is not None:
        book.condition("WorkloadObserved", "True", "StaticWorkload",
                       f"static {spec.workload.static.kind} workload from the spec")
        return spec.workload.static.model_dump(by_alias=True, mode="json", exclude_none=True), None
    assert spec.workload.prometheus is not None
    prom = spec.workload.prometheus
    if not has_recommendation:
        book.set(phase="Observing")
    await book.flush()
    try:
        observed = await asyncio.to_thread(observe, prom, "auto", timeout=settings.observe.timeout_s)
    except ObservationError as exc:
        if exc.reason == "BadSelector":
            # A label name, range or URL no Prometheus accepts: no retry fixes it, an edit of the spec
            # does (and starts a new pass).
            metrics.OBSERVE_FAILURES.labels(reason=exc.reason).inc()
            raise await park_invalid(body, book, kube, f"workload not observable: {exc}; fix the spec",
                                     condition=("WorkloadObserved", exc.reason),
                                     event="WorkloadNotObservable") from None
        retries = int(book.get("retries") or 0) + 1
        delay = backoff(settings, retries)
        metrics.OBSERVE_FAILURES.labels(reason=exc.reason).inc()
        book.condition("WorkloadObserved", "False", exc.reason, f"{exc}; retry {retries} in {delay:.0f} s")
        book.set(retries=retries, message=f"workload not observed: {exc}")
        await book.flush()
        post_event(body, "Warning", "WorkloadNotObserved", f"{exc} (retry in {delay:.0f} s)")
        raise kopf.TemporaryError(f"workload not observed: {exc}", delay=delay) from None
    MEMO.observed(book.uid)
    book.condition("WorkloadObserved", "True", "MetricsAvailable", observed.describe())
    # `retries` is not reset here: it counts failed passes, and a search that fails after a good
    # observation must back off further, not start over at the first delay.
    book.set(observedWorkload=dump(observed))
    post_event(body, "Normal", "WorkloadObserved", observed.describe())
    static = observed.to_static()
    return static.model_dump(by_alias=True, mode="json", exclude_none=True), observed


async def reconcile(body: dict[str, Any], kube: Kube, settings: Settings, *, trigger: str, reason: str,
                    force: bool = False, background: bool = False) -> str:
    """One full pass for a ServingTuning. Returns what happened (for logs and tests).

    Raises kopf.TemporaryError (retry with backoff: workload not observed, search timed out) and
    Invalid (a kopf.PermanentError: bad spec, reported as a condition)."""
    body = json.loads(json.dumps(dict(body)))  # a plain copy: kopf bodies are live views
    meta = body["metadata"]
    uid = meta.get("uid", f"{meta['namespace']}/{meta['name']}")
    if trigger == "create" and not (body.get("status") or {}).get("phase") and not MEMO.lock(uid).locked():
        await show_queued(body, kube, settings)
    async with MEMO.lock(uid):
        # A handler retried after a restart may find the work done by an earlier run.
        # Spec, status and generation are read together, inside the lock: a timer pass that captured
        # its body before a slow drift check must tune the spec of the generation it records.
        fresh = await asyncio.to_thread(kube.get_tuning, meta["namespace"], meta["name"])
        body["spec"] = fresh.get("spec") or {}
        body["status"] = fresh.get("status") or {}
        body["metadata"]["generation"] = fresh["metadata"].get("generation")
        book = StatusBook(body, kube)
        gen = book.generation
        if not force and book.get("observedGeneration") == gen and book.get("phase") in DONE_PHASES:
            metrics.set_phase(uid, book.get("phase"))
            metrics.RECONCILES.labels(trigger=trigger, result="skipped").inc()
            return "skipped"
        try:
            result = await run_pass(body, book, kube, settings, reason, background=background)
        except kopf.TemporaryError:
            metrics.RECONCILES.labels(trigger=trigger, result="retry").inc()
            raise
        except kopf.PermanentError:
            metrics.RECONCILES.labels(trigger=trigger, result="invalid").inc()
            raise
        except Exception as exc:  # noqa: BLE001 - every pass ends in a condition, never a bare traceback
            metrics.RECONCILES.labels(trigger=trigger, result="error").inc()
            raise await pass_failed(body, book, kube, settings, exc) from exc
        metrics.RECONCILES.labels(trigger=trigger, result=result).inc()
        return result


async def show_queued(body: dict[str, Any], kube: Kube, settings: Settings) -> None:
    """A new tuning shows a phase at once, before anything else of its pass (100 applied together
    waited seconds for their first status): Queued, at the place it would take in the search queue
    now (the pool corrects it). Only phase, queue and message: a merge patch of these clobbers nothing."""
    pool = search_pool(settings.search.workers, settings.search.burst_stage2_top)
    place = pool.waiting() + 1
    patch = {"phase": "Queued", "message": "queued for its first pass",
             "queue": {"position": place, "length": place, "workers": pool.size}}
    meta = body["metadata"]
    try:
        await asyncio.to_thread(kube.patch_tuning_status, meta["namespace"], meta["name"], patch)
    except ApiException as exc:  # the pass itself writes the status again, and reports what fails
        log.warning("%s/%s: cannot show phase Queued: HTTP %s", meta["namespace"], meta["name"], exc.status)


def _summary(exc: BaseException) -> str:
    """A short, one-line account of an exception for a condition and an Event (an ApiException's
    text is headers and a body over many lines)."""
    if isinstance(exc, ApiException):
        body = " ".join(str(exc.body or "").split())[:240]
        text = f"Kubernetes API: HTTP {exc.status} {exc.reason}" + (f": {body}" if body else "")
    else:
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 400 else text[:397] + "..."


async def pass_failed(body: dict[str, Any], book: StatusBook, kube: Kube, settings: Settings,
                      exc: Exception, timer_failures: int | None = None) -> kopf.PermanentError | kopf.TemporaryError:
    """What a pass that raised becomes: a spec error parks the tuning Invalid (naming the field, as
    the spec's own check does); anything else is the operator's own failure, `Degraded=True` with a
    short summary, an Event and a metric, retried with the same growing backoff as a failed search
    (it was retried blindly every 60 s, each time at the full cost of a search, with no condition
    saying why). A timer pass (confirmation, harvest progress, drift) gives ``timer_failures``: its
    backoff counts those, and `status.retries` is left alone, since the timer re-runs a whole search
    for a tuning whose retries are above zero (and would retire the canaries being measured).
    Returns the exception for the caller to raise."""
    if isinstance(exc, SpecError):
        metrics.PASS_ERRORS.labels(kind="spec", reason="InvalidSpec").inc()
        book.discard()
        return await park_invalid(body, book, kube, f"invalid spec: {exc}", condition=("Recommended", "InvalidSpec"),
                                  event="InvalidSpec")
    reason = ("StatusNotWritable" if isinstance(exc, StatusNotWritable) else
              "NotManaged" if isinstance(exc, NotManaged) else
              "KubernetesApiError" if isinstance(exc, ApiException) else "InternalError")
    summary = _summary(exc)
    metrics.PASS_ERRORS.labels(kind="internal", reason=reason).inc()
    log.error("%s/%s: pass failed (%s)", book.namespace, book.name, summary, exc_info=exc)
    book.discard()  # half a pass is not written: the patch holds the failure only
    retries = timer_failures or int(book.get("retries") or 0) + 1
    delay = backoff(settings, retries)
    book.condition("Degraded", "True", reason, f"{summary}; retry {retries} in {delay:.0f} s")
    book.set(message=f"the last pass failed: {summary}"[:1000])
    if timer_failures is None:
        book.set(retries=retries)
    try:
        await book.flush()
    except Exception as again:  # noqa: BLE001 - the status cannot be written either: the Event and log say it
        log.error("%s/%s: cannot write the Degraded condition: %s", book.namespace, book.name, _summary(again))
    post_event(body, "Warning", "Degraded", f"{summary} (retry in {delay:.0f} s)")
    return kopf.TemporaryError(summary, delay=delay)


async def search_gave_out(body: dict[str, Any], book: StatusBook, kube: Kube, settings: Settings,
                          exc: SearchTimeout | SearchFailed, reason: str) -> kopf.PermanentError | kopf.TemporaryError:
    """A search past its time limit (SearchTimeout) or one that raised inside the library
    (SearchFailed): retried after a growing backoff (at least as long as the pool's own backoff for
    that search), and given up after `search.max_failures` in a row: phase Failed until the spec
    changes (a timeout was retried forever, each time at the full cost of a search)."""
    retries = int(book.get("retries") or 0) + 1
    book.set(queue=None)
    what = str(exc)[:600]
    if retries >= settings.search.max_failures:
        why = (f"{what}; gave up after {retries} failed search(es) in a row: edit the spec (fewer engines, "
               f"precisions or GPUs) or raise the operator's search time limit ({settings.search.timeout_s:.0f} s)")
        # retries 0: the timer's retry of failed passes leaves it alone (an edit starts a new pass).
        if book.get("recommendation") and book.get("observedGeneration") == book.generation:
            # A refinement (or re-tune) of a spec that has its recommendation: that one stands, and
            # is not refined again.
            book.set(retries=0, message=why[:1000], search={**(book.get("search") or {}), "quick": False})
            book.condition("Degraded", "True", reason, why)
        else:
            book.condition("Recommended", "False", reason, why)
            book.set(phase="Failed", retries=0, message=why[:1000], observedGeneration=book.generation)
        await book.flush()
        post_event(body, "Warning", reason, why)
        return kopf.PermanentError(why)
    delay = max(backoff(settings, retries), getattr(exc, "retry_in", 0.0))
    book.condition("Recommended", "False", reason, f"{what}; retry {retries} in {delay:.0f} s")
    book.set(retries=retries, message=what)
    if not book.get("recommendation"):
        book.set(phase="Pending")
    await book.flush()
    post_event(body, "Warning", reason, f"{what} (retry {retries} in {delay:.0f} s)")
    return kopf.TemporaryError(what, delay=delay)


async def run_pass(body: dict[str, Any], book: StatusBook, kube: Kube, settings: Settings, reason: str,
                   depth: int = 0, background: bool = False) -> str:
    """The pass itself, steps 1 to 7, inside the lock :func:`reconcile` holds (no guard: the caller's
    guard turns what it raises into a condition). ``depth`` 1 is the one search again after anchors
    were imported mid-pass."""
    gen = book.generation
    # 1. the spec
    try:
        spec = parse_tuning_spec(body.get("spec") or {}, settings.observe.prometheus_url)
    except SpecError as exc:
        raise await park_invalid(body, book, kube, f"invalid spec: {exc}", condition=("Recommended", "InvalidSpec"),
                                 event="InvalidSpec") from None
    post_event(body, "Normal", "Tuning", f"tuning started: {reason}")
    has_rec = bool(book.get("recommendation"))

    if has_rec and book.get("observedGeneration") != gen:
        # The spec changed: until this pass publishes, the recommendation in status is the last
        # spec's. Say so (a pass that fails keeps it, and GitOps keeps its ConfigMap), and stop the
        # canaries that were confirming it: they judge a recommendation for a spec that no longer holds.
        book.condition("Recommended", "Unknown", "SpecChanged",
                       f"the spec changed (generation {gen}); the recommendation shown is for generation "
                       f"{book.get('observedGeneration')} until this pass completes")
        # The update handler owns the pass (and its retries) now: a handler phase keeps the timer from
        # judging canaries this pass retired, or drift against a spec still being tuned.
        book.set(phase="Searching")
        await retire_canaries(body, book, kube, set())

    # 2. the workload
    workload, observed = await observe_workload(spec, book, body, kube, settings, has_rec)

    # 3. anchors: the cluster's ServingAnchors next to the shipped ones, and the live target's own
    #    passive anchor (its kernel set then needs no harvest Job)
    n_cluster = await sync_anchors(kube, settings)
    if spec.workload.prometheus is not None:
        if await ensure_passive_anchor(body, spec, book, kube, settings):
            n_cluster = await sync_anchors(kube, settings)

    # 4. the search, in the operator's bounded search pool (fair, identical searches once), with a
    #    time limit; the status says Queued (with the place) while it waits, Searching once it runs
    price, p_status, p_reason, p_message = await resolve_price(spec, kube, settings)
    if p_reason == "BadPrice" and (book.cond("Priced") or {}).get("message") != p_message:
        post_event(body, "Warning", "BadPrice", p_message)
    book.condition("Priced", p_status, p_reason, p_message)
    hardware = spec.hardware.model_copy(update={"price_per_gpu_hour": price})
    tune_spec = spec.model_copy(update={"workload": WorkloadSource.model_validate({"static": workload}),
                                        "hardware": hardware})
    spec_dict = tune_spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    name = render_name(spec, book.name)
    if spec.target is not None and name != spec.target.name:
        # A Service name must be a DNS-1035 label; the target's name is not one, so the manifest
        # cannot replace the target in place: say so rather than deploy a second one silently.
        post_event(body, "Warning", "TargetNotReplaced",
                   f"target {spec.target.name!r} is not a DNS-1035 label (a Service name must be): the recommended "
                   f"manifest names its Deployment and Service {name!r}, next to the target, not in its place")
    selector = None
    if spec.target is not None and spec.target.kind == "Deployment" and name == spec.target.name:
        target = await asyncio.to_thread(kube.get_deployment, book.namespace, name)
        selector = ((target or {}).get("spec") or {}).get("selector")

    async def report(place: int, waiting: int, workers: int) -> None:
        # Called by the pool while this pass waits for it (the book is not written meanwhile).
        if place:
            book.set(queue={"position": place, "length": waiting, "workers": workers},
                     message=f"queued for a search: place {place} of {waiting} ({workers} run at once; {reason})")
        else:
            book.set(queue=None, message=f"searching ({reason})")
        if not has_rec:
            book.set(phase="Queued" if place else "Searching")
        await book.flush()

    t0 = time.perf_counter()
    try:
        payload = await run_search(spec_dict, anchor_dirs(settings), name, book.namespace,
                                   stage2_top=settings.search.stage2_top, timeout_s=settings.search.timeout_s,
                                   target_selector=selector, tuning=book.name, workers=settings.search.workers,
                                   burst_stage2_top=settings.search.burst_stage2_top, background=background,
                                   report=report)
    except SearchTimeout as exc:
        metrics.SEARCH_FAILURES.labels(reason="timeout").inc()
        raise await search_gave_out(body, book, kube, settings, exc, "SearchTimeout") from None
    except SearchFailed as exc:
        book.set(queue=None)
        metrics.SEARCH_FAILURES.labels(reason="invalid" if exc.invalid else "error").inc()
        if exc.invalid and observed is None:
            raise await park_invalid(body, book, kube, f"search refused the spec: {exc}",
                                     condition=("Recommended", "InvalidSpec"), event="InvalidSpec") from None
        retries = int(book.get("retries") or 0) + 1
        if exc.invalid:
            # The workload was observed, not written: what the search refuses (a mean prompt longer
            # than the model's context, say) comes from the traffic, which an edit of the spec may not
            # fix and which may change. Retried with backoff; not parked as Invalid, where the drift
            # checks would stop for good.
            delay = backoff(settings, retries)
            why = f"the observed workload ({observed.describe()}) cannot be served as the spec asks: {exc}"
            book.condition("Recommended", "False", "WorkloadNotServable", f"{why}; retry {retries} in {delay:.0f} s")
            book.set(retries=retries, message=why[:1000])
            await book.flush()
            post_event(body, "Warning", "WorkloadNotServable", why[:500])
            raise kopf.TemporaryError(why[:500], delay=delay) from None
        raise await search_gave_out(body, book, kube, settings, exc, "SearchFailed") from None
    book.set(queue=None)
    seconds = time.perf_counter() - t0
    metrics.SEARCH_SECONDS.observe(seconds)
    post_event(body, "Normal", "SearchComplete",
               f"{payload['candidates']} candidates in {seconds:.1f} s ({payload['workload']})")

    # 5. missing anchors: harvest within the budget
    harvesting, missing, imported = await plan_harvests(body, spec, payload["missing_anchors"], book, kube, settings)
    anchors = dict(book.get("anchors") or {})
    provenance = payload.get("anchors_provenance") or {}
    anchors["used"] = [dump(AnchorRef(key=k, id=v, provenance=provenance.get(k, "")))
                       for k, v in sorted(payload["anchors_used"].items())]
    anchors["missing"] = [dump(m) for m in missing]
    anchors["harvesting"] = [dump(h) for h in harvesting]
    book.set(anchors=anchors)
    if imported and depth == 0:
        # An anchor arrived between the search and now (a Job finished while the operator was away):
        # search again with it rather than publish an unanchored result.
        await book.flush()
        return await run_pass(body, book, kube, settings, f"{reason}; {imported} harvested anchor(s) imported",
                              depth + 1, background)
    if harvesting:
        book.condition("AnchorsReady", "False", "Harvesting",
                       f"{len(harvesting)} anchor(s) being harvested: " + ", ".join(h.job for h in harvesting))
    elif missing:
        book.condition("AnchorsReady", "False", "AnchorsMissing",
                       "; ".join(f"{m.engine}/{m.precision} on {m.gpu}: {m.reason}" for m in missing))
    else:
        book.condition("AnchorsReady", "True", "Available",
                       f"{len(payload['anchors_used'])} anchor(s): "
                       + ", ".join(f"{u['key']} {u.get('provenance') or 'unknown'}" for u in anchors["used"])
                       + f" ({n_cluster} in the cluster, {len(settings.anchors.dirs)} shipped folder(s))")

    # 6. the recommendation, and its ConfigMap for GitOps
    window_s = parse_duration(spec.confirmation.window, "confirmation.window") or 0.0
    cm_name = config_map_name(book.name)
    rec = recommendation_of(payload, cm_name)
    unmet = infeasible_reason(rec, payload, spec) if rec is not None else ""
    if unmet:
        # The search ranks the closest miss first when nothing meets the SLO: shown as what was
        # closest, never published (its throughput at the SLO is nil: "0 tok/s/GPU" was published).
        rec = None
    shortlist = shortlist_of(payload, window_s)
    entry = HistoryEntry(time=now_iso(), generation=gen, reason=reason[:200],
                         request_rate=observed.request_rate if observed else None)
    publish_config_map, notice = False, ""
    if rec is None:
        if unmet:
            message = unmet
        else:
            # Engine x precision pairs dropped before the search say why (ATOM on NVIDIA, fp4 for an
            # FP8 checkpoint): with no candidate left, that is the reason, not the GPU budget.
            excluded = "; ".join(f"{x['what']}: {x['why']}" for x in payload.get("excluded") or [])
            message = (f"none of {payload['candidates']} candidates fits {spec.hardware.max_gpus} GPUs"
                       + (f"; not considered: {excluded}" if excluded else ""))
        book.condition("Recommended", "False", "NoFeasibleConfig", message)
        book.set(phase="Harvesting" if harvesting else "Failed", recommendation=None, shortlist=[],
                 message=message[:1000])
        await _withdraw_config_map(body, book, kube, cm_name, "no recommendation")
        notice = message  # posted once the status saying so is written
    else:
        if payload.get("render_error"):
            rec.manifest = ""
            await _withdraw_config_map(body, book, kube, cm_name, "the recommendation cannot be rendered")
            book.condition("Recommended", "True", "NotRenderable", f"{rec.engine} {rec.layout_label}: "
                                                                   f"{payload['render_error']}")
        else:
            publish_config_map = True  # once the status holding the recommendation is written
            why = "Provisional" if harvesting else "SearchComplete"
            book.condition("Recommended", "True", why,
                           f"{rec.engine} {rec.precision} {rec.layout_label} x{rec.replicas} ({rec.gpus} GPUs): "
                           f"{_fmt(rec.predicted.throughput_per_gpu)} tok/s/GPU predicted; "
                           f"{payload['candidates']} candidates in {seconds:.1f} s"
                           + ("; anchors being harvested" if harvesting else "")
                           + (f"; a quick search under load (stage 2 on {payload.get('stage2_top')} candidates), "
                              "refined when the search queue is empty" if payload.get("quick") else ""))
        entry.engine, entry.layout_label, entry.gpus = rec.engine, rec.layout_label, rec.gpus
        entry.throughput_per_gpu = rec.predicted.throughput_per_gpu
        book.set(recommendation=dump(rec), shortlist=[dump(c) for c in shortlist])
    history = [dump(entry), *(book.get("history") or [])][:HISTORY_SIZE]
    book.set(history=history, lastTuneTime=now_iso(), observedGeneration=gen, retries=0,
             search={"candidates": payload["candidates"], "seconds": round(seconds, 3),
                     "workload": payload["workload"], "stage2Top": payload.get("stage2_top"),
                     "quick": bool(payload.get("quick"))})
    if (book.cond("Degraded") or {}).get("status") == "True":
        book.condition("Degraded", "False", "PassCompleted", "the last pass completed")

    # 7. phase, the status write, then what is published (and confirmation, once the anchors are in)
    canaries: set[str] = set()
    old_template = (book.get("confirmation") or {}).get("analysisTemplate")
    if old_template:
        book.set(confirmation=None)  # republished below by an argo-rollouts pass, else withdrawn
    if harvesting:
        book.set(phase="Harvesting", message=f"waiting for {len(harvesting)} harvest Job(s)")
    elif rec is not None:
        book.set(phase="Recommended", message=f"recommended {rec.engine} {rec.layout_label}")
    # Nothing is published (ConfigMap, event, AnalysisTemplate, canaries) before the status that
    # holds the recommendation is written: a refused status write once left a ConfigMap and a
    # Recommended event for a tuning whose status still read Searching. flush raises if refused.
    await book.flush()
    if notice:
        post_event(body, "Warning", "NoFeasibleConfig", notice)
    if rec is not None:
        if publish_config_map:
            await asyncio.to_thread(kube.apply_config_map, config_map_for(body, rec, payload))
        post_event(body, "Normal", "Recommended", f"{rec.engine} {rec.layout_label} x{rec.replicas}, "
                                                  f"{_fmt(rec.predicted.throughput_per_gpu)} tok/s/GPU; "
                                                  + (f"manifest in ConfigMap {cm_name}" if publish_config_map else
                                                     "not renderable, no manifest"))
        if not harvesting and spec.confirmation.mode != "none" and spec.confirmation.candidates > 0 and \
                not payload.get("render_error"):
            canaries = await start_confirmation(body, spec, payload, book, kube)
    if old_template and old_template != (book.get("confirmation") or {}).get("analysisTemplate"):
        await _withdraw_analysis_template(body, book, kube, old_template)
    await retire_canaries(body, book, kube, canaries)
    await book.flush()
    return book.get("phase") or "Recommended"


async def _withdraw_config_map(body: dict[str, Any], book: StatusBook, kube: Kube, cm_name: str, why: str) -> None:
    """Delete the recommendation's ConfigMap: the GitOps artifact must not keep serving the last
    recommendation (of another spec) when this pass has none to publish."""
    if await asyncio.to_thread(kube.delete_config_map, book.namespace, cm_name):
        post_event(body, "Normal", "RecommendationWithdrawn", f"ConfigMap {cm_name} deleted: {why}")


async def _withdraw_analysis_template(body: dict[str, Any], book: StatusBook, kube: Kube,
                                     name: str | None = None) -> None:
    """Delete the AnalysisTemplate an earlier pass published (`name`; default: the one in status):
    its thresholds are the predictions of a recommendation this pass does not stand by
    (confirmation switched off or to canaries, no recommendation, one that cannot be rendered, an
    invalid spec). Its confirmation status goes with it unless this pass wrote another."""
    conf = book.get("confirmation") or {}
    name = name or conf.get("analysisTemplate")
    if not name:
        return
    if await asyncio.to_thread(kube.delete_custom, "argoproj.io", "v1alpha1", "analysistemplates",
                               book.namespace, name):
        post_event(body, "Normal", "AnalysisTemplateWithdrawn", f"AnalysisTemplate {name} deleted")
    if conf.get("analysisTemplate") == name:
        book.set(confirmation=None)
    if "Confirmed" not in book.touched:  # a reason this pass gave (CannotMeasure, NoThresholds) stands
        book.condition("Confirmed", "Unknown", "Superseded",
                       f"AnalysisTemplate {name} withdrawn: this pass publishes no thresholds for it")


async def retire_canaries(body: dict[str, Any], book: StatusBook, kube: Kube, keep: set[str]) -> None:
    """Delete the canaries of earlier passes that this pass does not run (their GPUs go back), and
    say that their confirmation no longer stands: a new pass (a spec change, drift, a re-tune)
    judges a new recommendation."""
    selector = f"{LABEL_KIND}=canary,{LABEL_TUNING}={label_value(book.name)}"
    gone = await asyncio.to_thread(kube.delete_deployments, book.namespace, selector, keep)
    if gone:
        post_event(body, "Normal", "CanaryRemoved", f"{', '.join(sorted(gone))}: superseded by a new pass")
    if not keep and (book.get("confirmation") or {}).get("canaries"):
        book.set(confirmation=None)
        if "Confirmed" not in book.touched:  # a reason this pass gave (CannotCanary, NoCanary) stands
            book.condition("Confirmed", "Unknown", "Superseded",
                           "a new pass superseded the earlier confirmation; this recommendation is not confirmed")


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"

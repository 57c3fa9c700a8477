"""Confirmation: run short-listed configurations as canaries and compare measured with predicted.

mode `canary`: one single-replica Deployment per short-listed candidate (owned by the tuning).
Its pods carry the target Deployment's selector labels, so the Services in front of the target
send them a share of the live traffic (the classic canary; the operator never changes the target).
Once a canary has served for `confirmation.window` (counted from when it became available, so that
the image pull and weight loading are not part of it), its own series (the spec's Prometheus
selector with the target's name replaced by the canary's) are observed, its measured ITL/TTFT p90
compared with the prediction, and it is removed. A canary not available within
`confirmation.startupTimeout` is given up and removed.

mode `argo-rollouts`: an `AnalysisTemplate` (argoproj.io/v1alpha1) whose Prometheus metrics carry
the predicted thresholds; Argo Rollouts runs it during the user's own rollout.
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
from typing import Any

from inferasim.calibrate import (
    Calibration,
    CalibrationError,
    CanaryWindow,
    calibrate,
    measurable,
    measure_window,
    window_point,
)
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.layout import Layout
from inferasim.core.spec import PrometheusWorkload, TuningSpec
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import Anchor, BenchPoint, KernelSet
from inferasim.model.predictor import benchmark_kv_dtype
from inferasim.observe import ObservationError, observe, quantile_agrees
from inferasim.observed import ObservedWorkload
from inferasim_operator import kube as kube_mod
from inferasim_operator import metrics
from inferasim_operator.anchor_cache import anchor_dirs, sync_anchors
from inferasim_operator.harvest_job import anchor_object, dns_label
from inferasim_operator.kube import ApiException, Kube
from inferasim_operator.models import (
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_TUNING,
    MANAGER,
    Canary,
    LayoutStatus,
    dump,
    label_value,
)
from inferasim_operator.pod_security import harden_pod
from inferasim_operator.settings import Settings
from inferasim_operator.spec_rules import parse_duration
from inferasim_operator.status import StatusBook, post_event
from inferasim_operator.times import age_s, epoch, iso, now_iso

# A canary confirms the prediction when its measured ITL p90 is within this fraction of it.
TOLERANCE = 0.25
# Requests a canary must serve in its window for its measurement to count: a live Service spreads
# traffic over the target's pods and the canaries, and a canary that drew a handful of requests
# was measured at a load (and from a few requests' tokens) that says little about the predicted
# operating point.
MIN_CANARY_REQUESTS = 30
# Canary points a canary anchor keeps (the newest): earlier canaries of the same kernel set and
# layout at other operating points, which share its one calibrated scale.
MAX_CANARY_POINTS = 8


def canary_selector(selector: dict[str, str], target: str, canary: str) -> dict[str, str]:
    """The spec's selector, pointed at the canary: label values naming the target name the canary."""
    out = {k: (canary if v == target else v) for k, v in selector.items()}
    if out == selector:
        out["deployment"] = canary
    return out


LABEL_CANARY = "inferasim.io/canary"


def canary_deployment(dep: dict[str, Any], target_labels: dict[str, str], tuning: str) -> dict[str, Any]:
    d = copy.deepcopy(dep)
    d["spec"]["replicas"] = 1
    name = d["metadata"]["name"]
    extra = {LABEL_MANAGED: MANAGER, LABEL_TUNING: label_value(tuning), LABEL_KIND: "canary"}
    d["metadata"]["labels"].update(extra)
    pod_labels = d["spec"]["template"]["metadata"]["labels"]
    # The target Service routes by these labels: the canary's pods carry every one of them, with
    # the target's values (a rendered manifest's own app.kubernetes.io/name would otherwise keep
    # the canary out of the target's traffic), and the canary selects its pods by a key of its own.
    pod_labels.update(target_labels)
    pod_labels.update(extra)
    pod_labels[LABEL_CANARY] = name
    d["spec"]["selector"] = {"matchLabels": {LABEL_CANARY: name}}
    # Restricted: no privilege escalation, no capabilities, seccomp, no ServiceAccount token.
    harden_pod(d["spec"]["template"]["spec"])
    return d


async def start_confirmation(body: dict[str, Any], spec: TuningSpec, payload: dict[str, Any], book: StatusBook,
                             kube: Kube) -> set[str]:
    """Start the confirmation of a recommendation: the AnalysisTemplate, or the canaries. Returns
    the canary Deployments it runs (the caller removes earlier passes' others)."""
    mode = spec.confirmation.mode
    shortlist = payload.get("shortlist", [])
    if mode == "argo-rollouts":
        template = analysis_template(body, spec, payload)
        if not template["spec"]["metrics"]:
            # Nothing to check (a static workload has no Prometheus; ATOM exports no latency
            # histograms): a template without metrics would pass every Rollout.
            book.condition("Confirmed", "False", "NoThresholds",
                           "no latency to check: the AnalysisTemplate needs workload.prometheus and an engine that "
                           "exports TTFT or ITL histograms; it was not created")
            return set()
        try:
            await asyncio.to_thread(kube.apply_custom, "argoproj.io", "v1alpha1", "analysistemplates", template)
        except ApiException as exc:
            why = "Argo Rollouts is not installed" if exc.status == 404 else f"HTTP {exc.status} {exc.reason}"
            book.condition("Confirmed", "False", "AnalysisTemplateFailed", f"cannot create AnalysisTemplate: {why}")
            post_event(body, "Warning", "AnalysisTemplateFailed", why)
            return set()
        name = template["metadata"]["name"]
        book.set(confirmation={"mode": mode, "analysisTemplate": name, "started": now_iso()})
        book.condition("Confirmed", "Unknown", "AnalysisTemplateReady",
                       f"AnalysisTemplate {name} holds the predicted thresholds; reference it from a Rollout")
        post_event(body, "Normal", "AnalysisTemplateReady", f"AnalysisTemplate {name} created")
        return set()
    if spec.workload.prometheus is None:
        # A canary is judged on its own traffic, read from Prometheus: with a static workload it
        # would hold its GPUs for the whole window and then be reported unmeasured.
        book.condition("Confirmed", "False", "CannotMeasure",
                       "canaries are measured through Prometheus, and this workload is static: set "
                       "workload.prometheus, or confirmation.mode none")
        return set()
    canaries = []
    # The first `candidates` entries that render as one Deployment (a disaggregated one does not).
    renderable = [(dep, entry) for dep, entry in zip(payload.get("shortlist_deployments", []), shortlist, strict=False)
                  if "error" not in dep]
    # A canary is judged on its latency histograms; an engine that exports none (ATOM) would hold
    # its GPUs for the whole window and end unmeasured.
    judged = [(dep, entry) for dep, entry in renderable if measurable(entry["engine"])]
    if renderable and not judged:
        book.condition("Confirmed", "False", "CannotMeasure",
                       f"{', '.join(sorted({e['engine'] for _, e in renderable}))} export no latency histograms: "
                       "no canary of the short list could be measured, none was started")
        return set()
    renderable = judged
    # A canary takes live traffic by carrying the target Deployment's pod labels (its Service's
    # selector). Another kind of target, or none to copy them from, would leave it without traffic:
    # GPUs held for the whole window, then "not measured".
    if spec.target is None or spec.target.kind != "Deployment":
        kind = spec.target.kind if spec.target else "none"
        book.condition("Confirmed", "False", "CannotCanary",
                       f"target.kind {kind}: canaries copy a Deployment's pod labels to share its traffic; use "
                       "confirmation.mode argo-rollouts (or none) for this target")
        return set()
    target = await asyncio.to_thread(kube.get_deployment, book.namespace, spec.target.name)
    if target is None:
        book.condition("Confirmed", "False", "CannotCanary",
                       f"target Deployment {spec.target.name} not found in namespace {book.namespace}: a canary "
                       "takes its traffic through the target's pod labels; none was started")
        return set()
    target_labels = (target.get("spec") or {}).get("selector", {}).get("matchLabels", {}) or {}
    for dep, entry in renderable[: spec.confirmation.candidates]:
        # shortlist[0] is the recommendation (the best of the ranked candidates).
        recommended = bool(shortlist) and entry is shortlist[0]
        d = canary_deployment(dep, target_labels, book.name)
        kube_mod.own(d, body)
        await asyncio.to_thread(kube.apply_deployment, d)
        p = entry.get("predicted") or {}
        containers = d["spec"]["template"]["spec"].get("containers") or [{}]
        canaries.append(dump(Canary(name=d["metadata"]["name"], engine=entry["engine"],
                                    precision=entry.get("precision", ""),
                                    layout=LayoutStatus.model_validate(entry["layout"]) if entry.get("layout")
                                    else None,
                                    layout_label=entry["layout_label"], gpus=entry["gpus_per_replica"],
                                    image=containers[0].get("image", ""), parent_anchor=entry.get("anchor") or "",
                                    predicted_ttft_p90_ms=p.get("ttft_p90_ms"),
                                    predicted_itl_p90_ms=p.get("itl_p90_ms"), recommended=recommended)))
        post_event(body, "Normal", "CanaryCreated",
                   f"Deployment {d['metadata']['name']}: {entry['engine']} {entry['layout_label']}")
    if not canaries:
        book.condition("Confirmed", "False", "NoCanary", "no short-listed candidate can be rendered as a canary")
        return set()
    book.set(phase="Confirming", confirmation={"mode": mode, "canaries": canaries, "started": now_iso()},
             message=f"{len(canaries)} canary Deployment(s) for {spec.confirmation.window}")
    book.condition("Confirmed", "Unknown", "CanaryRunning",
                   f"{len(canaries)} canaries, window {spec.confirmation.window}")
    return {c["name"] for c in canaries}


async def confirm_progress(body: dict[str, Any], spec: TuningSpec, book: StatusBook, kube: Kube,
                           settings: Settings) -> bool:
    """Canary states; each canary is measured once it has served for the window, counted from when
    it became available (pulling the image and loading the weights are not its traffic), and its
    GPUs go back then. One that is not available within `confirmation.startupTimeout` is given up.
    When every canary is measured or failed, decide. True when confirmation is over."""
    conf = dict(book.get("confirmation") or {})
    canaries = [dict(c) for c in conf.get("canaries") or []]
    window = parse_duration(spec.confirmation.window, "confirmation.window") or 0.0
    startup = parse_duration(spec.confirmation.startup_timeout, "confirmation.startupTimeout") or 0.0
    age = age_s(conf.get("started")) or 0.0
    for c in canaries:
        if c.get("state") in ("Measured", "Failed"):
            continue
        dep = await asyncio.to_thread(kube.get_deployment, book.namespace, c["name"])
        if dep is None:
            c["state"], c["message"] = "Failed", "the canary Deployment is gone"
            continue
        if c.get("state") == "Pending" and ((dep.get("status") or {}).get("availableReplicas") or 0) > 0:
            c["state"], c["runningSince"] = "Running", available_since(dep)
        if c.get("state") == "Pending" and age >= startup:
            c["state"] = "Failed"
            c["message"] = (f"not available {spec.confirmation.startup_timeout} after it was created "
                            "(confirmation.startupTimeout); given up, its GPUs released")
            await _release_canary(book, kube, c)
        elif c.get("state") == "Running" and (age_s(c.get("runningSince")) or 0.0) >= window:
            await _measure_canary(body, spec, book, kube, settings, c, conf.get("started") or "")
            await _release_canary(book, kube, c)
    canaries = [{k: v for k, v in c.items() if v is not None} for c in canaries]
    waiting = [c for c in canaries if c.get("state") in ("Pending", "Running")]
    book.set(confirmation={**conf, "canaries": canaries})
    if waiting:
        book.condition("Confirmed", "Unknown", "CanaryRunning", "; ".join(_progress(c, window) for c in waiting))
        return False
    return _decide(body, book, canaries)


def _counted(c: dict[str, Any]) -> bool:
    """A canary whose prediction error counts: measured, with enough requests in its window."""
    return "predictionError" in c and (c.get("measuredRequests") or 0.0) >= MIN_CANARY_REQUESTS


def available_since(dep: dict[str, Any]) -> str:
    """When a Deployment became available: its Available condition's last transition (written by
    the deployment controller, so a timer that looks later does not shorten the window), else now."""
    for cond in (dep.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Available" and cond.get("status") == "True":
            when = epoch(cond.get("lastTransitionTime"))
            if when is not None and when <= time.time():
                return iso(when)
    return now_iso()


def _progress(c: dict[str, Any], window: float) -> str:
    if c.get("state") == "Pending":
        return f"{c['name']} starting (not available yet)"
    served = age_s(c.get("runningSince")) or 0.0
    return f"{c['name']} serving, {served / 60:.1f} of {window / 60:.1f} minutes"


async def _measure_canary(body: dict[str, Any], spec: TuningSpec, book: StatusBook, kube: Kube, settings: Settings,
                          c: dict[str, Any], started: str) -> None:
    """Observe a canary's own series over the window; compare its ITL p90 with the prediction."""
    prom = spec.workload.prometheus
    if prom is None:
        c["state"], c["message"] = "Failed", "static workload: no Prometheus to measure the canary with"
        return
    sel = canary_selector(prom.selector, spec.target.name if spec.target else "", c["name"])
    src = PrometheusWorkload(url=prom.url, selector=sel, window=spec.confirmation.window)
    try:
        m = await asyncio.to_thread(observe, src, "auto", timeout=settings.observe.timeout_s)
    except ObservationError as exc:
        c["state"], c["message"] = "Failed", str(exc)[:500]
        return
    c["measuredTtftP90Ms"] = m.ttft.p90_ms if m.ttft else None
    c["measuredItlP90Ms"] = m.itl.p90_ms if m.itl else None
    c["measuredRequestRate"] = m.request_rate
    window = parse_duration(spec.confirmation.window, "confirmation.window") or 0.0
    c["measuredRequests"] = round(m.request_rate * window, 1)
    pred = c.get("predictedItlP90Ms")
    if pred and c["measuredItlP90Ms"]:
        err = c["measuredItlP90Ms"] / pred - 1.0
        c["predictionError"] = round(err, 4)
        # The p90 read back from the engine's histogram is interpolated inside a bucket (vLLM's ITL
        # buckets are 10, 25, 50 ms ...): judge it at that resolution, not by the raw ratio.
        c["agrees"] = quantile_agrees(c["engine"], "itl", c["measuredItlP90Ms"] / 1e3, pred / 1e3, TOLERANCE)
        metrics.CANARY_ERROR.observe(err)
    c["state"] = "Measured"
    await store_canary_anchor(body, spec, book, kube, settings, c, m, prom.url, started)


async def _release_canary(book: StatusBook, kube: Kube, c: dict[str, Any]) -> None:
    """The canary's GPUs go back as soon as it is measured or given up."""
    await asyncio.to_thread(kube.delete_deployment, book.namespace, c["name"])


def _decide(body: dict[str, Any], book: StatusBook, canaries: list[dict[str, Any]]) -> bool:
    """Every canary measured or failed: the Confirmed condition from their prediction errors. The
    recommendation is confirmed only by its own canary, measured on at least MIN_CANARY_REQUESTS
    requests; the short list's other canaries can contradict it (a prediction off elsewhere) but
    not stand in for it."""
    def not_confirmed(reason: str, why: str) -> bool:
        book.condition("Confirmed", "False", reason, why)
        book.set(phase="Recommended", message=why[:500])
        post_event(body, "Warning", reason, why)
        return True

    for c in canaries:
        if "predictionError" in c and not _counted(c):
            c["message"] = (f"served {c.get('measuredRequests') or 0:g} requests in the window, fewer than the "
                            f"{MIN_CANARY_REQUESTS} its measurement needs to count")
    book.set(confirmation={**(book.get("confirmation") or {}), "canaries": canaries})
    if not any(_counted(c) for c in canaries):
        reasons = "; ".join(f"{c['name']}: {c.get('message', 'not measured')}" for c in canaries)
        return not_confirmed("CanaryNotMeasured", reasons)
    text = ", ".join(f"{c['name']} {c['predictionError']:+.0%}" for c in canaries if _counted(c))
    own = next((c for c in canaries if c.get("recommended")), None)
    if own is None:
        return not_confirmed("RecommendationNotCanaried",
                             "the recommendation itself ran no canary (disaggregated, not renderable as one "
                             f"Deployment, or an engine without latency histograms); the short list measured: {text}")
    if not _counted(own):
        return not_confirmed("RecommendationNotMeasured",
                             f"{own['name']} (the recommendation): {own.get('message', 'not measured')}; "
                             f"the short list measured: {text}")
    if all(c.get("agrees") for c in canaries if _counted(c)):
        book.condition("Confirmed", "True", "CanaryMeasured",
                       f"measured ITL p90 within {TOLERANCE:.0%} at the histogram's bucket resolution: {text}")
        post_event(body, "Normal", "Confirmed", text)
    else:
        book.condition("Confirmed", "False", "PredictionOff", f"measured ITL p90 off by more than {TOLERANCE:.0%} "
                                                              f"(beyond the histogram's bucket resolution): {text}")
        post_event(body, "Warning", "PredictionOff", text)
    book.set(phase="Confirmed", message=f"canaries measured: {text}")
    return True


# --------------------------------------------------------------------------------------------
# each measured canary becomes a ServingAnchor (so predictions learn from canaries)
# --------------------------------------------------------------------------------------------


def canary_anchor_name(kernel_set: KernelSet, layout: Layout) -> str:
    """Deterministic: one canary anchor per kernel set and layout, updated by every measurement
    (and apart from the harvested anchor of the same kernel set and layout, which it never replaces)."""
    return f"canary-{kernel_set.key()}-{dns_label(layout.label())}"[:253]


def _canary_kernel_set(spec: TuningSpec, c: dict[str, Any], parent: Anchor | None) -> KernelSet:
    if parent is not None:  # the kernels the prediction assumed
        return parent.kernel_set
    precision = c.get("precision") or "auto"
    return KernelSet(engine=c["engine"], model=get_model(spec.model).name, gpu=get_gpu(spec.hardware.gpu).name,
                     precision=precision, kv_dtype=benchmark_kv_dtype(precision))


def _parent(store: AnchorStore, anchor_id: str) -> Anchor | None:
    """The anchor the prediction came from; a canary anchor's own parent is the kernel set's best
    measured (non-canary) anchor, so that scales never compound."""
    hits = [a for a in store.all() if a.id == anchor_id]
    measured = [a for a in hits if a.provenance.method != "canary"]
    if measured:
        return measured[0]
    if hits:
        others = [a for a in store.candidates(hits[0].kernel_set) if a.provenance.method != "canary"]
        return others[0] if others else None
    return None


def build_canary_anchor(spec: TuningSpec, c: dict[str, Any], observed: ObservedWorkload, window: CanaryWindow,
                        prom_url: str, started: str, namespace: str, anchor_dirs: list[str],
                        existing: dict[str, Any] | None, window_s: float) -> Calibration:
    """The canary's anchor, calibrated on its parent, with the earlier points of ``existing``
    (blocking: run in a thread)."""
    row_id = f"canary:{namespace}/{c['name']}@{started or f'{observed.observed_at:.0f}'}"
    point = window_point(window, row_id=row_id)
    store = AnchorStore(*anchor_dirs)
    parent = _parent(store, c.get("parentAnchor") or "")
    ks = _canary_kernel_set(spec, c, parent)
    lay = c.get("layout") or {}
    layout = Layout(tp=lay.get("tp", 1), pp=lay.get("pp", 1), dp=lay.get("dp", 1), moe_tp=lay.get("moeTp", 0),
                    moe_ep=lay.get("moeEp", 1))
    earlier: list[BenchPoint] = []
    if existing is not None:
        try:
            old = Anchor.model_validate(existing.get("spec") or {})
            if old.kernel_set.same_kernels(ks) and old.layout.to_layout() == layout:
                earlier = [p for p in old.points if p.row_id != row_id]
        except ValueError:
            earlier = []  # an unreadable earlier anchor is replaced, not merged
    points = [*earlier, point][-MAX_CANARY_POINTS:]
    return calibrate(ks, layout, points, parent,
                     source=f"canary Deployment {namespace}/{c['name']}; Prometheus {prom_url} "
                            f"{observed.selector} over {observed.window}",
                     measured_at=iso(observed.observed_at), measured_by="inferasim-operator canary",
                     engine_image=c.get("image", ""), gpu_seconds=window_s * int(c.get("gpus") or 1),
                     notes="window queries: " + " | ".join(window.queries))


async def store_canary_anchor(body: dict[str, Any], spec: TuningSpec, book: StatusBook, kube: Kube, settings: Settings,
                              c: dict[str, Any], observed: ObservedWorkload, prom_url: str, started: str) -> None:
    """Turn one measured canary into a ServingAnchor (provenance canary); record it in ``c``.
    A measurement that cannot be calibrated is a Warning Event and a message, never a crash: the
    confirmation verdict does not depend on it."""
    window_s = parse_duration(spec.confirmation.window, "confirmation.window") or 0.0
    await sync_anchors(kube, settings)  # the parent may be a ServingAnchor harvested moments ago
    dirs = anchor_dirs(settings)
    try:
        # The name needs the kernel set, which needs the parent: calibrate once to learn it, then
        # again with the earlier points of that anchor, if there is one.
        window = await asyncio.to_thread(measure_window, observed, prom_url, timeout=settings.observe.timeout_s)
        args = (spec, c, observed, window, prom_url, started, book.namespace, dirs)
        cal = await asyncio.to_thread(build_canary_anchor, *args, None, window_s)
        name = canary_anchor_name(cal.anchor.kernel_set, cal.anchor.layout.to_layout())
        existing = await asyncio.to_thread(kube.get_anchor, name)
        if existing is not None:
            cal = await asyncio.to_thread(build_canary_anchor, *args, existing, window_s)
    except (CalibrationError, ValueError) as exc:
        c["message"] = f"measured, but not stored as an anchor: {exc}"[:1000]
        post_event(body, "Warning", "CanaryAnchorFailed", f"{c['name']}: {exc}")
        return
    point = cal.anchor.points[-1]
    c["measuredItlMeanMs"] = round(point.tpot_ms or 0.0, 4)
    if point.ttft_ms is not None:
        c["measuredTtftMeanMs"] = round(point.ttft_ms, 4)
    c["measuredInFlight"] = round(window.in_flight, 3)  # the point's concurrency is this, rounded, at least 1
    c["calibrationScale"] = round(cal.scale, 6)
    obj = anchor_object(cal.anchor)
    obj["metadata"]["name"] = name
    obj["metadata"]["labels"][LABEL_KIND] = "canary"
    # Cluster-scoped: a namespaced ServingTuning cannot own it (and the measurement should outlive
    # the tuning, as harvested anchors do); annotations say where it came from.
    obj["metadata"]["annotations"] = {"inferasim.io/measured-by": f"{book.namespace}/{book.name}",
                                      "inferasim.io/canary": f"{book.namespace}/{c['name']}",
                                      "inferasim.io/parent-anchor": cal.parent_id or ""}
    created = await asyncio.to_thread(kube.apply_anchor, obj, existing)
    try:
        await asyncio.to_thread(kube.patch_anchor_status, name, {"harvestedBy": f"{book.namespace}/{book.name}",
                                                                 "canary": f"{book.namespace}/{c['name']}",
                                                                 "importedAt": now_iso()})
    except ApiException as exc:  # status is informative only
        c["message"] = f"cannot write the status of ServingAnchor {name}: HTTP {exc.status}"
    c["anchor"] = name
    before = cal.before.get("tpot")
    post_event(body, "Normal", "CanaryAnchor",
               f"ServingAnchor {name} {'created' if created else 'updated'} from {c['name']}: mean ITL "
               f"{point.tpot_ms:.3g} ms at {point.concurrency} in flight ({point.isl}/{point.osl} tokens), "
               f"{len(cal.anchor.points)} point(s); step scale {cal.scale:.3f} on "
               f"{cal.parent_id or 'the defaults (no parent anchor)'}"
               + ("" if before is None else f"; measured ITL {math.exp(-before) - 1:+.0%} vs the parent's "
                                             "prediction at that point"))
    await sync_anchors(kube, settings)  # the next search reads it


def analysis_template(body: dict[str, Any], spec: TuningSpec, payload: dict[str, Any]) -> dict[str, Any]:
    """An Argo Rollouts AnalysisTemplate checking the recommendation's predicted latencies."""
    from inferasim.observe import quantile_bound, queries_for

    rec = payload.get("recommendation") or {}
    p = rec.get("predicted") or {}
    prom = spec.workload.prometheus
    engine = rec.get("engine", "vllm")
    window = spec.confirmation.window
    metrics_: list[dict[str, Any]] = []
    if prom is not None:
        queries = {q.name: q.queries[0] for q in queries_for(engine, prom.selector, window)}
        for key, pred, name in (("ttft_p90", p.get("ttft_p90_ms"), "ttft-p90"), ("itl_p90", p.get("itl_p90_ms"),
                                                                                  "itl-p90")):
            if pred is None or key not in queries:
                continue
            # histogram_quantile reads a p90 interpolated inside a bucket: the limit is the bucket
            # bound that a deployment within the tolerance can read back (quantile_bound).
            limit_s = quantile_bound(engine, "itl" if key == "itl_p90" else "ttft", pred / 1000.0 * (1 + TOLERANCE))
            metrics_.append({"name": name, "interval": "1m", "failureLimit": 1,
                             "successCondition": f"result[0] <= {limit_s:.6g}",
                             "provider": {"prometheus": {"address": prom.url, "query": queries[key]}}})
    meta = body["metadata"]
    t = {"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
         "metadata": {"name": f"{meta['name']}-analysis", "namespace": meta["namespace"],
                      "labels": {LABEL_MANAGED: MANAGER, LABEL_TUNING: label_value(meta["name"])}},
         "spec": {"metrics": metrics_}}
    kube_mod.own(t, body)
    return t

"""The CPU-heavy search, off the operator's event loop, in the bounded pool of worker processes
(search_pool.py), with a time limit.

`tune` is numpy plus a pure-Python discrete-event simulator: in a thread it would hold the GIL and
stall kopf's watches, and a thread cannot be stopped at a deadline. A worker process can be killed.
The search itself (:func:`compute`) does not depend on the tuning's names; what a tuning gets back
(:func:`render_payload`) is plain dicts: status pieces and rendered manifests.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from inferasim_operator.models import child_name
from inferasim_operator.search_pool import (
    SearchFailed,
    SearchTimeout,
    anchors_fingerprint,
    die_with_parent,
    search_key,
    shared_pool,
)
from inferasim_operator.search_pool import SearchPool as SearchPool

__all__ = ["SearchFailed", "SearchTimeout", "compute", "render_payload", "run_search", "search_payload"]


def _container_view(deployment: dict[str, Any]) -> dict[str, Any]:
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    return {"image": c.get("image", ""), "args": [*c.get("command", []), *c.get("args", [])],
            "env": [{"name": e["name"], "value": e.get("value", "")} for e in c.get("env", []) if "value" in e],
            "resources": c.get("resources", {})}


def adopt_selector(deployment: dict[str, Any], selector: dict[str, Any] | None) -> dict[str, Any]:
    """The rendered Deployment with the live target's selector: a Deployment's selector is
    immutable, so the recommendation must keep it to apply over the target (GitOps); the pod
    template carries the selector's labels besides its own."""
    if not selector:
        return deployment
    deployment["spec"]["selector"] = selector
    labels = deployment["spec"]["template"]["metadata"].setdefault("labels", {})
    labels.update(selector.get("matchLabels") or {})
    return deployment


def canary_base(name: str, tuning: str) -> str:
    """What a tuning's canaries are named after: the recommended Deployment's name (`name`, the
    target's), with the tuning's own name when it differs, so that two tunings of one target never
    name (and so patch, measure and delete) each other's canaries."""
    if not tuning or tuning == name:
        return name
    # A hash of the pair: "chat" + "b-x" and "chat-b" + "x" read alike once joined. Cut (with a hash
    # of the whole) to leave room for "-canary-N" within a DNS label.
    import hashlib

    pair = hashlib.sha256(f"{name}/{tuning}".encode()).hexdigest()[:4]
    return child_name(f"{name}-{tuning}-{pair}", "", limit=52)


def compute(spec: dict[str, Any], anchor_dirs: list[str], stage2_top: int, workers: int | None = None
            ) -> tuple[Any, Any, float]:
    """`tune` itself, the costly part: (parsed spec, TuneResult, seconds). Nothing in it depends on
    the tuning's name or namespace, so identical searches share it (search_pool.py)."""
    from inferasim.core.spec import TuningSpec
    from inferasim.search.tune import tune

    t0 = time.perf_counter()
    parsed = TuningSpec.model_validate(spec, context={"model_paths": False})
    result = tune(parsed, anchor_dirs=[Path(d) for d in anchor_dirs], stage2_top=stage2_top, workers=workers)
    return parsed, result, time.perf_counter() - t0


def render_payload(parsed: Any, result: Any, anchor_dirs: list[str], name: str, namespace: str, seconds: float,
                   target_selector: dict[str, Any] | None = None, tuning: str = "") -> dict[str, Any]:
    """What the status and the canaries need from a TuneResult, for one tuning (names, namespace,
    the target's selector): cheap, plain dicts."""
    from inferasim.render import render_deployment, to_yaml
    from inferasim.render_pod import RenderOptions
    from inferasim.search.deploy import config_of, recommendation_manifests

    full = result.as_dict()
    out: dict[str, Any] = {
        "recommendation": full["recommendation"], "shortlist": full["shortlist"],
        "missing_anchors": full["missing_anchors"], "anchors_used": full["anchors_used"],
        "candidates": full["space"]["candidates"], "excluded": full["space"]["excluded"],
        "workload": full["workload"], "timings": full["timings_s"],
        "manifest": "", "container": None, "render_error": "", "shortlist_deployments": [],
    }
    # How each anchor used was measured (harvest, public, passive, canary): the status shows it.
    from inferasim.live import used_provenance
    from inferasim.model.anchor_store import AnchorStore

    stored = AnchorStore(*anchor_dirs).all()
    out["anchors_provenance"] = {k: used_provenance(stored, v) for k, v in full["anchors_used"].items()}
    rec = result.recommendation
    if rec is not None:
        from inferasim.search.tune import slo_miss

        # The SLO term the first candidate misses ('' when it meets them): the operator names it
        # when no deployment meets the SLO, and publishes nothing.
        out["slo_miss"] = slo_miss(rec, parsed.objective.slo)
        try:
            manifests = recommendation_manifests(result, rec, name, namespace)
            if rec.candidate.disagg is None and manifests[0]["kind"] == "Deployment":
                adopt_selector(manifests[0], target_selector)
                out["container"] = _container_view(manifests[0])
            # A disaggregated recommendation is two pools (name-prefill, name-decode) beside the
            # target, not a patch of it, and a multi-node one a LeaderWorkerSet (another kind than
            # the target's Deployment): no single container to show, no selector to adopt.
            out["manifest"] = to_yaml(manifests)
        except ValueError as exc:  # e.g. a replica larger than one node: not renderable as a Deployment
            out["render_error"] = str(exc)
    # Canaries run as the spec's `deploy` section asks (model cache PVC and offline loading, ROCm
    # render group, runtime class): a canary that downloads the weights where the recommendation
    # reads them from a cache would be measured on another start-up, or never start offline.
    options = RenderOptions.from_spec(result.spec.deploy)
    n_canaries = 0  # canaries are numbered among the renderable entries: the first is -canary-0
    for e in result.shortlist():
        try:
            cfg = config_of(result, e)
            canary = child_name(canary_base(name, tuning), f"-canary-{n_canaries}")
            out["shortlist_deployments"].append(render_deployment(cfg, canary, namespace, options=options))
            n_canaries += 1
        except ValueError as exc:  # a disaggregated entry (two pools), or one a Deployment cannot hold
            out["shortlist_deployments"].append({"error": str(exc)})
    out["seconds"] = seconds
    return out


def search_payload(spec: dict[str, Any], anchor_dirs: list[str], name: str, namespace: str,
                   stage2_top: int, target_selector: dict[str, Any] | None = None, tuning: str = "",
                   workers: int | None = None) -> dict[str, Any]:
    """Run `tune` and render what the status and the canaries need (in a search worker)."""
    parsed, result, seconds = compute(spec, anchor_dirs, stage2_top, workers)
    return render_payload(parsed, result, anchor_dirs, name, namespace, seconds, target_selector, tuning)


def worker_main(conn: Any, parent_pid: int) -> None:
    """A search worker: answers ("search", args, render) and ("render", blob, args, render) until the
    pipe closes."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the operator decides when its workers end
    try:
        # Searches yield the CPU to the operator's own event loop (watches, status writes): with 100
        # tunings applied at once, workers at the same priority delayed their first status by seconds.
        os.nice(WORKER_NICE)
    except OSError:
        pass
    from inferasim.catalog.models import refuse_model_paths

    # A fresh (spawned) process: it refuses model paths as the operator does, everywhere in the
    # library (tune, rendering), not only in the spec's validation.
    refuse_model_paths()
    while True:
        try:
            kind, args, render = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        try:
            if kind == "search":
                spec, anchor_dirs, stage2_top = args
                # One process per search: the pool's size is the bound, so tune forks no workers.
                parsed, result, seconds = compute(spec, anchor_dirs, stage2_top, workers=1)
                blob = pickle.dumps((parsed, result, seconds), protocol=pickle.HIGHEST_PROTOCOL)
            else:
                blob = args[0]
                anchor_dirs = args[1]
                parsed, result, seconds = pickle.loads(blob)
                blob = None
            out: tuple[Any, ...] = ("ok", render_payload(parsed, result, anchor_dirs, *render[:2], seconds,
                                                         *render[2:]), blob)
        except ValueError as exc:
            out = ("invalid", str(exc), None)
        except Exception as exc:  # noqa: BLE001 - reported to the operator, which decides
            out = ("error", error_summary(exc), None)
        try:
            conn.send(out)
        except (OSError, ValueError):
            return


WORKER_NICE = 10


def error_summary(exc: BaseException) -> str:
    """One line for a condition, an Event and the log: the error and where it was raised (file,
    line, function), never a traceback (the operator's log must hold none)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        f = frames[-1]
        parts = f.filename.replace("\\", "/").split("/")
        short = "/".join(parts[parts.index("inferasim") if "inferasim" in parts else -1:])
        where = f" (at {short}:{f.lineno} in {f.name})"
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500] + where


def pool(workers: int = 0, burst_stage2_top: int = 0) -> SearchPool:
    """The operator's search pool (one per event loop), its workers running :func:`worker_main`."""
    return shared_pool(worker_main, workers, burst_stage2_top)


async def run_search(spec: dict[str, Any], anchor_dirs: list[str], name: str, namespace: str, *,
                     stage2_top: int, timeout_s: float, target_selector: dict[str, Any] | None = None,
                     tuning: str = "", workers: int = 0, tenant: str = "", burst_stage2_top: int = 0,
                     background: bool = False,
                     report: Callable[[int, int, int], Awaitable[None]] | None = None) -> dict[str, Any]:
    """`search_payload` in the operator's bounded search pool (search_pool.py): fair across
    namespaces (``tenant``, default the namespace), identical searches computed once, SearchTimeout
    after ``timeout_s`` of running (the worker is killed), SearchFailed when it raised. ``report``
    is called with (place, waiting, pool size) while the search waits, and (0, ...) when it starts.
    ``workers``: the pool's size (0: fitted to the CPUs). Under a burst the search may run a smaller
    stage 2 (``burst_stage2_top``; the payload's ``quick`` is then True); a ``background`` search
    (a refinement) waits until no other does, and is never shortened."""
    fingerprint = await asyncio.to_thread(anchors_fingerprint, anchor_dirs)
    key = search_key(spec, stage2_top, fingerprint)
    return await pool(workers, burst_stage2_top).search(
        key=key, tenant=tenant or namespace, search_args=(spec, anchor_dirs, stage2_top),
        render_args=(name, namespace, target_selector, tuning), timeout_s=timeout_s, report=report,
        background=background)

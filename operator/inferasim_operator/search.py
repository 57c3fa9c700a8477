"""The CPU-heavy search, off the operator's event loop, in a child process with a time limit.

`tune` is numpy plus a pure-Python discrete-event simulator: in a thread it would hold the GIL and
stall kopf's watches, and a thread cannot be stopped at a deadline. A spawned process can be killed.
The child returns plain dicts (status pieces and rendered manifests), never library objects.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

from inferasim_operator.models import child_name

__all__ = ["SearchFailed", "SearchTimeout", "run_search", "search_payload"]


class SearchTimeout(TimeoutError):
    pass


class SearchFailed(RuntimeError):
    """The search raised; ``invalid`` is True for bad input (a ValueError: unknown model, GPU ...)."""

    def __init__(self, message: str, invalid: bool) -> None:
        self.invalid = invalid
        super().__init__(message)


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


def search_payload(spec: dict[str, Any], anchor_dirs: list[str], name: str, namespace: str,
                   stage2_top: int, target_selector: dict[str, Any] | None = None, tuning: str = "") -> dict[str, Any]:
    """Run `tune` and render what the status and the canaries need (runs in the child)."""
    from inferasim.core.spec import TuningSpec
    from inferasim.render import render_deployment, to_yaml
    from inferasim.search.deploy import config_of, recommendation_manifests
    from inferasim.search.tune import tune

    t0 = time.perf_counter()
    parsed = TuningSpec.model_validate(spec, context={"model_paths": False})
    result = tune(parsed, anchor_dirs=[Path(d) for d in anchor_dirs], stage2_top=stage2_top)
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
            if rec.candidate.disagg is None:
                adopt_selector(manifests[0], target_selector)
                out["container"] = _container_view(manifests[0])
            # A disaggregated recommendation is two pools (name-prefill, name-decode) beside the
            # target, not a patch of it: no single container to show, no selector to adopt.
            out["manifest"] = to_yaml(manifests)
        except ValueError as exc:  # e.g. a replica larger than one node: not renderable as a Deployment
            out["render_error"] = str(exc)
    n_canaries = 0  # canaries are numbered among the renderable entries: the first is -canary-0
    for e in result.shortlist():
        try:
            cfg = config_of(result, e)
            canary = child_name(canary_base(name, tuning), f"-canary-{n_canaries}")
            out["shortlist_deployments"].append(render_deployment(cfg, canary, namespace))
            n_canaries += 1
        except ValueError as exc:  # a disaggregated entry (two pools), or one a Deployment cannot hold
            out["shortlist_deployments"].append({"error": str(exc)})
    out["seconds"] = time.perf_counter() - t0
    return out


def _kill_group(proc: Any) -> None:
    """End the search process and whatever it started (it leads its own process group)."""
    if proc.pid is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.is_alive():
        proc.kill()


def _child(conn: Any, args: tuple[Any, ...]) -> None:
    # Its own process group: tune may start worker processes, and a timeout must end them all.
    os.setsid()
    try:
        from inferasim.catalog.models import refuse_model_paths

        # A fresh (spawned) process: it refuses model paths as the operator does, everywhere in the
        # library (tune, rendering), not only in the spec's validation.
        refuse_model_paths()
        conn.send(("ok", search_payload(*args)))
    except ValueError as exc:
        conn.send(("invalid", str(exc)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"))
    finally:
        conn.close()


async def run_search(spec: dict[str, Any], anchor_dirs: list[str], name: str, namespace: str, *,
                     stage2_top: int, timeout_s: float, target_selector: dict[str, Any] | None = None,
                     tuning: str = "") -> dict[str, Any]:
    """`search_payload` in a spawned process; SearchTimeout after ``timeout_s`` (the child is killed)."""
    ctx = mp.get_context("spawn")  # fork would copy kopf's threads and locks
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, (spec, anchor_dirs, name, namespace, stage2_top, target_selector,
                                                    tuning)),
                       name="inferasim-search", daemon=False)  # not daemonic: tune may start workers
    proc.start()
    child.close()
    try:
        ready = await asyncio.to_thread(parent.poll, timeout_s)
        if not ready:
            raise SearchTimeout(f"the search did not finish within {timeout_s:.0f} s")
        try:
            kind, data = await asyncio.to_thread(parent.recv)
        except EOFError:
            raise SearchFailed(f"the search process died (exit code {proc.exitcode})", invalid=False) from None
    finally:
        _kill_group(proc)
        await asyncio.to_thread(proc.join, 10)
        parent.close()
    if kind == "ok":
        return data
    raise SearchFailed(data, invalid=(kind == "invalid"))

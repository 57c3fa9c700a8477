"""The kopf handlers: a thin adapter from kopf's events to the passes (passes/tune.py and
passes/timer.py).

Run with `python -m inferasim_operator` (or `kopf run -m inferasim_operator.handlers`). Settings
come from INFERASIM_* environment variables (settings.Settings); the timer's period is read at
import, since kopf registers it then.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from inferasim_operator import metrics, state
from inferasim_operator.kube import Kube, load_config
from inferasim_operator.models import GROUP, TUNING_PLURAL, VERSION
from inferasim_operator.passes import timer, tune
from inferasim_operator.search import pool as search_pool
from inferasim_operator.settings import Settings

SETTINGS = Settings.from_env()
API_THREADS = 64
_kube: Kube | None = None


def kube() -> Kube:
    global _kube
    if _kube is None:
        load_config()
        _kube = Kube()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, logger: logging.Logger, **_: Any) -> None:
    # kopf's bookkeeping in our own annotations (status is ours and schema-checked; kopf's
    # handler results would be pruned there anyway).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="inferasim.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="inferasim.io", key="last-handled-configuration")
    # kopf's own log lines as Events only from WARNING: at INFO every handler and timer run posted one
    # ("Handler 'on_create' succeeded", "Timer 'retune_timer' succeeded" every period for every tuning),
    # which under 100 tunings kept the API server and the event loop busy. The operator's own Events
    # (kopf.event, status.post_event) are posted as before.
    settings.posting.level = logging.WARNING
    # One replica (the chart's Deployment) and no peering CRD to install.
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Model names come from specs others wrote: the library resolves them through its catalog only,
    # never as paths on the operator's filesystem (parse_tuning_spec refuses paths as well).
    from inferasim.catalog.models import refuse_model_paths

    refuse_model_paths()
    port = int(os.environ.get("INFERASIM_METRICS_PORT", "8080") or 0)
    if port:
        metrics.serve(port, os.environ.get("INFERASIM_METRICS_ADDR", "0.0.0.0"))
    kube()
    logger.info("inferasim operator: anchors %s + cluster ServingAnchors; timer %.1f s; search limit %.0f s",
                SETTINGS.anchors.dirs, SETTINGS.timer.interval_s, SETTINGS.search.timeout_s)


@kopf.on.startup()
async def start_pools(logger: logging.Logger, **_: Any) -> None:
    # Blocking API calls run in threads: with 100 tunings applied at once, the default pool (CPUs + 4
    # threads) queued them for seconds, and tunings showed no phase for a long while.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=API_THREADS,
                                                                       thread_name_prefix="inferasim-api"))
    pool = search_pool(SETTINGS.search.workers, SETTINGS.search.burst_stage2_top)
    logger.info("search pool: %d worker process(es), time limit %.0f s", pool.size, SETTINGS.search.timeout_s)


@kopf.on.cleanup()
async def stop_pools(**_: Any) -> None:
    search_pool(SETTINGS.search.workers, SETTINGS.search.burst_stage2_top).close()


@kopf.on.probe(id="tunings")
def probe_tunings(**_: Any) -> int:
    # Shown by the liveness endpoint: how many tunings this process has handled.
    return state.MEMO.tunings()


@kopf.on.create(GROUP, VERSION, TUNING_PLURAL)
async def on_create(body: kopf.Body, **_: Any) -> None:
    await tune.reconcile(dict(body), kube(), SETTINGS, trigger="create", reason="created")


@kopf.on.update(GROUP, VERSION, TUNING_PLURAL, field="spec")
async def on_update(body: kopf.Body, **_: Any) -> None:
    await tune.reconcile(dict(body), kube(), SETTINGS, trigger="update", reason="spec changed")


@kopf.on.resume(GROUP, VERSION, TUNING_PLURAL)
async def on_resume(body: kopf.Body, **_: Any) -> None:
    # Work that was finished stays finished (reconcile skips it); an interrupted pass runs again,
    # and a Job started before the restart is found by its deterministic name, not started twice.
    await tune.reconcile(dict(body), kube(), SETTINGS, trigger="resume", reason="operator restarted")


@kopf.on.delete(GROUP, VERSION, TUNING_PLURAL, optional=True)
def on_delete(body: kopf.Body, **_: Any) -> None:
    # optional: no finalizer. Owned Jobs, ConfigMaps and canaries go with the garbage collector.
    state.forget(body["metadata"].get("uid", ""))


@kopf.timer(GROUP, VERSION, TUNING_PLURAL, interval=SETTINGS.timer.interval_s, initial_delay=SETTINGS.timer.interval_s)
async def retune_timer(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    result = await timer.tick(dict(body), kube(), SETTINGS)
    if result not in ("idle", "steady", "harvesting", "confirming", "backoff"):
        logger.info("timer: %s", result)

"""The operator's own metrics (prometheus-client), served on INFERASIM_METRICS_PORT at /metrics."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from inferasim_operator.models import PHASES

REGISTRY = CollectorRegistry(auto_describe=True)

TUNINGS = Gauge("inferasim_tunings", "ServingTunings handled by this operator, by phase.", ["phase"],
                registry=REGISTRY)
SEARCH_SECONDS = Histogram("inferasim_search_seconds", "Wall time of one search (tune) in the child process.",
                           buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600), registry=REGISTRY)
SEARCH_FAILURES = Counter("inferasim_search_failures_total", "Searches that failed, by reason.", ["reason"],
                          registry=REGISTRY)
OBSERVE_FAILURES = Counter("inferasim_observe_failures_total", "Failed workload observations, by reason.",
                           ["reason"], registry=REGISTRY)
HARVEST_JOBS = Counter("inferasim_harvest_jobs_total", "Harvest Jobs created.", ["engine"], registry=REGISTRY)
HARVEST_GPU_SECONDS = Counter("inferasim_harvest_gpu_seconds_total",
                              "GPU-seconds spent by finished harvest Jobs (run time x GPUs).", ["engine", "result"],
                              registry=REGISTRY)
CANARY_ERROR = Histogram("inferasim_canary_prediction_error",
                         "Measured / predicted ITL p90 - 1 of measured canaries.",
                         buckets=(-0.5, -0.25, -0.1, -0.05, 0, 0.05, 0.1, 0.25, 0.5, 1.0), registry=REGISTRY)
PREDICTION_ERROR = Gauge("inferasim_prediction_error",
                         "Observed / predicted - 1 of the running configuration over the last window, by metric "
                         "(ttft, itl, throughput).", ["namespace", "tuning", "metric"], registry=REGISTRY)
PASSIVE_FITS = Counter("inferasim_passive_fits_total", "Passive anchor fits from live traffic, by result.", ["result"],
                       registry=REGISTRY)
PASS_ERRORS = Counter("inferasim_pass_errors_total",
                      "Passes (reconcile or timer) that ended in an exception, by kind (spec: the tuning is "
                      "Invalid; internal: Degraded) and reason.", ["kind", "reason"], registry=REGISTRY)
RECONCILES = Counter("inferasim_reconciles_total", "Reconcile runs, by trigger and result.", ["trigger", "result"],
                     registry=REGISTRY)

_phases: dict[str, str] = {}
_errors: dict[str, set[tuple[str, str, str]]] = {}  # uid -> label sets of PREDICTION_ERROR
_lock = threading.Lock()


def set_prediction_error(uid: str, namespace: str, tuning: str, relative: dict[str, float]) -> None:
    """Publish the relative errors of one check; metrics not observed this time are removed (a
    stale number would read as a measurement)."""
    with _lock:
        old = _errors.get(uid, set())
        new = {(namespace, tuning, m) for m in relative}
        for labels in old - new:
            PREDICTION_ERROR.remove(*labels)
        for m, v in relative.items():
            PREDICTION_ERROR.labels(namespace=namespace, tuning=tuning, metric=m).set(v)
        _errors[uid] = new


def set_phase(uid: str, phase: str) -> None:
    with _lock:
        _phases[uid] = phase
        _publish()


def forget(uid: str) -> None:
    with _lock:
        _phases.pop(uid, None)
        for labels in _errors.pop(uid, set()):
            PREDICTION_ERROR.remove(*labels)
        _publish()


def _publish() -> None:
    counts = dict.fromkeys(PHASES, 0)
    for p in _phases.values():
        counts[p] = counts.get(p, 0) + 1
    for phase, n in counts.items():
        TUNINGS.labels(phase=phase).set(n)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose /metrics (a daemon thread of prometheus_client)."""
    with _lock:
        _publish()
    start_http_server(port, addr=addr, registry=REGISTRY)

"""The spec as the operator accepts it: the library's TuningSpec plus the operator's own rules
(a target, no trace files, durations it can schedule, windows PromQL can read) and names."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from inferasim.core.spec import SpecError, TuningSpec, parse_spec

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d|w))+$")
_PROMQL_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


MAX_DURATION_S = 366 * 86400.0


def parse_duration(text: str | None, field_name: str) -> float | None:
    """`24h`, `30m`, `1h30m` -> seconds, at most a year; SpecError naming the field otherwise."""
    if text is None:
        return None
    shown = repr(text[:40] + "...") if isinstance(text, str) and len(text) > 40 else repr(text)
    if not isinstance(text, str) or not _DURATION.match(text.strip()):
        raise SpecError(f"{field_name}: {shown} is not a duration such as 30m, 24h or 1h30m")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", text))
    # Bounded: thousands of digits read as an infinite float, which then reached the status patch
    # (a canary's GPU-hours) and made the API server refuse the whole status write.
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise SpecError(f"{field_name}: {shown} is longer than a year (366d)")
    return seconds


def parse_tuning_spec(spec: dict[str, Any], default_prometheus_url: str = "") -> TuningSpec:
    """The spec as the operator accepts it: TuningSpec plus the operator's own rules. An empty
    `workload.prometheus.url` is the operator's default Prometheus (`default_prometheus_url`)."""
    # model_paths=False: a model is a Hugging Face id or a catalog name here, never a path the
    # operator would open on its own filesystem (and whose existence its messages would reveal).
    parsed = parse_spec(json.loads(json.dumps(dict(spec))), model_paths=False)
    prom = parsed.workload.prometheus
    if prom is not None and not prom.url:
        if not default_prometheus_url:
            raise SpecError("workload.prometheus.url: empty, and the operator has no default Prometheus (set the "
                            "chart value prometheus.url, env INFERASIM_PROMETHEUS_URL, or give the URL here)")
        prom.url = default_prometheus_url
    if parsed.target is None:
        raise SpecError("target: required (the Deployment whose workload is tuned)")
    if parsed.workload.trace is not None:
        raise SpecError("workload.trace: the operator observes `prometheus` workloads or takes a `static` one; "
                        "run trace files with `inferasim simulate`")
    parse_duration(parsed.retune.every, "retune.every")
    parse_duration(parsed.confirmation.window, "confirmation.window")
    parse_duration(parsed.confirmation.startup_timeout, "confirmation.startupTimeout")
    if parsed.confirmation.mode != "none" and not _PROMQL_DURATION.match(parsed.confirmation.window.strip()):
        # The window is also a PromQL range (the canary's and the AnalysisTemplate's queries).
        raise SpecError(f"confirmation.window: {parsed.confirmation.window!r} must be whole numbers of units, as "
                        "PromQL reads ranges (90m, not 1.5h)")
    return parsed


def render_name(spec: TuningSpec, tuning_name: str) -> str:
    """Name of the recommended Deployment: the target's, so that GitOps replaces it in place."""
    name = spec.target.name if spec.target else tuning_name
    return name if len(name) <= 63 and _DNS1035.match(name) else tuning_name[:63]

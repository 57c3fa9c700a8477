"""The live workload, observed through the Prometheus HTTP API (DESIGN.md section 6).

Instant queries (`/api/v1/query`) of the serving engine's own metrics, by engine:
vLLM `vllm:*`, SGLang `sglang:*`, ATOM `atom:*` (PromQL of shared/notes/engine-facts.md section 4),
restricted to the target's series by a label selector. The result is an
:class:`~inferasim.observed.ObservedWorkload` (request rate, prompt/output length means and
quantiles, prefix-cache hit rate, running and waiting requests, observed TTFT and ITL) and, from
it, the :class:`~inferasim.core.spec.StaticWorkload` that ``tune`` reads.

A quantity is never made up: a series the engine should export but Prometheus does not have, an
unreachable Prometheus, or a query error raises :class:`ObservationError` carrying the query that
failed. Quantities an engine does not export at all (ATOM has no latency histograms; SGLang
exports length histograms only with ``--collect-tokens-histogram``) are ``None`` and listed in
``unavailable``, again never zero.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from inferasim.core.spec import PrometheusWorkload
from inferasim.errors import InferasimError
from inferasim.observed import LatencyQuantiles, ObservedWorkload, TokenQuantiles
from inferasim.passive import Window

__all__ = [
    "ENGINE_PREFIX",
    "ObservationError",
    "PrometheusClient",
    "detect_engine",
    "observe",
    "observe_windows",
    "parse_duration",
    "quantile_agrees",
    "quantile_bound",
    "queries_for",
    "range_queries",
    "selector_matchers",
]

Engine = Literal["vllm", "sglang", "atom"]
ENGINE_PREFIX: dict[str, str] = {"vllm": "vllm", "sglang": "sglang", "atom": "atom"}
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# PromQL durations: one or more <number><unit>, e.g. 5m, 6h, 1h30m.
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


class ObservationError(InferasimError, RuntimeError):
    """The workload could not be observed. ``query`` is the PromQL (or URL) that failed and
    ``reason`` a short CamelCase word for a Kubernetes condition (Unreachable, MissingSeries,
    QueryError, NoTraffic, BadSelector)."""

    def __init__(self, message: str, query: str = "", reason: str = "QueryError") -> None:
        self.query = query
        self.reason = reason
        super().__init__(message + (f" (query: {query})" if query else ""))


# --------------------------------------------------------------------------------------------
# PromQL per engine
# --------------------------------------------------------------------------------------------


def quantile_bound(engine: str, metric: Literal["ttft", "itl"], limit_s: float) -> float:
    """The value to compare a Prometheus quantile (`histogram_quantile`) of the engine's `metric`
    histogram with, for a limit `limit_s` on the true quantile: the first bucket bound at or above
    `limit_s`.

    histogram_quantile interpolates linearly inside the bucket that holds the quantile, so what it
    reads is not the true quantile: a true ITL p90 of 13 ms in vLLM's (10, 25] ms bucket reads back
    as up to 23.5 ms, and a check "p90 <= 13 ms x 1.25" would fail a deployment that meets its
    prediction. With B the first bound >= limit, "read-back <= B" holds exactly when the true
    quantile is <= B (the cumulative count at B reaches the quantile's rank or it does not), so the
    check never fails a deployment within its limit, and catches any that is a bucket beyond it.
    `limit_s` itself where the engine has no such histogram or the limit is past the last bucket.
    """
    from inferasim.catalog.engines import LATENCY_BUCKETS

    if not limit_s > 0:
        raise ValueError(f"a latency limit must be positive, got {limit_s!r}")
    bounds = LATENCY_BUCKETS.get(engine, {}).get(metric, ())
    return next((b for b in bounds if b >= limit_s * (1 - 1e-9)), limit_s)


def quantile_agrees(engine: str, metric: Literal["ttft", "itl"], read_back_s: float, predicted_s: float,
                    tolerance: float) -> bool:
    """Whether a quantile read back from the engine's histogram is consistent with a true quantile
    within `tolerance` of `predicted_s`, at the histogram's resolution: the read-back must lie
    between the last bucket bound at or below predicted x (1 - tolerance) and the first at or above
    predicted x (1 + tolerance) (see quantile_bound; the same argument bounds it from below). A
    deployment whose true quantile is in the band always agrees; one a bucket outside never does."""
    if not (predicted_s > 0 and 0 <= tolerance < 1):
        raise ValueError(f"need a positive prediction and a tolerance in [0, 1), got {predicted_s!r}, {tolerance!r}")
    from inferasim.catalog.engines import LATENCY_BUCKETS

    low = predicted_s * (1 - tolerance)
    bounds = LATENCY_BUCKETS.get(engine, {}).get(metric, ())
    floor = max((b for b in bounds if b <= low * (1 + 1e-9)), default=0.0) if bounds else low
    return floor <= read_back_s <= quantile_bound(engine, metric, predicted_s * (1 + tolerance))


def selector_matchers(selector: Mapping[str, str]) -> str:
    """`{a="x",b="y"}` with PromQL string escaping; label names are checked (they cannot be quoted)."""
    parts = []
    for name, value in sorted(selector.items()):
        if not isinstance(name, str) or not _LABEL_NAME.match(name):
            raise ObservationError(f"workload.prometheus.selector: {name!r} is not a Prometheus label name "
                                   "(letters, digits and _ only, not starting with a digit)", reason="BadSelector")
        if not isinstance(value, str):
            raise ObservationError(f"workload.prometheus.selector.{name}: the value must be a string, got {value!r}",
                                   reason="BadSelector")
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{name}="{escaped}"')
    return "{" + ",".join(parts) + "}"


@dataclass(frozen=True)
class Quantity:
    """One observed quantity: PromQL alternatives (the current metric name first, older names
    after), whether the engine always exports it, and how to scale the value."""

    name: str
    queries: tuple[str, ...]
    required: bool = True
    scale: float = 1.0
    # A NaN (0/0) that means "not applicable" rather than "not observed": the prefix-cache ratio
    # when the engine never consulted its cache (prefix caching off).
    nan_ok: bool = False


def _rate(metric: str, sel: str, w: str) -> str:
    return f"sum(rate({metric}{sel}[{w}]))"


def _ratio(num: str, den: str, sel: str, w: str) -> str:
    return f"{_rate(num, sel, w)} / {_rate(den, sel, w)}"


def _quantile(q: float, hist: str, sel: str, w: str) -> str:
    return f"histogram_quantile({q:g}, sum by (le) (rate({hist}_bucket{sel}[{w}])))"


def _hist(name: str, hists: tuple[str, ...], sel: str, w: str, required: bool, scale: float = 1.0) -> list[Quantity]:
    return [Quantity(f"{name}_p{round(q * 100)}", tuple(_quantile(q, h, sel, w) for h in hists), required, scale)
            for q in QUANTILES]


def queries_for(engine: str, selector: Mapping[str, str], window: str) -> list[Quantity]:
    """The quantities of one engine, with their PromQL (engine-facts.md section 4)."""
    if engine not in ENGINE_PREFIX:
        raise ObservationError(f"engine {engine!r} has no known metrics; accepted: {', '.join(ENGINE_PREFIX)}",
                               reason="BadSelector")
    if not _DURATION.match(window):
        raise ObservationError(f"workload.prometheus.window: {window!r} is not a Prometheus duration (e.g. 5m, 6h)",
                               reason="BadSelector")
    s, w = selector_matchers(selector), window
    out: list[Quantity]
    if engine == "vllm":
        out = [
            Quantity("request_rate", (_rate("vllm:request_success_total", s, w),)),
            Quantity("prompt_tokens_mean", (_ratio("vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count",
                                                   s, w),)),
            Quantity("output_tokens_mean", (_ratio("vllm:request_generation_tokens_sum",
                                                   "vllm:request_generation_tokens_count", s, w),)),
            # vLLM before 0.9 names the prefix-cache counters gpu_prefix_cache_*.
            Quantity("prefix_hit_rate", (_ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                                                s, w),
                                         _ratio("vllm:gpu_prefix_cache_hits_total",
                                                "vllm:gpu_prefix_cache_queries_total", s, w)), nan_ok=True),
            Quantity("running", (f"sum(vllm:num_requests_running{s})",)),
            Quantity("waiting", (f"sum(vllm:num_requests_waiting{s})",)),
            Quantity("kv_cache_usage", (f"avg(vllm:kv_cache_usage_perc{s})", f"avg(vllm:gpu_cache_usage_perc{s})"),
                     required=False),
            *_hist("prompt_tokens", ("vllm:request_prompt_tokens",), s, w, True),
            *_hist("output_tokens", ("vllm:request_generation_tokens",), s, w, True),
            *_hist("ttft", ("vllm:time_to_first_token_seconds",), s, w, True, 1e3),
            # vLLM older than 0.11 names the ITL histogram time_per_output_token_seconds.
            *_hist("itl", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), s, w, True, 1e3),
        ]
    elif engine == "sglang":
        out = [
            Quantity("request_rate", (_rate("sglang:num_requests_total", s, w),)),
            Quantity("prompt_tokens_mean", (_ratio("sglang:prompt_tokens_total", "sglang:num_requests_total", s, w),)),
            Quantity("output_tokens_mean", (_ratio("sglang:generation_tokens_total", "sglang:num_requests_total",
                                                   s, w),)),
            Quantity("prefix_hit_rate", (_ratio("sglang:cached_tokens_total", "sglang:prompt_tokens_total", s, w),
                                         f"avg(sglang:cache_hit_rate{s})"), nan_ok=True),
            Quantity("running", (f"sum(sglang:num_running_reqs{s})",)),
            Quantity("waiting", (f"sum(sglang:num_queue_reqs{s})",)),
            Quantity("kv_cache_usage", (f"avg(sglang:token_usage{s})",), required=False),
            # Only with --collect-tokens-histogram: optional.
            *_hist("prompt_tokens", ("sglang:prompt_tokens_histogram",), s, w, False),
            *_hist("output_tokens", ("sglang:generation_tokens_histogram",), s, w, False),
            *_hist("ttft", ("sglang:time_to_first_token_seconds",), s, w, True, 1e3),
            *_hist("itl", ("sglang:inter_token_latency_seconds",), s, w, True, 1e3),
        ]
    else:  # atom: no length or latency histograms (n/a in the notes), so they are not queried
        out = [
            Quantity("request_rate", (_rate("atom:requests_finished_total", s, w),)),
            Quantity("prompt_tokens_mean", (_ratio("atom:prompt_tokens_total", "atom:requests_finished_total", s, w),)),
            Quantity("output_tokens_mean", (_ratio("atom:generation_tokens_total", "atom:requests_finished_total",
                                                   s, w),)),
            Quantity("prefix_hit_rate", (_ratio("atom:prefix_cache_cached_tokens_total",
                                                "atom:prefix_cache_full_tokens_total", s, w),
                                         f"avg(atom:prefix_cache_hit_ratio{s})"), nan_ok=True),
            Quantity("running", (f"sum(atom:requests_running{s})",)),
            Quantity("waiting", (f"sum(atom:requests_waiting{s})",)),
            Quantity("kv_cache_usage", (f"avg(atom:kv_cache_usage_ratio{s})",), required=False),
        ]
    return out


# --------------------------------------------------------------------------------------------
# the HTTP client
# --------------------------------------------------------------------------------------------


class PrometheusClient:
    """Instant queries against one Prometheus (sync httpx; the operator calls it off its loop)."""

    def __init__(self, url: str, *, timeout: float = 10.0, headers: Mapping[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        if url == "":
            raise ObservationError("workload.prometheus.url is empty: give the Prometheus HTTP API URL (in the "
                                   "operator, the chart value prometheus.url is the default)", reason="BadSelector")
        if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
            raise ObservationError(f"workload.prometheus.url: {url!r} is not an http(s) URL", reason="BadSelector")
        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, timeout=timeout, headers=dict(headers or {}),
                                    transport=transport)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _data(self, path: str, params: dict[str, str], what: str) -> dict[str, Any]:
        """The `data` of a successful API answer; every failure an ObservationError with the query."""
        promql = params["query"]
        try:
            resp = self._client.get(path, params=params)
        except httpx.InvalidURL as exc:
            # Not an HTTPError: a query no URL can carry (2,000 selector labels made it "too long").
            # No retry fixes it; an edit of the selector does.
            raise ObservationError(f"the query for workload.prometheus.selector cannot be sent to {self.url}: {exc}",
                                   promql[:200], reason="BadSelector") from None
        except httpx.HTTPError as exc:
            raise ObservationError(f"Prometheus at {self.url} is unreachable: {type(exc).__name__}: {exc}",
                                   promql, reason="Unreachable") from None
        try:
            body = resp.json()
        except ValueError:
            raise ObservationError(f"Prometheus at {self.url} answered HTTP {resp.status_code} without JSON "
                                   f"({resp.text[:120]!r})", promql,
                                   reason="Unreachable" if resp.status_code >= 500 else "QueryError") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error", "") if isinstance(body, dict) else ""
            kind = body.get("errorType", "") if isinstance(body, dict) else ""
            raise ObservationError(f"Prometheus at {self.url} refused the {what} (HTTP {resp.status_code} {kind}: "
                                   f"{err})", promql, reason="QueryError")
        return body.get("data") or {}

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """The result vector of an instant query: [{"metric": {...}, "value": [ts, "1.5"]}, ...]."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._data("/api/v1/query", params, "query")
        rtype = data.get("resultType")
        if rtype == "scalar":
            return [{"metric": {}, "value": data.get("result")}]
        if rtype != "vector":
            raise ObservationError(f"expected an instant vector, Prometheus returned {rtype!r}", promql)
        result = data.get("result")
        if not isinstance(result, list):
            raise ObservationError("Prometheus returned a malformed result", promql)
        return result

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The result matrix of a range query: [{"metric": {...}, "values": [[ts, "1.5"], ...]}, ...]."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._data("/api/v1/query_range", params, "range query")
        if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise ObservationError(f"expected a range vector, Prometheus returned {data.get('resultType')!r}", promql)
        return data["result"]

    def series(self, promql: str, start: float, end: float, step: float) -> dict[float, float] | None:
        """The one series of an aggregated range query as {timestamp: value}; None when empty."""
        result = self.query_range(promql, start, end, step)
        if not result:
            return None
        if len(result) > 1:
            raise ObservationError(f"expected one series, got {len(result)}: aggregate the query", promql)
        try:
            return {round(float(ts), 3): float(v) for ts, v in result[0]["values"]}
        except (KeyError, TypeError, ValueError):
            raise ObservationError(f"malformed series {str(result[0])[:120]!r}", promql) from None

    def scalar(self, promql: str, at: float | None = None) -> float | None:
        """The single value of a query; None when the result is empty (no such series)."""
        result = self.query(promql, at)
        if not result:
            return None
        if len(result) > 1:
            raise ObservationError(f"expected one series, got {len(result)}: aggregate the query", promql)
        try:
            return float(result[0]["value"][1])  # Prometheus encodes NaN/+Inf as "NaN"/"+Inf"
        except (KeyError, IndexError, TypeError, ValueError):
            raise ObservationError(f"malformed sample {result[0]!r}", promql) from None


def detect_engine(client: PrometheusClient, selector: Mapping[str, str], at: float | None = None,
                  engines: tuple[str, ...] = ("vllm", "sglang", "atom")) -> str:
    """Which engine's metrics the selected series carry (the first found, in ``engines`` order)."""
    s = selector_matchers(selector)
    inner = s[1:-1]
    tried = []
    for engine in engines:
        q = f'count({{__name__=~"{ENGINE_PREFIX[engine]}:.+"{"," + inner if inner else ""}}})'
        tried.append(q)
        value = client.scalar(q, at)
        if value is not None and value > 0:
            return engine
    raise ObservationError(f"no vllm:*, sglang:* or atom:* series match the selector {s}; is the engine scraped "
                           "and the selector right?", tried[0], reason="MissingSeries")


# --------------------------------------------------------------------------------------------
# observe
# --------------------------------------------------------------------------------------------


def _first_value(client: PrometheusClient, q: Quantity, at: float) -> tuple[float | None, str]:
    """The value of the first alternative that has a series, and the query that answered (or the
    first query when none did)."""
    for promql in q.queries:
        value = client.scalar(promql, at)
        if value is not None:
            return value, promql
    return None, q.queries[0]


def observe(source: PrometheusWorkload | Mapping[str, Any], engine: str = "auto", *,
            at: float | None = None, timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
            clock: Callable[[], float] = time.time) -> ObservedWorkload:
    """Observe the workload of the series selected by ``source`` (url, selector, window).

    ``engine`` names the metric family (vllm, sglang, atom) or "auto" to detect it. All queries are
    evaluated at one instant (``at``, default now) so the quantities are consistent.
    Raises ObservationError (with the failing query) for anything missing or unreachable.
    """
    if not isinstance(source, PrometheusWorkload):
        source = PrometheusWorkload.model_validate(dict(source))
    at = clock() if at is None else at
    with PrometheusClient(source.url, timeout=timeout, transport=transport) as client:
        if engine == "auto":
            engine = detect_engine(client, source.selector, at)
        quantities = queries_for(engine, source.selector, source.window)
        values: dict[str, float | None] = {}
        unavailable: list[str] = []
        rate_q = quantities[0]
        for q in quantities:
            value, promql = _first_value(client, q, at)
            if value is None:
                if q.required:
                    alt = f"; also tried {len(q.queries) - 1} older metric name(s)" if len(q.queries) > 1 else ""
                    raise ObservationError(f"{q.name}: no series for the selector {selector_matchers(source.selector)}"
                                           f" over {source.window}{alt}", promql, reason="MissingSeries")
                unavailable.append(f"{q.name}: {promql}")
                continue
            if q is rate_q and value == 0:
                # A real zero, but nothing to tune for: no request finished in the window.
                raise ObservationError(f"no request finished in the last {source.window}", promql, reason="NoTraffic")
            if math.isnan(value):
                if q.required and not q.nan_ok:
                    raise ObservationError(f"{q.name} is NaN (no observations in the window)", promql,
                                           reason="MissingSeries")
                unavailable.append(f"{q.name}: {promql} (NaN)")
                continue
            if math.isinf(value):
                # A quantile inside the +Inf bucket: above the top bucket bound, not a number to store.
                unavailable.append(f"{q.name}: above the histogram's top bucket ({promql})")
                continue
            values[q.name] = value * q.scale
        if engine == "atom":
            unavailable += ["ttft: ATOM exports no latency histograms", "itl: ATOM exports no latency histograms",
                            "prompt_tokens quantiles: ATOM exports no length histograms",
                            "output_tokens quantiles: ATOM exports no length histograms"]

    def quant(prefix: str, cls: type[TokenQuantiles] | type[LatencyQuantiles]) -> Any:
        keys = [f"{prefix}_p{round(q * 100)}" for q in QUANTILES]
        if not any(k in values for k in keys):
            return None
        fields = ("p50", "p90", "p99") if cls is TokenQuantiles else ("p50_ms", "p90_ms", "p99_ms")
        return cls(**{f: values.get(k) for f, k in zip(fields, keys, strict=True)})

    return ObservedWorkload(
        engine=engine, window=source.window, selector=dict(source.selector), observed_at=at,
        request_rate=values["request_rate"], prompt_tokens_mean=values["prompt_tokens_mean"],
        output_tokens_mean=values["output_tokens_mean"],
        prompt_tokens=quant("prompt_tokens", TokenQuantiles), output_tokens=quant("output_tokens", TokenQuantiles),
        prefix_hit_rate=values.get("prefix_hit_rate"), running=values["running"], waiting=values["waiting"],
        kv_cache_usage=values.get("kv_cache_usage"), ttft=quant("ttft", LatencyQuantiles),
        itl=quant("itl", LatencyQuantiles), unavailable=unavailable)


# --------------------------------------------------------------------------------------------
# range observations: one Window per step (passive anchors, prediction error)
# --------------------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def parse_duration(text: str, what: str = "window") -> float:
    """Seconds of a Prometheus duration (``90s``, ``5m``, ``1h30m``); ObservationError naming ``what``."""
    if not isinstance(text, str) or not _DURATION.match(text):
        raise ObservationError(f"{what}: {text!r} is not a Prometheus duration (e.g. 30s, 5m, 1h)",
                               reason="BadSelector")
    return sum(int(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))


def _promql_duration(seconds: float) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _increase(metric: str, sel: str, w: str) -> str:
    return f"sum(increase({metric}{sel}[{w}]))"


def _mean_of(num: str, den: str, sel: str, w: str) -> str:
    # Ratio of increases: the mean of what was observed within the step (0/0 = NaN when nothing was).
    return f"{_increase(num, sel, w)} / {_increase(den, sel, w)}"


def _hist_mean(hist: str, sel: str, w: str) -> str:
    return _mean_of(f"{hist}_sum", f"{hist}_count", sel, w)


RANGE_QUANTITIES: tuple[str, ...] = ("requests", "prompt_tokens", "output_tokens", "running", "waiting", "ttft",
                                     "itl")


def range_queries(engine: str, selector: Mapping[str, str], step_s: float) -> dict[str, tuple[str, ...]]:
    """PromQL of the per-step quantities of :func:`observe_windows`, each with its alternatives (the
    current metric name first, older names after). Every query is evaluated at the end of each step
    over a range of one step, so consecutive windows do not overlap (but for the boundary sample)."""
    if engine == "atom":
        raise ObservationError("ATOM exports no TTFT or inter-token latency histograms (engine-facts.md section 3), "
                               "so live windows of an ATOM deployment carry no timing to fit; harvest it instead",
                               reason="Unsupported")
    if engine not in ("vllm", "sglang"):
        raise ObservationError(f"engine {engine!r} has no known metrics; accepted: vllm, sglang", reason="BadSelector")
    if not step_s >= 1.0:
        raise ObservationError(f"step: {step_s!r} s is below Prometheus' useful resolution (at least 1s)",
                               reason="BadSelector")
    s, w = selector_matchers(selector), _promql_duration(step_s)
    if engine == "vllm":
        return {
            "requests": (_increase("vllm:request_success_total", s, w),),
            "prompt_tokens": (_hist_mean("vllm:request_prompt_tokens", s, w),),
            "output_tokens": (_hist_mean("vllm:request_generation_tokens", s, w),),
            "running": (f"sum(avg_over_time(vllm:num_requests_running{s}[{w}]))",),
            "waiting": (f"sum(avg_over_time(vllm:num_requests_waiting{s}[{w}]))",),
            "ttft": (_hist_mean("vllm:time_to_first_token_seconds", s, w),),
            # vLLM older than 0.11 names the ITL histogram time_per_output_token_seconds.
            "itl": (_hist_mean("vllm:inter_token_latency_seconds", s, w),
                    _hist_mean("vllm:time_per_output_token_seconds", s, w)),
        }
    return {
        "requests": (_increase("sglang:num_requests_total", s, w),),
        # SGLang adds prompt and generation tokens at finish: their counters give the means of the
        # finished requests without --collect-tokens-histogram.
        "prompt_tokens": (_mean_of("sglang:prompt_tokens_total", "sglang:num_requests_total", s, w),),
        "output_tokens": (_mean_of("sglang:generation_tokens_total", "sglang:num_requests_total", s, w),),
        "running": (f"sum(avg_over_time(sglang:num_running_reqs{s}[{w}]))",),
        "waiting": (f"sum(avg_over_time(sglang:num_queue_reqs{s}[{w}]))",),
        "ttft": (_hist_mean("sglang:time_to_first_token_seconds", s, w),),
        # _sum gains each chunk's whole interval and _count its tokens: sum/count is the mean per token.
        "itl": (_hist_mean("sglang:inter_token_latency_seconds", s, w),),
    }


def observe_windows(source: PrometheusWorkload | Mapping[str, Any], start: float, end: float, step_s: float,
                    engine: str = "auto", *, timeout: float = 10.0,
                    transport: httpx.BaseTransport | None = None) -> list[Window]:
    """One :class:`~inferasim.passive.Window` per ``step_s`` between ``start`` and ``end`` (Unix
    seconds) of the series selected by ``source`` (its url and selector; its window is not used).

    Per step: mean running + waiting requests, mean prompt and output length and mean TTFT and
    inter-token latency of what finished or was observed in the step (increases of the histograms'
    ``_sum`` and ``_count``), and the finished requests. Steps in which no request finished carry
    no lengths or latencies and are left out. Raises ObservationError (with the query) when a series
    is missing, Prometheus refuses or cannot be reached, or the engine is ATOM (no latency histograms).
    """
    if not isinstance(source, PrometheusWorkload):
        source = PrometheusWorkload.model_validate(dict(source))
    if not end > start:
        raise ObservationError(f"the range must end after it starts (start {start}, end {end})", reason="BadSelector")
    first = start + step_s
    if first > end:
        raise ObservationError(f"the range {end - start:g} s is shorter than one step of {step_s:g} s",
                               reason="BadSelector")
    with PrometheusClient(source.url, timeout=timeout, transport=transport) as client:
        if engine == "auto":
            engine = detect_engine(client, source.selector, end, engines=("vllm", "sglang", "atom"))
        queries = range_queries(engine, source.selector, step_s)
        series: dict[str, dict[float, float]] = {}
        for name in RANGE_QUANTITIES:
            got = None
            for promql in queries[name]:
                got = client.series(promql, first, end, step_s)
                if got is not None:
                    break
            if got is None:
                alt = f"; also tried {len(queries[name]) - 1} older metric name(s)" if len(queries[name]) > 1 else ""
                raise ObservationError(f"{name}: no series for the selector {selector_matchers(source.selector)} "
                                       f"between {start:.0f} and {end:.0f}{alt}", queries[name][0],
                                       reason="MissingSeries")
            series[name] = got

    def finite(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None

    out: list[Window] = []
    for ts in sorted(series["requests"]):
        done = finite(series["requests"][ts])
        prompt, output = finite(series["prompt_tokens"].get(ts)), finite(series["output_tokens"].get(ts))
        running, waiting = finite(series["running"].get(ts)), finite(series["waiting"].get(ts))
        if not done or done <= 0 or prompt is None or output is None or running is None or waiting is None:
            continue
        ttft, itl = finite(series["ttft"].get(ts)), finite(series["itl"].get(ts))
        out.append(Window(start=ts - step_s, end=ts, in_flight=running + waiting, prompt_tokens=prompt,
                          output_tokens=output, itl_s=itl, ttft_s=ttft, requests=done))
    return out

"""The emulated engine's `/metrics`: the real engines' metric names, types, buckets and labels.

Every name, type, bucket list and label below is read from `shared/notes/engine-facts.md`, whose
source tags are cited in the comments (V10 / V12 / Vnow: vLLM `vllm/v1/metrics/loggers.py` and
`buckets.py`; S: SGLang `python/sglang/srt/metrics/collector.py`; L: llm-d-inference-sim, an
existing vLLM-metrics emulator used as a cross-check of the exposed names).

Counters and gauges are prometheus_client's own classes in a private CollectorRegistry. A counter
registered as `vllm:prompt_tokens` is exposed as `vllm:prompt_tokens_total` (notes 1, exposition
rules). Histograms are a small collector of our own (`BulkHistogram`) because the engine loop
observes one inter-token gap per running request per step: hundreds of thousands of
observations per second at speedup 20, which per-value `Histogram.observe` calls cannot keep up
with. It is exposed with the same `_bucket{le}`, `_sum`, `_count` samples and type `histogram`.

All latencies are recorded in emulated seconds (real elapsed x speedup), so the exposition looks
like the real engine's at full speed.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from inferasim.catalog.engines import (  # noqa: F401 - re-exported: the emulator's bucket families
    SGLANG_ITL_BUCKETS,
    SGLANG_TTFT_BUCKETS,
    VLLM_ITL_BUCKETS,
    VLLM_TTFT_BUCKETS,
)

# -- bucket families -----------------------------------------------------------------------------

# TTFT and ITL buckets: inferasim.catalog.engines (the comparison of p90s with predictions needs them too).
VLLM_REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0)
# iteration_tokens: 1, 8, 16, ..., 8192, 16384 (powers of 2; notes 1.2, Vnow).
VLLM_ITERATION_TOKEN_BUCKETS: tuple[float, ...] = (1.0,) + tuple(float(2 ** k) for k in range(3, 15))

# Notes 2 (S collector.py).
SGLANG_E2E_BUCKETS: tuple[float, ...] = SGLANG_TTFT_BUCKETS + (600.0, 1200.0, 1800.0, 2400.0)


def request_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM `request_tokens` family: the 1-2-5 series up to max_model_len (notes 1.2; 32768 gives
    1, 2, 5, ..., 10000, 20000)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


# -- a histogram that takes arrays ---------------------------------------------------------------

class BulkHistogram(Collector):
    """A labelled histogram family observed with numpy arrays (optionally weighted).

    `observe(key, values, weights)` adds every value (weight times); `key` selects the label set
    given at construction. Exposition matches prometheus_client's Histogram: cumulative buckets
    named with floatToGoString, a `+Inf` bucket, `_sum` and `_count`."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], labelnames: Sequence[str],
                 labelsets: Sequence[Sequence[str]]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = np.asarray(sorted(float(b) for b in buckets), dtype=float)
        self._bounds_list = self.bounds.tolist()
        self.labelnames = list(labelnames)
        self.labelsets = [list(ls) for ls in labelsets]
        self._counts = np.zeros((len(self.labelsets), self.bounds.size + 1), dtype=np.float64)
        self._sums = np.zeros(len(self.labelsets), dtype=np.float64)
        self._lock = threading.Lock()
        self._le = [floatToGoString(b) for b in self.bounds] + ["+Inf"]

    def observe(self, key: int, values: np.ndarray | Sequence[float] | float,
                weights: np.ndarray | Sequence[float] | float | None = None) -> None:
        vals = np.atleast_1d(np.asarray(values, dtype=float))
        if not vals.size:
            return
        # `le` buckets are inclusive upper bounds: a value equal to a bound goes into that bucket.
        idx = np.searchsorted(self.bounds, vals, side="left")
        if weights is None:
            w = np.ones_like(vals)
        else:
            w = np.broadcast_to(np.asarray(weights, dtype=float), vals.shape)
        add = np.bincount(idx, weights=w, minlength=self.bounds.size + 1)
        with self._lock:
            self._counts[key] += add
            self._sums[key] += float(np.dot(vals, w))

    def observe_one(self, key: int, value: float) -> None:
        i = bisect.bisect_left(self._bounds_list, value)  # scalar path: no numpy call overhead
        with self._lock:
            self._counts[key, i] += 1.0
            self._sums[key] += value

    def count(self, key: int = 0) -> float:
        return float(self._counts[key].sum())

    def collect(self) -> Iterator[HistogramMetricFamily]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            counts = self._counts.copy()
            sums = self._sums.copy()
        for key, labels in enumerate(self.labelsets):
            cum = np.cumsum(counts[key])
            fam.add_metric(labels, buckets=[(le, float(c)) for le, c in zip(self._le, cum, strict=True)],
                           sum_value=float(sums[key]))
        yield fam

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]


class _InfoCollector(Collector):
    """vllm:cache_config_info: a gauge of value 1 whose labels carry the KV-cache config (notes 1.1:
    every CacheConfig field as a string label, `engine` from V12, no `model_name`)."""

    def __init__(self, name: str, documentation: str, labelsets: list[dict[str, str]]) -> None:
        self.name, self.documentation, self.labelsets = name, documentation, labelsets

    def collect(self) -> Iterator[GaugeMetricFamily]:
        keys = sorted(self.labelsets[0]) if self.labelsets else []
        fam = GaugeMetricFamily(self.name, self.documentation, labels=keys)
        for ls in self.labelsets:
            fam.add_metric([ls[k] for k in keys], 1.0)
        yield fam


# -- the engines' metric sets ----------------------------------------------------------------------

class EngineMetrics:
    """Metric objects of one emulated replica, one label set per engine core / dp rank.

    The engine loop calls the `on_*` hooks; each hook takes the rank index. Histogram keys are
    rank indices (vLLM: `engine` = "0".."dp-1", notes 1; SGLang: `dp_rank` under dp attention)."""

    def __init__(self, engine: str, model_name: str, ranks: int, max_model_len: int, block_size: int,
                 kv_tokens_per_rank: int, tp: int = 1, pp: int = 1) -> None:
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        self.ranks = ranks
        self.kv_tokens = kv_tokens_per_rank
        if engine == "sglang":
            self._init_sglang(model_name, ranks, kv_tokens_per_rank)
        else:
            # ATOM is not emulated with its own names (its /metrics has no labels at all, notes 3);
            # anything but SGLang speaks vLLM's.
            self._init_vllm(model_name, ranks, max_model_len, block_size, kv_tokens_per_rank)

    # ---- vLLM (notes 1; V10 / V12 / Vnow loggers.py) ----------------------------------------------
    def _init_vllm(self, model_name: str, ranks: int, max_model_len: int, block_size: int,
                   kv_tokens: int) -> None:
        reg = self.registry
        names = ["model_name", "engine"]
        sets = [[model_name, str(r)] for r in range(ranks)]  # engine = engine-core index (notes 1)

        def gauge(name: str, doc: str) -> list[Gauge]:
            g = Gauge(name, doc, names, registry=reg)
            return [g.labels(*s) for s in sets]

        def counter(name: str, doc: str) -> list[Counter]:
            c = Counter(name, doc, names, registry=reg)
            return [c.labels(*s) for s in sets]

        def hist(name: str, doc: str, buckets: Sequence[float]) -> BulkHistogram:
            h = BulkHistogram(name, doc, buckets, names, sets)
            reg.register(h)
            return h

        # 1.1 gauges
        self.g_running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.g_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.g_kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        # 1.1 counters: registered without `_total`, exposed with it.
        self.c_prompt = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.c_gen = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.c_preempt = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.c_pc_queries = counter("vllm:prefix_cache_queries",
                                    "Prefix cache queries, in terms of number of queried tokens.")
        self.c_pc_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        # request_success: finished_reason = stop | length | abort (V10)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          names + ["finished_reason"], registry=reg)
        self.c_success = [{reason: success.labels(*s, reason) for reason in ("stop", "length", "abort")}
                          for s in sets]
        # 1.2 histograms
        req_tokens = request_token_buckets(max_model_len)
        self.h_ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                           VLLM_TTFT_BUCKETS)
        self.h_itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                          VLLM_ITL_BUCKETS)
        self.h_e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                          VLLM_REQUEST_LATENCY_BUCKETS)
        self.h_queue = hist("vllm:request_queue_time_seconds",
                            "Histogram of time spent in WAITING phase for request.", VLLM_REQUEST_LATENCY_BUCKETS)
        self.h_prefill = hist("vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.", VLLM_REQUEST_LATENCY_BUCKETS)
        self.h_decode = hist("vllm:request_decode_time_seconds",
                             "Histogram of time spent in DECODE phase for request.", VLLM_REQUEST_LATENCY_BUCKETS)
        self.h_inference = hist("vllm:request_inference_time_seconds",
                                "Histogram of time spent in RUNNING phase for request.", VLLM_REQUEST_LATENCY_BUCKETS)
        self.h_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", req_tokens)
        self.h_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", req_tokens)
        self.h_max_tokens = hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
                                 req_tokens)
        # The family name ends in `_total` but it is a histogram (notes 1.2).
        self.h_iter = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                           VLLM_ITERATION_TOKEN_BUCKETS)
        blocks = kv_tokens // max(block_size, 1)
        reg.register(_InfoCollector("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [
            {"block_size": str(block_size), "cache_dtype": "auto", "enable_prefix_caching": "True",
             "gpu_memory_utilization": "0.9", "num_gpu_blocks": str(blocks), "engine": str(r)}
            for r in range(ranks)]))

    # ---- SGLang (notes 2; S collector.py) ---------------------------------------------------------
    def _init_sglang(self, model_name: str, ranks: int, kv_tokens: int) -> None:
        reg = self.registry
        # Tokenizer-side families carry `model_name` (+ `engine_type` in the newest versions);
        # scheduler-side ones add tp_rank, pp_rank, moe_ep_rank, and dp_rank under dp attention.
        tok_names = ["model_name", "engine_type"]
        tok_set = [model_name, "unified"]
        sch_names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        sch_sets = [[model_name, "unified", "0", "0", "0"] for _ in range(ranks)]
        if ranks > 1:
            sch_names.append("dp_rank")
            for r, s in enumerate(sch_sets):
                s.append(str(r))

        def gauge(name: str, doc: str) -> list[Gauge]:
            g = Gauge(name, doc, sch_names, registry=reg)
            return [g.labels(*s) for s in sch_sets]

        def counter(name: str, doc: str) -> list[Counter]:
            # The tokenizer manager is one process for all ranks: one series, shared by the ranks.
            c = Counter(name, doc, tok_names, registry=reg).labels(*tok_set)
            return [c] * ranks

        def hist(name: str, doc: str, buckets: Sequence[float]) -> BulkHistogram:
            h = BulkHistogram(name, doc, buckets, tok_names, [tok_set])
            reg.register(h)
            return h

        self.g_running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.g_waiting = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.g_kv = gauge("sglang:token_usage", "The token usage.")
        self.g_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.g_max_tokens = gauge("sglang:max_total_num_tokens",
                                  "Maximum total number of tokens in the KV cache pool.")
        self.g_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.g_gen_tput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        for g in self.g_max_tokens:
            g.set(kv_tokens)
        # Counters: the names already end in _total (S); prometheus_client strips and re-adds it.
        self.c_prompt = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.")
        self.c_gen = counter("sglang:generation_tokens_total", "Number of generation tokens processed.")
        self.c_cached = counter("sglang:cached_tokens_total", "Number of cached prompt tokens.")
        self.c_requests = counter("sglang:num_requests_total", "Number of requests processed.")
        self.c_aborted = counter("sglang:num_aborted_requests_total", "Number of requests aborted.")
        self.h_ttft = hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                           SGLANG_TTFT_BUCKETS)
        self.h_itl = hist("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                          SGLANG_ITL_BUCKETS)
        self.h_e2e = hist("sglang:e2e_request_latency_seconds",
                          "Histogram of End-to-end request latency in seconds", SGLANG_E2E_BUCKETS)

    # ---- hooks -------------------------------------------------------------------------------------
    @property
    def is_sglang(self) -> bool:
        return self.engine == "sglang"

    def _key(self, rank: int) -> int:
        # SGLang histograms are tokenizer-side: one series for all ranks.
        return 0 if self.is_sglang else rank

    def set_state(self, rank: int, running: int, waiting: int, used_tokens: int, gen_tput: float = 0.0) -> None:
        self.g_running[rank].set(running)
        self.g_waiting[rank].set(waiting)
        usage = used_tokens / self.kv_tokens if self.kv_tokens else 0.0
        self.g_kv[rank].set(usage)
        if self.is_sglang:
            self.g_used_tokens[rank].set(used_tokens)
            self.g_gen_tput[rank].set(gen_tput)

    def on_admitted(self, rank: int, prompt_tokens: int) -> None:
        """A request's prompt was looked up in the prefix cache (no hits: the emulator caches nothing)."""
        if not self.is_sglang:
            self.c_pc_queries[rank].inc(prompt_tokens)
            self.c_pc_hits[rank].inc(0)

    def on_first_tokens(self, rank: int, ttfts: np.ndarray, prompt_tokens: int) -> None:
        """Requests that emitted their first token in one step. vLLM adds the prompt to
        `prompt_tokens` at that moment (V10 stats.py); SGLang adds prompt tokens at finish."""
        self.h_ttft.observe(self._key(rank), ttfts)
        if not self.is_sglang:
            self.c_prompt[rank].inc(prompt_tokens)

    def on_tokens(self, rank: int, n_tokens: int, gaps: np.ndarray | None, gap_weights: np.ndarray | None = None,
                  iteration_tokens: np.ndarray | None = None) -> None:
        """Generated tokens of a run of steps: inter-token gaps (with weights) and, for vLLM, the
        tokens of each step. vLLM counts generation tokens as they are produced; SGLang at finish."""
        if gaps is not None and gaps.size:
            self.h_itl.observe(self._key(rank), gaps, gap_weights)
        if not self.is_sglang:
            self.c_gen[rank].inc(n_tokens)
            if iteration_tokens is not None and iteration_tokens.size:
                self.h_iter.observe(rank, iteration_tokens)

    def on_preempted(self, rank: int, n: int) -> None:
        if n and not self.is_sglang:
            self.c_preempt[rank].inc(n)

    def on_finished(self, rank: int, reason: str, prompt: int, output: int, max_tokens: int, e2e: float,
                    queue: float | None, prefill: float | None, decode: float | None,
                    inference: float | None) -> None:
        key = self._key(rank)
        self.h_e2e.observe_one(key, e2e)
        if self.is_sglang:
            self.c_prompt[rank].inc(prompt)
            self.c_gen[rank].inc(output)
            self.c_requests[rank].inc()
            self.c_cached[rank].inc(0)
            if reason == "abort":
                self.c_aborted[rank].inc()
            return
        self.c_success[rank][reason].inc()
        self.h_prompt.observe_one(key, float(prompt))
        self.h_gen.observe_one(key, float(output))
        self.h_max_tokens.observe_one(key, float(max_tokens))
        if queue is not None:
            self.h_queue.observe_one(key, queue)
        if prefill is not None:
            self.h_prefill.observe_one(key, prefill)
        if decode is not None:
            self.h_decode.observe_one(key, decode)
        if inference is not None:
            self.h_inference.observe_one(key, inference)

"""Results of a trace-simulator run (DESIGN.md section 4): per-request records, latency
percentiles, throughput, goodput under an SLO, KV usage and prefix hit rate over time.

Inter-token latency is exact, not sampled. Every decode step of a rank ends at a time in the
rank's list `E`, and a decoding request emits one token at the end of each of its rank's decode
steps; so all of its gaps but the first after it (re)starts decoding are differences of
consecutive `E`, and the rank records how many requests continued from one decode step to the
next (the weight of that difference). The first gaps and the gaps across a preemption are
recorded one by one. Pooling the weighted differences and the single gaps gives the distribution
of every inter-token gap of the run (as `vllm bench serve` pools ITLs), and a range maximum over
`E`'s differences gives each request's largest gap. Percentiles are the inverted CDF of that
weighted distribution (the smallest gap with at least q of the gaps at or below it).

The report streams (`inferasim.sim.tally`): those gaps, and every request's TTFT, TPOT, E2E and
largest gap, go into quantile sketches as the run goes, so its memory does not grow with the
trace. Means, counts, throughput and goodput are exact; percentiles are within the sketches'
relative error (`inferasim.sim.sketch.ALPHA`, 0.25%) of the exact inverted CDF. Per-request
records (`SimReport.requests`) are kept only when asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferasim.output import table
from inferasim.sim.core import Core
from inferasim.sim.request import SimRequest
from inferasim.sim.tally import Tally, stats_ms

QUANTILES = (50, 90, 99)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[int, ...] = QUANTILES) -> list[float]:
    """Exact inverted-CDF percentiles of weighted values: what the sketches of the streaming
    report approximate (tests compare the two)."""
    if values.size == 0:
        return [math.nan] * len(qs)
    order = np.argsort(values, kind="stable")
    v = values[order]
    cum = np.cumsum(weights[order], dtype=float)
    total = cum[-1]
    if total <= 0:
        return [math.nan] * len(qs)
    idx = np.searchsorted(cum, np.array(qs, dtype=float) / 100.0 * total, side="left")
    return [float(v[min(i, v.size - 1)]) for i in idx]


@dataclass
class SimReport:
    """What `simulate_workload` returns; `as_dict()` is the JSON of `inferasim simulate`."""

    requests: list[SimRequest]  # client requests (dropped ones included) when records were asked for, else []
    gpus: int
    replicas: int
    duration: float  # s, first arrival to last token delivered
    ttft: dict[str, float | None]
    itl: dict[str, float | None]
    tpot: dict[str, float | None]
    e2e: dict[str, float | None]
    max_itl: dict[str, float | None]  # distribution over requests of their largest gap
    throughput: float  # output tokens/s, all replicas
    total_throughput: float  # prompt + output tokens/s
    request_throughput: float
    goodput: dict[str, Any]
    prefix_hit_rate: float
    host_hit_rate: float
    prefill_tokens: int  # prompt tokens computed (cache misses and recomputation)
    kv: dict[str, Any]
    preemptions: int
    steps: int
    series: dict[str, list[float]]
    config: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)  # issued, completed, dropped (records or not)
    reasons: dict[str, int] = field(default_factory=dict)  # dropped requests by cause
    # The sequence limit each rank ran under (vLLM's capped at the token budget) and the most
    # requests any rank held at once: below the limit, the limit never bound.
    limits: dict[str, int] = field(default_factory=dict)

    @property
    def completed(self) -> list[SimRequest]:
        return [r for r in self.requests if r.dropped is None and r.finish is not None]

    @property
    def dropped(self) -> list[SimRequest]:
        return [r for r in self.requests if r.dropped is not None]

    @property
    def throughput_per_gpu(self) -> float:
        return self.throughput / self.gpus if self.gpus else 0.0

    @property
    def n_requests(self) -> int:
        return self.counts.get("issued", len(self.requests))

    @property
    def n_completed(self) -> int:
        return self.counts.get("completed", len(self.completed))

    @property
    def n_dropped(self) -> int:
        return self.counts.get("dropped", len(self.dropped))

    def dropped_reasons(self) -> dict[str, int]:
        """Dropped requests by cause (the reason's words before its first colon)."""
        return dict(self.reasons)

    def as_dict(self, series: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "completed": self.n_completed,
            "dropped": self.n_dropped,
            "dropped_reasons": self.dropped_reasons(),
            "requests": self.n_requests,
            "duration_s": self.duration,
            "gpus": self.gpus,
            "replicas": self.replicas,
            "throughput_tok_s": self.throughput,
            "throughput_per_gpu": self.throughput_per_gpu,
            "total_throughput_tok_s": self.total_throughput,
            "request_throughput": self.request_throughput,
            "goodput": self.goodput,
            "prefix_hit_rate": self.prefix_hit_rate,
            "host_hit_rate": self.host_hit_rate,
            "prefill_tokens": self.prefill_tokens,
            "ttft": self.ttft,
            "itl": self.itl,
            "tpot": self.tpot,
            "e2e": self.e2e,
            "max_itl": self.max_itl,
            "ttft_mean_ms": self.ttft["mean"],
            "itl_mean_ms": self.itl["mean"],
            "kv": self.kv,
            "preemptions": self.preemptions,
            "steps": self.steps,
            "config": self.config,
            "limits": self.limits,
            "wall_s": self.wall_s,
            "sim_s_per_wall_s": self.duration / self.wall_s if self.wall_s > 0 else None,
        }
        if series:
            d["series"] = self.series
        return d

    def request_records(self) -> list[dict[str, Any]]:
        """One record per client request (times in s): what `--requests-out` writes."""
        out = []
        for r in self.requests:
            done = r.dropped is None and r.finish is not None and r.first_token is not None
            out.append({
                "rid": r.rid, "arrival": r.arrival, "prompt": r.prompt, "output": r.output,
                "replica": r.replica, "prefix_hit": max(r.prefix_hit, 0), "preemptions": r.preemptions,
                "ttft": r.ttft if done else None, "tpot": r.tpot if done else None, "e2e": r.e2e if done else None,
                "max_itl": r.max_gap if done and r.output > 1 else None, "dropped": r.dropped,
            })
        return out

    def table(self) -> str:
        def ms(stat: dict[str, float | None]) -> list[Any]:
            return [stat["mean"], stat["p50"], stat["p90"], stat["p99"]]

        rows = [["TTFT (ms)", *ms(self.ttft)], ["ITL (ms)", *ms(self.itl)], ["TPOT (ms)", *ms(self.tpot)],
                ["E2E (ms)", *ms(self.e2e)], ["max gap / request (ms)", *ms(self.max_itl)]]
        lat = table(["latency", "mean", "p50", "p90", "p99"], rows)
        g = self.goodput
        reasons = self.dropped_reasons()
        dropped = f"{self.n_dropped}" + (f" ({', '.join(f'{n} {why}' for why, n in sorted(reasons.items()))})"
                                            if reasons else "")
        summary = [
            # Issued: a session that ends at a refused turn issues fewer than the workload asks.
            ("requests issued / completed / dropped", f"{self.n_requests} / {self.n_completed} / {dropped}"),
            ("simulated duration (s)", self.duration),
            ("GPUs (replicas)", f"{self.gpus} ({self.replicas})"),
            ("output tok/s", self.throughput),
            ("output tok/s per GPU", self.throughput_per_gpu),
            ("prompt + output tok/s", self.total_throughput),
            ("requests/s", self.request_throughput),
            (f"goodput req/s ({g['slo']})", g["requests_per_s"]),
            # Without an SLO every completed request counts: a share of 1.00 would read as a verdict.
            ("share of requests within SLO", g["fraction"] if g["slo"] != "none" else "no SLO given"),
            ("prefix cache hit rate", self.prefix_hit_rate),
            ("KV in use, peak share", self.kv["peak_fraction"]),
            ("KV pool per rank (tokens)", self.kv["capacity_tokens_per_rank"]),
            ("preemptions", self.preemptions),
            ("engine steps", self.steps),
        ]
        if self.host_hit_rate:
            summary.insert(10, ("host-tier hit rate", self.host_hit_rate))
        return table(["simulation", "value"], summary) + "\n\n" + lat


def build_report(tally: Tally, requests: list[SimRequest], cores: list[Core], *, gpus: int, replicas: int, steps: int,
                 preemptions: int, kv: dict[str, Any], series: dict[str, list[float]],
                 config: dict[str, Any] | None = None) -> SimReport:
    """The report of a finished run from its tally (every replica flushed with `final`)."""
    duration = tally.duration
    hits = sum(c.hit_tokens for c in cores)
    host_hits = sum(c.host_hit_tokens for c in cores)
    queried = sum(c.query_tokens for c in cores)
    done = int(tally.ttft.count)
    return SimReport(
        requests=requests, gpus=gpus, replicas=replicas, duration=duration,
        ttft=stats_ms(tally.ttft), itl=stats_ms(tally.itl), tpot=stats_ms(tally.tpot), e2e=stats_ms(tally.e2e),
        max_itl=stats_ms(tally.max_itl),
        throughput=tally.out_tokens / duration if duration > 0 else 0.0,
        total_throughput=(tally.out_tokens + tally.prompt_tokens) / duration if duration > 0 else 0.0,
        request_throughput=done / duration if duration > 0 else 0.0,
        goodput=tally.goodput(), prefix_hit_rate=hits / queried if queried else 0.0,
        host_hit_rate=host_hits / queried if queried else 0.0,
        prefill_tokens=sum(c.prefill_tokens for c in cores),
        kv=kv, preemptions=preemptions, steps=steps, series=series, config=config or {},
        counts={"issued": tally.issued, "completed": tally.completed, "dropped": tally.dropped},
        reasons=dict(tally.reasons),
        limits={"max_num_seqs_per_rank": min((c.max_seqs for c in cores), default=0),
                "peak_running_per_rank": max((c.peak_alive for c in cores), default=0)},
    )

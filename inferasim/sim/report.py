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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferasim.output import table
from inferasim.sim.engines import Core, SimRequest

QUANTILES = (50, 90, 99)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[int, ...] = QUANTILES) -> list[float]:
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


def _stats_ms(values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float | None]:
    if values.size == 0:
        return {"mean": None, **{f"p{q}": None for q in QUANTILES}}
    if weights is None:
        weights = np.ones(values.size)
    total = float(weights.sum())
    mean = float((values * weights).sum() / total) if total > 0 else math.nan
    ps = weighted_percentiles(values, weights)
    return {"mean": mean * 1e3, **{f"p{q}": p * 1e3 for q, p in zip(QUANTILES, ps, strict=True)}}


def _range_max(d: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(d[lo_i:hi_i]) for every i (hi > lo), by a sparse table: O(n log n) once."""
    if d.size == 0 or lo.size == 0:
        return np.zeros(lo.size)
    levels = [d]
    k = 1
    while 2 * k <= d.size:
        prev = levels[-1]
        levels.append(np.maximum(prev[:-k], prev[k:]))
        k *= 2
    length = hi - lo
    lvl = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    out = np.empty(lo.size)
    for L in np.unique(lvl):
        sel = lvl == L
        tab = levels[int(L)]
        span = 1 << int(L)
        out[sel] = np.maximum(tab[lo[sel]], tab[hi[sel] - span])
    return out


def itl_samples(cores: list[Core]) -> tuple[np.ndarray, np.ndarray]:
    """Every inter-token gap of the run as (values, weights)."""
    vals, wts = [], []
    for core in cores:
        if len(core.E) > 1:
            e = np.asarray(core.E, dtype=float)
            w = np.asarray(core.cont[1:], dtype=float)
            d = np.diff(e)
            keep = w > 0
            vals.append(d[keep])
            wts.append(w[keep])
        if core.gaps:
            g = np.asarray(core.gaps, dtype=float)
            vals.append(g)
            wts.append(np.ones(g.size))
    if not vals:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(vals), np.concatenate(wts)


def fill_max_gaps(cores: list[Core]) -> None:
    """Each finished request's largest inter-token gap (`SimRequest.max_gap`)."""
    for core in cores:
        reqs = [r for r in core.finished if r.segs]
        if not reqs or len(core.E) < 2:
            continue
        d = np.diff(np.asarray(core.E, dtype=float))
        owner, lo, hi = [], [], []
        for i, r in enumerate(reqs):
            for a, b in r.segs:  # type: ignore[union-attr]
                owner.append(i)
                lo.append(a)
                hi.append(b)
        m = _range_max(d, np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64))
        for i, v in zip(owner, m.tolist(), strict=True):
            if v > reqs[i].max_gap:
                reqs[i].max_gap = v


@dataclass
class SimReport:
    """What `simulate_workload` returns; `as_dict()` is the JSON of `inferasim simulate`."""

    requests: list[SimRequest]  # client requests, issue order (dropped ones included)
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

    @property
    def completed(self) -> list[SimRequest]:
        return [r for r in self.requests if r.dropped is None and r.finish is not None]

    @property
    def dropped(self) -> list[SimRequest]:
        return [r for r in self.requests if r.dropped is not None]

    @property
    def throughput_per_gpu(self) -> float:
        return self.throughput / self.gpus if self.gpus else 0.0

    def dropped_reasons(self) -> dict[str, int]:
        """Dropped requests by cause (the reason's words before its first colon)."""
        reasons: dict[str, int] = {}
        for r in self.dropped:
            key = str(r.dropped).split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
        return reasons

    def as_dict(self, series: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "completed": len(self.completed),
            "dropped": len(self.dropped),
            "dropped_reasons": self.dropped_reasons(),
            "requests": len(self.requests),
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
        dropped = f"{len(self.dropped)}" + (f" ({', '.join(f'{n} {why}' for why, n in sorted(reasons.items()))})"
                                            if reasons else "")
        summary = [
            # Issued: a session that ends at a refused turn issues fewer than the workload asks.
            ("requests issued / completed / dropped", f"{len(self.requests)} / {len(self.completed)} / {dropped}"),
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


def build_report(requests: list[SimRequest], cores: list[Core], *, gpus: int, replicas: int, steps: int,
                 preemptions: int, kv: dict[str, Any], series: dict[str, list[float]],
                 slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None,
                 config: dict[str, Any] | None = None) -> SimReport:
    fill_max_gaps(cores)
    for core in cores:
        for r in core.finished:
            # A client request served in two phases (disaggregated) takes its decode phase's gaps.
            if r.parent is not None and r.prebuilt and r.max_gap > r.parent.max_gap:
                r.parent.max_gap = r.max_gap
    done = [r for r in requests if r.dropped is None and r.finish is not None and r.first_token is not None]
    arrival = np.array([r.arrival for r in done])
    first = np.array([r.first_token for r in done], dtype=float)
    finish = np.array([r.finish for r in done], dtype=float)
    out = np.array([r.output for r in done], dtype=float)
    prompt = np.array([r.prompt for r in done], dtype=float)
    if done:
        duration = float(finish.max() - min(r.arrival for r in requests))
    else:
        duration = 0.0
    ttft = first - arrival
    multi = out > 1
    tpot = (finish - first)[multi] / (out[multi] - 1.0)
    e2e = finish - arrival
    gaps, weights = itl_samples(cores)
    max_gap = np.array([r.max_gap for r in done if r.output > 1], dtype=float)
    ok = np.ones(len(done), dtype=bool)
    if slo_ttft_ms is not None:
        ok &= ttft * 1e3 <= slo_ttft_ms
    if slo_itl_ms is not None:
        per_req_itl = np.where(multi, (finish - first) / np.maximum(out - 1.0, 1.0), 0.0)
        ok &= per_req_itl * 1e3 <= slo_itl_ms
    slo_text = ", ".join(s for s in (f"TTFT <= {slo_ttft_ms:g} ms" if slo_ttft_ms is not None else "",
                                     f"ITL <= {slo_itl_ms:g} ms" if slo_itl_ms is not None else "") if s) or "none"
    goodput = {
        "slo": slo_text,
        "slo_ttft_ms": slo_ttft_ms,
        "slo_itl_ms": slo_itl_ms,
        "requests_per_s": float(ok.sum() / duration) if duration > 0 else 0.0,
        "tok_s": float(out[ok].sum() / duration) if duration > 0 else 0.0,
        "fraction": float(ok.mean()) if ok.size else 0.0,
    }
    hits = sum(c.hit_tokens for c in cores)
    host_hits = sum(c.host_hit_tokens for c in cores)
    queried = sum(c.query_tokens for c in cores)
    return SimReport(
        requests=requests, gpus=gpus, replicas=replicas, duration=duration,
        ttft=_stats_ms(ttft), itl=_stats_ms(gaps, weights), tpot=_stats_ms(tpot), e2e=_stats_ms(e2e),
        max_itl=_stats_ms(max_gap),
        throughput=float(out.sum() / duration) if duration > 0 else 0.0,
        total_throughput=float((out.sum() + prompt.sum()) / duration) if duration > 0 else 0.0,
        request_throughput=float(len(done) / duration) if duration > 0 else 0.0,
        goodput=goodput, prefix_hit_rate=hits / queried if queried else 0.0,
        host_hit_rate=host_hits / queried if queried else 0.0,
        prefill_tokens=sum(c.prefill_tokens for c in cores),
        kv=kv, preemptions=preemptions, steps=steps, series=series, config=config or {},
    )

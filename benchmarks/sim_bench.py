"""Speed of the trace simulator, as ratios measured in the same run.

    python benchmarks/sim_bench.py

- Replay of the whole Mooncake conversation trace (12,031 requests, one hour) on one replica of
  Llama-3.1-70B fp8 on 8 x H100 (tp8, vLLM, prefix caching on; step-time parameters from the
  shipped H100 fp8 anchor): wall time (trace reading and the report included) against the 2 s
  budget, simulated seconds per wall second.
- The decode-run jumps against stepping one iteration at a time (`jump=False`), on the trace's
  first requests at three times its recorded spacing (the rate this replica keeps up with, where
  decode runs are long; at the recorded rate it is saturated and nearly every step carries a
  prefill chunk, which no jump skips): same records, the speed-up.
- Peak Python memory of the whole replay (tracemalloc) against the 500 MB budget.
- Memory flat in the trace's length: the hour repeated 1, 4 and 24 times (each copy an hour after
  the one before), peak RSS of a fresh process (imports and reading the hour included): the list
  driver keeping every request (the baseline) against a `StreamDriver` with records=False (the
  24 copies against the 300 MB target).
- What the replay predicts (TTFT, ITL, throughput), for the record.
"""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from inferasim.core.layout import Layout  # noqa: E402
from inferasim.model.anchors import load_anchor  # noqa: E402
from inferasim.model.predictor import fitted_from_anchor  # noqa: E402
from inferasim.sim.api import simulate_workload  # noqa: E402
from inferasim.sim.request import SimRequest  # noqa: E402
from inferasim.sim.workload import Driver, StreamDriver, load_trace  # noqa: E402

TRACE = REPO.parent / "shared" / "data" / "traces" / "conversation_trace.jsonl"
ANCHOR = REPO / "anchors" / "vllm-meta-llama--llama-3.1-70b-h100_sxm-fp8-tp2-1716c3.json"
LAYOUT = Layout(tp=8)
BUDGET_S = 2.0
SIM_TARGET_S = 0.3  # issue 29: the hour's simulation and report
BUDGET_MB = 500.0
COPIES_MB = 300.0  # peak for 24 copies of the hour, streamed
SLICE = 1000  # requests of the jump / no-jump comparison
SLICE_SCALE = 3.0


def _replay(fitted, sample: int | None = None, jump: bool = True, scale: float = 1.0):  # noqa: ANN001, ANN202
    gc.collect()  # leave no garbage of an earlier run to the timed one
    t0 = time.perf_counter()
    driver = Driver(load_trace(TRACE, sample=sample, time_scale=scale))
    t1 = time.perf_counter()
    rep = simulate_workload(fitted, LAYOUT, driver, jump=jump, slo_ttft_ms=2000.0, slo_itl_ms=100.0)
    t2 = time.perf_counter()
    return rep, t1 - t0, t2 - t1


def bench_replay(fitted) -> dict[str, float]:  # noqa: ANN001
    best = None
    for _ in range(3):  # best of three: the budget is about the code, not a busy machine
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        rep, load_s, sim_s = _replay(fitted)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if best is None or wall < best[0]:
            best = (wall, cpu, load_s, sim_s, rep)
    assert best is not None
    wall, cpu, load_s, sim_s, rep = best
    d = rep.as_dict(series=False)
    print(f"Mooncake conversation trace, {d['completed']} requests ({d['dropped']} dropped), "
          f"{d['duration_s']:,.0f} s simulated, {fitted.model.name} {fitted.precision} on 8 x {fitted.gpu.name} "
          f"{LAYOUT.label()} ({fitted.engine}, prefix caching on)")
    print(f"  wall {wall:.2f} s = {wall / BUDGET_S:.2f} x the {BUDGET_S:.0f} s budget (CPU {cpu:.2f} s; trace reading "
          f"{load_s:.2f} s, simulation + report {sim_s:.2f} s = {sim_s / SIM_TARGET_S:.2f} x the {SIM_TARGET_S} s "
          "target); "
          f"{d['duration_s'] / wall:,.0f} simulated s per wall s")
    print(f"  TTFT ms mean {d['ttft']['mean']:,.0f} p50 {d['ttft']['p50']:,.0f} p90 {d['ttft']['p90']:,.0f} "
          f"p99 {d['ttft']['p99']:,.0f}")
    print(f"  ITL  ms mean {d['itl']['mean']:.1f} p50 {d['itl']['p50']:.1f} p90 {d['itl']['p90']:.1f} "
          f"p99 {d['itl']['p99']:.1f}; TPOT mean {d['tpot']['mean']:.1f}")
    print(f"  output {d['throughput_tok_s']:,.0f} tok/s = {d['throughput_per_gpu']:.1f} tok/s/GPU, prompt + output "
          f"{d['total_throughput_tok_s']:,.0f} tok/s; prefix hit rate {d['prefix_hit_rate']:.3f}; KV peak "
          f"{d['kv']['peak_fraction']:.2f}; {d['preemptions']} preemptions; goodput {d['goodput']['fraction']:.3f} "
          f"of requests within {d['goodput']['slo']}")
    if d["ttft"]["p50"] > 60e3:
        print("  (the trace's recorded rate saturates this one replica: the waiting queue, not the engine, sets "
              "TTFT; the replay is here for its speed)")
    return {"wall_s": wall, "sim_s_per_wall_s": d["duration_s"] / wall, "ttft_mean_ms": d["ttft"]["mean"],
            "itl_p50_ms": d["itl"]["p50"], "throughput_per_gpu": d["throughput_per_gpu"]}


def bench_jump(fitted) -> float:  # noqa: ANN001
    out = 0.0
    for scale in (SLICE_SCALE, 1.0):
        fast, _, t_fast = _replay(fitted, SLICE, jump=True, scale=scale)
        slow, _, t_slow = _replay(fitted, SLICE, jump=False, scale=scale)
        same = fast.steps == slow.steps and all(
            abs(a.finish - b.finish) <= 1e-9 * b.finish and abs(a.first_token - b.first_token) <= 1e-9 * b.first_token
            for a, b in zip(fast.requests, slow.requests, strict=True))
        ratio = t_slow / t_fast
        print(f"decode-run jumps vs one iteration at a time, first {SLICE} requests at {scale:g} x the recorded "
              f"spacing: {t_fast:.2f} s vs {t_slow:.2f} s = {ratio:.1f} x faster ({fast.steps} engine steps; "
              f"same records to 1e-9: {same})")
        out = out or ratio
    return out


def bench_memory(fitted) -> float:  # noqa: ANN001
    gc.collect()
    tracemalloc.start()
    _replay(fitted)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    mb = peak / 1e6
    print(f"peak traced memory of the whole replay: {mb:.0f} MB = {mb / BUDGET_MB:.2f} x the {BUDGET_MB:.0f} MB budget")
    return mb


def _copies(base: list[SimRequest], n: int) -> Iterator[SimRequest]:
    """The hour `n` times, each copy starting a second after the one before ends (same prefixes)."""
    span = base[-1].arrival + 1.0
    rid = 0
    for c in range(n):
        for r in base:
            yield SimRequest(rid, r.arrival + c * span, r.prompt, r.output, r.ids, r.unit, r.id_tokens)
            rid += 1


def peak_child(mode: str, n: int) -> None:
    """In a fresh process: replay `n` copies (mode list: all requests built first and kept; stream:
    read as the replay reaches them, no records) and print the peak RSS in MB."""
    fitted = fitted_from_anchor(load_anchor(ANCHOR))
    base = load_trace(TRACE)
    span = n * (base[-1].arrival + 1.0)
    if mode == "list":
        rep = simulate_workload(fitted, LAYOUT, Driver(list(_copies(base, n))), records=True)
    else:
        rep = simulate_workload(fitted, LAYOUT, StreamDriver(_copies(base, n), span), records=False)
    assert rep.n_completed + rep.n_dropped == n * len(base)
    print(_peak_mb())


def _peak_mb() -> float:
    """This process's peak RSS in MB. Linux's ru_maxrss survives exec (a child started by a big
    parent reads the parent's peak): VmHWM belongs to the new address space."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _peak_rss(mode: str, n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--peak", mode, str(n)], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.split()[-1]), time.perf_counter() - t0


def bench_copies() -> float:
    got = {}
    for mode, n in (("list", 1), ("list", 4), ("stream", 1), ("stream", 4), ("stream", 24)):
        got[mode, n] = _peak_rss(mode, n)
    lst = " / ".join(f"{got['list', n][0]:.0f}" for n in (1, 4))
    st = " / ".join(f"{got['stream', n][0]:.0f}" for n in (1, 4, 24))
    peak24, wall24 = got["stream", 24]
    print(f"Mooncake hour repeated n times, peak RSS of the process: all requests kept (baseline) n = 1 / 4: "
          f"{lst} MB; streamed, no records, n = 1 / 4 / 24: {st} MB ({peak24 / COPIES_MB:.2f} x the "
          f"{COPIES_MB:.0f} MB target for 24; {got['list', 4][0] / got['stream', 4][0]:.2f} x less than the "
          f"baseline at n = 4; the 24 copies in {wall24:.1f} s)")
    return peak24


def main() -> dict[str, float]:
    if not TRACE.exists():
        print(f"skipped the simulator benchmark: {TRACE} not present")
        return {}
    fitted = fitted_from_anchor(load_anchor(ANCHOR))
    out = bench_replay(fitted)
    out["jump_speedup"] = bench_jump(fitted)
    out["peak_mb"] = bench_memory(fitted)
    out["copies24_mb"] = bench_copies()
    return out


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--peak":
        peak_child(sys.argv[2], int(sys.argv[3]))
    else:
        main()

"""Speed and accuracy benchmarks, printed as ratios against baselines measured in the same run.

    make bench

- validate on the whole dev file: wall time, and its ratio to the 60 s budget of the issue, and
  to the time it takes just to read and score the file with an oracle predictor (the baseline:
  what the protocol costs without any modelling);
- the vectorised step-time model against a per-step Python loop of the same model;
- tune (issue 5): >= 5,000 candidates, the simulator on the best 50 with a 2,000-request multi-turn
  workload: wall time against the 10 s budget, stage times and stage-1 candidates/s;
- the bundled example's tune (`inferasim tune examples/llama70b-mi355x.yaml`) against its 2 s target,
  in process and as the command (start-up and output included);
- start-up: `inferasim --help` against a bare interpreter;
- the accuracy figures of `inferasim validate` on the dev files;
- each dev anchor's fit of its own rows, per engine (benchmarks/self_fit.py);
- what the dev file's TTFT leaves to an anchored predictor (benchmarks/ttft_limits.py): the fit's
  TTFT weight against the anchors' self-fit, the error left if each kernel set's level were known,
  and whether an anchor's unexplained TTFT repeats in its kernel set's other rows;
- disaggregated rows carried from the aggregated anchor of the nearest other release, against their
  measurement-free prices (benchmarks/disagg_carried.py);
- the step model against isolated H200 step timings (benchmarks/h200_steps.py): held-out steps,
  tp slices, other models;
- the trace simulator (benchmarks/sim_bench.py): the full Mooncake replay against its 2 s and 500 MB
  budgets, simulated s per wall s, the decode-run jumps against one step at a time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from inferasim.catalog.gpus import get_gpu  # noqa: E402
from inferasim.catalog.models import get_model  # noqa: E402
from inferasim.core.layout import Layout  # noqa: E402
from inferasim.core.runs import BenchRow, RowPrediction, load_rows  # noqa: E402
from inferasim.model.layoutcost import layout_cost  # noqa: E402
from inferasim.model.predictor import AnchoredPredictor  # noqa: E402
from inferasim.model.steptime import StepParams, step_time  # noqa: E402
from inferasim.sources import read_as_run  # noqa: E402
from inferasim.validate import run_validation  # noqa: E402

DATA = REPO.parent / "shared" / "data"
BUDGET_S = 60.0


class _Oracle:
    """Baseline predictor: returns the anchor's first row; costs nothing but the protocol."""

    def fit(self, key: tuple[str, ...], rows: list[BenchRow]) -> _Oracle:
        self.row = rows[0]
        return self

    def predict(self, row: BenchRow) -> RowPrediction:
        return RowPrediction(ttft_ms=self.row.ttft_ms, tpot_ms=self.row.tpot_ms,
                             batch_latency_s=self.row.batch_latency_s, throughput_tok_s=self.row.throughput_tok_s)


def bench_validate(path: Path) -> dict[str, float]:
    # Rows read as `inferasim validate` reads them (the files' source rules), so that these are its figures.
    t0 = time.perf_counter()
    rows = read_as_run(load_rows(path))
    run_validation(rows, _Oracle())
    base = time.perf_counter() - t0
    t0 = time.perf_counter()
    rows = read_as_run(load_rows(path))
    res = run_validation(rows, AnchoredPredictor(), split_by=("engine", "gpu"))
    wall = time.perf_counter() - t0
    s = res.summary
    print(f"validate {path.name}: {wall:.2f} s = {wall / BUDGET_S:.3f} x the 60 s budget, "
          f"{wall / base:.1f} x the protocol-only baseline ({base:.2f} s)")
    for m in ("tpot", "ttft", "throughput_per_gpu", "batch_latency"):
        if s[m]["n"]:
            print(f"  {m:20s} median APE {100 * s[m]['median_ape']:5.1f}%  p90 {100 * s[m]['p90_ape']:6.1f}%  "
                  f"n={s[m]['n']}")
    for m, cov in s["interval_coverage"].items():
        if cov["n"]:
            print(f"  {m:20s} 90% interval covers {100 * cov['share']:5.1f}% of measured values (n={cov['n']})")
    r = s["ranking"]
    if r.get("pairs"):
        equal = r["pair_accuracy_equal_gpus"]
        print(f"  ranking: pair accuracy {r['pair_accuracy']:.3f} ({r['pairs']} pairs), equal-GPU pairs "
              f"{'-' if equal is None else f'{equal:.3f}'} ({r['pairs_equal_gpus']}), top1 {r['top1']:.3f}, "
              f"regret {r['regret']:.4f}")
    for split, groups in s.get("splits", {}).items():
        for name, sub in groups.items():
            parts = [f"{m} {100 * sub[m]['median_ape']:.1f}%" for m in ("tpot", "ttft", "throughput_per_gpu")
                     if sub.get(m, {}).get("n")]
            if parts:
                print(f"    {split}={name}: " + ", ".join(parts))
    return {"wall": wall, "base": base}


def _median_by_gpu(results: list, metric: str) -> dict[str, tuple[float, int]]:
    by: dict[str, list[float]] = {}
    for r in results:
        ape = r.ape(metric)
        if r.status == "ok" and r.row.mode == "agg" and ape is not None:
            by.setdefault(r.row.system, []).append(ape)
            by.setdefault("all", []).append(ape)
    return {g: (100 * float(np.median(v)), len(v)) for g, v in by.items()}


def bench_measurement_free(path: Path) -> None:
    """Issue 28: every kernel set priced from the others' anchors alone (leave one kernel set out),
    against the GPU-family defaults that measurement-free predictions used before (an empty
    population), per engine and GPU; with the 90% intervals' coverage."""
    from inferasim.model import priors

    rows = read_as_run(load_rows(path))
    population = run_validation(rows, AnchoredPredictor(), measurement_free=True, split_by=("engine", "gpu"))
    shrink, priors.SHRINK = priors.SHRINK, float("inf")  # no population: the defaults alone
    try:
        defaults = run_validation(rows, AnchoredPredictor(), measurement_free=True, split_by=("engine", "gpu"))
    finally:
        priors.SHRINK = shrink
    offline = any(r.scenario == "offline" for r in rows)
    metrics = ("throughput_per_gpu", "batch_latency") if offline else ("tpot", "ttft", "throughput_per_gpu")
    print(f"measurement-free (leave one kernel set out) on {path.name}: median APE " + " / ".join(metrics)
          + ", population priors vs GPU-family defaults")
    for name, res in (("population", population), ("defaults", defaults)):
        s = res.summary
        cov = " / ".join(f"{100 * s['interval_coverage'][m]['share']:.0f}%" for m in metrics
                         if s["interval_coverage"].get(m, {}).get("n"))
        print(f"  {name:10s} all: " + " / ".join(f"{100 * s[m]['median_ape']:.1f}%" for m in metrics if s[m]["n"])
              + f"  (90% interval coverage {cov})")
    for split in ("engine", "gpu"):
        for group, sub in population.summary["splits"][split].items():
            other = defaults.summary["splits"][split].get(group, {})
            cells = [f"{100 * sub[m]['median_ape']:.1f}% ({100 * other[m]['median_ape']:.1f}%)" for m in metrics
                     if sub.get(m, {}).get("n") and other.get(m, {}).get("n")]
            if cells:
                print(f"    {split}={group}: " + " / ".join(cells))


def bench_anchor_rules(path: Path) -> None:
    """Issue 23: the figures of both anchor rules side by side, per GPU, with what each anchor costs
    (its share of the rows and of the measured GPU time). Rows are read as their engine ran them
    (inferasim/sources.py), as `inferasim validate` reads them."""
    rows = read_as_run(load_rows(path))
    runs = {rule: run_validation(rows, AnchoredPredictor(), rule=rule) for rule in ("min-gpus", "harvest")}
    offline = any(r.scenario == "offline" for r in rows)
    metrics = ("throughput_per_gpu", "batch_latency") if offline else ("tpot", "ttft", "throughput_per_gpu")
    print(f"anchor rules on {path.name} (median APE per GPU: " + " / ".join(metrics) + "):")
    for rule, res in runs.items():
        s = res.summary
        share, gpu_share = s.get("anchor_share"), s.get("anchor_gpu_time_share")
        print(f"  {rule:8s} anchors: {100 * (share or 0):.1f}% of rows, {100 * (gpu_share or 0):.1f}% of measured "
              f"GPU time; unpredicted {s['unpredicted']['n']}")
    per = {rule: {m: _median_by_gpu(res.results, m) for m in metrics} for rule, res in runs.items()}
    gpus = sorted({g for rule in per.values() for m in rule.values() for g in m}, key=lambda g: (g != "all", g))
    for g in gpus:
        cells = []
        for rule in runs:
            vals = [per[rule][m].get(g) for m in metrics]
            n = next((v[1] for v in vals if v), 0)
            cells.append(f"{rule} " + "/".join(f"{v[0]:.1f}" if v else "-" for v in vals) + f" (n={n})")
        print(f"    {g:10s} " + "   ".join(cells))


def bench_steptime() -> None:
    cost = layout_cost(get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H100"), Layout(tp=4), "fp8")
    p = StepParams()
    n = 20000
    batches = np.random.default_rng(0).integers(1, 256, n).astype(float)
    ctx = np.random.default_rng(1).integers(128, 8192, n).astype(float)
    t0 = time.perf_counter()
    step_time(p, cost, batches, ctx)
    vec = time.perf_counter() - t0
    t0 = time.perf_counter()
    for b, c in zip(batches[:2000], ctx[:2000], strict=True):
        step_time(p, cost, b, c)
    loop = (time.perf_counter() - t0) * n / 2000
    print(f"step_time over {n} batches: vectorised {vec * 1e3:.1f} ms, {loop / vec:.0f} x faster than a "
          f"per-step Python loop ({loop * 1e3:.0f} ms)")


def bench_tune() -> None:
    """Issue 5's target: >= 5,000 candidates, the simulator on the best 50, a 2,000-request
    multi-turn workload, under 10 s on the 2-core machine."""
    from inferasim.core.spec import parse_spec
    from inferasim.search.tune import tune

    spec = parse_spec({
        "model": "Qwen/Qwen3-235B-A22B", "precision": ["fp8", "bf16"],
        "hardware": {"gpu": "MI355X", "gpusPerNode": 8, "maxGPUs": 16}, "engines": ["vllm", "sglang", "atom"],
        "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 2000, "itlP90Ms": 50}},
        "workload": {"static": {"kind": "multi-turn", "sessionsPerSecond": 2, "turns": 4, "thinkTimeS": 10,
                                "inputTokens": 2000, "userTokensPerTurn": 300, "outputTokens": 400,
                                "numRequests": 2000}}})
    t0 = time.perf_counter()
    r = tune(spec, stage2_top=50)
    wall = time.perf_counter() - t0
    t = r.timings
    print(f"tune: {len(r.space.candidates):,} candidates ({len(r.space.pruned)} pruned) in {wall:.2f} s = "
          f"{wall / 10.0:.2f} x the 10 s budget, {wall / 1.5:.2f} x the 1.5 s target; stage 1 {t['stage1']:.2f} s "
          f"({t['candidates_per_s']:,.0f} candidates/s), stage 2 (simulator, best 50) {t['stage2']:.2f} s: "
          f"{t['stage2_simulations']:.0f} simulations for {t['stage2_replays']:.0f} replayed candidates")


def bench_tune_example() -> None:
    """The bundled example (`inferasim tune examples/llama70b-mi355x.yaml`) against the 2 s target."""
    from inferasim.core.spec import load_spec
    from inferasim.search.tune import tune

    t0 = time.perf_counter()
    r = tune(load_spec(REPO / "examples" / "llama70b-mi355x.yaml"))
    wall = time.perf_counter() - t0
    t = r.timings
    rec = r.recommendation
    print(f"tune of the bundled example: {len(r.space.candidates):,} candidates in {wall:.2f} s = {wall / 2.0:.2f} x "
          f"the 2 s target; stage 1 {t['stage1']:.2f} s, stage 2 {t['stage2']:.2f} s "
          f"({t['stage2_simulations']:.0f} simulations); recommends {rec.candidate.label() if rec else None}")
    cli = _median_wall([sys.executable, "-m", "inferasim.cli", "tune", str(REPO / "examples" / "llama70b-mi355x.yaml")])
    print(f"  `inferasim tune examples/llama70b-mi355x.yaml` (start-up and output included): {cli:.2f} s wall, "
          f"median of 3 = {cli / 2.0:.2f} x the 2 s target")


def _median_wall(argv: list[str], runs: int = 3) -> float:
    import subprocess

    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=REPO)
        walls.append(time.perf_counter() - t0)
    return float(np.median(walls))


def bench_startup() -> None:
    """Issue 29: `inferasim --help` against a bare interpreter's start (the baseline, in the same
    run): what the command's imports add."""
    bare = _median_wall([sys.executable, "-c", "pass"])
    helped = _median_wall([sys.executable, "-m", "inferasim.cli", "--help"])
    print(f"start-up: `inferasim --help` {helped:.2f} s wall (median of 3), {helped / bare:.1f} x a bare interpreter "
          f"({bare:.2f} s), {helped - bare:.2f} s for the CLI's imports")


def main() -> int:
    bench_startup()
    bench_steptime()
    bench_tune()
    bench_tune_example()
    files = [DATA / "aic-silicon" / "silicon_dev.csv", DATA / "argonne-offline" / "vllm_offline_dev.csv"]
    for f in files:
        if f.exists():
            out = bench_validate(f)
            if out["wall"] > BUDGET_S:
                print(f"  over budget: {out['wall']:.1f} s > {BUDGET_S} s")
        else:
            print(f"skipped {f}: not present")
    for f in files + [DATA / "rocm-vllm-dev-docker" / "vllm_rocm_mi300x.csv"]:
        if f.exists():
            bench_anchor_rules(f)
    for f in files:
        if f.exists():
            bench_measurement_free(f)
    from benchmarks import self_fit

    self_fit.main()
    from benchmarks import ttft_limits

    ttft_limits.main()
    from benchmarks import disagg_carried

    disagg_carried.main()
    from benchmarks import h200_steps

    h200_steps.main()
    from benchmarks import sim_bench

    sim_bench.main()
    from benchmarks import passive_bench

    passive_bench.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much harvest GPU time passive anchors save.

Scenario: twenty ServingTunings (four workloads each) over five kernel sets; three of the kernel
sets already serve live traffic (vLLM 8B on H100, vLLM 70B fp8 on H100, SGLang Qwen3-32B on
MI300X), two do not (SGLang Qwen3-30B-A3B fp8 on H200, ATOM 70B fp8 on MI355X; ATOM could not
have a passive anchor anyway: it exports no latency histograms).

Without passive anchors every kernel set a tuning needs is harvested once (one harvest serves all
tunings of its kernel set). With them, the live kernel sets are fitted from their own traffic
(`inferasim.passive.fit_passive` on windows of the closed-loop model of known parameters at the
live layout: what `fit_live` gets from Prometheus) and only the others are harvested. GPU-hours
are `tune`'s own estimate for each missing anchor (`harvest_gpu_hours`: the smallest layout's
GPUs x (engine start-up for its weights + the measurement), inferasim.harvest.plan). The store
starts empty so that the shipped anchors do not hide the effect.

    python benchmarks/passive_bench.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from inferasim.catalog.models import get_model  # noqa: E402
from inferasim.core.config import ServingConfig  # noqa: E402
from inferasim.core.layout import Layout  # noqa: E402
from inferasim.core.spec import parse_spec  # noqa: E402
from inferasim.deployment import read_deployment  # noqa: E402
from inferasim.model.anchor_store import AnchorStore  # noqa: E402
from inferasim.model.layoutcost import layout_cost  # noqa: E402
from inferasim.model.steady import closed_loop, engine_sched  # noqa: E402
from inferasim.model.steptime import default_params  # noqa: E402
from inferasim.passive import Window, fit_passive  # noqa: E402
from inferasim.render import render_deployment  # noqa: E402
from inferasim.search.tune import tune  # noqa: E402

# (engine, model, gpu, precision, live layout or None when not running live)
KERNEL_SETS: list[tuple[str, str, str, str, Layout | None]] = [
    ("vllm", "meta-llama/Llama-3.1-8B", "H100", "bf16", Layout(tp=1)),
    ("vllm", "meta-llama/Llama-3.1-70B", "H100", "fp8", Layout(tp=4)),
    ("sglang", "Qwen/Qwen3-32B", "MI300X", "bf16", Layout(tp=2)),
    ("sglang", "Qwen/Qwen3-30B-A3B", "H200", "fp8", None),
    ("atom", "meta-llama/Llama-3.1-70B", "MI355X", "fp8", None),
]
# (input tokens, output tokens, requests/s): four workloads per kernel set -> twenty tunings
WORKLOADS = [(2000, 300, 2.0), (500, 500, 8.0), (8000, 200, 0.5), (1000, 1000, 4.0)]


def spec_for(engine: str, model: str, gpu: str, precision: str, isl: int, osl: int, rate: float) -> Any:
    return parse_spec({
        "model": model, "precision": [precision], "engines": [engine],
        "hardware": {"gpu": gpu, "gpusPerNode": 8, "maxGPUs": 8},
        "objective": {"maximize": "throughputPerGPU", "slo": {"ttftP90Ms": 3000, "itlP90Ms": 60}},
        "workload": {"static": {"kind": "poisson", "requestRate": rate, "inputTokens": isl, "outputTokens": osl,
                                "numRequests": 500}}})


def live_windows(engine: str, model_id: str, gpu_name: str, precision: str, layout: Layout) -> tuple[Any, list[Window]]:
    """The deployment as its manifest reads, and an hour of its traffic as Prometheus windows."""
    cfg = ServingConfig(engine=engine, model=model_id, gpu=gpu_name, layout=layout, precision=precision,
                        engine_version="live")
    live = read_deployment(render_deployment(cfg, "live"))
    model, gpu = get_model(model_id), live.gpu
    ks = live.kernel_set()
    truth = replace(default_params(gpu, engine), t_fixed=default_params(gpu, engine).t_fixed * 1.3, burst=0.0)
    cost = layout_cost(model, gpu, layout, precision, ks.kv_dtype)
    sched = engine_sched(engine, model, gpu, layout, precision, "", ks.kv_dtype)
    rng = np.random.default_rng(0)
    loads = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0])  # quiet night to busy afternoon
    isl, osl = rng.integers(800, 2400, loads.size).astype(float), rng.integers(150, 400, loads.size).astype(float)
    r = closed_loop(truth, cost, sched, isl, osl, loads)
    wins = [Window(start=3600.0 * i, end=3600.0 * (i + 1), in_flight=float(c), prompt_tokens=float(a),
                   output_tokens=float(b), itl_s=float(t) * float(np.exp(rng.normal(0, 0.02))),
                   ttft_s=float(f) * float(np.exp(rng.normal(0, 0.03))), requests=500.0)
            for i, (c, a, b, t, f) in enumerate(zip(loads, isl, osl, r.tpot, r.ttft, strict=True))]
    return live, wins


def harvest_hours(anchor_dir: Path) -> tuple[float, dict[tuple[str, ...], float], int]:
    """GPU-hours of the harvests the twenty tunings need (one per missing kernel set)."""
    needed: dict[tuple[str, ...], float] = {}
    tunings = 0
    for engine, model, gpu, precision, _ in KERNEL_SETS:
        for isl, osl, rate in WORKLOADS:
            r = tune(spec_for(engine, model, gpu, precision, isl, osl, rate), anchor_dirs=[anchor_dir], stage2_top=0)
            tunings += 1
            for m in r.missing_anchors:
                key = (m["engine"], m["model"], m["gpu"], m["precision"])
                needed[key] = max(needed.get(key, 0.0), float(m["harvest_gpu_hours"]))
    return sum(needed.values()), needed, tunings


def main() -> dict[str, float]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as passive_dir:
        without, need_without, tunings = harvest_hours(Path(empty))
        store = AnchorStore(passive_dir)
        fits = []
        for engine, model, gpu, precision, layout in KERNEL_SETS:
            if layout is None:
                continue
            live, wins = live_windows(engine, model, gpu, precision, layout)
            anchor = fit_passive(live.kernel_set(), get_model(model), live.gpu, layout, wins,
                                 source="passive_bench (closed-loop model windows)")
            store.save(anchor)
            fits.append(anchor.fit.rms_log_error if anchor.fit else float("nan"))
        with_passive, need_with, _ = harvest_hours(Path(passive_dir))
    wall = time.perf_counter() - t0
    ratio = without / with_passive if with_passive else float("inf")
    n_live = sum(1 for k in KERNEL_SETS if k[4] is not None)
    print(f"passive anchors: {tunings} tunings over {len(KERNEL_SETS)} kernel sets, {n_live} live "
          "(harvest = smallest layout x (start-up for its weights + measurement))")
    print(f"  harvest GPU-hours without passive anchors: {without:.2f} ({len(need_without)} harvests)")
    print(f"  harvest GPU-hours with passive anchors:    {with_passive:.2f} ({len(need_with)} harvests; passive fits "
          f"rms log error {', '.join(f'{f:.3f}' for f in fits)}, 0 GPU-hours)")
    print(f"  saved {without - with_passive:.2f} GPU-hours: {ratio:.2f} x fewer harvest GPU-hours ({wall:.1f} s)")
    return {"without": without, "with": with_passive, "ratio": ratio}


if __name__ == "__main__":
    main()

"""`inferasim simulate`: run a deployment against a trace or a workload, request by request.

    inferasim simulate --model M --gpu G --engine E --tp N [--ep N --pp N --dp N] [--replicas R
        --router rr|least|prefix | --disagg P:D] [--precision P] [--anchor FILE | --anchors DIR]
        (--trace FILE [--format F --time-scale X --sample N] | --workload SPEC.yaml)
        [--output table|json|yaml] [--plot FILE.png]

`add_cli(subparsers)` registers the subcommand; `inferasim.cli` wires it in. Bad input raises
ValueError with a message that names the option or field (the main command prints it, exit 2).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from inferasim.catalog.userfile import load_yaml, read_user_text
from inferasim.cli.args import (
    anchor_store,
    check_anchor_matches,
    check_output_file,
    check_plot_file,
    check_token_budget,
    draw_plot,
    note_carried,
    note_checkpoint_precision,
    note_multi_node,
    note_poor_anchor,
    precision_name,
    refuse_engine_on_gpu,
    refuse_unservable,
)
from inferasim.cli.args import positive_float as _positive_float
from inferasim.cli.args import positive_int as _positive
from inferasim.core.spec import StaticWorkload, TraceWorkload, plain_validation_error
from inferasim.model.anchors import SHIPPED_ANCHORS
from inferasim.output import OUTPUT_FORMATS, emit

ANCHOR_DIR = SHIPPED_ANCHORS


def add_cli(subparsers: Any) -> None:
    """Register `simulate` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "simulate", help="replay a trace or a workload against a deployment, request by request",
        description="Discrete-event simulation of a deployment (engine scheduler, KV cache with prefix "
                    "caching, replicas behind a router or prefill/decode pools) against a Mooncake or Azure "
                    "trace or a workload spec: TTFT, inter-token latency, throughput, goodput, prefix hits.")
    p.add_argument("--model", required=True, help="Hugging Face id or config.json path")
    p.add_argument("--gpu", required=True, help="GPU name, e.g. H100, h200_sxm, MI355X")
    p.add_argument("--engine", required=True, help="vllm, sglang or atom")
    p.add_argument("--engine-version", default="", help="engine version, e.g. 0.10.1 (default: any)")
    p.add_argument("--precision", type=precision_name, default="auto",
                   help="auto (the checkpoint's), bf16, fp8, fp4 ...")
    p.add_argument("--kv-cache-dtype", default=None, help="auto, bf16, fp8 (default: fp8 for fp8/fp4 precision)")
    p.add_argument("--tp", type=_positive("tp"), default=1, help="tensor-parallel width")
    p.add_argument("--pp", type=_positive("pp"), default=1, help="pipeline stages")
    p.add_argument("--dp", type=_positive("dp"), default=1, help="attention data-parallel ranks")
    p.add_argument("--ep", type=_positive("ep"), default=1, help="expert-parallel width of MoE layers")
    p.add_argument("--replicas", type=_positive("replicas"), default=1, help="replicas behind the router")
    p.add_argument("--router", choices=("rr", "least", "prefix"), default="rr",
                   help="round robin, least outstanding tokens, or prefix-cache aware")
    p.add_argument("--disagg", default=None, metavar="P:D",
                   help="prefill and decode pools of P and D replicas instead of --replicas colocated ones")
    p.add_argument("--max-num-seqs", type=_positive("max-num-seqs"), default=None,
                   help="running requests per engine (default: the engine's)")
    # One flag name across commands (the engines' own); --max-batched-tokens, its old name here, still works.
    p.add_argument("--max-num-batched-tokens", "--max-batched-tokens", dest="max_batched_tokens",
                   type=_positive("max-num-batched-tokens"), default=None,
                   help="tokens per engine step (default: the engine's)")
    p.add_argument("--mixed", action=argparse.BooleanOptionalAction, default=None,
                   help="prefill chunks in decode steps (default: the engine's; SGLang: --enable-mixed-chunk)")
    p.add_argument("--no-prefix-caching", action="store_true", help="turn the engine's prefix cache off")
    p.add_argument("--schedule-policy", choices=("fcfs", "lpm"), default="fcfs", help="SGLang's schedule policy")
    p.add_argument("--host-kv-gb", type=float, default=0.0, help="host memory for offloaded KV per replica (GB)")
    p.add_argument("--anchor", default=None, help="anchor file to take the step-time parameters from")
    p.add_argument("--anchors", action="append", default=None, help="anchor folder(s) (default: anchors/)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", default=None, help="Mooncake JSONL or Azure CSV trace")
    src.add_argument("--workload", default=None, help="workload YAML (the fields of a spec's static workload)")
    p.add_argument("--format", choices=("auto", "mooncake", "azure"), default="auto", help="trace format")
    p.add_argument("--time-scale", type=_positive_float("time-scale"), default=1.0,
                   help="multiply the trace's arrival times (0.5 = twice the rate)")
    p.add_argument("--sample", type=_positive("sample"), default=None,
                   help="only the first N records of the trace file (file order; then sorted by time)")
    p.add_argument("--slo-ttft-ms", type=_positive_float("slo-ttft-ms"), default=None, help="goodput: TTFT limit")
    p.add_argument("--slo-itl-ms", type=_positive_float("slo-itl-ms"), default=None,
                   help="goodput: limit on a request's mean inter-token latency")
    p.add_argument("--seed", type=int, default=0, help="random seed of the workload's sampling (default 0)")
    p.add_argument("--no-series", action="store_true", help="leave the time series out of the JSON")
    p.add_argument("--requests-out", default=None, metavar="FILE.jsonl",
                   help="also write one JSON line per request (TTFT, TPOT, E2E, largest gap, prefix hit)")
    p.add_argument("--plot", default=None, help="draw latency percentiles and KV usage over time (needs matplotlib)")
    p.add_argument("--output", "-o", choices=OUTPUT_FORMATS, default="table",
                   help="table for people, json or yaml for programs")
    p.set_defaults(func=cmd_simulate)


# -- inputs ------------------------------------------------------------------------------------------

def load_workload(path: str | Path) -> StaticWorkload | TraceWorkload:
    """A workload YAML: the fields of `inferasim.core.spec.StaticWorkload` (kind, requestRate, ...), or
    a mapping with one key `static` or `trace` (as in a spec's `workload`)."""
    p = Path(path)
    try:
        data = load_yaml(read_user_text(p, "--workload"))
    except yaml.YAMLError as exc:
        raise ValueError(f"--workload: {p} is not valid YAML: {exc}") from None
    if isinstance(data, dict) and "workload" in data and isinstance(data["workload"], dict):
        data = data["workload"]
    if not isinstance(data, dict):
        raise ValueError(f"--workload: {p} must hold a mapping of workload fields")
    model: type[StaticWorkload] | type[TraceWorkload] = StaticWorkload
    if set(data) == {"static"} or set(data) == {"trace"}:
        key = next(iter(data))
        model = StaticWorkload if key == "static" else TraceWorkload
        data = data[key]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"--workload {p}: " + plain_validation_error(exc, "workload")) from None


def resolve_fitted(args: argparse.Namespace, layout: Any) -> tuple[Any, bool, str]:
    """Step-time parameters: --anchor FILE, else the store's best anchor of (engine, model, GPU,
    precision), else measurement-free defaults (with a note)."""
    from inferasim.catalog.checkpoints import priced_precision
    from inferasim.catalog.engines import normalize_engine
    from inferasim.catalog.gpus import get_gpu
    from inferasim.catalog.models import get_model
    from inferasim.model.anchors import load_anchor
    from inferasim.model.measurement_free import measurement_free
    from inferasim.model.predictor import benchmark_kv_dtype, fitted_from_anchor
    from inferasim.search.tune import anchored_fit

    engine = normalize_engine(args.engine)
    model, gpu = get_model(args.model), get_gpu(args.gpu)
    refuse_engine_on_gpu(engine, gpu)
    precision = priced_precision(args.precision, args.model, model)
    note_checkpoint_precision(engine, args.model, args.precision)
    kv = args.kv_cache_dtype or benchmark_kv_dtype(precision)
    if args.anchor:
        fitted = fitted_from_anchor(load_anchor(args.anchor))
        check_anchor_matches(args.anchor, fitted, engine, model.name, gpu.name, args.precision, args.kv_cache_dtype)
        return fitted, True, fitted.anchor_id
    found = anchored_fit(anchor_store(args.anchors), engine, model, gpu, precision)
    if found is not None:
        fitted = found[0]
        note_carried(fitted)
        note_poor_anchor(fitted)
        return fitted, True, fitted.anchor_id
    fitted = measurement_free(anchor_store(args.anchors), engine, model, gpu, precision, layout,
                              args.engine_version, kv_dtype=kv)
    return fitted, False, "unanchored"


class _Progress:
    """A one-line progress bar on stderr (TTY only)."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.shown = False

    def __call__(self, t: float) -> None:
        if self.span > 0:
            frac = min(t / self.span, 1.0)
            bar = "#" * int(30 * frac)
            msg = f"\rsimulating [{bar:<30}] {100 * frac:5.1f}%  {t:,.0f} / {self.span:,.0f} s simulated"
        else:
            msg = f"\rsimulating  {t:,.0f} s simulated"
        sys.stderr.write(msg)
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 78 + "\r")
            sys.stderr.flush()


def cmd_simulate(args: argparse.Namespace) -> int:
    from inferasim.core.layout import Layout
    from inferasim.sim.api import simulate_workload
    from inferasim.sim.workload import driver_for, load_trace

    layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp, moe_ep=args.ep)
    if args.plot:
        check_plotting()
        check_plot_file("--plot", args.plot)
    if args.requests_out:
        check_output_file("--requests-out", args.requests_out)
    if args.host_kv_gb < 0 or not math.isfinite(args.host_kv_gb):
        raise ValueError(f"--host-kv-gb must be >= 0, got {args.host_kv_gb}")
    if args.disagg and args.replicas != 1:
        raise ValueError("--disagg P:D sets the replicas of both pools; leave --replicas out")
    fitted, anchored, anchor_id = resolve_fitted(args, layout)
    refuse_unservable(fitted.model, fitted.gpu, layout, fitted.engine, fitted.precision, fitted.kv_dtype)
    note_multi_node(fitted.gpu, layout)
    if not anchored:
        print(f"note: no anchor for {fitted.engine} / {fitted.model.name} / {fitted.gpu.name} / {fitted.precision}; "
              "simulating with measurement-free defaults (good for ranking within one engine only)",
              file=sys.stderr)
    w = None
    if args.trace:
        from inferasim.sim.workload import Driver

        trace_notes: list[str] = []
        driver = Driver(load_trace(args.trace, args.format, args.time_scale, args.sample, trace_notes))
        for note in trace_notes:
            print(f"warning: {note}", file=sys.stderr)
        source = f"trace {args.trace}"
    else:
        # The trace options mean nothing to a generated workload: refused, not ignored.
        given = [flag for flag, value, default in (("--format", args.format, "auto"), ("--time-scale", args.time_scale,
                 1.0), ("--sample", args.sample, None)) if value != default]
        if given:
            raise ValueError(f"{', '.join(given)} apply to --trace only; a --workload sets its own requests, rate "
                             "and lengths (numRequests, requestRate, inputTokens, ...)")
        w = load_workload(args.workload)
        driver = driver_for(w, args.seed)
        source = f"workload {args.workload}"
    if not driver.requests and not driver.closed:
        raise ValueError(f"{source} has no requests")
    check_token_budget(fitted.engine, fitted.gpu, layout, args.max_batched_tokens, args.max_num_seqs)
    progress = _Progress(driver.span) if sys.stderr.isatty() else None
    try:
        report = simulate_workload(
            fitted, layout, driver, replicas=args.replicas, max_num_seqs=args.max_num_seqs,
            max_batched_tokens=args.max_batched_tokens, mixed=args.mixed, seed=args.seed, router=args.router,
            prefix_caching=not args.no_prefix_caching, host_kv_bytes=args.host_kv_gb * 1e9, disagg=args.disagg,
            schedule_policy=args.schedule_policy, slo_ttft_ms=args.slo_ttft_ms, slo_itl_ms=args.slo_itl_ms,
            progress=progress, records=bool(args.requests_out or args.plot))  # only these read them
    finally:
        if progress is not None:
            progress.close()
    data = report.as_dict(series=not args.no_series)
    data["anchored"] = anchored
    data["source"] = source
    if not args.trace and not args.disagg:
        _note_lockstep_waves(fitted, layout, w, args, data)
    cfg = report.config
    topo = (f"prefill {cfg['disagg']['prefill']} + decode {cfg['disagg']['decode']} replicas" if cfg["disagg"]
            else f"{cfg['replicas']} replica(s), router {cfg['router']}")
    head = (f"{cfg['engine']} {cfg['model']} on {cfg['gpu']} {cfg['layout_label']} ({cfg['precision']}, "
            f"KV {cfg.get('kv_dtype') or 'auto'}), {topo}; "
            f"{source}; anchor {anchor_id}")
    # The run is done: a file that cannot be written is reported after the result, not instead of it.
    failures: list[str] = []
    plotted = bool(args.plot) and draw_plot(lambda: plot_report(report, args.plot, args.slo_ttft_ms, args.slo_itl_ms),
                                           args.plot, failures)
    if args.requests_out:
        import json

        try:
            with open(args.requests_out, "w") as fh:
                for rec in report.request_records():
                    fh.write(json.dumps(rec) + "\n")
            data["requests_file"] = args.requests_out
        except OSError as exc:
            failures.append(f"--requests-out {args.requests_out}: cannot write ({exc.strerror or exc})")
    emit(data, args.output, head + "\n\n" + report.table())
    if plotted and args.output == "table":
        print(f"plot written to {args.plot}")
    for failure in failures:
        print(f"inferasim simulate: error: {failure}", file=sys.stderr)
    if failures:
        return 1
    if data.get("completed") == 0:
        # Every request dropped (too long for the model or the KV pool): a failed run, not a fast one.
        reasons = "; ".join(f"{n} x {why}" for why, n in (data.get("dropped_reasons") or {}).items())
        print(f"inferasim simulate: no request completed ({data.get('dropped', '?')} dropped: {reasons or '?'})",
              file=sys.stderr)
        return 1
    return 0


# -- plot ------------------------------------------------------------------------------------------

def check_plotting() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib, which is not installed (pip install matplotlib)") from None


def plot_report(report: Any, path: str, slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None) -> None:
    """TTFT and ITL percentiles by arrival window (with the SLO's limits, if given), KV usage and
    prefix hit rate over time."""
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    done = report.completed
    s = report.series
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    if done:
        arr = np.array([r.arrival for r in done])
        ttft = np.array([r.ttft for r in done]) * 1e3
        tpot = np.array([r.tpot for r in done]) * 1e3
        span = max(float(arr.max()), 1e-9)
        edges = np.linspace(0.0, span, 41)
        mids, cols = [], {k: [] for k in ("ttft50", "ttft90", "ttft99", "tpot50", "tpot99")}
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            sel = (arr >= lo) & (arr < hi) if hi < span else (arr >= lo)
            if not sel.any():
                continue
            mids.append((lo + hi) / 2)
            for q in (50, 90, 99):
                cols[f"ttft{q}"].append(np.percentile(ttft[sel], q))
            for q in (50, 99):
                cols[f"tpot{q}"].append(np.percentile(tpot[sel], q))
        for q, style in ((50, "-"), (90, "--"), (99, ":")):
            ax1.plot(mids, cols[f"ttft{q}"], style, color="C0", label=f"TTFT p{q}")
        for q, style in ((50, "-"), (99, ":")):
            ax1.plot(mids, cols[f"tpot{q}"], style, color="C1", label=f"TPOT p{q}")
        for limit, col, name in ((slo_ttft_ms, "C0", "TTFT"), (slo_itl_ms, "C1", "ITL")):
            if limit:
                ax1.axhline(limit, color=col, lw=0.8, alpha=0.7, label=f"{name} SLO {limit:g} ms")
        ax1.set_yscale("log")
    ax1.set_ylabel("ms (by arrival time)")
    ax1.legend(loc="upper left", fontsize=8)
    ax1.set_title(f"{report.config.get('engine')} {report.config.get('model')} on {report.config.get('gpu')} "
                  f"{report.config.get('layout_label')}")
    if s["t_s"]:
        ax2.plot(s["t_s"], s["kv_usage"], label="KV in use")
        ax2.plot(s["t_s"], s["kv_cached"], label="KV in use + cached")
        ax2.plot(s["t_s"], s["prefix_hit_rate"], label="prefix hit rate (cumulative)")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("simulated time (s)")
    ax2.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _note_lockstep_waves(fitted: Any, layout: Any, w: Any, args: argparse.Namespace, data: dict[str, Any]) -> None:
    """A closed loop of fixed lengths with no think time: every client starts at once, and in the
    simulator they keep finishing together, so every request meets a whole wave of prompts. A
    measured benchmark keeps only part of its waves (jitter spreads them), which is what `predict`
    prices (the anchor's wave share): say so, with predict's figures, when the two differ."""
    import numpy as np

    from inferasim.model.layoutcost import layout_cost
    from inferasim.model.steady import closed_loop, engine_sched

    if getattr(w, "kind", None) != "closed" or w.think_time_s > 0 or not data.get("completed"):
        return
    cost = layout_cost(fitted.model, fitted.gpu, layout, fitted.precision, fitted.kv_dtype, fitted.engine,
                       fitted.engine_version)
    sched = engine_sched(fitted.engine, fitted.model, fitted.gpu, layout, fitted.precision, fitted.engine_version,
                         fitted.kv_dtype, max_num_seqs=args.max_num_seqs, max_batched_tokens=args.max_batched_tokens)
    clients = max(int(w.concurrency or 1) // max(args.replicas, 1), 1)
    # The replay's clients are the workload's, not the anchor's benchmark client (client_cap).
    r = closed_loop(replace(fitted.params, client_cap=0.0), cost, sched, np.array([float(w.input_tokens)]),
                    np.array([float(w.output_tokens)]), np.array([float(clients)]))
    ttft = float(r.ttft[0]) * 1e3
    simulated = data["ttft"]["mean"]
    data["benchmark_estimate"] = {"ttft_ms": ttft, "tpot_ms": float(r.tpot[0]) * 1e3}
    if simulated > 1.25 * ttft or simulated < 0.8 * ttft:
        print(f"note: this closed loop starts every client at once with fixed lengths, and the simulator keeps their "
              f"arrival waves in lock step (mean TTFT {simulated:,.0f} ms); a measured benchmark keeps only part of "
              f"them, which `inferasim predict` prices: TTFT {ttft:,.0f} ms, TPOT {float(r.tpot[0]) * 1e3:.2f} ms. "
              "Give the workload a thinkTimeS to spread the clients", file=sys.stderr)

"""`inferasim tune`: search deployments for a spec; its table and its Pareto plot."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from inferasim.cli.args import check_output_file, check_plot_file, draw_plot
from inferasim.cli.usage import UsageError, add_output, anchors_in, stage_progress, usage_check
from inferasim.core.layout import Layout
from inferasim.output import emit, table


def _finite_or_dash(v: float | None) -> float | str:
    return v if v is not None and math.isfinite(v) else "-"


# What the layout column's notation means (a person reading the table meets P2xtp1+D2xtp1 first here).
LAYOUT_NOTATION = ("layout: tpN = N GPUs in tensor parallel, ppN = pipeline stages, dpN = attention data-parallel "
                   "ranks, epN = experts over N GPUs; P2xtp1+D2xtp1 = disaggregated: 2 prefill workers at tp1 and "
                   "2 decode workers at tp1; repl = copies of the whole layout behind one Service")


def _band(value: float, interval_log: Any) -> tuple[float, float] | None:
    """The 90% band of a predicted figure: value / f .. value x f with f = exp(interval_log)."""
    if not isinstance(interval_log, int | float) or not math.isfinite(interval_log) or not value > 0:
        return None
    f = math.exp(interval_log)
    return value / f, value * f


def _band_text(value: float, interval_log: Any) -> str:
    b = _band(value, interval_log)
    return "-" if b is None else f"{b[0]:,.0f}-{b[1]:,.0f}"


def _with_band(value: float, interval_log: Any) -> str:
    if not value > 0:
        return "-"
    b = _band(value, interval_log)
    return f"{value:.0f}" if b is None else f"{value:.0f} [{b[0]:.0f}-{b[1]:.0f}]"


def _slo_line(result: Any, rec: dict[str, Any]) -> str:
    """The SLO asked for, beside what the recommendation is predicted to give at the workload's rate."""
    slo = result.spec.objective.slo
    asked = [f"{name} <= {v:g} ms" for name, v in (("TTFT p90", slo.ttft_p90_ms), ("ITL p90", slo.itl_p90_ms))
             if v is not None]
    p = rec["predicted"]
    got = []
    for name, key in (("TTFT p90", "ttft_p90_ms"), ("ITL p90", "itl_p90_ms")):
        v = p.get(key)
        if isinstance(v, int | float) and math.isfinite(v):
            b = _band(v, p.get("interval_log"))
            got.append(f"{name} {v:.4g} ms" + (f" [{b[0]:.4g}-{b[1]:.4g}]" if b else ""))
    return (f"SLO: {', '.join(asked) or 'none'}; predicted at the workload's rate: {', '.join(got) or '-'} "
            "(90% bands)")


def _tune_table(result: Any) -> str:
    d = result.as_dict()
    lines = [f"Tuning {d['model']} on {d['gpu']} (budget {result.spec.hardware.max_gpus} GPUs): {d['workload']}",
             f"{d['space']['candidates']} candidates scored, {d['space']['pruned']} pruned; "
             f"stage 1 {d['timings_s']['stage1']:.2f} s ({d['timings_s']['candidates_per_s']:,.0f} candidates/s), "
             f"stage 2 {d['timings_s']['stage2']:.2f} s", ""]
    from inferasim.search.estimate import blocking_notes
    from inferasim.search.tune import slo_miss

    rows, misses = [], []
    for i, (e, est) in enumerate(zip(d["shortlist"], result.shortlist(), strict=True), 1):
        p = e["predicted"]
        at_slo = p["throughput_per_gpu_at_slo"]
        rows.append((i, e["engine"], e["precision"], e["shape"], e["replicas"], e["gpus"], e["max_num_seqs"],
                     e["max_num_batched_tokens"], _with_band(at_slo, p.get("interval_log")), p["ttft_p90_ms"],
                     p["itl_p90_ms"], "yes" if e["meets_slo"] else "no",
                     "sim" if p.get("stage") == 2 else "est", e["anchor"][:24] if e["anchor"] else "unanchored"))
        if not e["meets_slo"]:
            # The percentiles shown may all be inside the SLO when what fails is the budget (more
            # replicas needed than it allows) or the rate: say which.
            why = blocking_notes(est)
            term = slo_miss(est, result.spec.objective.slo)
            text = "; ".join(why) + (f" ({term})" if why and term else term)
            misses.append(f"#{i} misses the SLO: {text or 'requests dropped in the simulation'}")
    headers = ["#", "engine", "prec", "layout", "repl", "GPUs", "max seqs", "max tokens", "out tok/s/GPU@SLO [90%]",
               "TTFT p90 ms", "ITL p90 ms", "SLO", "checked", "anchor"]
    if result.spec.hardware.price_per_gpu_hour is not None:
        headers.insert(9, "$/Mtok")
        # No rate within the SLO has no price per token: "-", not inf.
        rows = [(*r[:9], _finite_or_dash(d["shortlist"][i]["predicted"].get("cost_per_million_tokens")), *r[9:])
                for i, r in enumerate(rows)]
    lines.append(table(headers, rows, title="Short list (best first)"))
    # Replayed candidates rank before estimated ones, whatever the figures: an estimate's closed form
    # has not yet met the simulator's tails, so a higher estimate below a replayed row is expected.
    lines.append("checked: sim = replayed request by request, est = closed-form estimate only (the search ranks "
                 "replayed candidates first; the list shows each layout's best, then the next best)")
    lines.append(LAYOUT_NOTATION)
    lines += misses
    rec = d["recommendation"]
    meeting = next((e for e in result.ranked if e.meets_slo), None)
    if rec:
        # Anchored candidates rank first (tune.score): the recommendation may miss the SLO while a
        # measurement-free one meets it. Say which, rather than "none meets it".
        head = "Recommendation" if rec["meets_slo"] else (
            f"No deployment within {result.spec.hardware.max_gpus} GPUs meets the SLO. Closest" if meeting is None
            else "No anchored deployment meets the SLO (a measurement-free "
                 f"{meeting.candidate.engine} {meeting.candidate.layout.label()} x{meeting.replicas} is predicted to; "
                 "harvest its anchor to confirm). Closest anchored")
        at_slo = rec["predicted"]["throughput_per_gpu_at_slo"]
        if rec["meets_slo"] or at_slo > 0:
            how = f"{at_slo:,.0f} tok/s/GPU at the SLO"
        else:
            from inferasim.search.tune import slo_miss

            how = f"misses {slo_miss(result.ranked[0], result.spec.objective.slo) or 'the SLO'}"
        if rec["meets_slo"] or at_slo > 0:
            how += f" (90%: {_band_text(at_slo, rec['predicted'].get('interval_log'))})"
        lines += ["", f"{head}: {rec['engine']} {rec['precision']} {rec['shape']} x{rec['replicas']} "
                      f"({rec['gpus']} GPUs), max_num_seqs {rec['max_num_seqs']}, "
                      f"max_num_batched_tokens {rec['max_num_batched_tokens']}: {how}"
                      + ("" if rec["anchor"] else "  [unanchored: measurement-free, rank within engine]")]
        lines.append(_slo_line(result, rec))
        gap = _pd_router_gap(result)
        if gap:
            lines.append(f"note: P/D: {gap}")
        w = result.spec.workload.static
        if w is not None and w.kind == "multi-turn" and rec["replicas"] > 1:
            lines.append(f"note: {rec['replicas']} replicas keep the sessions' prefix reuse only behind session-affine "
                         "(prefix-aware) routing, as priced; behind a plain Service each turn lands on a random "
                         "replica and keeps about 1/replicas of it (`inferasim simulate --router rr` shows the "
                         "difference)")
        engines = sorted({e["engine"] for e in d["shortlist"] if not e["anchor"]})
        if not rec["anchor"] and len(engines) > 1:
            # Measurement-free defaults rank layouts within one engine; between engines they differ by
            # assumption, not by measurement.
            lines.append(f"note: {', '.join(engines)} are compared measurement-free: which engine serves best is "
                         "not decided until their anchors are harvested (below)")
    cap = d.get("capacity")
    if cap:
        lines += ["", f"Capacity: {cap['headline']}"]
        if cap["answers"]:
            span = "rate_interval" if cap["question"] == "maxRate" else "gpus_interval"
            rows_c = [(a["engine"], a["precision"], a["shape"], a["replicas"], a["gpus"], f"{a['rate']:.2f}",
                       f"[{a[span][0]:.2f}, {a[span][1]:.2f}]" if span == "rate_interval"
                       else f"[{a[span][0]}, {a[span][1]}]", "yes" if a["anchored"] else "no")
                      for a in cap["answers"]]
            lines.append(table(["engine", "prec", "shape", "repl", "GPUs", "req/s", f"{span.split('_')[0]} [90%]",
                                "anchored"], rows_c))
    for x in d["space"]["excluded"]:
        lines.append(f"not considered: {x['what']}: {x['why']}")
    for p in d.get("proposals") or []:
        # An LLM proposer's suggestions, the refused ones with their reason (an unreachable endpoint too).
        lines.append(f"proposal {p['verdict']}: {p['proposal'] or '-'}" + (f" ({p['reason']})" if p["reason"] else ""))
    if len(d["missing_anchors"]) > 1:
        lines.append("missing anchors, most informative first (how much of the leading candidates' 90% bands "
                     "rests on each):")
    for m in d["missing_anchors"]:
        cost = f", ${m['harvest_cost']:.2f}" if m.get("harvest_cost") is not None else ""
        lines.append(f"missing anchor: {m['engine']} {m['precision']} on {m['gpu']} "
                     f"(harvest ~{m['harvest_gpu_hours']:.2f} GPU-hours{cost} at "
                     f"{Layout(**m['harvest_layout']).label()}; band weight {m.get('band_weight', 0.0):.2f})")
    return "\n".join(lines)


def _pd_router_gap(result: Any) -> str | None:
    """Why --manifest renders no P/D router for the recommendation (None: it renders one, or the
    recommendation is colocated)."""
    from inferasim.render_pd import pd_router_gap
    from inferasim.search.deploy import pool_configs

    rec = result.recommendation
    if rec is None or rec.candidate.disagg is None:
        return None
    pools = dict(pool_configs(result, rec))
    return pd_router_gap(rec.candidate.engine, pools["-prefill"].replicas, pools["-decode"].replicas)


def bench_jobs(result: Any, name: str, namespace: str) -> list[dict[str, Any]]:
    """A benchmark Job per short-listed configuration (``name``-bench-1, -2 ...), each running its engine's
    client against Service ``name`` (where `tune --manifest` or `render` deploys it) at the workload's
    mean lengths and rate, annotated with what was predicted for it."""
    from inferasim.render_bench import BenchWorkload, render_bench_job
    from inferasim.render_pod import RenderOptions
    from inferasim.search.deploy import pool_configs, predicted_annotation

    w = result.workload
    static = result.spec.workload.static
    count = static.num_requests if static is not None else 1000
    closed = w.rate is None
    workload = BenchWorkload(input_tokens=max(1, round(w.isl)), output_tokens=max(1, round(w.osl)),
                             request_rate=None if closed else w.rate, num_requests=count,
                             max_concurrency=w.concurrency if closed else None)
    options = RenderOptions.from_spec(result.spec.deploy)
    jobs = []
    for i, e in enumerate(result.shortlist(), 1):
        cfg = pool_configs(result, e)[-1][1]  # the engine, model and GPU; the decode pool's for P/D
        job = render_bench_job(cfg, name, f"{name}-bench-{i}", workload, namespace, options,
                               note=predicted_annotation(result, e))
        job["metadata"]["annotations"]["inferasim.io/configuration"] = e.candidate.label()
        jobs.append(job)
    return jobs


def plot_pareto(result: Any, path: str) -> None:
    """Throughput per GPU against tokens/s per user (every candidate's curve, the Pareto front, the
    recommendation); with `hardware.pricePerGpuHour`, a second panel: $ per million output tokens
    against the same interactivity."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'inferasim[plot]'") from None
    import numpy as np

    from inferasim.search.select import cost_per_million_tokens

    price = result.spec.hardware.price_per_gpu_hour
    osl = result.workload.osl
    if price is None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        cost_ax = None
    else:
        fig, (ax, cost_ax) = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = {"vllm": "tab:blue", "sglang": "tab:orange", "atom": "tab:red"}
    step = max(len(result.ranked) // 3000, 1)  # every candidate's curve, thinned past 3,000 candidates
    for e in result.ranked[::step]:
        col = colors.get(e.candidate.engine, "gray")
        per_gpu = e.curve_rate * osl / e.candidate.gpus_per_replica
        ax.plot(1.0 / e.curve_tpot, per_gpu, ".", color=col, alpha=0.15, ms=3)
        if cost_ax is not None:
            # A GPU-hour buys 3600 x (tokens/s per GPU) tokens; points that serve nothing are left out.
            ok = per_gpu > 0
            cost_ax.plot(1.0 / e.curve_tpot[ok], price * 1e6 / (3600.0 * per_gpu[ok]), ".", color=col, alpha=0.15,
                         ms=3)
    rec = result.recommendation
    if rec is not None and rec.slo_tpot > 0:
        ax.plot([1.0 / rec.slo_tpot], [rec.per_gpu_at_slo(osl)], "*", color="gold", ms=14,
                markeredgecolor="black", label="recommendation (at the SLO)")
        if cost_ax is not None and rec.max_rate_slo > 0:
            cost_ax.plot([1.0 / rec.slo_tpot], [cost_per_million_tokens(rec, osl, price)], "*", color="gold", ms=14,
                         markeredgecolor="black", label="recommendation (at the SLO)")
    xs = [p.tokens_per_user for p in result.pareto]
    ys = [p.throughput_per_gpu for p in result.pareto]
    ax.plot(xs, ys, "k-", lw=1.5, label="Pareto front")
    # The SLO's inter-token limit as the interactivity it asks for: candidates left of it miss it.
    itl = result.spec.objective.slo.itl_p90_ms
    axes = [ax] if cost_ax is None else [ax, cost_ax]
    if itl:
        for a in axes:
            a.axvline(1e3 / itl, color="firebrick", lw=1.0, ls="--", label=f"SLO: ITL p90 {itl:g} ms")
    # Axes from the front, the SLO and the recommendation: every candidate's curve runs out to its
    # lightest load (one request, the highest tokens/s per user), far beyond any choice.
    if xs:
        x_hi = 1.15 * max([*xs, *([1e3 / itl] if itl else [])])
        for a in axes:
            a.set_xlim(0.0, x_hi)
        ax.set_ylim(0.0, 1.15 * max([*ys, rec.per_gpu_at_slo(osl) if rec is not None and rec.slo_tpot > 0 else 0.0]))
    for eng, col in colors.items():
        ax.plot([], [], ".", color=col, label=eng)
    ax.set_xlabel("tokens/s per user (1 / TPOT)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title(f"{result.model.name} on {result.gpu.name}")
    ax.legend(loc="upper right", fontsize=8)
    if cost_ax is not None:
        # Cost is price / throughput per GPU: the throughput front is the cost front.
        front = [(x, price * 1e6 / (3600.0 * y)) for x, y in zip(xs, ys, strict=True) if y > 0]
        if front:
            cost_ax.plot(*np.array(front).T, "k-", lw=1.5, label="Pareto front")
        for eng, col in colors.items():
            cost_ax.plot([], [], ".", color=col, label=eng)
        cost_ax.set_yscale("log")
        cost_ax.set_xlabel("tokens/s per user (1 / TPOT)")
        cost_ax.set_ylabel("$ per million output tokens")
        cost_ax.set_title(f"cost at ${price:g} per GPU-hour")
        cost_ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_tune(args: argparse.Namespace) -> int:
    from inferasim.core.spec import load_spec
    from inferasim.search.tune import tune

    spec = load_spec(args.spec)
    # Before the search, not after it.
    if args.plot is not None:
        usage_check(check_plot_file, "--plot", args.plot)
    if args.bench_jobs is not None:
        usage_check(check_output_file, "--bench-jobs", args.bench_jobs)
    if args.manifest is not None:
        usage_check(check_output_file, "--manifest", args.manifest)
        from inferasim.render import check_k8s_names

        try:
            check_k8s_names(args.name, args.namespace)
        except ValueError as exc:
            raise UsageError(f"--name/--namespace: {exc}") from None
    if args.propose_model != "default" and not args.propose_endpoint:
        raise UsageError("--propose-model names the model at --propose-endpoint; give the endpoint too")
    store = anchors_in(args.anchors)  # a missing folder is refused, unreadable files named
    propose_with = (args.propose_endpoint, args.propose_model) if args.propose_endpoint else None
    result = tune(spec, store=store, progress=None if args.output != "table" else stage_progress,
                  propose_with=propose_with)
    data = result.as_dict()
    # The search is done: a file that cannot be written (or a manifest that cannot be rendered)
    # is reported after the result, which is printed all the same.
    failures: list[str] = []
    plotted = bool(args.plot) and draw_plot(lambda: plot_pareto(result, args.plot), args.plot, failures)
    exported: tuple[Path, Path] | None = None
    if args.plot:
        from inferasim.search.export import write_exports

        try:
            exported = write_exports(data, args.plot)
        except OSError as exc:
            failures.append(f"--plot {args.plot}: the CSVs beside it cannot be written ({exc.strerror or exc})")
    if args.manifest and result.recommendation is not None:
        from inferasim.search.deploy import manifests_for

        try:
            Path(args.manifest).write_text(manifests_for(result, name=args.name, namespace=args.namespace))
            data["manifest_file"] = args.manifest
        except ValueError as exc:
            failures.append(f"--manifest {args.manifest}: not rendered: {exc}")
        except OSError as exc:
            failures.append(f"--manifest {args.manifest}: cannot write ({exc.strerror or exc})")
    if args.bench_jobs and result.shortlist():
        from inferasim.render import to_yaml

        try:
            Path(args.bench_jobs).write_text(to_yaml(bench_jobs(result, args.name, args.namespace)))
            data["bench_jobs_file"] = args.bench_jobs
        except ValueError as exc:
            failures.append(f"--bench-jobs {args.bench_jobs}: not rendered: {exc}")
        except OSError as exc:
            failures.append(f"--bench-jobs {args.bench_jobs}: cannot write ({exc.strerror or exc})")
    emit(data, args.output, _tune_table(result))
    args.result_data = data  # for the demo's next steps
    if args.output == "table":
        if plotted:
            print(f"Pareto plot written to {args.plot}")
        if exported:
            print(f"Pareto front and short list as CSV: {exported[0]}, {exported[1]}")
        if "manifest_file" in data:
            print(f"Deployment manifest written to {args.manifest}")
        if "bench_jobs_file" in data:
            print(f"Benchmark Jobs (one per short-listed configuration, against Service {args.name}) written to "
                  f"{args.bench_jobs}")
    for failure in failures:
        print(f"inferasim tune: error: {failure}", file=sys.stderr)
    if failures:
        return 1
    rec = result.recommendation
    if rec is None or not rec.meets_slo:
        # A pipeline must not roll out a deployment that misses the SLO: exit 1, the result printed.
        if any(e.meets_slo for e in result.ranked):
            print("inferasim tune: the recommended (anchored) deployment misses the SLO; only measurement-free "
                  "candidates are predicted to meet it: harvest their anchors to confirm", file=sys.stderr)
        elif not result.space.candidates:
            print("inferasim tune: nothing to search: every engine, precision and layout was pruned "
                  f"({len(result.space.pruned)}; `-o json` lists space.pruned_reasons)", file=sys.stderr)
        else:
            print("inferasim tune: no deployment meets the SLO (relax objective.slo, raise hardware.maxGPUs, or "
                  "allow more engines/precisions)", file=sys.stderr)
        if "manifest_file" in data:
            print(f"inferasim tune: {args.manifest} holds the closest deployment, annotated "
                  "inferasim.io/predicted meets_slo false", file=sys.stderr)
        return 1
    return 0


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim tune`."""
    p = sub.add_parser("tune", help="search deployments for a spec (the ServingTuning spec fields)")
    p.add_argument("spec", help="SPEC.yaml: a tuning spec or a whole ServingTuning manifest")
    p.add_argument("--anchors", action="append", default=None, help="anchor folder(s) (default: anchors/)")
    p.add_argument("--plot", default=None, help="write the Pareto plot here (.png, .svg, .pdf: the extension picks); "
                                                "the front and the short list go beside it as CSV (STEM.csv, "
                                                "STEM-shortlist.csv)")
    p.add_argument("--manifest", default=None, help="write the recommendation's manifests here (Deployment, Service, "
                                                    "PodDisruptionBudget; for P/D the router and both pools; spec "
                                                    "deploy sets the model cache and pod options)")
    p.add_argument("--bench-jobs", default=None, metavar="FILE",
                   help="write a benchmark Job per short-listed configuration here (the engine's own client against "
                        "Service --name, at the workload's lengths and rate)")
    p.add_argument("--name", default="llm", help="name of the rendered Deployment (with P/D: the router's Service)")
    p.add_argument("--namespace", default="default",
                   help="namespace of the --manifest and --bench-jobs objects (default: default)")
    p.add_argument("--propose-endpoint", default=None,
                   help="OpenAI-compatible endpoint of an LLM that proposes candidates (off by default)")
    p.add_argument("--propose-model", default="default", help="model name to ask at --propose-endpoint")
    add_output(p)
    p.set_defaults(func=cmd_tune)

"""`inferasim harvest run`: register with `add_cli(subparsers)`; `python -m inferasim.harvest run ...` alone."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from inferasim.cli.args import precision_name
from inferasim.cli.emulate import add_layout_args, positive_float, positive_int
from inferasim.cli.torchharvest import add_actions as add_torch_actions
from inferasim.harvest.plan import DEFAULT_PLAN_TEXT, MIN_REQUESTS, REQUESTS_PER_CLIENT, parse_plan
from inferasim.harvest.run import (
    DEFAULT_BUDGET_S,
    DEFAULT_MAX_RMS_LOG_ERROR,
    EXIT_FAILED,
    SPEEDUP_NOTE,
    HarvestConfig,
    HarvestError,
    HarvestReport,
    harvest,
    write_anchor,
)


def add_cli(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `harvest` (with its action `run`) on an argparse subparsers object."""
    p = subparsers.add_parser(
        "harvest", help="measure an engine's OpenAI endpoint and write an anchor",
        description="Drive a running vLLM / SGLang (or emulated) OpenAI-compatible endpoint with a few "
                    "closed-loop benchmark points, fit the step-time parameters, and write an anchor JSON.")
    actions = p.add_subparsers(dest="harvest_action", required=True, metavar="ACTION")
    run = actions.add_parser(
        "run", help="measure, fit and write the anchor",
        description="Exit codes: 0 anchor written; 1 measurement failed (endpoint unreachable, every point "
                    "dropped); 2 bad input; 3 fit too poor (the anchor is not written).")
    run.add_argument("--endpoint", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    run.add_argument("--model", required=True, help="Hugging Face id of the served model (see `inferasim models`)")
    run.add_argument("--gpu", required=True, help="GPU the engine runs on (see `inferasim gpus`)")
    run.add_argument("--engine", required=True, help="vllm, sglang or atom")
    add_layout_args(run)
    run.add_argument("--precision", type=precision_name, default="auto",
                     help="weight precision (auto = the checkpoint's)")
    run.add_argument("--kv-cache-dtype", default=None, help="KV-cache dtype (default: fp8 for fp8/fp4 weights)")
    run.add_argument("--engine-version", default="", help="engine release or build (part of the kernel set)")
    run.add_argument("--engine-image", default="", help="container image measured (recorded in provenance)")
    run.add_argument("--served-model-name", default=None, help="model name to send (default: --model)")
    run.add_argument("--out", required=True, help="anchor file, a folder to write it into, or - for stdout")
    run.add_argument("--budget-s", type=positive_float("budget-s"), default=DEFAULT_BUDGET_S,
                     help="wall-clock budget; points that do not fit are skipped (default %(default)s)")
    run.add_argument("--speedup", type=positive_float("speedup"), default=1.0,
                     help="the endpoint runs X times faster than the engine (an emulator's --speedup)")
    run.add_argument("--plan", default=DEFAULT_PLAN_TEXT,
                     help="points as ISLxOSL@C1,C2;ISLxOSL@C... (default %(default)s)")
    run.add_argument("--min-requests", type=positive_int("min-requests"), default=MIN_REQUESTS,
                     help="requests per point at least (default %(default)s)")
    run.add_argument("--requests-per-client", type=positive_int("requests-per-client"),
                     default=REQUESTS_PER_CLIENT, help="requests per point per client (default %(default)s)")
    run.add_argument("--max-rms-log-error", type=positive_float("max-rms-log-error"),
                     default=DEFAULT_MAX_RMS_LOG_ERROR,
                     help="refuse to write an anchor whose fit is worse (default %(default)s)")
    run.add_argument("--request-timeout-s", type=positive_float("request-timeout-s"), default=600.0,
                     help="give up on one request after this many seconds (default 600)")
    run.add_argument("--no-warmup", action="store_true", help="skip the warm-up request")
    run.add_argument("--timing", choices=("client", "server"), default="client",
                     help="fit the client's TTFT/TPOT (as vllm bench serve measures them; default) or the "
                          "engine's own histograms at /metrics (no client or network latency)")
    run.add_argument("--client", choices=("auto", "raw", "httpx"), default="auto",
                     help="HTTP client of the measured requests: raw (lean stdlib client, the default for "
                          "http://) or httpx (the default for https://)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    run.add_argument("--report", default=None, help="also write a JSON report (points, fit, counters) here")
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    run.set_defaults(func=cmd_harvest)
    add_torch_actions(actions)


def config_from_args(args: argparse.Namespace) -> HarvestConfig:
    return HarvestConfig(
        endpoint=args.endpoint, model=args.model, gpu=args.gpu, engine=args.engine, tp=args.tp, ep=args.ep,
        pp=args.pp, dp=args.dp, precision=args.precision, kv_dtype=args.kv_cache_dtype,
        engine_version=args.engine_version, engine_image=args.engine_image,
        served_model_name=args.served_model_name,
        plan=parse_plan(args.plan, args.min_requests, args.requests_per_client), budget_s=args.budget_s,
        speedup=args.speedup, max_rms_log_error=args.max_rms_log_error, request_timeout_s=args.request_timeout_s,
        warmup=not args.no_warmup, seed=args.seed, client=args.client, timing=args.timing)


def _refuse_unservable_layout(cfg: HarvestConfig) -> None:
    """The layout the engine behind --endpoint was started with: one it would not run (tp not
    dividing the heads, weights beyond HBM) means --tp/--ep/--dp/--pp do not describe it, and an
    anchor recorded under them would price another deployment."""
    from inferasim.catalog.checkpoints import priced_precision
    from inferasim.catalog.engines import normalize_engine
    from inferasim.catalog.gpus import get_gpu
    from inferasim.catalog.models import get_model
    from inferasim.cli.args import refuse_unservable
    from inferasim.model.predictor import benchmark_kv_dtype

    model, gpu = get_model(cfg.model), get_gpu(cfg.gpu)
    precision = priced_precision(cfg.precision, cfg.model, model)
    refuse_unservable(model, gpu, cfg.layout(), normalize_engine(cfg.engine), precision,
                      cfg.kv_dtype or benchmark_kv_dtype(precision))


def check_writable(flag: str, out: str) -> None:
    """ValueError naming `flag` unless `out` can be written (a folder to write into, or a file
    whose missing parent folders can be created), so that no GPU time is spent on a harvest
    whose anchor could not be saved."""
    if out == "-":
        return
    path = Path(out)
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {out!r}: the folder is not writable")
        return
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {out!r}: the file is not writable")
    parent = path.parent
    while not parent.exists():  # write_anchor creates the missing folders
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {out!r}: {str(parent)!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {out!r}: cannot create files under {str(parent)!r} (not writable)")


def cmd_harvest(args: argparse.Namespace) -> int:
    if getattr(args, "harvest_action", "run") != "run":
        raise ValueError(f"unknown harvest action {args.harvest_action!r}; use: run")
    cfg = config_from_args(args)  # ValueError on bad input, before any traffic
    _refuse_unservable_layout(cfg)
    check_writable("--out", args.out)
    if args.report:
        check_writable("--report", args.report)
    if cfg.speedup > 1:
        print(f"note: {SPEEDUP_NOTE.format(s=cfg.speedup)} (the anchor's provenance says so)", file=sys.stderr)

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"harvest: {line}", file=sys.stderr, flush=True)

    try:
        report = harvest(cfg, progress)
    except HarvestError as exc:
        print(f"harvest: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.report:
        try:
            Path(args.report).parent.mkdir(parents=True, exist_ok=True)
            Path(args.report).write_text(json.dumps(report_dict(report), indent=2), encoding="utf-8")
        except OSError as exc:
            print(f"harvest: --report {args.report!r}: cannot write the report: {exc}", file=sys.stderr)
    for line in report.skipped:
        progress(line)
    if report.exit_code != 0 or report.anchor is None:
        print(f"harvest: {report.message or 'no anchor'}", file=sys.stderr)
        return report.exit_code or EXIT_FAILED
    try:
        path = write_anchor(report.anchor, args.out, on_replace=lambda p, kept: progress(
            f"{p} held another anchor: kept it as {kept}"))
    except OSError as exc:
        # The measurement is not lost: the anchor goes to stdout instead.
        print(f"harvest: failed: --out {args.out!r}: cannot write the anchor ({exc}); it follows on stdout",
              file=sys.stderr)
        write_anchor(report.anchor, "-")
        return EXIT_FAILED
    fit = report.fit
    assert fit is not None
    progress(f"fit rms log error {fit.rms_log_error:.3f} over {fit.n_points} points; "
             f"wall {report.wall_s:.1f} s (engine time {report.emulated_s:.1f} s); "
             f"wrote {path if path is not None else 'stdout'}")
    return 0


def report_dict(report: HarvestReport) -> dict[str, object]:
    """The --report JSON: measured points (client and engine views), skips, warnings (a layout the
    endpoint contradicts, points measured again), counters, fit, anchor."""
    return {
        "exit_code": report.exit_code, "message": report.message, "wall_s": report.wall_s,
        "engine_time_s": report.emulated_s, "points": [p.summary() for p in report.points],
        "skipped": report.skipped, "warnings": report.warnings, "server_counter_deltas": report.counters,
        "client_tokens": report.client_tokens,
        "fit": None if report.fit is None else {
            "rms_log_error": report.fit.rms_log_error, "max_abs_log_error": report.fit.max_abs_log_error,
            "per_metric": report.fit.per_metric_mape, "params": report.fit.params.as_dict(),
            "residuals": report.fit.residuals},
        "anchor": None if report.anchor is None else report.anchor.model_dump(mode="json"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferasim.harvest")
    sub = parser.add_subparsers(dest="command", required=True)
    add_cli(sub)
    args = parser.parse_args(["harvest", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


__all__ = ["add_cli", "cmd_harvest", "config_from_args", "main", "report_dict"]

"""`inferasim predict`: TTFT, TPOT and throughput of one deployment, with their 90% intervals."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import GPU, get_gpu
from inferasim.catalog.models import get_model
from inferasim.catalog.precision import PRECISIONS
from inferasim.cli.args import (
    check_anchor_matches,
    note_carried,
    note_checkpoint_precision,
    note_gpu_precision,
    note_multi_node,
    note_poor_anchor,
    precision_name,
    refuse_early,
    refuse_unservable,
)
from inferasim.cli.args import positive_float as _positive_float
from inferasim.cli.args import positive_int as _positive
from inferasim.cli.usage import (
    UsageError,
    add_deployment,
    add_layout,
    add_output,
    anchors_in,
    layout_of,
    refuse_beyond_context,
)
from inferasim.core.layout import Layout
from inferasim.model.anchor_store import NoCompatibleAnchor
from inferasim.model.anchors import KernelSet, load_anchor
from inferasim.output import emit, table


def cmd_predict(args: argparse.Namespace) -> int:
    from inferasim.model.deployment import RequestTooLong, predict_deployment
    from inferasim.model.measurement_free import measurement_free
    from inferasim.model.predictor import fitted_from_anchor

    engine = normalize_engine(args.engine)
    model = get_model(args.model)
    gpu = get_gpu(args.gpu)
    layout = layout_of(args)
    refuse_beyond_context(model, args.isl, args.osl)
    if (args.concurrency is None) == (args.request_rate is None):
        raise UsageError("give exactly one of --concurrency N (closed loop) or --request-rate R (req/s)")
    refuse_early(model, gpu, layout, engine, args.kv_cache_dtype)
    note_multi_node(gpu, layout)
    note_checkpoint_precision(engine, args.model, args.precision)
    from inferasim.catalog.checkpoints import priced_precision
    from inferasim.model.predictor import benchmark_kv_dtype

    # The checkpoint's format where --precision is auto (amd/...-FP8-KV runs an fp8 KV cache).
    precision = priced_precision(args.precision, args.model, model)
    kv_dtype = args.kv_cache_dtype or benchmark_kv_dtype(precision)
    if args.anchor:
        fitted = fitted_from_anchor(load_anchor(args.anchor))
        anchored = True
        check_anchor_matches(args.anchor, fitted, engine, model.name, gpu.name, args.precision, args.kv_cache_dtype)
    else:
        ks = KernelSet(engine=engine, engine_version=args.engine_version, model=args.model, gpu=args.gpu,
                       precision=args.precision if args.precision != "auto" else "", kv_dtype=kv_dtype)
        store = anchors_in(args.anchors)
        try:
            if args.engine_version:
                fitted = find_or_sibling(store, ks, layout, gpu)
                note_carried(fitted)
            else:
                # No version asked: the anchor tune, simulate and advise use for this kernel set (any
                # version; measured on purpose first, then the most points, then the newest), so
                # that predict and tune give one number for one deployment.
                from inferasim.search.tune import anchored_fit

                found = anchored_fit(store, engine, model, gpu, precision, kv_dtype=args.kv_cache_dtype)
                fitted = found[0] if found is not None else fitted_from_anchor(store.find(ks, layout))
                note_carried(fitted)
            anchored = True
        except NoCompatibleAnchor as exc:
            if args.require_anchor:
                raise UsageError(str(exc)) from None
            fitted = measurement_free(anchors_in(args.anchors), engine, model, gpu, precision, layout,
                                      args.engine_version, kv_dtype)
            anchored = False
            print(f"note: {exc}; predicting measurement-free from the population of the store's other "
                  "anchors (rank within one engine first)", file=sys.stderr)
    # Checked at what the prediction will run: an anchor's precision and KV dtype may differ from
    # the flags' (an fp8 anchor of a bf16 checkpoint fits layouts bf16 does not).
    refuse_unservable(fitted.model, fitted.gpu, layout, fitted.engine, fitted.precision, fitted.kv_dtype)
    note_gpu_precision(fitted.gpu, fitted.model, fitted.precision)
    if anchored:
        note_poor_anchor(fitted)
    isl, osl = args.isl, args.osl
    replicas = args.replicas

    if args.concurrency is not None and args.concurrency < replicas:
        print(f"note: {args.concurrency} clients over {replicas} replicas: {replicas - args.concurrency} replicas "
              "get no client and sit idle, and their GPUs count in tok/s per GPU", file=sys.stderr)
    try:
        pred = predict_deployment(fitted, layout, isl, osl, concurrency=args.concurrency,
                                  request_rate=None if args.concurrency is not None else args.request_rate,
                                  replicas=replicas, anchored=anchored)
    except RequestTooLong as exc:
        raise UsageError(str(exc)) from None
    load: dict[str, Any] = ({"concurrency": args.concurrency} if args.concurrency is not None
                            else {"request_rate": args.request_rate})
    if pred.running_per_replica is not None:
        load["running_per_replica"] = pred.running_per_replica
        print(f"note: {pred.held_by} holds {pred.running_per_replica} of the {pred.per_replica} requests per replica "
              "at once; the rest queue for a slot, and that wait is in TTFT", file=sys.stderr)
    if pred.capacity_request_rate is not None:
        load["capacity_request_rate"] = pred.capacity_request_rate
        print(f"note: {args.request_rate:g} req/s exceeds what this deployment serves "
              f"({pred.capacity_request_rate:.3g} req/s): the queue grows without bound; TTFT is unbounded",
              file=sys.stderr)
    stable, extrap, tput, gpus = pred.stable, pred.extrapolated, pred.throughput, pred.gpus
    has_tpot = pred.tpot_ms is not None
    out = {
        "model": model.name, "gpu": gpu.name, "engine": engine, "precision": fitted.precision,
        "layout": layout.as_dict(), "replicas": replicas, "gpus": gpus, "isl": isl, "osl": osl, **load,
        "ttft_ms": pred.ttft_ms, "tpot_ms": pred.tpot_ms,
        "throughput_tok_s": tput, "throughput_per_gpu": pred.throughput_per_gpu,
        "tokens_per_s_per_user": 1e3 / pred.tpot_ms if pred.tpot_ms else None,
        "interval": {"ttft_ms": list(pred.ttft_interval) if pred.ttft_interval else None,
                     "tpot_ms": list(pred.tpot_interval) if pred.tpot_interval else None},
        "extrapolated": extrap, "stable": stable,
        "carries": pred.carries,
        "anchor": fitted.anchor_id if anchored else None,
        "mode": "anchored" if anchored else "unanchored: use for ranking within one engine",
    }
    rows = [("deployment", f"{engine} {model.name} on {replicas}x{layout.label()} {gpu.name} ({gpus} GPUs)"),
            ("load", ", ".join(f"{k}={v}" for k, v in load.items()) + f", isl={isl}, osl={osl}"),
            ("TTFT (ms) [90%]", f"{out['ttft_ms']:,.1f}  [{out['interval']['ttft_ms'][0]:,.1f}, "
                          f"{out['interval']['ttft_ms'][1]:,.1f}]" if stable else "unbounded (the queue grows)"),
            ("TPOT (ms) [90%]", f"{out['tpot_ms']:.2f}  [{out['interval']['tpot_ms'][0]:.2f}, "
                          f"{out['interval']['tpot_ms'][1]:.2f}]" if has_tpot else "- (one output token)"),
            ("output tok/s", f"{tput:,.0f}"), ("tok/s per GPU", f"{tput / gpus:,.0f}"),
            ("extrapolated", extrap), ("stable", stable),
            ("carries", "; ".join(out["carries"]) or "nothing: the anchor's own layout, lengths and sweep"),
            ("anchor", out["anchor"] or out["mode"])]
    emit(out, args.output, table(["prediction", "value"], rows))
    return 0


def find_or_sibling(store: Any, ks: KernelSet, layout: Layout, gpu: GPU) -> Any:
    """The anchor of kernel set `ks` (one engine version) on its own GPU, else one of that version
    measured on a sibling part (the same die: MI300X for an MI325X, H100 for an H200) carried to
    it (predictor.carry_to_gpu); NoCompatibleAnchor, naming the own GPU's nearest, when neither."""
    from inferasim.catalog.gpus import siblings
    from inferasim.model.predictor import carry_to_gpu, fitted_from_anchor

    try:
        return fitted_from_anchor(store.find(ks, layout))
    except NoCompatibleAnchor as own:
        for name in siblings(gpu):
            try:
                return carry_to_gpu(fitted_from_anchor(store.find(ks.model_copy(update={"gpu": name}), layout)), gpu)
            except NoCompatibleAnchor:
                continue
        raise own from None


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim predict`."""
    p = sub.add_parser("predict", help="TTFT, TPOT and throughput of one deployment")
    add_deployment(p)
    p.add_argument("--engine-version", default="", help="engine version, e.g. 0.10.1 (default: any)")
    p.add_argument("--precision", type=precision_name, default="auto", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="auto, bf16 or fp8 (default: fp8 for fp8/fp4 precision, as in the public benchmarks)")
    p.add_argument("--isl", type=_positive("isl"), required=True, help="input tokens per request")
    p.add_argument("--osl", type=_positive("osl"), required=True, help="output tokens per request")
    p.add_argument("--concurrency", type=_positive("concurrency"), default=None, help="closed-loop clients")
    p.add_argument("--request-rate", type=_positive_float("request-rate"), default=None,
                   help="Poisson arrivals, requests/s")
    p.add_argument("--replicas", type=_positive("replicas"), default=1,
                   help="copies of the layout behind one router (default 1)")
    p.add_argument("--anchor", default=None, help="an anchor JSON file to use")
    p.add_argument("--anchors", action="append", default=None, help="anchor folder(s) (default: anchors/)")
    p.add_argument("--require-anchor", action="store_true", help="fail instead of predicting unanchored")
    add_layout(p)
    add_output(p)
    p.set_defaults(func=cmd_predict)

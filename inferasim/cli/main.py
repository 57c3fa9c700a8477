"""The `inferasim` command.

Every user error (unknown model, GPU, engine, bad layout, unreadable file) ends with a one-line
message that names the field and what is accepted, and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferasim.catalog.engines import ENGINES, ROCM_FORK_TAG, UnknownEngineError, normalize_engine
from inferasim.catalog.gpus import GPU, UnknownGPUError, get_gpu, list_gpus
from inferasim.catalog.models import (
    ModelConfigError,
    ModelSpec,
    UnknownModelError,
    context_error,
    get_model,
    known_models,
)
from inferasim.catalog.precision import PRECISIONS
from inferasim.catalog.userfile import load_yaml, read_user_text
from inferasim.cli.args import (
    anchor_store,
    check_anchor_matches,
    check_output_file,
    check_output_folder,
    check_plot_file,
    check_token_budget,
    draw_plot,
    fraction,
    note_carried,
    note_checkpoint_precision,
    note_gpu_precision,
    note_multi_node,
    note_poor_anchor,
    precision_name,
    refuse_early,
    refuse_engine_on_gpu,
    refuse_unservable,
)
from inferasim.cli.args import positive_float as _positive_float
from inferasim.cli.args import positive_int as _positive
from inferasim.core.layout import Layout, LayoutError
from inferasim.core.runs import load_rows
from inferasim.core.spec import SpecError, plain_validation_error
from inferasim.errors import CannotPredict, InferasimError
from inferasim.model.anchors import (
    SHIPPED_ANCHORS,
    Anchor,
    AnchorFileError,
    AnchorStore,
    KernelSet,
    NoCompatibleAnchor,
    load_anchor,
)
from inferasim.model.memory import plan_memory
from inferasim.output import OUTPUT_FORMATS, emit, table
from inferasim.sources import SOURCE_RULES, read_as_run

EXIT_USAGE = 2


class UsageError(InferasimError):
    """Bad input from the user; printed as one line, exit code 2."""


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=OUTPUT_FORMATS, default="table",
                   help="table for people, json or yaml for programs")


def _add_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=_positive("tp"), default=1, help="tensor-parallel width")
    p.add_argument("--pp", type=_positive("pp"), default=1, help="pipeline stages")
    p.add_argument("--dp", type=_positive("dp"), default=1, help="attention data-parallel ranks")
    p.add_argument("--ep", type=_positive("ep"), default=1, help="expert-parallel width of MoE layers")


def _add_deployment(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face id or config.json path")
    p.add_argument("--gpu", required=True, help="GPU name, e.g. MI355X, h200_sxm, NVIDIA-H200")
    p.add_argument("--engine", required=True, help=f"one of {', '.join(ENGINES)}")


def _layout(args: argparse.Namespace) -> Layout:
    try:
        return Layout(tp=args.tp, pp=args.pp, dp=args.dp, moe_ep=args.ep)
    except LayoutError as exc:
        raise UsageError(str(exc)) from None


# ---- models ------------------------------------------------------------------------------------

def cmd_models(args: argparse.Namespace) -> int:
    if args.action == "list" and args.name:
        raise UsageError(f"models list takes no name; `inferasim models show {args.name}` shows one model")
    if args.action == "show":
        if not args.name:
            raise UsageError("models show needs a NAME (a Hugging Face id or a config.json path)")
        model = get_model(args.name)
        info = model.summary(args.precision)
        text = table(["field", "value"], [
            ("name", info["name"]), ("architecture", info["architecture"]), ("layers", info["layers"]),
            ("hidden size", info["hidden_size"]), ("attention", ", ".join(info["attention"])),
            ("experts (top-k)", f"{info['n_experts']} ({info['top_k']})" if info["moe"] else "dense"),
            ("checkpoint format", info["checkpoint_format"]),
            ("FP8 weight scales", info["fp8_scales"]),
            ("total params (B)", info["total_params"] / 1e9),
            ("active params (B)", info["active_params"] / 1e9),
            (f"weights at {args.precision} (GB)", info["weight_bytes"]["total"] / 1e9),
            ("KV bytes/token (bf16)", info["kv_bytes_per_token_bf16"]),
            ("max context", info["max_context"]), ("source", info["source"]),
        ] + [("note", n) for n in info["notes"]])
        emit(info, args.output, text)
        return 0
    rows, data = [], []
    for hf_id in known_models():
        try:
            m = get_model(hf_id)
        except ModelConfigError as exc:
            data.append({"name": hf_id, "supported": False, "reason": str(exc)})
            rows.append((hf_id, "-", "-", "-", "-", f"refused: {exc}"))
            continue
        data.append({"name": hf_id, "supported": True, "total_params": m.total_params,
                     "active_params": m.active_param_count, "moe": m.is_moe,
                     "attention": m.attention_kinds(),
                     "checkpoint_format": m.checkpoint_format})
        rows.append((hf_id, m.total_params / 1e9, m.active_param_count / 1e9,
                     ",".join(m.attention_kinds()), m.checkpoint_format, ""))
    emit(data, args.output, table(["model", "total B", "active B", "attention", "format", "note"], rows))
    return 0


# ---- gpus --------------------------------------------------------------------------------------

def cmd_gpus(args: argparse.Namespace) -> int:
    gpus = list_gpus()
    data = [{
        "name": g.name, "vendor": g.vendor, "hbm_gb": g.hbm_gb, "hbm_tb_s": g.hbm_bandwidth / 1e12,
        "tflops": {k: v / 1e12 for k, v in g.flops.items()},
        "scale_up": {"name": g.scale_up.name, "gb_s": g.scale_up.bandwidth / 1e9,
                     "domain": g.scale_up.domain},
        "scale_out_gb_s": g.scale_out.bandwidth / 1e9, "host_link_gb_s": g.host_link.bandwidth / 1e9,
        "gpus_per_node": g.gpus_per_node, "resource": g.resource_name, "product_label": g.product_label,
    } for g in gpus]
    # Native tensor-core rates only ("-" where the GPU has none; peak_flops would give the rate the
    # kernels fall back to, e.g. BF16 for FP4 weights on H100).
    rows = [(g.name, g.vendor, g.hbm_gb, g.hbm_bandwidth / 1e12, g.peak_flops("bf16") / 1e12,
             *(g.flops[k] / 1e12 if k in g.flops else "-" for k in ("fp8", "fp4")),
             f"{g.scale_up.name} {g.scale_up.bandwidth / 1e9:.0f} GB/s x{g.scale_up.domain}",
             g.gpus_per_node) for g in gpus]
    emit(data, args.output, table(
        ["gpu", "vendor", "HBM GiB", "TB/s", "bf16 TF", "fp8 TF", "fp4 TF", "scale-up (per dir.)", "per node"],
        rows))
    return 0


# ---- memory ------------------------------------------------------------------------------------

def cmd_memory(args: argparse.Namespace) -> int:
    model = get_model(args.model)
    gpu = get_gpu(args.gpu)
    layout = _layout(args)
    from inferasim.catalog.checkpoints import priced_precision
    from inferasim.model.predictor import benchmark_kv_dtype

    # The KV dtype predict, simulate, tune and render price when none is asked for.
    kv_dtype = args.kv_cache_dtype or benchmark_kv_dtype(priced_precision(args.precision, args.model, model))
    note_checkpoint_precision(normalize_engine(args.engine), args.model, args.precision)
    plan = plan_memory(model, gpu, layout, engine=args.engine, precision=args.precision,
                       kv_dtype=kv_dtype, memory_fraction=args.memory_fraction)
    d = plan.as_dict()
    w = d["weights_gb_per_gpu"]
    rows = [
        ("model", plan.model), ("gpu", f"{gpu.name} ({gpu.hbm_gb:.0f} GiB = {gpu.hbm_bytes / 1e9:.1f} GB)"),
        ("engine", plan.engine), ("precision", plan.precision),
        ("layout", f"{layout.label()} ({layout.gpus} GPUs)"),
        ("memory fraction", plan.memory_fraction),
        ("weights / GPU (GB)", w["total"]),
        ("  attention", w["attention"]), ("  dense MLP", w["dense_mlp"]),
        ("  routed experts", w["routed_experts"]), ("  shared experts", w["shared_experts"]),
        ("  embeddings + head", w["embeddings_head"]),
        ("activations (GB, est.)", d["activation_gb"]), ("non-torch (GB, est.)", d["non_torch_gb"]),
        ("KV pool / GPU (GB)", d["kv_gb_per_gpu"]),
        # The engine's default is the model's dtype; benchmarks (and predict, simulate, tune and
        # render) run fp8 KV with fp8 or fp4 weights: say which this plan used.
        ("KV dtype", kv_dtype if kv_dtype != "auto"
         else "auto (the model's dtype; --kv-cache-dtype fp8 halves the bytes per token)"),
        ("KV bytes / token / GPU", d["kv_bytes_per_token_per_gpu"]),
        ("KV tokens / replica", d["kv_tokens_per_replica"]),
        ("feasible", plan.feasible),
    ] + [("why not", r) for r in plan.reasons]
    _refuse_over_context(model, "--context", args.context, "no sequence that long runs")
    if plan.feasible and args.context:
        rows.append((f"sequences of {args.context} tokens", plan.max_concurrency(args.context)))
        d["max_concurrency_at_context"] = {"context": args.context,
                                           "sequences": plan.max_concurrency(args.context)}
    emit(d, args.output, table(["memory plan", "value"], rows))
    return 0 if plan.feasible or not args.strict else 1


# ---- render ------------------------------------------------------------------------------------

def cmd_render(args: argparse.Namespace) -> int:
    """The Deployment and Service of one hand-picked configuration (what `tune --manifest` writes
    for its recommendation), checked as tune checks its own: flags known to the engine, the
    replica on one node, a precision the engine would run with this checkpoint."""
    from inferasim.catalog.checkpoints import priced_precision
    from inferasim.model.predictor import benchmark_kv_dtype
    from inferasim.render import ServingConfig, render_manifests, served_model_id, to_yaml

    if args.out == "-":  # as `anchors fit-live --out -` and kubectl's `-f -`: standard output
        args.out = None
    if args.out is not None:  # an empty --out is a mistake, not stdout
        _usage(check_output_file, "--out", args.out)
    layout = _layout(args)
    model = get_model(args.model)  # an unknown model is named here, before the manifest
    gpu = get_gpu(args.gpu)
    engine = normalize_engine(args.engine)
    # Planned at the weights the named checkpoint holds (an -FP8 variant of a BF16 catalog model).
    _refuse_over_context(model, "--max-model-len", args.max_model_len, "the engine refuses to start")
    check_token_budget(engine, gpu, layout, args.max_num_batched_tokens, args.max_num_seqs)
    priced = priced_precision(args.precision, args.model, model)
    # The KV dtype predict and tune price (fp8 with fp8 or fp4 weights), rendered as a flag.
    kv_dtype = args.kv_cache_dtype or benchmark_kv_dtype(priced)
    needed = refuse_unservable(model, gpu, layout, engine, priced, kv_dtype, args.memory_fraction)
    note_gpu_precision(gpu, model, priced)
    fraction = args.memory_fraction if args.memory_fraction is not None else needed
    max_model_len = _max_model_len_that_starts(model, gpu, layout, engine, priced, kv_dtype, fraction, args)
    cfg = ServingConfig(
        engine=engine, model=served_model_id(args.model, model.name), gpu=gpu.name, layout=layout,
        replicas=args.replicas,
        precision=args.precision, kv_cache_dtype=kv_dtype, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        # The raised fraction the layout needs is rendered, not only noted (None: the engine's default).
        memory_fraction=fraction,
        max_model_len=max_model_len, image=args.image, engine_version=args.engine_version,
        disagg_role=args.disagg_role)
    text = to_yaml(render_manifests(cfg, args.name, args.namespace))
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}: Deployment and Service {args.name} ({engine} {layout.label()} x{args.replicas})",
              file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _max_model_len_that_starts(model: ModelSpec, gpu: GPU, layout: Layout, engine: str, precision: str,
                               kv_dtype: str, fraction: float | None, args: argparse.Namespace) -> int | None:
    """The --max-model-len to render: the user's, refused when vLLM would not start with it; else
    the longest the KV pool holds, where it cannot hold the model's whole context (a note says so)."""
    plan = plan_memory(model, gpu, layout, engine=engine, precision=precision, kv_dtype=kv_dtype,
                       memory_fraction=fraction, max_num_batched_tokens=args.max_num_batched_tokens,
                       max_num_seqs=args.max_num_seqs)
    if args.max_model_len is not None:
        most = plan.start_max_model_len(args.max_model_len)  # the pool in whole blocks, where it is shorter
        if most is not None:
            raise UsageError(f"--max-model-len {args.max_model_len}: vLLM refuses to start when one sequence that "
                             f"long does not fit its KV cache, which holds {plan.kv_tokens:,} tokens at "
                             f"{layout.label()} on {gpu.name}; give at most {most}, a larger "
                             "--memory-fraction or more GPUs")
        return int(args.max_model_len)
    limit = plan.start_max_model_len(model.max_context)
    if limit is not None:
        print(f"note: the KV pool holds {plan.kv_tokens:,} tokens at {layout.label()} on {gpu.name}, less than "
              f"{model.name}'s context of {model.max_context:,}: vLLM would refuse to start, so --max-model-len "
              f"{limit} is rendered (longer requests are refused; more GPUs or --memory-fraction lift it)",
              file=sys.stderr)
    return limit


# ---- predict -----------------------------------------------------------------------------------

ANCHOR_DIR = SHIPPED_ANCHORS


def _anchor_store(folders: Sequence[str] | None, flag: str = "--anchors") -> AnchorStore:
    try:
        return anchor_store(folders, flag)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _usage(check: Any, flag: str, path: str) -> None:
    """Run an output-path check, its ValueError as a usage error (exit 2)."""
    try:
        check(flag, path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _refuse_over_context(model: ModelSpec, flag: str, tokens: int | None, consequence: str) -> None:
    """ValueError when `flag` asks for more tokens than the model's context holds."""
    if tokens is not None and model.max_context > 0 and tokens > model.max_context:
        raise ValueError(f"{flag} {tokens} exceeds {model.name}'s context of {model.max_context} tokens "
                         f"(max_position_embeddings): {consequence}; give at most {model.max_context}")


def _load_rows_noted(path: str, unreadable: list[Any] | None = None, *, as_written: bool = False,
                     applied: dict[str, int] | None = None) -> list[Any]:
    """core.runs.load_rows, its notes (a measured column absent) on stderr. With an `unreadable`
    list, cells it cannot read are listed there (and counted on stderr) instead of stopping.
    The rows are read as their engine ran them (sources.SOURCE_RULES: how one public file writes its
    layouts) unless `as_written`; `applied` receives how many rows each rule read."""
    notes: list[str] = []
    rows = load_rows(path, notes, unreadable)
    if not as_written:
        counts: dict[str, int] = {}
        rows = read_as_run(rows, applied=counts)
        for rule in SOURCE_RULES:
            if counts.get(rule.name):
                notes.append(f"{path}: source rule {rule.name} read {counts[rule.name]} row(s): {rule.why} "
                             "(--as-written reads them as written)")
        if applied is not None:
            applied.update(counts)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if unreadable:
        out = sum(1 for u in unreadable if not u.kept)
        print(f"note: {path}: {len(unreadable)} cell(s) could not be read ({out} row(s) left out, "
              f"{len(unreadable) - out} scored without the value); summary.json lists each under 'unreadable', "
              f"e.g. {unreadable[0].reason}", file=sys.stderr)
    return rows


def _refuse_beyond_context(model: ModelSpec, isl: int, osl: int) -> None:
    error = context_error(model, isl)
    if error:
        raise UsageError(f"--isl {isl}: {error}")
    note = context_error(model, isl, osl)
    if note:
        print(f"note: --isl {isl} --osl {osl}: {note}; an API server refuses such a request (an offline run stops "
              "at the context)", file=sys.stderr)


def cmd_predict(args: argparse.Namespace) -> int:
    from inferasim.model.deployment import RequestTooLong, predict_deployment
    from inferasim.model.measurement_free import measurement_free
    from inferasim.model.predictor import fitted_from_anchor

    engine = normalize_engine(args.engine)
    model = get_model(args.model)
    gpu = get_gpu(args.gpu)
    layout = _layout(args)
    _refuse_beyond_context(model, args.isl, args.osl)
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
        store = _anchor_store(args.anchors)
        try:
            if args.engine_version:
                fitted = _find_or_sibling(store, ks, layout, gpu)
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
            fitted = measurement_free(_anchor_store(args.anchors), engine, model, gpu, precision, layout,
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


# ---- validate ----------------------------------------------------------------------------------

def _progress(done: int, total: int) -> None:
    _stage_progress("", done, total, unit=" kernel sets")


def _validation_text(s: dict[str, Any], data: str, rule: str) -> str:
    """`validate`'s report for people: the figures of summary.json as tables and lines."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    out: list[str] = []
    metric_rows = []
    coverage = s.get("interval_coverage") or {}
    for name in ("tpot", "ttft", "throughput_per_gpu", "batch_latency"):
        m = s.get(name) or {}
        if m.get("n"):
            inside = (coverage.get(name) or {}).get("share")
            metric_rows.append((name, pct(m["median_ape"]), pct(m["p90_ape"]), pct(inside), m["n"]))
    out.append(table(["metric", "median APE", "p90 APE", "inside interval", "n"], metric_rows,
                     title=f"Validation of {data} (anchor rule {rule})"))
    r = s.get("ranking") or {}
    out.append(f"ranking: pair accuracy {pct(r.get('pair_accuracy'))} over {r.get('pairs', 0)} pairs "
               f"(equal GPU count {pct(r.get('pair_accuracy_equal_gpus'))} over {r.get('pairs_equal_gpus', 0)}), "
               f"top-1 {pct(r.get('top1'))}, regret {pct(r.get('regret'))}")
    unmeasured = (s.get("unmeasured") or {}).get("n", 0)
    out.append(f"anchor share {pct(s.get('anchor_share'))} of rows, {pct(s.get('anchor_gpu_time_share'))} of measured "
               f"GPU time; unpredicted rows {s.get('unpredicted', {}).get('n', 0)}"
               + (f"; {unmeasured} rows without any measured value (predicted, not scored)" if unmeasured else ""))
    counts = s.get("counts") or {}
    if counts.get("excluded_engine") or counts.get("excluded_mode"):
        out.append(f"not validated: {counts.get('excluded_engine', 0)} rows of other engines (only vllm, sglang, "
                   f"atom), {counts.get('excluded_mode', 0)} of other modes (only agg, disagg)")
    for u in s.get("unusable_anchors") or []:
        out.append(f"unusable anchor {u['kernel_set']} ({len(u['rows'])} anchor rows): {u['reason']}")
    for key, label in (("disagg", "disaggregated"),
                       ("measurement_free", "disaggregated without an aggregated anchor (measurement-free)")):
        d = s.get(key) or {}
        if any((d.get(k) or {}).get("n") for k in ("tpot", "ttft")):
            n = max((d.get(k) or {}).get("n") or 0 for k in ("tpot", "ttft"))
            out.append(f"{label}, {n} rows: " + ", ".join(f"{k} median {pct((d.get(k) or {}).get('median_ape'))}"
                                                         for k in ("tpot", "ttft", "throughput_per_gpu")))
    for split, per_value in (s.get("splits") or {}).items():
        split_rows = []
        for value, sec in per_value.items():
            counts = sec.get("counts") or {}
            # A group of disaggregated rows only (reach "disagg", or "no anchor": measurement-free)
            # shows its disaggregated figures.
            kind = "agg" if counts.get("scored_agg") else "disagg" if counts.get("scored_disagg") else \
                "measurement_free" if counts.get("scored_measurement_free") else "agg"
            block = sec if kind == "agg" else sec.get(kind) or {}
            split_rows.append((value, counts.get(f"scored_{kind}", 0),
                               *(pct((block.get(k) or {}).get("median_ape"))
                                 for k in ("tpot", "ttft", "throughput_per_gpu")),
                               pct(sec.get("anchor_share")), (sec.get("unpredicted") or {}).get("n", 0)))
        out.append(table([split, "scored rows", "TPOT", "TTFT", "throughput/GPU", "anchor share", "unpredicted"],
                         split_rows, title=f"median APE by {split}"))
    return "\n".join(out)


def cmd_validate(args: argparse.Namespace) -> int:
    from inferasim.model.predictor import AnchoredPredictor
    from inferasim.validate import run_validation
    from inferasim.validation_outputs import write_outputs

    # Repeated flags add up (--split-by engine --split-by gpu), as do comma lists; a key twice counts once.
    split_by = tuple(dict.fromkeys(s.strip() for flag in (args.split_by or []) for s in flag.split(",") if s.strip()))
    _usage(check_output_folder, "--out", args.out)
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)  # now: a refusal after the scoring would lose it
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot create the folder ({exc.strerror})") from None
    for name in ("predictions.csv", "summary.json"):
        if (Path(args.out) / name).is_dir():
            raise UsageError(f"--out {args.out}: {name} there is a folder; give another --out")
    # One cell nobody can read must not cost the whole run: such cells are listed, not fatal.
    unreadable: list[Any] = []
    applied: dict[str, int] = {}
    rows = _load_rows_noted(args.data, unreadable, as_written=args.as_written, applied=applied)
    result = run_validation(rows, AnchoredPredictor(), rule=args.anchor_rule, split_by=split_by,
                            progress=_progress, unreadable=unreadable, measurement_free=args.measurement_free)
    out = Path(args.out)
    # Which source rules read the file's rows as their engine ran them (none with --as-written).
    result.summary["source_rules"] = {r.name: {"rows": applied[r.name], "why": r.why}
                                      for r in SOURCE_RULES if applied.get(r.name)}
    write_outputs(result, out)
    s = result.summary

    # The report for people, or (-o json / yaml) summary.json's figures for programs.
    emit(s, args.output, _validation_text(s, args.data, args.anchor_rule))
    print(f"wrote {out / 'predictions.csv'} and {out / 'summary.json'}",
          file=sys.stdout if args.output == "table" else sys.stderr)
    c = s["counts"]
    if c["scored_agg"] + c["scored_disagg"] == 0:
        # Nothing scored is a failed check, not a perfect one: say why (the counts show where rows went).
        print(f"inferasim validate: no row was scored: {c['rows']} rows read, {c['excluded_engine']} of an engine "
              f"validate does not score, {c['excluded_mode']} of another mode, {c['anchor_rows']} anchor rows, "
              f"{c.get('unreadable_rows', 0)} unreadable; scoring needs at least two layouts or length pairs of one "
              "kernel set", file=sys.stderr)
        return 1
    return 0


# ---- anchors -----------------------------------------------------------------------------------

# anchors: the actions each flag applies to (flag, attribute, default). A flag given to another
# action is refused rather than ignored: `anchors build --out X` once wrote into anchors/.
_ANCHORS_FLAGS: tuple[tuple[str, str, object, tuple[str, ...]], ...] = (
    ("--prometheus", "prometheus", None, ("fit-live", "drift")),
    ("--selector", "selector", [], ("fit-live", "drift")),
    ("--deployment", "deployment", None, ("fit-live", "drift")),
    ("--gpu", "gpu", None, ("fit-live", "drift")),
    ("--engine-version", "engine_version", None, ("fit-live", "drift")),
    ("--window", "window", None, ("fit-live", "drift")),
    ("--step", "step", "1m", ("fit-live",)),
    ("--end", "end", None, ("fit-live", "drift")),
    ("--speedup", "speedup", 1.0, ("drift",)),
    ("--out", "out", None, ("fit-live", "build")),
    ("--threshold", "threshold", 0.25, ("drift",)),
    ("--replace", "replace", False, ("build",)),
    ("--dir", "dir", None, ("list", "show", "check", "build", "drift")),
)


def _check_anchors_flags(args: argparse.Namespace) -> None:
    for flag, attr, default, actions in _ANCHORS_FLAGS:
        if getattr(args, attr, default) != default and args.action not in actions:
            raise UsageError(f"{flag} does not apply to `anchors {args.action}` (it is for "
                             f"{' and '.join(actions)})")


def cmd_anchors(args: argparse.Namespace) -> int:
    _check_anchors_flags(args)
    if args.action == "check":
        # An explicit folder that does not exist is a typo, not an empty store (list and show get
        # the same check from anchor_store; check reads the store itself, to list its bad files).
        for folder in args.dir or []:
            if not Path(folder).is_dir():
                raise UsageError(f"--dir {folder!r} is not a folder of anchor JSON files")
        return _anchors_check(args)
    if args.action in ("fit-live", "drift"):
        return _anchors_live(args)
    if args.action == "build":
        return _anchors_build(args)
    store = _anchor_store(args.dir, "--dir")
    if args.action == "list":
        items = store.all()
        data = [{"id": a.id, "file": a.filename(), "kernel_set": a.kernel_set.model_dump(),
                 "layout": a.layout.model_dump(), "points": len(a.points),
                 "rms_log_error": a.fit.rms_log_error if a.fit else None, "method": a.provenance.method}
                for a in items]
        rows = [(a.id, a.kernel_set.engine, a.kernel_set.engine_version or "-", a.kernel_set.model,
                 a.kernel_set.gpu, a.kernel_set.precision or "-", a.layout.to_layout().label(), len(a.points),
                 a.fit.rms_log_error if a.fit else None, a.provenance.method) for a in items]
        emit(data, args.output, table(["id", "engine", "version", "model", "gpu", "precision", "layout", "points",
                                       "fit rms(log)", "provenance"], rows))
        return 0
    if args.action == "show":
        if not args.name:
            raise UsageError("anchors show needs an anchor id or file name (see `inferasim anchors list`)")
        path = Path(args.name)
        if path.is_file():
            anchor = load_anchor(path)
        else:
            stem = args.name.removesuffix(".json")
            hits = [a for a in store.all() if a.id == args.name or a.filename().removesuffix(".json") == stem
                    or a.id.startswith(args.name)]
            if not hits:
                raise UsageError(f"no anchor {args.name!r}; `inferasim anchors list` shows the ids")
            anchor = hits[0]
        emit(anchor.model_dump(mode="json"), args.output, _anchor_table(anchor))
        return 0
    raise UsageError(f"unknown anchors action {args.action!r}")


def _anchor_table(anchor: Anchor) -> str:
    """One anchor for a person: what it measured, where, how well the fit holds, its parameters
    (`-o json` gives every point)."""
    ks, lay, fit, rng = anchor.kernel_set, anchor.layout, anchor.fit, anchor.measured_range
    rows: list[tuple[str, Any]] = [
        ("id", anchor.id), ("kernel set", ks.describe()),
        ("layout", f"tp{lay.tp} pp{lay.pp} dp{lay.dp} moe_tp{lay.moe_tp or '-'} moe_ep{lay.moe_ep}"),
        ("points", f"{len(anchor.points)} benchmark, {len(anchor.steps)} step"),
    ]
    if rng is not None:
        rows += [("concurrency", f"{rng.concurrency[0]}-{rng.concurrency[1]}"),
                 ("isl", f"{rng.isl[0]}-{rng.isl[1]}"), ("osl", f"{rng.osl[0]}-{rng.osl[1]}")]
    if fit is not None:
        rows += [("fit rms(log)", f"{fit.rms_log_error:.3f} over {fit.n_points} points"),
                 ("fit per metric (median APE)", ", ".join(f"{k} {v:.1%}" for k, v in fit.per_metric.items()))]
    rows += [("provenance", f"{anchor.provenance.method}: {anchor.provenance.source}"),
             ("measured at", anchor.provenance.measured_at or "-")]
    rows += [(f"  {k}", f"{v:.4g}") for k, v in sorted(anchor.params.items())]
    return table(["anchor", "value"], rows)


def _anchors_build(args: argparse.Namespace) -> int:
    """`anchors build CSV [--out FOLDER]`: the min-gpus anchor of each kernel set in the CSV."""
    from inferasim.anchor_rules import select_anchors
    from inferasim.core.runs import filter_rows
    from inferasim.errors import CannotPredict
    from inferasim.model.predictor import anchor_from_rows

    if not args.name:
        raise UsageError("anchors build needs a CSV of measured runs (the validate schema)")
    if args.out and args.dir:
        raise UsageError("give the destination once: --out FOLDER (or --dir FOLDER), not both")
    out = Path(args.out) if args.out else Path(args.dir[0]) if args.dir else ANCHOR_DIR
    _usage(check_output_folder, "--out" if args.out else "--dir", str(out))
    every = _load_rows_noted(args.name)
    rows = filter_rows(every)
    if len(rows) < len(every):  # trtllm rows, other modes: said, not dropped silently
        print(f"not used: {len(every) - len(rows)} of {len(every)} rows (engines other than vllm, sglang, atom, "
              "or modes other than agg, disagg)", file=sys.stderr)
    chosen = select_anchors(rows)
    built: list[Anchor] = []
    for i, (_key, choice) in enumerate(chosen.items(), 1):
        _progress(i, len(chosen))
        try:
            built.append(anchor_from_rows(choice.rows, source=f"{Path(args.name).name}: {choice.describe()}"))
        except CannotPredict as exc:
            print(f"skipped {choice.describe()}: {exc}", file=sys.stderr)
    # Never replace a different anchor without being asked: the default folder holds the
    # shipped anchors. Checked before writing anything, so a refusal leaves the folder as it was.
    clash = [a.filename() for a in built if (out / a.filename()).is_file() and not _same_fit(out / a.filename(), a)]
    if clash and not args.replace:
        raise UsageError(f"{len(clash)} anchor(s) in {out} would be replaced by different fits "
                         f"({', '.join(clash[:3])}{', ...' if len(clash) > 3 else ''}); pass --replace to "
                         "replace them, or --out FOLDER to write elsewhere")
    same = {a.filename() for a in built if (out / a.filename()).is_file() and a.filename() not in clash}
    store = AnchorStore(out)
    for anchor in built:
        if anchor.filename() not in same:  # an unchanged fit keeps its file as it is
            store.save(anchor, out, keep_previous=False)  # --replace asked for it (clashes refused above)
    if built:
        print(f"wrote {len(built) - len(same)} anchors to {out}" + (f" ({len(clash)} replaced)" if clash else "")
              + (f"; {len(same)} unchanged" if same else ""))
    else:
        # Nothing to anchor on is a failure: a pipeline building anchors must not carry on.
        print(f"inferasim anchors build: no anchor built from {args.name} ({len(chosen)} kernel sets, "
              f"{len(rows)} usable rows)", file=sys.stderr)
        return 1
    return 0


def _same_fit(path: Path, anchor: Anchor) -> bool:
    """The anchor file at `path` holds `anchor`'s points and parameters (to fit precision: a refit
    on another machine differs in the last digits)."""
    try:
        old = load_anchor(path)
    except AnchorFileError:
        return False
    if old.points != anchor.points or old.params.keys() != anchor.params.keys():
        return False
    # Parameters fitted under another step-model revision mean something else: rewrite the file.
    if (old.fit.step_model if old.fit else None) != (anchor.fit.step_model if anchor.fit else None):
        return False
    return all(math.isclose(old.params[k], v, rel_tol=1e-6, abs_tol=1e-12) for k, v in anchor.params.items())


def _anchors_check(args: argparse.Namespace) -> int:
    """`anchors check [FILE|FOLDER]`: schema (every file parses as an Anchor) and compatibility
    (its model, GPU, engine and precision resolve in this version's catalogs and it yields fitted
    parameters). Fits worse than the harvester's own threshold are reported, not failed. Exit 1
    when a file is invalid or unusable."""
    from inferasim.errors import CannotPredict
    from inferasim.harvest.run import DEFAULT_MAX_RMS_LOG_ERROR
    from inferasim.model.memory import layout_problems
    from inferasim.model.predictor import fitted_from_anchor, stale_params
    from inferasim.model.steptime import STEP_MODEL_REVISION, StepParams

    anchors: list[tuple[str, Anchor]] = []
    bad: list[AnchorFileError] = []
    if args.name:
        target = Path(args.name)
        if not target.exists() and args.dir:
            # A name inside a --dir folder, with or without .json (as `anchors show` takes it).
            found = [c for d in args.dir for c in (Path(d) / args.name, Path(d) / f"{args.name}.json")
                     if c.exists()]
            target = found[0] if found else target
        if target.is_file():
            try:
                anchors.append((str(target), load_anchor(target)))
            except AnchorFileError as exc:
                bad.append(exc)
        elif target.is_dir():
            store = AnchorStore(target)
            anchors, bad = [(str(p), a) for p, a in store.items()], store.errors()
        else:
            raise UsageError(f"anchors check: {args.name!r} is neither an anchor JSON file nor a folder of them")
    else:
        store = AnchorStore(*([Path(d) for d in args.dir] if args.dir else [ANCHOR_DIR]))  # its errors: below
        anchors, bad = [(str(p), a) for p, a in store.items()], store.errors()
    for err in bad:
        print(f"invalid: {err}", file=sys.stderr)
    problems = poor = 0
    for where, a in anchors:
        try:
            fitted = fitted_from_anchor(a)
            # A layout the engine would refuse (tp not dividing the heads) was never measured.
            why = layout_problems(fitted.model, a.layout.to_layout(), fitted.engine)
            if why:
                raise ValueError(f"{fitted.engine} cannot run layout {a.layout.to_layout().label()}: {'; '.join(why)}")
        except (CannotPredict, ValueError) as exc:
            problems += 1
            print(f"unusable: {where} ({a.id}): {exc}", file=sys.stderr)
            continue
        stale = stale_params(a)
        if stale:
            print(f"note: {where} ({a.id}): {stale} on every read; `inferasim anchors build` (or a new "
                  "harvest) stores the refit", file=sys.stderr)
        elif a.params and (a.fit is None or not a.fit.step_model):
            print(f"note: {where} ({a.id}): no step-time model revision recorded; its parameters are read "
                  f"as fitted under this one ({STEP_MODEL_REVISION}). Refit it if it predates that.",
                  file=sys.stderr)
        unused = sorted(set(a.params) - set(StepParams.__dataclass_fields__))
        if unused:
            print(f"note: {where} ({a.id}): parameters this version does not use (a newer writer, or a typo): "
                  f"{', '.join(unused)}", file=sys.stderr)
        if a.fit is not None and a.fit.rms_log_error > DEFAULT_MAX_RMS_LOG_ERROR:
            poor += 1
            print(f"poor fit: {where} ({a.id}): rms log error {a.fit.rms_log_error:.3f} is above "
                  f"{DEFAULT_MAX_RMS_LOG_ERROR:g}, the threshold below which `harvest run` writes an anchor",
                  file=sys.stderr)
    # Every file counts once: invalid (does not parse), unusable (parses, cannot predict) or usable.
    print(f"{len(anchors) + len(bad)} anchor files: {len(anchors) - problems} usable, {len(bad)} invalid, "
          f"{problems} unusable; {poor} with a poor fit")
    if not anchors and not bad:
        # A pipeline checking the wrong folder must not pass: nothing checked is not "all valid".
        print("inferasim anchors check: no anchor JSON file found", file=sys.stderr)
        return 1
    return 1 if bad or problems else 0


def _selector(items: Sequence[str]) -> dict[str, str]:
    """--selector k=v[,k=v] (repeatable) -> {k: v}; every command that reads Prometheus reads it so."""
    selector: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            if "=" not in part or not part.split("=", 1)[0].strip():
                raise UsageError(f"--selector {part!r} must be LABEL=VALUE (several: k=v,k=v)")
            k, v = part.split("=", 1)
            selector[k.strip()] = v.strip()
    return selector


def _live_selector(items: Sequence[str]) -> dict[str, str]:
    """--selector, required: the deployment's own series."""
    selector = _selector(items)
    if not selector:
        raise UsageError("--selector is required: the label matchers of the deployment's series, e.g. "
                         "--selector namespace=llm,app=chat")
    return selector


def _anchors_live(args: argparse.Namespace) -> int:
    """`anchors fit-live` (a passive anchor from live traffic) and `anchors drift` (prediction error)."""
    import time

    from inferasim.deployment import read_deployment
    from inferasim.live import fit_live
    from inferasim.observe import ObservationError, observe_windows, parse_duration
    from inferasim.passive import NotIdentifiable

    cmd = f"inferasim anchors {args.action}"
    for flag, value in (("--prometheus", args.prometheus), ("--deployment", args.deployment)):
        if not value:
            raise UsageError(f"anchors {args.action} needs {flag}")
    _check_prometheus_url(args.prometheus)
    selector = _live_selector(args.selector)
    live = read_deployment(args.deployment, gpu=args.gpu, engine_version=args.engine_version)
    try:
        window = parse_duration(args.window or ("1h" if args.action == "fit-live" else "5m"), "--window")
        step = parse_duration(args.step, "--step")
    except ObservationError as exc:
        raise UsageError(str(exc)) from None
    end = _live_end(args.end) if args.end else time.time()
    try:
        if args.action == "fit-live":
            anchor = fit_live(live, args.prometheus, selector, window_s=window, step_s=step, end=end)
        else:
            windows = observe_windows({"url": args.prometheus, "selector": selector}, end - window, end, window,
                                      live.engine)
    except NotIdentifiable as exc:
        print(f"{cmd}: not identifiable: {exc}", file=sys.stderr)
        return 1
    except ObservationError as exc:
        print(f"{cmd}: {exc}", file=sys.stderr)
        return 1
    if args.action == "fit-live":
        return _write_live_anchor(anchor, args, cmd)
    from inferasim.drift import prediction_error

    if not windows:
        print(f"{cmd}: no request finished in the last {args.window or '5m'}: nothing to compare", file=sys.stderr)
        return 1
    err = prediction_error(live, windows[-1], _anchor_store(args.dir, "--dir"), speedup=args.speedup)
    rows = [(m, err.observed.get(m), err.predicted[m], err.relative.get(m)) for m in ("ttft", "itl", "throughput")]
    emit(err.as_dict(), args.output, table(["metric (ms, tok/s)", "observed", "predicted", "relative error"], rows))
    if err.exceeds(args.threshold):
        print(f"{cmd}: prediction error {err.worst():.0%} exceeds {args.threshold:.0%} (anchor {err.anchor_id})",
              file=sys.stderr)
        return 1
    return 0


def _live_end(text: str) -> float:
    """--end: Unix seconds or an ISO 8601 time (UTC unless it names a zone)."""
    import datetime as dt

    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--end {text!r} is neither Unix seconds nor an ISO 8601 time "
                         "(e.g. 2025-06-01T14:00:00Z)") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def _write_live_anchor(anchor: Any, args: argparse.Namespace, cmd: str) -> int:
    from inferasim.harvest.run import write_anchor

    out = args.out or "-"
    if out != "-" and (Path(out).is_dir() or not out.endswith(".json")):
        store = AnchorStore(out)
        path = store.save(anchor, out)
        print(f"{cmd}: wrote {path} (fit rms log error {anchor.fit.rms_log_error:.3f}, {len(anchor.points)} windows)",
              file=sys.stderr)
        if store.last_replaced is not None:
            print(f"{cmd}: {path.name} held another anchor: kept it as {store.last_replaced}", file=sys.stderr)
        # Both a harvested and a passive anchor of these kernels may be stored: show which one wins.
        for i, (p, a) in enumerate(store.alternatives(anchor.kernel_set, anchor.layout.to_layout())):
            rms = f"{a.fit.rms_log_error:.3f}" if a.fit else "-"
            print(f"  {'used' if i == 0 else 'kept'}: {p.name} ({a.provenance.method}, fit rms log error {rms})",
                  file=sys.stderr)
        return 0
    path = write_anchor(anchor, out, on_replace=lambda p, kept: print(
        f"{cmd}: {p} held another anchor: kept it as {kept}", file=sys.stderr))
    if path is not None:
        print(f"{cmd}: wrote {path} (fit rms log error {anchor.fit.rms_log_error:.3f})", file=sys.stderr)
    return 0


# ---- tune --------------------------------------------------------------------------------------

def _stage_progress(stage: str, done: int, total: int, unit: str = "") -> None:
    if not sys.stderr.isatty():
        return  # a bar is for people watching a terminal, not for logs
    width = 30
    filled = int(width * done / max(total, 1))
    label = f"{stage:8s} " if stage else ""
    sys.stderr.write(f"\r{label}[{'#' * filled}{'.' * (width - filled)}] {done}/{total}{unit}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _finite_or_dash(v: float | None) -> float | str:
    return v if v is not None and math.isfinite(v) else "-"


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
                     e["max_num_batched_tokens"], round(at_slo) if at_slo > 0 else "-", p["ttft_p90_ms"],
                     p["itl_p90_ms"], "yes" if e["meets_slo"] else "no",
                     "sim" if p.get("stage") == 2 else "est", e["anchor"][:24] if e["anchor"] else "unanchored"))
        if not e["meets_slo"]:
            # The percentiles shown may all be inside the SLO when what fails is the budget (more
            # replicas needed than it allows) or the rate: say which.
            why = blocking_notes(est)
            term = slo_miss(est, result.spec.objective.slo)
            text = "; ".join(why) + (f" ({term})" if why and term else term)
            misses.append(f"#{i} misses the SLO: {text or 'requests dropped in the simulation'}")
    headers = ["#", "engine", "prec", "layout", "repl", "GPUs", "max seqs", "max tokens", "out tok/s/GPU@SLO",
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
        lines += ["", f"{head}: {rec['engine']} {rec['precision']} {rec['shape']} x{rec['replicas']} "
                      f"({rec['gpus']} GPUs), max_num_seqs {rec['max_num_seqs']}, "
                      f"max_num_batched_tokens {rec['max_num_batched_tokens']}: {how}"
                      + ("" if rec["anchor"] else "  [unanchored: measurement-free, rank within engine]")]
        if rec.get("disaggregation"):
            lines.append("note: P/D: the manifest (--manifest) renders the prefill and decode pools, not the P/D "
                         "router clients reach them through; each pool's annotation inferasim.io/pd-router names the "
                         "engine's own (deploy it in front of both pools)")
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


def _plot_pareto(result: Any, path: str) -> None:
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
        _usage(check_plot_file, "--plot", args.plot)
    if args.manifest is not None:
        _usage(check_output_file, "--manifest", args.manifest)
        from inferasim.render import check_k8s_names

        try:
            check_k8s_names(args.name, args.namespace)
        except ValueError as exc:
            raise UsageError(f"--name/--namespace: {exc}") from None
    if args.propose_model != "default" and not args.propose_endpoint:
        raise UsageError("--propose-model names the model at --propose-endpoint; give the endpoint too")
    store = _anchor_store(args.anchors)  # a missing folder is refused, unreadable files named
    propose_with = (args.propose_endpoint, args.propose_model) if args.propose_endpoint else None
    result = tune(spec, store=store, progress=None if args.output != "table" else _stage_progress,
                  propose_with=propose_with)
    data = result.as_dict()
    # The search is done: a file that cannot be written (or a manifest that cannot be rendered)
    # is reported after the result, which is printed all the same.
    failures: list[str] = []
    plotted = bool(args.plot) and draw_plot(lambda: _plot_pareto(result, args.plot), args.plot, failures)
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
    emit(data, args.output, _tune_table(result))
    args.result_data = data  # for the demo's next steps
    if args.output == "table":
        if plotted:
            print(f"Pareto plot written to {args.plot}")
        if exported:
            print(f"Pareto front and short list as CSV: {exported[0]}, {exported[1]}")
        if "manifest_file" in data:
            print(f"Deployment manifest written to {args.manifest}")
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


# ---- advise / mix -------------------------------------------------------------------------------

def _find_or_sibling(store: Any, ks: KernelSet, layout: Layout, gpu: GPU) -> Any:
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


def _fitted_for(args: argparse.Namespace, layout: Layout):  # noqa: ANN202
    from inferasim.catalog.checkpoints import priced_precision
    from inferasim.model.measurement_free import measurement_free
    from inferasim.model.predictor import benchmark_kv_dtype, fitted_from_anchor
    from inferasim.search.tune import anchored_fit

    engine = normalize_engine(args.engine)
    model, gpu = get_model(args.model), get_gpu(args.gpu)
    refuse_engine_on_gpu(engine, gpu)
    precision = priced_precision(args.precision, args.model, model)
    note_checkpoint_precision(engine, args.model, args.precision)
    if args.anchor:
        fitted = fitted_from_anchor(load_anchor(args.anchor))
        # Not another model's, nor at another precision or KV dtype than asked.
        check_anchor_matches(args.anchor, fitted, engine, model.name, gpu.name, args.precision,
                             getattr(args, "kv_cache_dtype", None))
        return fitted, True
    found = anchored_fit(_anchor_store(args.anchors), engine, model, gpu, precision)
    if found is not None:
        note_carried(found[0])
        return found[0], True
    print("note: no anchor for this kernel set; advising measurement-free", file=sys.stderr)
    return measurement_free(_anchor_store(args.anchors), engine, model, gpu, precision, layout,
                            kv_dtype=benchmark_kv_dtype(precision)), False


def cmd_advise(args: argparse.Namespace) -> int:
    from inferasim.search.advisor import advise_batch

    layout = _layout(args)
    _refuse_beyond_context(get_model(args.model), args.isl, args.osl)
    fitted, anchored = _fitted_for(args, layout)
    refuse_unservable(fitted.model, fitted.gpu, layout, fitted.engine, fitted.precision, fitted.kv_dtype)
    note_multi_node(fitted.gpu, layout)
    adv = advise_batch(fitted, args.isl, args.osl, args.itl_p90_ms, args.max_loss, layout=layout)
    d = adv.as_dict()
    d["anchored"] = anchored
    rows = [("largest max_num_seqs meeting ITL p90", adv.max_num_seqs),
            ("  TPOT there (ms)", adv.tpot_ms), ("  output tok/s there", adv.throughput),
            (f"smallest limit within {args.max_loss:.0%} of that", adv.saturating_batch),
            ("  output tok/s there", adv.throughput_at_saturating),
            ("KV pool per GPU (GB)", adv.kv_gb_pool), ("KV needed per GPU (GB)", adv.kv_gb_needed),
            ("KV that can be given back per GPU (GB)", adv.kv_gb_returnable),
            ("memory fraction that gives it back", adv.memory_fraction),
            ("anchored", anchored)]
    emit(d, args.output, table(["batching advice", "value"], rows))
    return 0


def cmd_mix(args: argparse.Namespace) -> int:
    import yaml
    from pydantic import ValidationError

    from inferasim.search.mix import MixSpec, plan_mix

    try:
        raw = load_yaml(read_user_text(args.plan, "mix plan"))
        if not isinstance(raw, dict):
            raise UsageError(f"{args.plan} must hold a mapping of plan fields (hardware, engines, precision, tiers); "
                             f"it holds {'nothing' if raw is None else type(raw).__name__}")
        spec = MixSpec.model_validate(raw)
    except OSError as exc:
        raise UsageError(f"{args.plan}: cannot read ({exc.strerror or exc})") from None
    except ValidationError as exc:
        raise UsageError(f"{args.plan}: " + plain_validation_error(exc, "plan")) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{args.plan} is not valid YAML: {exc}") from None
    store = _anchor_store(args.anchors)  # a missing folder refused, bad files named
    try:
        plan = plan_mix(spec, store=store)
    except ValidationError as exc:  # a tier's spec, built from the plan's fields
        raise UsageError(f"{args.plan}: " + plain_validation_error(exc, "plan")) from None
    except (UnknownModelError, UnknownGPUError, ValueError) as exc:  # names the model, GPU or precision
        raise UsageError(f"{args.plan}: {exc}") from None
    rows = []
    for a in plan.assignments:
        e = a.entry or {}
        p = e.get("predicted") or {}
        rows.append((a.tier, a.model, a.preference + 1, a.gpus, e.get("engine", "-"), e.get("precision", "-"),
                     e.get("layout_label", "-"), e.get("replicas", "-"), p.get("ttft_p90_ms"), p.get("itl_p90_ms"),
                     "yes" if e.get("meets_slo") else "no", e.get("anchor") or "unanchored"))
    text = table(["tier", "model", "choice", "GPUs", "engine", "prec", "layout", "replicas", "TTFT p90 ms",
                  "ITL p90 ms", "SLO", "anchor"], rows, title=f"Mix plan: {plan.gpus} of {plan.budget} GPUs")
    # A tier served by a model it ranked lower: say why its earlier choices were passed over (more
    # GPUs than the plan had left once every tier was served, or no deployment meets the tier).
    for a in plan.assignments:
        for o in plan.options:
            if o.tier == a.tier and o.preference < a.preference:
                why = o.why if o.gpus is None else f"needs {o.gpus} GPUs, more than the plan leaves it"
                text += f"\n{a.tier}: choice {o.preference + 1} {o.model} passed over: {why}"
    if plan.gpus < plan.budget and not plan.unserved:
        text += f"\n{plan.budget - plan.gpus} of {plan.budget} GPUs left unassigned: no tier needs them to meet its SLO"
    reasons = plan.unserved_reasons()
    for tier in plan.unserved:
        text += f"\nunserved tier {tier}: " + ("; ".join(reasons[tier]) or "the budget went to other tiers")
    emit(plan.as_dict(), args.output, text)
    if plan.unserved:
        # As tune does when nothing meets the SLO: a pipeline must see that a tier went unplanned.
        print("inferasim mix: unserved tiers: " + ", ".join(plan.unserved) + " (see why above: relax their SLO, raise "
              "the GPU budget, offer more models, or a precision their checkpoints can run at)", file=sys.stderr)
        return 1
    return 0


# ---- observe -----------------------------------------------------------------------------------

def _check_prometheus_url(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--prometheus {url!r} is not an http(s) URL (e.g. http://prometheus:9090)")


def cmd_observe(args: argparse.Namespace) -> int:
    from inferasim.observe import ObservationError, observe, parse_duration

    # The flags are checked before Prometheus is asked anything, each error naming its flag.
    _check_prometheus_url(args.prometheus)
    try:
        if parse_duration(args.window, "--window") <= 0:
            raise UsageError(f"--window {args.window!r} must be longer than 0")
    except ObservationError as exc:
        raise UsageError(str(exc)) from None
    selector = _selector(args.selector)
    try:
        obs = observe({"url": args.prometheus, "selector": selector, "window": args.window}, engine=args.engine)
    except ObservationError as exc:
        print(f"inferasim observe: {exc}", file=sys.stderr)
        return 1
    d = obs.model_dump(mode="json", exclude_none=True)
    rows = [(k, v) for k, v in d.items() if not isinstance(v, dict | list)]
    emit(d, args.output, table(["observed", "value"], rows))
    return 0


# ---- demo --------------------------------------------------------------------------------------

# The demo's anchored AMD case: Llama-3.1-70B FP8 (AMD's -FP8-KV checkpoint) at tp8, 64 clients of
# 2048-token prompts and answers, on the shipped MI300X anchor of AMD's vLLM 0.10.0 build (its own
# ROCm dev-docker tables), carried to the MI325X (the same die), beside the measurement-free MI355X.
_DEMO_AMD = ("amd/Llama-3.1-70B-Instruct-FP8-KV", "0.10.0" + ROCM_FORK_TAG, 8, 2048, 2048, 64)


def _demo_amd_cases() -> None:
    from inferasim.model.deployment import predict_deployment
    from inferasim.model.measurement_free import measurement_free
    from inferasim.model.predictor import benchmark_kv_dtype

    model_id, version, tp, isl, osl, conc = _DEMO_AMD
    model, layout = get_model(model_id), Layout(tp=tp)
    ks = KernelSet(engine="vllm", engine_version=version, model=model_id, gpu="MI300X", precision="",
                   kv_dtype="fp8")
    store = _anchor_store(None)
    rows = []
    for gpu_name in ("MI300X", "MI325X", "MI355X"):
        gpu = get_gpu(gpu_name)
        try:
            fitted = _find_or_sibling(store, ks.model_copy(update={"gpu": gpu_name}), layout, gpu)
            anchored = True
            how = f"anchored: {fitted.anchor_id}" + (" (carried from the same die)" if fitted.measured_on else "")
        except NoCompatibleAnchor:
            fitted = measurement_free(store, "vllm", model, gpu, "fp8", layout, version, benchmark_kv_dtype("fp8"))
            anchored = False
            how = "measurement-free (population prior; no anchor on this die)"
        p = predict_deployment(fitted, layout, isl, osl, concurrency=conc, anchored=anchored)
        lo, hi = p.tpot_interval or (math.nan, math.nan)
        t_lo, t_hi = p.ttft_interval or (math.nan, math.nan)
        g_lo, g_hi = (v / p.gpus for v in (p.throughput_interval or (math.nan, math.nan)))
        rows.append((f"{gpu_name} x{tp}", how, f"{p.ttft_ms or math.nan:,.0f} [{t_lo:,.0f}, {t_hi:,.0f}]",
                     f"{p.tpot_ms or math.nan:.1f} [{lo:.1f}, {hi:.1f}]",
                     f"{p.throughput_per_gpu:,.0f} [{g_lo:,.0f}, {g_hi:,.0f}]"))
    print(table(["GPUs", "prediction", "TTFT ms [90%]", "TPOT ms [90%]", "tok/s per GPU [90%]"], rows,
                title=f"\nAnchored on AMD: vLLM {version} {model_id}, tp{tp}, {conc} clients, {isl}x{osl} tokens"))
    print("(the MI300X anchor is fitted from AMD's own published MI300X runs; an MI325X borrows it from the same "
          "die; the MI355X, a CDNA 4 part, has none yet: `inferasim harvest run` measures one)")


def _harvest_commands(data: dict[str, Any]) -> list[str]:
    """`inferasim harvest run` for each anchor the tune result is missing, at its cheapest layout."""
    out = []
    for m in data.get("missing_anchors", []):
        lay = m.get("harvest_layout", {})
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in lay.items() if v != 1)
        out.append(f"inferasim harvest run --endpoint http://ENGINE:8000 --model {m['model']} --gpu {m['gpu']} "
                   f"--engine {m['engine']} --precision {m['precision']} {flags}".rstrip() + " --out anchors/")
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    import importlib.util

    example = Path(__file__).resolve().parents[2] / "examples" / "llama70b-mi355x.yaml"
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out!r}: cannot create the folder ({exc.strerror or exc})") from None
    # The plot needs matplotlib (the `plot` extra); without it the demo still writes the manifest.
    plot = str(out / "pareto.png") if importlib.util.find_spec("matplotlib") else None
    manifest = str(out / "deploy.yaml")
    print(f"inferasim demo: `inferasim tune {example.relative_to(example.parent.parent)} "
          f"{'--plot ' + plot + ' ' if plot else ''}--manifest {manifest}`\n")
    ns = argparse.Namespace(spec=str(example), anchors=None, plot=plot, manifest=manifest, name="llm",
                            namespace="default", output="table", propose_endpoint=None, propose_model="default")
    rc = cmd_tune(ns)
    _demo_amd_cases()
    commands = _harvest_commands(getattr(ns, "result_data", {}))
    if commands:
        print("\nNext: harvest the missing anchors on the cluster's GPUs (an engine serving the model at ENGINE), "
              "then tune again:")
        for c in commands:
            print(f"  {c}")
        print(f"  inferasim tune {example} --plot {plot or 'pareto.png'} --manifest {manifest}")
        print("  (or let the operator do it: kubectl apply -f a ServingTuning; see charts/ and README 'The operator')")
    return rc


# ---- entry point -------------------------------------------------------------------------------

def _version() -> str:
    """The installed distribution's version, and the step-time model revision anchors record."""
    from importlib.metadata import PackageNotFoundError, version

    from inferasim.model.steptime import STEP_MODEL_REVISION

    try:
        release = version("inferasim")
    except PackageNotFoundError:  # run from a checkout without installing
        release = "unknown (not installed)"
    return f"{release} (step-time model {STEP_MODEL_REVISION})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferasim",
        description="Predict LLM serving performance from anchors, simulate traffic, search deployments.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list known models, or `models show NAME`")
    p.add_argument("action", nargs="?", choices=("list", "show"), default="list")
    p.add_argument("name", nargs="?", help="Hugging Face id (org/name or org--name) or config.json path")
    p.add_argument("--precision", choices=PRECISIONS, default="auto")
    _add_output(p)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("gpus", help="GPU catalog")
    _add_output(p)
    p.set_defaults(func=cmd_gpus)

    p = sub.add_parser("memory", help="weights, workspace and KV capacity per GPU for a layout")
    p.add_argument("--model", required=True, help="Hugging Face id or config.json path")
    p.add_argument("--gpu", required=True, help="GPU name, e.g. MI355X, h200_sxm, NVIDIA-H200")
    p.add_argument("--engine", default="vllm", help=f"one of {', '.join(ENGINES)}")
    p.add_argument("--precision", choices=PRECISIONS, default="auto")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="auto, bf16 or fp8 (default: fp8 for fp8/fp4 precision, as predict and tune price)")
    p.add_argument("--memory-fraction", type=fraction("memory-fraction"), default=None,
                   help="gpu_memory_utilization / mem_fraction_static (default: the engine's own)")
    p.add_argument("--context", type=_positive("context"), default=None,
                   help="also report how many sequences of this length fit")
    p.add_argument("--strict", action="store_true", help="exit 1 when the layout does not fit")
    _add_layout(p)
    _add_output(p)
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("render", help="the Kubernetes Deployment and Service of one configuration")
    _add_deployment(p)
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="weights as priced; fp8 of a 16-bit checkpoint adds the engine's online quantization")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="auto, bf16 or fp8 (default: fp8 for fp8/fp4 precision, as predict and tune price)")
    p.add_argument("--replicas", type=_positive("replicas"), default=1)
    p.add_argument("--max-num-seqs", type=_positive("max-num-seqs"), default=None)
    p.add_argument("--max-num-batched-tokens", type=_positive("max-num-batched-tokens"), default=None)
    p.add_argument("--memory-fraction", type=fraction("memory-fraction"), default=None,
                   help="gpu_memory_utilization / mem_fraction_static (default: the engine's own)")
    p.add_argument("--max-model-len", type=_positive("max-model-len"), default=None)
    p.add_argument("--image", default=None, help="engine image (default: the engine's release image for the GPU)")
    p.add_argument("--engine-version", default="", help="image tag version, when --image is not given")
    p.add_argument("--disagg-role", choices=("prefill", "decode"), default=None,
                   help="one pool of a P/D deployment (its KV-transfer flags)")
    p.add_argument("--name", default="llm", help="Deployment and Service name")
    p.add_argument("--namespace", default="default")
    p.add_argument("--out", default=None, help="write the YAML to this file (default, or -: stdout)")
    _add_layout(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("predict", help="TTFT, TPOT and throughput of one deployment")
    _add_deployment(p)
    p.add_argument("--engine-version", default="")
    p.add_argument("--precision", type=precision_name, default="auto", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="auto, bf16 or fp8 (default: fp8 for fp8/fp4 precision, as in the public benchmarks)")
    p.add_argument("--isl", type=_positive("isl"), required=True, help="input tokens per request")
    p.add_argument("--osl", type=_positive("osl"), required=True, help="output tokens per request")
    p.add_argument("--concurrency", type=_positive("concurrency"), default=None, help="closed-loop clients")
    p.add_argument("--request-rate", type=_positive_float("request-rate"), default=None,
                   help="Poisson arrivals, requests/s")
    p.add_argument("--replicas", type=_positive("replicas"), default=1)
    p.add_argument("--anchor", default=None, help="an anchor JSON file to use")
    p.add_argument("--anchors", action="append", default=None, help="anchor folder(s) (default: anchors/)")
    p.add_argument("--require-anchor", action="store_true", help="fail instead of predicting unanchored")
    _add_layout(p)
    _add_output(p)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("validate", help="score the predictor on measured runs (DESIGN.md section 7)")
    p.add_argument("data", help="CSV of measured runs (schema of shared/data/aic-silicon/silicon_dev.csv)")
    p.add_argument("--anchor-rule", default="min-gpus", choices=("min-gpus", "harvest"),
                   help="which rows of a kernel set form its anchor (DESIGN.md section 7): min-gpus, every row of "
                        "the fewest-GPU layout at its shortest length pair; harvest, what `harvest run` measures "
                        "by default (the pair nearest 512x128 at up to 4 concurrencies, the longest prompt at one)")
    p.add_argument("--as-written", action="store_true",
                   help="read every row's layout as the file writes it, without the named rules of known public "
                        "sources (inferasim/sources.py; e.g. Argonne counts an MI250 package of two GCDs as one GPU)")
    p.add_argument("--measurement-free", action="store_true",
                   help="leave one kernel set out: price every row of each kernel set, its anchor rows too, from "
                        "the population of the other kernel sets' anchors (model/priors.py), with no row of its own")
    p.add_argument("--out", required=True, help="folder for predictions.csv and summary.json")
    _add_output(p)
    p.add_argument("--split-by", action="append", default=[],
                   help="engine, gpu, model or reach; a comma list or the flag repeated (reach: what a "
                        "prediction carries from its anchor: another length pair, another layout, both, or "
                        "disaggregated pools)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("anchors", help="list, show, check shipped anchors; build anchors from a CSV; fit one from "
                                       "live traffic (fit-live); prediction error of a live deployment (drift)")
    p.add_argument("action", choices=("list", "show", "check", "build", "fit-live", "drift"))
    p.add_argument("name", nargs="?", help="anchor id/file (show), anchor file or folder (check; default: --dir), "
                                           "or CSV (build)")
    p.add_argument("--dir", action="append", default=None, help="anchor folder(s) (default: anchors/)")
    p.add_argument("--prometheus", default=None, help="fit-live, drift: Prometheus base URL")
    p.add_argument("--selector", action="append", default=[], metavar="K=V[,K=V]",
                   help="fit-live, drift: label matchers of the deployment's series")
    p.add_argument("--deployment", default=None, help="fit-live, drift: the Deployment manifest (YAML)")
    p.add_argument("--gpu", default=None, help="fit-live, drift: GPU when the manifest names none")
    p.add_argument("--engine-version", default=None, help="fit-live, drift: when the image tag names none")
    p.add_argument("--window", default=None, help="fit-live: range to fit (default 1h); drift: range (default 5m)")
    p.add_argument("--step", default="1m", help="fit-live: one window per step (default 1m)")
    p.add_argument("--end", default=None, help="fit-live, drift: end of the range, Unix seconds or ISO 8601 "
                                               "(default: now)")
    p.add_argument("--speedup", type=_positive_float("speedup"), default=1.0,
                   help="drift: engine seconds per wall second (the emulator's --speedup; 1 for real engines)")
    p.add_argument("--out", default=None, help="fit-live: anchor folder, file, or - for stdout (default -); "
                                               "build: the folder to write (default: --dir, else anchors/)")
    p.add_argument("--replace", action="store_true",
                   help="build: replace anchors of the same kernel set and layout that fit differently")
    p.add_argument("--threshold", type=_positive_float("threshold"), default=0.25,
                   help="drift: exit 1 when a relative error exceeds this fraction (default 0.25)")
    _add_output(p)
    p.set_defaults(func=cmd_anchors)

    p = sub.add_parser("tune", help="search deployments for a spec (the ServingTuning spec fields)")
    p.add_argument("spec", help="SPEC.yaml: a tuning spec or a whole ServingTuning manifest")
    p.add_argument("--anchors", action="append", default=None, help="anchor folder(s) (default: anchors/)")
    p.add_argument("--plot", default=None, help="write the Pareto plot here (.png, .svg, .pdf: the extension picks); "
                                                "the front and the short list go beside it as CSV (STEM.csv, "
                                                "STEM-shortlist.csv)")
    p.add_argument("--manifest", default=None, help="write the recommended Deployment + Service YAML here")
    p.add_argument("--name", default="llm", help="name of the rendered Deployment")
    p.add_argument("--namespace", default="default")
    p.add_argument("--propose-endpoint", default=None,
                   help="OpenAI-compatible endpoint of an LLM that proposes candidates (off by default)")
    p.add_argument("--propose-model", default="default", help="model name to ask at --propose-endpoint")
    _add_output(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("advise", help="batching advisor: batch limit for a latency target, KV to give back")
    _add_deployment(p)
    p.add_argument("--precision", type=precision_name, default="auto")
    p.add_argument("--isl", type=_positive("isl"), required=True)
    p.add_argument("--osl", type=_positive("osl"), required=True)
    p.add_argument("--itl-p90-ms", type=_positive_float("itl-p90-ms"), required=True,
                   help="latency target: p90 inter-token latency")
    p.add_argument("--max-loss", type=fraction("max-loss", zero=True), default=0.05,
                   help="share of the throughput one may give up, a fraction (default 0.05: 5%%)")
    p.add_argument("--anchor", default=None)
    p.add_argument("--anchors", action="append", default=None)
    _add_layout(p)
    _add_output(p)
    p.set_defaults(func=cmd_advise)

    p = sub.add_parser("mix", help="mix planner: models x latency tiers under one GPU budget")
    p.add_argument("plan", help="PLAN.yaml: hardware, engines, precision, tiers (name, models, requestRate, slo)")
    p.add_argument("--anchors", action="append", default=None)
    _add_output(p)
    p.set_defaults(func=cmd_mix)

    p = sub.add_parser("observe", help="the live workload of a deployment, read from Prometheus")
    p.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://prometheus:9090")
    p.add_argument("--selector", action="append", default=[], metavar="K=V[,K=V]",
                   help="label matchers of the target's series, e.g. namespace=llm,app=chat (repeatable)")
    p.add_argument("--window", default="5m", help="rate() window, e.g. 5m, 6h")
    p.add_argument("--engine", default="auto", choices=("auto", "vllm", "sglang", "atom"),
                   help="the engine's metric family (default: detected)")
    _add_output(p)
    p.set_defaults(func=cmd_observe)

    for module in ("inferasim.cli.emulate", "inferasim.cli.harvest", "inferasim.cli.simulate"):
        import importlib

        importlib.import_module(module).add_cli(sub)

    p = sub.add_parser("demo", help="run the main job on the bundled example")
    p.add_argument("--out", default="demo-out", help="folder for the Pareto plot, its CSVs and the manifest "
                                                     "(default %(default)s)")
    p.set_defaults(func=cmd_demo)
    return parser


USER_ERRORS: tuple[type[Exception], ...] = (
    UsageError, UnknownModelError, ModelConfigError, UnknownGPUError, UnknownEngineError, LayoutError,
    FileNotFoundError, AnchorFileError, NoCompatibleAnchor, SpecError,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"inferasim {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, CannotPredict) as exc:
        # Library validation errors (precision, dtype, ranges) name the field in their message;
        # CannotPredict says why an anchor cannot price a deployment (its kernel set unknown here).
        print(f"inferasim {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
    except OSError as exc:
        # A file the command writes (a full disk, a folder where a file goes) or stdout itself.
        where = f" {exc.filename}:" if exc.filename else ""
        print(f"inferasim {args.command}: error:{where} {exc.strerror or exc}", file=sys.stderr)
        return 1



if __name__ == "__main__":
    sys.exit(main())

"""`inferasim memory`: weights, workspace and KV capacity per GPU for a layout."""

from __future__ import annotations

import argparse

from inferasim.catalog.engines import ENGINES, normalize_engine
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.catalog.precision import PRECISIONS
from inferasim.cli.args import fraction, note_checkpoint_precision
from inferasim.cli.args import positive_int as _positive
from inferasim.cli.usage import add_layout, add_output, layout_of, refuse_over_context
from inferasim.model.memory import plan_memory
from inferasim.output import emit, table

# ---- memory ------------------------------------------------------------------------------------

def cmd_memory(args: argparse.Namespace) -> int:
    model = get_model(args.model)
    gpu = get_gpu(args.gpu)
    layout = layout_of(args)
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
    refuse_over_context(model, "--context", args.context, "no sequence that long runs")
    if plan.feasible and args.context:
        rows.append((f"sequences of {args.context} tokens", plan.max_concurrency(args.context)))
        d["max_concurrency_at_context"] = {"context": args.context,
                                           "sequences": plan.max_concurrency(args.context)}
    emit(d, args.output, table(["memory plan", "value"], rows))
    return 0 if plan.feasible or not args.strict else 1


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim memory`."""
    p = sub.add_parser("memory", help="weights, workspace and KV capacity per GPU for a layout")
    p.add_argument("--model", required=True, help="Hugging Face id or config.json path")
    p.add_argument("--gpu", required=True, help="GPU name, e.g. MI355X, h200_sxm, NVIDIA-H200")
    p.add_argument("--engine", default="vllm", help=f"one of {', '.join(ENGINES)}")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="weight precision (default: the checkpoint's)")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="auto, bf16 or fp8 (default: fp8 for fp8/fp4 precision, as predict and tune price)")
    p.add_argument("--memory-fraction", type=fraction("memory-fraction"), default=None,
                   help="gpu_memory_utilization / mem_fraction_static (default: the engine's own)")
    p.add_argument("--context", type=_positive("context"), default=None,
                   help="also report how many sequences of this length fit")
    p.add_argument("--strict", action="store_true", help="exit 1 when the layout does not fit")
    add_layout(p)
    add_output(p)
    p.set_defaults(func=cmd_memory)

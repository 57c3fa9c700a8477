"""The `inferasim` command.

Every user error (unknown model, GPU, engine, bad layout, unreadable file) ends with a one-line
message that names the field and what is accepted, and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from inferasim.catalog.engines import ENGINES, UnknownEngineError
from inferasim.catalog.gpus import UnknownGPUError, get_gpu, list_gpus
from inferasim.catalog.models import (
    PRECISIONS,
    ModelConfigError,
    UnknownModelError,
    get_model,
    known_models,
)
from inferasim.layout import Layout, LayoutError
from inferasim.memory import plan_memory
from inferasim.output import OUTPUT_FORMATS, emit, table

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user; printed as one line, exit code 2."""


def _positive(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive integer, got {value}")
        return value

    return parse


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=OUTPUT_FORMATS, default="table",
                   help="table for people, json or yaml for programs")


def _add_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=_positive("tp"), default=1, help="tensor-parallel width")
    p.add_argument("--pp", type=_positive("pp"), default=1, help="pipeline stages")
    p.add_argument("--dp", type=_positive("dp"), default=1, help="attention data-parallel ranks")
    p.add_argument("--ep", type=_positive("ep"), default=1, help="expert-parallel width of MoE layers")


def _layout(args: argparse.Namespace) -> Layout:
    try:
        return Layout(tp=args.tp, pp=args.pp, dp=args.dp, moe_ep=args.ep)
    except LayoutError as exc:
        raise UsageError(str(exc)) from None


# ---- models ------------------------------------------------------------------------------------

def cmd_models(args: argparse.Namespace) -> int:
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
                     "attention": sorted({la.attention.kind for la in m.layers}),
                     "checkpoint_format": m.checkpoint_format})
        rows.append((hf_id, m.total_params / 1e9, m.active_param_count / 1e9,
                     ",".join(sorted({la.attention.kind for la in m.layers})), m.checkpoint_format, ""))
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
    rows = [(g.name, g.vendor, g.hbm_gb, g.hbm_bandwidth / 1e12, g.peak_flops("bf16") / 1e12,
             g.peak_flops("fp8") / 1e12, g.peak_flops("fp4") / 1e12,
             f"{g.scale_up.name} {g.scale_up.bandwidth / 1e9:.0f} GB/s x{g.scale_up.domain}",
             g.gpus_per_node) for g in gpus]
    emit(data, args.output, table(
        ["gpu", "vendor", "HBM GB", "TB/s", "bf16 TF", "fp8 TF", "fp4 TF", "scale-up (per dir.)", "per node"],
        rows))
    return 0


# ---- memory ------------------------------------------------------------------------------------

def cmd_memory(args: argparse.Namespace) -> int:
    model = get_model(args.model)
    gpu = get_gpu(args.gpu)
    layout = _layout(args)
    plan = plan_memory(model, gpu, layout, engine=args.engine, precision=args.precision,
                       kv_dtype=args.kv_cache_dtype, memory_fraction=args.memory_fraction)
    d = plan.as_dict()
    w = d["weights_gb_per_gpu"]
    rows = [
        ("model", plan.model), ("gpu", f"{gpu.name} ({gpu.hbm_gb:.0f} GB)"),
        ("engine", plan.engine), ("precision", plan.precision),
        ("layout", f"{layout.label()} ({layout.gpus} GPUs)"),
        ("memory fraction", plan.memory_fraction),
        ("weights / GPU (GB)", w["total"]),
        ("  attention", w["attention"]), ("  dense MLP", w["dense_mlp"]),
        ("  routed experts", w["routed_experts"]), ("  shared experts", w["shared_experts"]),
        ("  embeddings + head", w["embeddings_head"]),
        ("activations (GB, est.)", d["activation_gb"]), ("non-torch (GB, est.)", d["non_torch_gb"]),
        ("KV pool / GPU (GB)", d["kv_gb_per_gpu"]),
        ("KV bytes / token / GPU", d["kv_bytes_per_token_per_gpu"]),
        ("KV tokens / replica", d["kv_tokens_per_replica"]),
        ("feasible", plan.feasible),
    ] + [("why not", r) for r in plan.reasons]
    if plan.feasible and args.context:
        rows.append((f"sequences of {args.context} tokens", plan.max_concurrency(args.context)))
        d["max_concurrency_at_context"] = {"context": args.context,
                                           "sequences": plan.max_concurrency(args.context)}
    emit(d, args.output, table(["memory plan", "value"], rows))
    return 0 if plan.feasible or not args.strict else 1


# ---- demo --------------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace) -> int:
    print("inferasim demo: the catalog and a memory plan for the bundled example\n")
    cmd_gpus(argparse.Namespace(output="table"))
    print()
    example = Path(__file__).resolve().parent.parent / "examples" / "llama70b-mi355x.yaml"
    model_name, gpu_name = "meta-llama/Meta-Llama-3.1-70B", "MI355X"
    if example.exists():
        import yaml

        spec = yaml.safe_load(example.read_text()) or {}
        model_name = spec.get("model", model_name)
        gpu_name = spec.get("hardware", {}).get("gpu", gpu_name)
    model = get_model(model_name)
    gpu = get_gpu(gpu_name)
    rows = []
    for engine in ENGINES:
        for tp in (1, 2, 4, 8):
            plan = plan_memory(model, gpu, Layout(tp=tp), engine=engine, precision="fp8")
            rows.append((engine, f"tp{tp}", plan.weights["total"] / 1e9, plan.kv_bytes / 1e9,
                         plan.kv_tokens_per_replica, plan.feasible, "; ".join(plan.reasons)))
    print(table(["engine", "layout", "weights GB/GPU", "KV GB/GPU", "KV tokens", "fits", "why not"], rows,
                title=f"Memory plans: {model.name} at fp8 on {gpu.name}"))
    return 0


# ---- entry point -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferasim",
        description="Predict LLM serving performance from anchors, simulate traffic, search deployments.")
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
    p.add_argument("--kv-cache-dtype", default="auto", help="auto, bf16, fp8")
    p.add_argument("--memory-fraction", type=float, default=None,
                   help="gpu_memory_utilization / mem_fraction_static (default: the engine's own)")
    p.add_argument("--context", type=_positive("context"), default=None,
                   help="also report how many sequences of this length fit")
    p.add_argument("--strict", action="store_true", help="exit 1 when the layout does not fit")
    _add_layout(p)
    _add_output(p)
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("demo", help="run the main job on the bundled example")
    p.set_defaults(func=cmd_demo)
    return parser


USER_ERRORS: tuple[type[Exception], ...] = (
    UsageError, UnknownModelError, ModelConfigError, UnknownGPUError, UnknownEngineError, LayoutError,
    FileNotFoundError,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"inferasim {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        # Library validation errors (precision, dtype, ranges) name the field in their message.
        print(f"inferasim {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0



if __name__ == "__main__":
    sys.exit(main())

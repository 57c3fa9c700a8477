"""`inferasim models` and `inferasim gpus`: what the catalog knows."""

from __future__ import annotations

import argparse

from inferasim.catalog.gpus import list_gpus
from inferasim.catalog.models import ModelConfigError, get_model, known_models
from inferasim.catalog.precision import PRECISIONS
from inferasim.cli.usage import UsageError, add_output
from inferasim.output import emit, table

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


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim models` and `inferasim gpus`."""
    p = sub.add_parser("models", help="list known models, or `models show NAME`")
    p.add_argument("action", nargs="?", choices=("list", "show"), default="list",
                   help="list the catalog (default), or show one model")
    p.add_argument("name", nargs="?", help="Hugging Face id (org/name or org--name) or config.json path")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="weight precision the sizes are given for (default: the checkpoint's)")
    add_output(p)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("gpus", help="GPU catalog")
    add_output(p)
    p.set_defaults(func=cmd_gpus)

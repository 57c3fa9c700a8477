"""`inferasim render`: the Kubernetes Deployment and Service of one configuration."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import GPU, get_gpu
from inferasim.catalog.models import ModelSpec, get_model
from inferasim.catalog.precision import PRECISIONS
from inferasim.cli.args import check_output_file, check_token_budget, fraction, note_gpu_precision, refuse_unservable
from inferasim.cli.args import positive_int as _positive
from inferasim.cli.usage import UsageError, add_deployment, add_layout, layout_of, refuse_over_context, usage_check
from inferasim.core.layout import Layout
from inferasim.model.memory import plan_memory

# ---- render ------------------------------------------------------------------------------------

def cmd_render(args: argparse.Namespace) -> int:
    """The Deployment and Service of one hand-picked configuration (what `tune --manifest` writes
    for its recommendation), checked as tune checks its own: flags known to the engine, the
    replica on one node, a precision the engine would run with this checkpoint."""
    from inferasim.catalog.checkpoints import priced_precision
    from inferasim.core.config import ServingConfig
    from inferasim.model.predictor import benchmark_kv_dtype
    from inferasim.render import render_manifests, served_model_id, to_yaml

    if args.out == "-":  # as `anchors fit-live --out -` and kubectl's `-f -`: standard output
        args.out = None
    if args.out is not None:  # an empty --out is a mistake, not stdout
        usage_check(check_output_file, "--out", args.out)
    layout = layout_of(args)
    model = get_model(args.model)  # an unknown model is named here, before the manifest
    gpu = get_gpu(args.gpu)
    engine = normalize_engine(args.engine)
    # Planned at the weights the named checkpoint holds (an -FP8 variant of a BF16 catalog model).
    refuse_over_context(model, "--max-model-len", args.max_model_len, "the engine refuses to start")
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


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim render`."""
    p = sub.add_parser("render", help="the Kubernetes Deployment and Service of one configuration")
    add_deployment(p)
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="weights as priced; fp8 of a 16-bit checkpoint adds the engine's online quantization")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="auto, bf16 or fp8 (default: fp8 for fp8/fp4 precision, as predict and tune price)")
    p.add_argument("--replicas", type=_positive("replicas"), default=1,
                   help="copies of the layout behind one Service (default 1)")
    p.add_argument("--max-num-seqs", type=_positive("max-num-seqs"), default=None,
                   help="running requests per engine (default: the engine's)")
    p.add_argument("--max-num-batched-tokens", type=_positive("max-num-batched-tokens"), default=None,
                   help="tokens per engine step (default: the engine's)")
    p.add_argument("--memory-fraction", type=fraction("memory-fraction"), default=None,
                   help="gpu_memory_utilization / mem_fraction_static (default: the engine's own)")
    p.add_argument("--max-model-len", type=_positive("max-model-len"), default=None,
                   help="longest prompt + output accepted (default: the model's context)")
    p.add_argument("--image", default=None, help="engine image (default: the engine's release image for the GPU)")
    p.add_argument("--engine-version", default="", help="image tag version, when --image is not given")
    p.add_argument("--disagg-role", choices=("prefill", "decode"), default=None,
                   help="one pool of a P/D deployment (its KV-transfer flags)")
    p.add_argument("--name", default="llm", help="Deployment and Service name")
    p.add_argument("--namespace", default="default", help="namespace of the rendered objects (default: default)")
    p.add_argument("--out", default=None, help="write the YAML to this file (default, or -: stdout)")
    add_layout(p)
    p.set_defaults(func=cmd_render)

"""`inferasim render`: the Kubernetes Deployment and Service of one configuration."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import GPU, get_gpu
from inferasim.catalog.models import ModelSpec, get_model
from inferasim.catalog.precision import PRECISIONS
from inferasim.cli.args import check_output_file, check_token_budget, fraction, note_gpu_precision, refuse_unservable
from inferasim.cli.args import positive_int as _positive
from inferasim.cli.usage import UsageError, add_deployment, add_layout, layout_of, refuse_over_context, usage_check
from inferasim.core.layout import Layout, LayoutError
from inferasim.model.memory import plan_memory

if TYPE_CHECKING:  # pragma: no cover
    from inferasim.core.config import ServingConfig
    from inferasim.render_bench import BenchWorkload
    from inferasim.render_pod import RenderOptions

# ---- render ------------------------------------------------------------------------------------

def cmd_render(args: argparse.Namespace) -> int:
    """The manifests of one hand-picked configuration (what `tune --manifest` writes for its
    recommendation), checked as tune checks its own: flags known to the engine, the replica on one node,
    a precision the engine would run with this checkpoint. ``--pd`` renders a P/D deployment: both pools
    and the engine's router; ``--bench`` adds the benchmark Job."""
    from inferasim.render import render_manifests, to_yaml
    from inferasim.render_bench import render_bench_job
    from inferasim.render_pd import render_pd_manifests

    if args.out == "-":  # as `anchors fit-live --out -` and kubectl's `-f -`: standard output
        args.out = None
    if args.out is not None:  # an empty --out is a mistake, not stdout
        usage_check(check_output_file, "--out", args.out)
    options = _options(args)
    bench = _bench_workload(args)
    if args.pd is not None:
        if args.disagg_role is not None:
            raise UsageError("--pd renders both pools with their roles; drop --disagg-role")
        if (args.tp, args.pp, args.dp, args.ep) != (1, 1, 1, 1):
            raise UsageError("--pd names each pool's layout (P2xtp1+D2xtp1); drop --tp/--pp/--dp/--ep")
        (p_workers, p_layout), (d_workers, d_layout) = _pd_layouts(args.pd)
        prefill = _config(args, p_layout, "prefill", p_workers * args.replicas)
        decode = _config(args, d_layout, "decode", d_workers * args.replicas)
        manifests = _render(lambda: render_pd_manifests(prefill, decode, args.name, args.namespace, options))
        cfg, what = decode, f"P/D {args.pd} x{args.replicas}: router, prefill and decode pools"
    else:
        cfg = _config(args, layout_of(args), args.disagg_role, args.replicas)
        manifests = _render(lambda: render_manifests(cfg, args.name, args.namespace, options))
        what = f"{cfg.engine} {cfg.layout.label()} x{args.replicas}"
    if bench is not None:
        manifests.append(_render(lambda: render_bench_job(cfg, args.name, f"{args.name}-bench", bench,
                                                          args.namespace, options)))
    text = to_yaml(manifests)
    if args.out:
        Path(args.out).write_text(text)
        kinds = ", ".join(sorted({m["kind"] for m in manifests}))
        print(f"wrote {args.out}: {what} ({kinds})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _render(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _options(args: argparse.Namespace) -> RenderOptions:
    from inferasim.render_pod import RenderOptions, check_options

    options = RenderOptions(model_cache_pvc=args.model_cache_pvc, offline=args.offline,
                            runtime_class_name=args.runtime_class, rocm_render_gid=args.rocm_render_gid,
                            rdma_resource=args.rdma_resource, rdma_count=args.rdma_count,
                            kv_transfer_backend=args.kv_transfer_backend, router_image=args.router_image,
                            pod_disruption_budget=not args.no_pdb)
    try:
        check_options(options, get_gpu(args.gpu).vendor)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return options


def _bench_workload(args: argparse.Namespace) -> BenchWorkload | None:
    from inferasim.render_bench import BenchWorkload

    if not args.bench:
        given = [f for f in ("bench_input_tokens", "bench_output_tokens", "bench_rate", "bench_requests")
                 if getattr(args, f) is not None]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} sets the benchmark Job: add --bench")
        return None
    try:
        return BenchWorkload(input_tokens=args.bench_input_tokens or 1024,
                             output_tokens=args.bench_output_tokens or 256, request_rate=args.bench_rate,
                             num_requests=args.bench_requests or 1000)
    except ValueError as exc:
        raise UsageError(f"--bench: {exc}") from None


_PD = re.compile(r"^P(\d+)x([a-z0-9-]+)\+D(\d+)x([a-z0-9-]+)$")
_PART = re.compile(r"^(tp|pp|dp|ep)(\d+)$")


def _pd_layouts(text: str) -> tuple[tuple[int, Layout], tuple[int, Layout]]:
    """``P2xtp1+D2xtp1`` -> ((2, tp1), (2, tp1)): workers and layout of each pool, as tune prints them."""
    m = _PD.match(text.strip())
    if not m:
        raise UsageError(f"--pd {text!r}: give the pools as tune prints them, PxLAYOUT+DxLAYOUT, e.g. "
                         "P2xtp1+D2xtp1 or P1xtp4+D1xtp2-dp2")
    pools = []
    for workers, label in ((m.group(1), m.group(2)), (m.group(3), m.group(4))):
        fields = {"tp": 1, "pp": 1, "dp": 1, "ep": 1}
        for part in label.split("-"):
            pm = _PART.match(part)
            if not pm:
                raise UsageError(f"--pd {text!r}: {part!r} is not tpN, ppN, dpN or epN")
            fields[pm.group(1)] = int(pm.group(2))
        if int(workers) < 1 or int(workers) > 1024:
            raise UsageError(f"--pd {text!r}: a pool has 1 to 1024 workers, not {workers}")
        try:
            layout = Layout(tp=fields["tp"], pp=fields["pp"], dp=fields["dp"], moe_ep=fields["ep"])
        except LayoutError as exc:
            raise UsageError(f"--pd {text!r}: {exc}") from None
        pools.append((int(workers), layout))
    return pools[0], pools[1]


def _config(args: argparse.Namespace, layout: Layout, role: str | None, replicas: int) -> ServingConfig:
    """The checked ServingConfig of one pool at ``layout``."""
    from inferasim.catalog.checkpoints import priced_precision
    from inferasim.core.config import ServingConfig
    from inferasim.model.predictor import benchmark_kv_dtype
    from inferasim.render import served_model_id

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
    return ServingConfig(
        engine=engine, model=served_model_id(args.model, model.name), gpu=gpu.name, layout=layout,
        replicas=replicas,
        precision=args.precision, kv_cache_dtype=kv_dtype, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        # The raised fraction the layout needs is rendered, not only noted (None: the engine's default).
        memory_fraction=fraction,
        max_model_len=max_model_len, image=args.image, engine_version=args.engine_version,
        disagg_role=role)


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
    p = sub.add_parser("render", help="the Kubernetes manifests of one configuration (Deployment, Service, "
                                      "PodDisruptionBudget; with --pd the P/D router and both pools)")
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
    p.add_argument("--pd", default=None, metavar="PxLAYOUT+DxLAYOUT",
                   help="a P/D deployment in tune's notation (P2xtp1+D2xtp1: two prefill workers at tp1, two decode "
                        "workers at tp1): the engine's P/D router (Service NAME), NAME-prefill and NAME-decode")
    g = p.add_argument_group("pods")
    g.add_argument("--model-cache-pvc", default=None, metavar="CLAIM",
                   help="mount this existing PersistentVolumeClaim at HF_HOME (weights downloaded once)")
    g.add_argument("--offline", action="store_true",
                   help="load only from --model-cache-pvc (HF_HUB_OFFLINE=1, mounted read-only)")
    g.add_argument("--runtime-class", default=None, metavar="NAME",
                   help="NVIDIA: the pods' runtimeClassName (e.g. nvidia)")
    g.add_argument("--rocm-render-gid", type=int, default=None, metavar="GID",
                   help="AMD: the nodes' render group GID, added to the pods' groups beside video (44)")
    g.add_argument("--rdma-resource", default=None, metavar="RESOURCE",
                   help="P/D: RDMA device-plugin resource each pool pod requests, e.g. rdma/hca_shared_devices_a")
    g.add_argument("--rdma-count", type=_positive("rdma-count"), default=1, help="P/D: how many --rdma-resource")
    g.add_argument("--kv-transfer-backend", choices=("mooncake", "nixl"), default="mooncake",
                   help="SGLang P/D: --disaggregation-transfer-backend")
    g.add_argument("--router-image", default=None, help="P/D: the router's image (default: the engine's image)")
    g.add_argument("--no-pdb", action="store_true", help="render no PodDisruptionBudget")
    b = p.add_argument_group("benchmark Job")
    b.add_argument("--bench", action="store_true",
                   help="add a Job NAME-bench running the engine's benchmark client against Service NAME")
    b.add_argument("--bench-input-tokens", type=_positive("bench-input-tokens"), default=None,
                   help="prompt tokens per request (default 1024)")
    b.add_argument("--bench-output-tokens", type=_positive("bench-output-tokens"), default=None,
                   help="output tokens per request (default 256)")
    b.add_argument("--bench-rate", type=float, default=None,
                   help="requests/s, Poisson (default: every request at once)")
    b.add_argument("--bench-requests", type=_positive("bench-requests"), default=None,
                   help="requests in all (default 1000)")
    p.add_argument("--name", default="llm", help="Deployment and Service name (with --pd: the router's Service)")
    p.add_argument("--namespace", default="default", help="namespace of the rendered objects (default: default)")
    p.add_argument("--out", default=None, help="write the YAML to this file (default, or -: stdout)")
    add_layout(p)
    p.set_defaults(func=cmd_render)

"""`inferasim advise`: the batching advisor (a batch limit for a latency target, KV to give back)."""

from __future__ import annotations

import argparse
import sys

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.cli.args import (
    check_anchor_matches,
    fraction,
    note_carried,
    note_checkpoint_precision,
    note_multi_node,
    precision_name,
    refuse_engine_on_gpu,
    refuse_unservable,
)
from inferasim.cli.args import positive_float as _positive_float
from inferasim.cli.args import positive_int as _positive
from inferasim.cli.usage import add_deployment, add_layout, add_output, anchors_in, layout_of, refuse_beyond_context
from inferasim.core.layout import Layout
from inferasim.model.anchors import load_anchor
from inferasim.output import emit, table


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
    found = anchored_fit(anchors_in(args.anchors), engine, model, gpu, precision)
    if found is not None:
        note_carried(found[0])
        return found[0], True
    print("note: no anchor for this kernel set; advising measurement-free", file=sys.stderr)
    return measurement_free(anchors_in(args.anchors), engine, model, gpu, precision, layout,
                            kv_dtype=benchmark_kv_dtype(precision)), False


def cmd_advise(args: argparse.Namespace) -> int:
    from inferasim.search.advisor import advise_batch

    layout = layout_of(args)
    refuse_beyond_context(get_model(args.model), args.isl, args.osl)
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


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim advise`."""
    p = sub.add_parser("advise", help="batching advisor: batch limit for a latency target, KV to give back")
    add_deployment(p)
    p.add_argument("--precision", type=precision_name, default="auto",
                   help="weight precision: auto (the checkpoint's), bf16, fp8, fp4 ...")
    p.add_argument("--isl", type=_positive("isl"), required=True, help="input tokens per request")
    p.add_argument("--osl", type=_positive("osl"), required=True, help="output tokens per request")
    p.add_argument("--itl-p90-ms", type=_positive_float("itl-p90-ms"), required=True,
                   help="latency target: p90 inter-token latency")
    p.add_argument("--max-loss", type=fraction("max-loss", zero=True), default=0.05,
                   help="share of the throughput one may give up, a fraction (default 0.05: 5%%)")
    p.add_argument("--anchor", default=None, help="an anchor JSON file to use (default: the best of --anchors)")
    p.add_argument("--anchors", action="append", default=None, metavar="FOLDER",
                   help="anchor folder; repeat for several (default: anchors/)")
    add_layout(p)
    add_output(p)
    p.set_defaults(func=cmd_advise)

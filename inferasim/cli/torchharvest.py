"""`inferasim harvest torch-plan` and `harvest torch-import`: the PyTorch step harvest's two ends.

torch-plan writes what the harness times (inferasim.harvest.torchplan); the harness runs on the
GPU node as a plain script (inferasim/harvest/torchstep.py, torch only); torch-import fits its
result into anchors (inferasim.harvest.torchimport).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferasim.cli.emulate import positive_int


def add_actions(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    plan = actions.add_parser(
        "torch-plan", help="write the step grid a PyTorch harvest times on one GPU",
        description="Shapes of each model (from the catalog) and the decode / prefill / mixed steps that fit "
                    "on one GPU beside its bf16 weights. Run the plan on the GPU node with "
                    "`python3 inferasim/harvest/torchstep.py PLAN RESULT` (needs torch only), then "
                    "`inferasim harvest torch-import RESULT`.")
    plan.add_argument("--model", action="append", required=True,
                      help="Hugging Face id of a dense GQA/MHA model the catalog knows (repeat for more)")
    plan.add_argument("--gpu", required=True, help="GPU the harness will run on (see `inferasim gpus`)")
    plan.add_argument("--tp", action="append", type=positive_int("tp"), default=None,
                      help="also time one GPU's slice at this tensor width, for the layout check "
                           "(repeatable; default 1 only)")
    plan.add_argument("--out", required=True, help="plan JSON to write")
    plan.set_defaults(func=cmd_torch_plan)
    imp = actions.add_parser(
        "torch-import", help="fit a PyTorch harvest result into anchors",
        description="One anchor per tp-1 model of the result: its steps, GPU terms fitted from them, host "
                    "terms of --engine's prior. Kernel set: attention backend torch-sdpa, graph mode "
                    "cuda-graph (use it with `predict --anchor FILE`).")
    imp.add_argument("result", help="the JSON the harness wrote")
    imp.add_argument("--engine", default="vllm", help="engine whose host costs complete the anchor (default vllm)")
    imp.add_argument("--engine-version", default="", help="that engine's release (part of the kernel set)")
    imp.add_argument("--out", default="anchors/", help="folder (or file, for one model) to write (default anchors/)")
    imp.set_defaults(func=cmd_torch_import)


def cmd_torch_plan(args: argparse.Namespace) -> int:
    from inferasim.catalog.gpus import get_gpu
    from inferasim.catalog.models import get_model
    from inferasim.harvest import torchstep
    from inferasim.harvest.torchplan import torch_plan

    tps = tuple(dict.fromkeys([1, *(args.tp or [])]))
    plan = torch_plan([get_model(m, allow_path=False) for m in args.model], get_gpu(args.gpu), tps)
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--out {args.out!r}: cannot write the plan ({exc.strerror or exc})") from None
    print(f"{'model':<36} {'tp':>3} {'weights GiB':>11} {'decode':>6} {'prefill':>7} {'mixed':>5}")
    for e in plan["models"]:
        print(f"{e['model']:<36} {e['tp']:>3} {e['weight_bytes'] / 2**30:>11.1f} {len(e['decode']):>6} "
              f"{len(e['prefill']):>7} {len(e['mixed']):>5}")
    print(f"wrote {out}; on the GPU node: python3 {Path(torchstep.__file__).name} {out.name} result.json "
          f"(the harness is {torchstep.__file__})")
    return 0


def cmd_torch_import(args: argparse.Namespace) -> int:
    from inferasim.harvest.run import write_anchor
    from inferasim.harvest.torchimport import import_result, read_result

    data = read_result(args.result)
    imported = import_result(data, args.engine, args.engine_version, source=Path(args.result).name)
    if len(imported) > 1 and not (Path(args.out).is_dir() or args.out.endswith("/")):
        raise ValueError(f"--out {args.out!r}: the result holds {len(imported)} models; give a folder (ending in /)")
    print(f"{'model':<32} {'steps':>5} {'median err':>10} {'e_bw':>5} {'e_kv':>5} {'e_flops':>7} {'e_attn':>6} "
          f"{'m_tile':>7}  file")
    for item in imported:
        p, f = item.fit.params, item.fit
        path = write_anchor(item.anchor, args.out)
        print(f"{item.anchor.kernel_set.model:<32} {f.n_points:>5} {100 * f.median_abs_error:>9.1f}% {p.e_bw:>5.2f} "
              f"{p.e_kv:>5.2f} {p.e_flops:>7.2f} {p.e_attn:>6.2f} {p.m_tile:>7.0f}  {path or 'stdout'}")
        for line in item.skipped:
            print(f"  skipped by the harness: {line}", file=sys.stderr)
    return 0

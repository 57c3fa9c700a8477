"""`inferasim mix`: the mix planner (models x latency tiers under one GPU budget)."""

from __future__ import annotations

import argparse
import sys

from inferasim.catalog.gpus import UnknownGPUError
from inferasim.catalog.models import UnknownModelError
from inferasim.catalog.userfile import load_yaml, read_user_text
from inferasim.cli.usage import UsageError, add_output, anchors_in
from inferasim.core.spec import plain_validation_error
from inferasim.output import emit, table


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
    store = anchors_in(args.anchors)  # a missing folder refused, bad files named
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


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim mix`."""
    p = sub.add_parser("mix", help="mix planner: models x latency tiers under one GPU budget")
    p.add_argument("plan", help="PLAN.yaml: hardware, engines, precision, tiers (name, models, requestRate, slo)")
    p.add_argument("--anchors", action="append", default=None, metavar="FOLDER",
                   help="anchor folder; repeat for several (default: anchors/)")
    add_output(p)
    p.set_defaults(func=cmd_mix)

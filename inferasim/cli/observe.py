"""`inferasim observe`: the live workload of a deployment, read from Prometheus."""

from __future__ import annotations

import argparse
import sys

from inferasim.cli.usage import UsageError, add_output, check_prometheus_url, parse_selector
from inferasim.output import emit, table


def cmd_observe(args: argparse.Namespace) -> int:
    from inferasim.observe import ObservationError, observe, parse_duration

    # The flags are checked before Prometheus is asked anything, each error naming its flag.
    check_prometheus_url(args.prometheus)
    try:
        if parse_duration(args.window, "--window") <= 0:
            raise UsageError(f"--window {args.window!r} must be longer than 0")
    except ObservationError as exc:
        raise UsageError(str(exc)) from None
    selector = parse_selector(args.selector)
    try:
        obs = observe({"url": args.prometheus, "selector": selector, "window": args.window}, engine=args.engine)
    except ObservationError as exc:
        print(f"inferasim observe: {exc}", file=sys.stderr)
        return 1
    d = obs.model_dump(mode="json", exclude_none=True)
    rows = [(k, v) for k, v in d.items() if not isinstance(v, dict | list)]
    emit(d, args.output, table(["observed", "value"], rows))
    return 0


def add_cli(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`inferasim observe`."""
    p = sub.add_parser("observe", help="the live workload of a deployment, read from Prometheus")
    p.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://prometheus:9090")
    p.add_argument("--selector", action="append", default=[], metavar="K=V[,K=V]",
                   help="label matchers of the target's series, e.g. namespace=llm,app=chat (repeatable)")
    p.add_argument("--window", default="5m", help="rate() window, e.g. 5m, 6h")
    p.add_argument("--engine", default="auto", choices=("auto", "vllm", "sglang", "atom"),
                   help="the engine's metric family (default: detected)")
    add_output(p)
    p.set_defaults(func=cmd_observe)

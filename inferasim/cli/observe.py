"""`inferasim observe`: the live workload of a deployment, read from Prometheus."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from inferasim.cli.usage import UsageError, add_output, check_prometheus_url, parse_selector
from inferasim.output import emit, table

if TYPE_CHECKING:
    from inferasim.observed import LatencyQuantiles, ObservedWorkload, TokenQuantiles


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
    emit(obs.model_dump(mode="json", exclude_none=True), args.output, observation_table(obs))
    return 0


def _quantiles(q: TokenQuantiles | LatencyQuantiles | None, unit: str) -> str:
    if q is None:
        return "-"
    from inferasim.observed import TokenQuantiles  # imported when a table is drawn, not at start-up

    vals = (q.p50, q.p90, q.p99) if isinstance(q, TokenQuantiles) else (q.p50_ms, q.p90_ms, q.p99_ms)
    return "  ".join(f"p{n} {'-' if v is None else f'{v:,.0f}' if unit == 'tokens' else f'{v:,.1f}'}"
                     for n, v in zip((50, 90, 99), vals, strict=True)) + f" {unit}"


def observation_table(obs: ObservedWorkload) -> str:
    """The observation for a person: units on every value, the time in UTC, the length and latency
    percentiles (`-o json` keeps every field as the operator's status stores it)."""
    when = datetime.fromtimestamp(obs.observed_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    rows: list[tuple[str, str]] = [
        ("engine", obs.engine),
        ("series", ",".join(f"{k}={v}" for k, v in obs.selector.items()) or "(all)"),
        ("window", f"{obs.window}, ending {when}"),
        ("request rate", f"{obs.request_rate:.3g} req/s ({obs.request_rate * 3600:,.0f} per hour)"),
        ("prompt length", f"mean {obs.prompt_tokens_mean:,.0f} tokens; {_quantiles(obs.prompt_tokens, 'tokens')}"),
        ("output length", f"mean {obs.output_tokens_mean:,.0f} tokens; {_quantiles(obs.output_tokens, 'tokens')}"),
        ("prefix cache hits", "n/a (no lookups in the window: prefix caching off?)" if obs.prefix_hit_rate is None
         else f"{obs.prefix_hit_rate:.1%} of prompt tokens"),
        ("running / waiting", f"{obs.running:.0f} / {obs.waiting:.0f} requests (now, all replicas)"),
        ("KV cache usage", "n/a" if obs.kv_cache_usage is None else f"{obs.kv_cache_usage:.1%}"),
        ("TTFT", _quantiles(obs.ttft, "ms")),
        ("inter-token latency", _quantiles(obs.itl, "ms")),
    ]
    rows += [("not exported", u) for u in obs.unavailable]
    return table(["observed", "value"], rows)


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

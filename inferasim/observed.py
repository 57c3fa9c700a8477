"""What :func:`inferasim.observe.observe` returns: :class:`ObservedWorkload` (request rate, length
means and quantiles, prefix-cache hit rate, running and waiting requests, observed TTFT and ITL;
camelCase on the wire: it lands in the ServingTuning status), and how far a workload moved
between two observations (:func:`drift`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from inferasim.core.spec import StaticWorkload

# --------------------------------------------------------------------------------------------
# result models (camelCase on the wire: they land in the ServingTuning status)
# --------------------------------------------------------------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class TokenQuantiles(_Wire):
    p50: float | None = Field(None, description="Median, tokens.")
    p90: float | None = Field(None, description="90th percentile, tokens.")
    p99: float | None = Field(None, description="99th percentile, tokens.")


class LatencyQuantiles(_Wire):
    p50_ms: float | None = Field(None, description="Median, milliseconds.")
    p90_ms: float | None = Field(None, description="90th percentile, milliseconds.")
    p99_ms: float | None = Field(None, description="99th percentile, milliseconds.")


class ObservedWorkload(_Wire):
    """What the live deployment served over ``window`` (rates are per second over the window)."""

    engine: str = Field(description="Engine whose metric names were read: vllm, sglang or atom.")
    window: str = Field(description="Range of the rate() windows, e.g. 5m.")
    selector: dict[str, str] = Field(default_factory=dict, description="Label matchers of the target's series.")
    observed_at: float = Field(description="Evaluation time of the queries, Unix seconds.")
    request_rate: float = Field(description="Finished requests per second (equals arrivals in steady state).")
    prompt_tokens_mean: float = Field(description="Mean prompt length, tokens (cached tokens included).")
    output_tokens_mean: float = Field(description="Mean output length, tokens.")
    prompt_tokens: TokenQuantiles | None = Field(None, description="Prompt length quantiles, from the histogram.")
    output_tokens: TokenQuantiles | None = Field(None, description="Output length quantiles, from the histogram.")
    # Optional on the wire (default None): a status patch leaves a null out, and a required field
    # would then refuse every status write of a deployment without prefix caching.
    prefix_hit_rate: float | None = Field(
        None,
        description="Share of prompt tokens served by the prefix cache, 0..1; null when the cache was never "
                    "consulted in the window (prefix caching off).")
    running: float = Field(description="Requests running now, all replicas.")
    waiting: float = Field(description="Requests waiting now, all replicas.")
    kv_cache_usage: float | None = Field(None, description="Mean KV-cache usage, 0..1.")
    ttft: LatencyQuantiles | None = Field(None, description="Observed time to first token.")
    itl: LatencyQuantiles | None = Field(None, description="Observed inter-token latency.")
    unavailable: list[str] = Field(default_factory=list,
                                   description="Quantities this engine does not export here, with the query tried.")

    def to_static(self, num_requests: int = 2000) -> StaticWorkload:
        """The open-loop workload `tune` searches for: Poisson arrivals at the observed rate with
        the observed mean lengths and prefix reuse."""
        return StaticWorkload(
            kind="poisson", request_rate=self.request_rate, input_tokens=max(int(round(self.prompt_tokens_mean)), 1),
            output_tokens=max(int(round(self.output_tokens_mean)), 1),
            prefix_hit_rate=None if self.prefix_hit_rate is None else min(max(self.prefix_hit_rate, 0.0), 1.0),
            num_requests=num_requests)

    def describe(self) -> str:
        hit = "n/a" if self.prefix_hit_rate is None else f"{self.prefix_hit_rate:.0%}"
        return (f"{self.engine} over {self.window}: {self.request_rate:.3g} req/s, "
                f"prompt {self.prompt_tokens_mean:.0f}, "
                f"output {self.output_tokens_mean:.0f} tokens, prefix hit {hit}, "
                f"{self.running:.0f} running, {self.waiting:.0f} waiting")


def drift(old: ObservedWorkload | Mapping[str, Any], new: ObservedWorkload) -> float:
    """How far the workload moved: the largest relative change of request rate, mean prompt and
    mean output length, plus the absolute change of the prefix hit rate (already a fraction).
    ``old`` may be the camelCase dict stored in a status."""
    if not isinstance(old, ObservedWorkload):
        old = ObservedWorkload.model_validate(dict(old))

    def rel(a: float, b: float) -> float:
        return abs(b - a) / max(abs(a), 1e-9)

    hit = abs((new.prefix_hit_rate or 0.0) - (old.prefix_hit_rate or 0.0))  # both None: no change
    return max(rel(old.request_rate, new.request_rate), rel(old.prompt_tokens_mean, new.prompt_tokens_mean),
               rel(old.output_tokens_mean, new.output_tokens_mean), hit)

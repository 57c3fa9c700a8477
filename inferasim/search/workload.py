"""The workload as the search sees it: mean lengths, prefix reuse and load.

Stage 1 of the search needs only a few numbers (prompt and output tokens, the share of each prompt
a prefix cache serves, the request rate or the client count); stage 2 replays requests. Multi-turn
sessions grow their prompt each turn (previous prompt + answer + new user tokens), and the part
that was already seen is what a prefix cache can serve.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferasim.core.spec import StaticWorkload


@dataclass(frozen=True)
class WorkloadShape:
    isl: float  # mean prompt tokens
    osl: float  # mean output tokens
    hit: float  # share of prompt tokens a prefix cache can serve
    rate: float | None  # requests/s offered (open loop)
    concurrency: int | None  # clients (closed loop)
    kind: str
    source: StaticWorkload | None = None

    def describe(self) -> str:
        load = f"{self.rate:.2f} req/s" if self.rate is not None else f"{self.concurrency} clients"
        return f"{self.kind}: prompt {self.isl:.0f}, output {self.osl:.0f}, prefix hit {self.hit:.0%}, {load}"


def turn_prompts(w: StaticWorkload) -> list[int]:
    """Prompt length of each turn of a session."""
    return [w.input_tokens + k * (w.output_tokens + w.user_tokens_per_turn) for k in range(w.turns)]


def shape_of(w: StaticWorkload) -> WorkloadShape:
    if w.kind == "multi-turn":
        prompts = turn_prompts(w)
        isl = sum(prompts) / len(prompts)
        # Turn k > 1 can reuse the previous prompt and answer; only the new user tokens are new.
        cached = sum(p - w.user_tokens_per_turn for p in prompts[1:])
        hit = cached / sum(prompts) if w.prefix_hit_rate is None else w.prefix_hit_rate
        rate = (w.sessions_per_second or 0.0) * w.turns
        return WorkloadShape(isl, float(w.output_tokens), hit, rate, None, w.kind, w)
    hit = w.prefix_hit_rate or 0.0
    if w.kind == "closed":
        return WorkloadShape(float(w.input_tokens), float(w.output_tokens), hit, None, w.concurrency, w.kind, w)
    return WorkloadShape(float(w.input_tokens), float(w.output_tokens), hit, w.request_rate, None, w.kind, w)

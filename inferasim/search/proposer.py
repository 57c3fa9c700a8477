"""Optional LLM proposer: an OpenAI-compatible endpoint suggests candidate configurations; the
predictor alone scores them. Off by default — the deterministic search stays the source of truth.

The model is shown the space (engines, precisions, budget, layouts that fit memory) and the best
results so far, and asked for a JSON list of configurations. Every proposal is checked against the
space; malformed or infeasible ones are rejected with a reason, never silently dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

from inferasim.core.layout import Layout, LayoutError
from inferasim.search.space import Candidate, Space

SYSTEM_PROMPT = (
    "You propose LLM serving configurations. Answer with a JSON array only. Each item: "
    '{"engine": str, "precision": str, "tp": int, "pp": int, "dp": int, "ep": int, '
    '"max_num_seqs": int, "max_num_batched_tokens": int, "chunked_prefill": bool}.'
)


@dataclass(frozen=True)
class Proposal:
    raw: Any
    candidate: Candidate | None
    reason: str  # "" when accepted


def _describe(space: Space, best: list[dict[str, Any]], engines: list[str], precisions: list[str],
              max_gpus: int) -> str:
    layouts = sorted({c.layout.label() for c in space.candidates if c.disagg is None})
    return json.dumps({
        "engines": engines, "precisions": precisions, "gpu_budget": max_gpus,
        "feasible_layouts": layouts[:60], "best_so_far": best[:5],
        "ask": "Propose up to 8 configurations likely to beat the best so far on throughput per GPU at the SLO.",
    })


def _extract_json(text: str) -> Any:
    """The first JSON array in a reply (models wrap answers in prose or code fences)."""
    match = re.search(r"\[.*\]", text, re.S)
    if not match:
        raise ValueError("no JSON array in the reply")
    return json.loads(match.group(0))


def validate_proposal(item: Any, space: Space) -> Proposal:
    if not isinstance(item, dict):
        return Proposal(item, None, "not a JSON object")
    try:
        layout = Layout(tp=int(item.get("tp", 1)), pp=int(item.get("pp", 1)), dp=int(item.get("dp", 1)),
                        moe_ep=int(item.get("ep", 1)))
        engine = str(item["engine"]).lower()
        precision = str(item.get("precision", "auto")).lower()
        cand = Candidate(engine, precision, layout, int(item.get("max_num_seqs", 256)),
                         int(item.get("max_num_batched_tokens", 8192)), bool(item.get("chunked_prefill", True)))
    except (KeyError, TypeError, ValueError, LayoutError) as exc:
        return Proposal(item, None, f"malformed: {exc}")
    feasible = {(c.engine, c.precision, c.layout) for c in space.candidates if c.disagg is None}
    if (cand.engine, cand.precision, cand.layout) not in feasible:
        pruned = dict(space.pruned).get(f"{cand.engine} {cand.precision} {cand.layout.label()}")
        why = pruned or "engine, precision or layout outside the space (budget, node size, memory)"
        return Proposal(item, None, f"infeasible: {why}")
    if not 1 <= cand.max_num_seqs <= 4096 or not 256 <= cand.max_batched_tokens <= 131072:
        return Proposal(item, None, "scheduler limits out of range (max_num_seqs 1-4096, tokens 256-131072)")
    return Proposal(item, cand, "")


def propose(endpoint: str, model: str, space: Space, best: list[dict[str, Any]], engines: list[str],
            precisions: list[str], max_gpus: int, api_key: str | None = None, timeout: float = 30.0,
            client: httpx.Client | None = None) -> list[Proposal]:
    """Ask the endpoint once; return every proposal with its verdict."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "temperature": 0.2, "messages": [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": _describe(space, best, engines, precisions, max_gpus)}]}
    own = client is None
    client = client or httpx.Client(timeout=timeout)
    try:
        resp = client.post(endpoint.rstrip("/") + "/v1/chat/completions", json=body, headers=headers)
        resp.raise_for_status()
        text = resp.json()["choices"][0]["message"]["content"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        return [Proposal(None, None, f"endpoint failed: {exc}")]
    finally:
        if own:
            client.close()
    try:
        items = _extract_json(text)
    except ValueError as exc:
        return [Proposal(text[:200], None, f"unparsable reply: {exc}")]
    if not isinstance(items, list):
        return [Proposal(items, None, "the reply is not a JSON array")]
    return [validate_proposal(it, space) for it in items]

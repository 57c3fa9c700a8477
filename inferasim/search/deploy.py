"""From a tuning result to Kubernetes manifests (through inferasim.render)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferasim.render import ServingConfig, render_manifests, to_yaml

if TYPE_CHECKING:  # pragma: no cover
    from inferasim.search.estimate import Estimate
    from inferasim.search.tune import TuneResult


def config_of(result: TuneResult, e: Estimate) -> ServingConfig:
    c = e.candidate
    return ServingConfig(
        engine=c.engine, model=result.model.name, gpu=result.gpu.name, layout=c.layout, replicas=e.replicas,
        precision=c.precision, kv_cache_dtype=e.fitted.kv_dtype, max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_batched_tokens, chunked_prefill=c.chunked_prefill,
    )


def manifests_for(result: TuneResult, name: str = "llm", namespace: str = "default") -> str:
    rec = result.recommendation
    if rec is None:
        raise ValueError("the search found no feasible deployment to render")
    return to_yaml(render_manifests(config_of(result, rec), name, namespace))

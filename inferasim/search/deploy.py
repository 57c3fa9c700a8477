"""From a tuning result to Kubernetes manifests (through inferasim.render)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.model.memory import start_max_model_len
from inferasim.render import render_manifests, served_model_id, to_yaml
from inferasim.render_pd import render_pd_manifests
from inferasim.render_pod import RenderOptions

if TYPE_CHECKING:  # pragma: no cover
    from inferasim.search.estimate import Estimate
    from inferasim.search.tune import TuneResult


def pool_configs(result: TuneResult, e: Estimate) -> list[tuple[str, ServingConfig]]:
    """(name suffix, config) of each pool that deploys ``e``: one for colocated replicas; for a
    disaggregated candidate a prefill and a decode pool, each with its workers x ``e.replicas``
    pods at its own layout and its role (the engine's KV-transfer flags)."""
    c = e.candidate
    common: dict[str, Any] = dict(
        engine=c.engine, model=served_model_id(result.spec.model, result.model.name), gpu=result.gpu.name,
        precision=c.precision,
        kv_cache_dtype=e.fitted.kv_dtype, max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_batched_tokens, chunked_prefill=c.chunked_prefill,
    )
    def starts(layout: Layout) -> int | None:
        # A KV pool shorter than the model's context: vLLM starts only with --max-model-len within it.
        return start_max_model_len(result.model, result.gpu, layout, c.engine, c.precision, e.fitted.kv_dtype,
                                   max_num_batched_tokens=c.max_batched_tokens, max_num_seqs=c.max_num_seqs)

    d = c.disagg
    if d is None:
        return [("", ServingConfig(layout=c.layout, replicas=e.replicas, max_model_len=starts(c.layout), **common))]
    return [
        ("-prefill", ServingConfig(layout=d.prefill, replicas=d.prefill_workers * e.replicas,
                                   disagg_role="prefill", max_model_len=starts(d.prefill), **common)),
        ("-decode", ServingConfig(layout=d.decode, replicas=d.decode_workers * e.replicas,
                                  disagg_role="decode", max_model_len=starts(d.decode), **common)),
    ]


def config_of(result: TuneResult, e: Estimate) -> ServingConfig:
    """The one config of a colocated candidate. A disaggregated one deploys two pools
    (pool_configs): ValueError, rather than a single Deployment that would serve the whole load
    on the decode pool's GPUs."""
    pools = pool_configs(result, e)
    if len(pools) != 1:
        raise ValueError(f"{e.candidate.label()} is disaggregated: it deploys a prefill and a decode pool "
                         "(search.deploy.pool_configs), not one Deployment")
    return pools[0][1]


def render_pools(result: TuneResult, e: Estimate, name: str, namespace: str = "default") -> list[dict[str, Any]]:
    """What serves ``e``, as the spec's `deploy` section asks: Deployment and Service ``name``, or for a
    P/D candidate the prefill and decode pools with the engine's P/D router (render_pd)."""
    options = RenderOptions.from_spec(result.spec.deploy)
    pools = pool_configs(result, e)
    if len(pools) == 2:
        return render_pd_manifests(pools[0][1], pools[1][1], name, namespace, options)
    return render_manifests(pools[0][1], name, namespace, options)


# Annotation holding what the search predicted for a rendered recommendation, for the canary
# automation that compares it with what the deployment then measures (and for a person reading
# the manifest: whether it was predicted to meet the SLO at all).
ANNOTATION_PREDICTED = "inferasim.io/predicted"


def predicted_annotation(result: TuneResult, e: Estimate) -> str:
    entry = result.entry(e)
    p = entry["predicted"]
    keep = ("ttft_p90_ms", "itl_p90_ms", "ttft_ms", "tpot_ms", "throughput_per_gpu_at_slo",
            "max_request_rate_per_replica_at_slo")
    view = {k: (round(p[k], 3) if isinstance(p.get(k), float) else p.get(k)) for k in keep}
    view.update(meets_slo=entry["meets_slo"], shape=entry["shape"], anchor=entry["anchor"] or "unanchored")
    return json.dumps(view, separators=(",", ":"))


def recommendation_manifests(result: TuneResult, e: Estimate, name: str,
                             namespace: str = "default") -> list[dict[str, Any]]:
    """render_pools, each Deployment annotated with what the search predicted for it (the same
    manifests for `tune --manifest` and the operator's ConfigMap)."""
    manifests = render_pools(result, e, name, namespace)
    note = predicted_annotation(result, e)
    for m in manifests:
        if m["kind"] in ("Deployment", "LeaderWorkerSet"):
            m["metadata"]["annotations"][ANNOTATION_PREDICTED] = note
    return manifests


def manifests_for(result: TuneResult, name: str = "llm", namespace: str = "default") -> str:
    rec = result.recommendation
    if rec is None:
        raise ValueError("the search found no feasible deployment to render")
    return to_yaml(recommendation_manifests(result, rec, name, namespace))

"""What a search's payload becomes in the status and for GitOps: the recommendation (or why none
may be published), the short list, and the recommendation's ConfigMap."""

from __future__ import annotations

import math
from typing import Any

import yaml

from inferasim.core.spec import TuningSpec
from inferasim_operator import kube as kube_mod
from inferasim_operator.models import (
    CARRIES_MAX,
    CARRY_CHARS,
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_TUNING,
    MANAGER,
    SHORTLIST_SIZE,
    Candidate,
    LayoutStatus,
    Predicted,
    Recommendation,
    dump,
    label_value,
)


def _predicted(p: dict[str, Any]) -> Predicted:
    return Predicted(throughput_per_gpu=_finite(p.get("throughput_per_gpu_at_slo")),
                     max_request_rate_per_replica=_finite(p.get("max_request_rate_per_replica_at_slo")),
                     ttft_ms=_finite(p.get("ttft_ms")), tpot_ms=_finite(p.get("tpot_ms")),
                     ttft_p90_ms=_finite(p.get("ttft_p90_ms")), itl_p90_ms=_finite(p.get("itl_p90_ms")),
                     cost_per_million_tokens=_finite(p.get("cost_per_million_tokens")),
                     interval=_finite(p.get("interval_log")), stage=p.get("stage"))


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def candidate_of(entry: dict[str, Any], confirm_hours: float | None = None) -> Candidate:
    lay = entry["layout"]
    return Candidate(
        engine=entry["engine"], precision=entry["precision"],
        layout=LayoutStatus(tp=lay.get("tp", 1), pp=lay.get("pp", 1), dp=lay.get("dp", 1),
                            moe_tp=lay.get("moe_tp", 0), moe_ep=lay.get("moe_ep", 1)),
        # A disaggregated candidate's shape (P2xtp4+D1xtp8), not only its decode pool's layout.
        layout_label=entry.get("shape") or entry["layout_label"], replicas=entry["replicas"], gpus=entry["gpus"],
        max_num_seqs=entry.get("max_num_seqs"), max_num_batched_tokens=entry.get("max_num_batched_tokens"),
        chunked_prefill=entry.get("chunked_prefill"), predicted=_predicted(entry.get("predicted") or {}),
        meets_slo=bool(entry.get("meets_slo")), extrapolated=bool(entry.get("extrapolated")),
        measurement_free=entry.get("anchor") is None,
        carries=[str(c)[:CARRY_CHARS] for c in (entry.get("carries") or [])][:CARRIES_MAX],
        anchor=entry.get("anchor"), confirm_gpu_hours=confirm_hours)


def recommendation_of(payload: dict[str, Any], config_map: str) -> Recommendation | None:
    rec = payload.get("recommendation")
    if not rec:
        return None
    c = candidate_of(rec)
    view = payload.get("container") or {}
    return Recommendation(**c.model_dump(), image=view.get("image", ""), args=view.get("args", []),
                          env=view.get("env", []), resources=view.get("resources", {}),
                          manifest=payload.get("manifest", ""), manifest_config_map=config_map)


def infeasible_reason(rec: Recommendation, payload: dict[str, Any], spec: TuningSpec) -> str:
    """Why the search's first candidate must not be published ('' when it may): it misses the SLO
    (the search ranks the closest miss first when no deployment meets it), or its predicted
    throughput at the SLO is zero or not a finite number. The message names the closest candidate
    and the SLO term it misses."""
    what = f"{rec.engine} {rec.precision} {rec.layout_label} x{rec.replicas} ({rec.gpus} GPUs)"
    slo = spec.objective.slo.model_dump(by_alias=True, exclude_none=True)
    terms = ", ".join(f"objective.slo.{k} {v:g}" for k, v in slo.items()) or "no SLO terms set"
    if not rec.meets_slo:
        miss = str(payload.get("slo_miss") or "") or _p90_miss(rec, spec)
        return (f"no deployment of {payload.get('candidates', 0)} candidates meets the SLO ({terms}); the closest, "
                f"{what}, misses {miss}")
    tp = rec.predicted.throughput_per_gpu  # None when the search's figure was not finite
    if tp is None or tp <= 0:
        raw = ((payload.get("recommendation") or {}).get("predicted") or {}).get("throughput_per_gpu_at_slo")
        return (f"no deployment of {payload.get('candidates', 0)} candidates serves a positive throughput within "
                f"the SLO ({terms}); the closest, {what}, predicts {raw!r} tok/s/GPU")
    return ""


def _p90_miss(rec: Recommendation, spec: TuningSpec) -> str:
    """The p90 term `rec` misses most, from its predicted figures (a payload without `slo_miss`)."""
    slo, p = spec.objective.slo, rec.predicted
    worst, words = 1.0, "the SLO"
    terms = (("TTFT p90", p.ttft_p90_ms, slo.ttft_p90_ms), ("ITL p90", p.itl_p90_ms, slo.itl_p90_ms))
    for name, value, target in terms:
        if value is not None and target and value / target > worst:
            worst, words = value / target, f"{name} {value:,.1f} ms against {target:g} ms"
    return words


def shortlist_of(payload: dict[str, Any], window_s: float) -> list[Candidate]:
    out = []
    for e in payload.get("shortlist", [])[:SHORTLIST_SIZE]:
        out.append(candidate_of(e, confirm_hours=round(e["gpus_per_replica"] * window_s / 3600.0, 4)))
    return out


def config_map_for(body: dict[str, Any], rec: Recommendation, payload: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    summary = {k: v for k, v in dump(rec).items() if k != "manifest"}
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(meta["name"]), "namespace": meta["namespace"],
                     "labels": {LABEL_MANAGED: MANAGER, LABEL_TUNING: label_value(meta["name"]),
                                LABEL_KIND: "recommendation"},
                     "annotations": {"inferasim.io/generation": str(meta.get("generation", ""))}},
        "data": {
            "manifest.yaml": payload.get("manifest", ""),
            "recommendation.yaml": yaml.safe_dump(summary, sort_keys=False),
            "shortlist.yaml": yaml.safe_dump([dump(candidate_of(e)) for e in payload.get("shortlist", [])],
                                             sort_keys=False),
        },
    }
    kube_mod.own(cm, body)
    return cm


def config_map_name(tuning: str) -> str:
    return f"{tuning}-recommendation"[:253]

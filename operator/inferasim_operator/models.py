"""The operator's API: group, kinds and the pydantic models of the ServingTuning status.

The ServingTuning `spec` is :class:`inferasim.core.spec.TuningSpec` (what `inferasim tune` reads), the
ServingAnchor `spec` is :class:`inferasim.model.anchors.Anchor` (an anchor file). The status models live
here; the CRDs in `crds/` are generated from all of them (`python -m inferasim_operator.crds`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from inferasim.observed import ObservedWorkload

GROUP = "inferasim.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
TUNING_KIND, TUNING_PLURAL = "ServingTuning", "servingtunings"
ANCHOR_KIND, ANCHOR_PLURAL = "ServingAnchor", "servinganchors"

PHASES = ("Pending", "Observing", "Queued", "Harvesting", "Searching", "Recommended", "Confirming", "Confirmed",
          "Invalid", "Failed")
Phase = Literal["Pending", "Observing", "Queued", "Harvesting", "Searching", "Recommended", "Confirming", "Confirmed",
                "Invalid", "Failed"]
# Degraded: the last pass ended in an error of the operator's own (not of the spec), with a summary.
CONDITION_TYPES = ("WorkloadObserved", "AnchorsReady", "Recommended", "Confirmed", "Priced", "PredictionDrift",
                   "Degraded")
SHORTLIST_SIZE = 5
HISTORY_SIZE = 10

# Labels and annotations the operator writes on what it creates.
LABEL_TUNING = "inferasim.io/tuning"
LABEL_ANCHOR = "inferasim.io/anchor"
LABEL_KIND = "inferasim.io/kind"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGER = "inferasim-operator"


def label_value(name: str) -> str:
    """`name` as a label value: object names run to 253 characters, label values to 63 (a longer
    one is cut and given a hash of the whole, as child_name does)."""
    return child_name(name, "")


def child_name(base: str, suffix: str, limit: int = 63) -> str:
    """`base` + `suffix` within `limit` characters (a DNS label): a long base is cut and given a
    hash of itself, so that two long tunings never name their children alike."""
    if len(base) + len(suffix) <= limit:
        return base + suffix
    import hashlib

    keep = limit - len(suffix) - 9
    return f"{base[:keep].rstrip('.-')}-{hashlib.sha256(base.encode()).hexdigest()[:8]}{suffix}"


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Condition(_Wire):
    type: Literal["WorkloadObserved", "AnchorsReady", "Recommended", "Confirmed", "Priced", "PredictionDrift",
                  "Degraded"]
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason, e.g. MetricsAvailable, MissingSeries, SearchComplete.")
    message: str = Field("", description="Human-readable detail (the failing query, counts, durations).")
    last_transition_time: str = Field("", description="RFC 3339 time the status last changed.")
    observed_generation: int | None = Field(None, ge=0, description="Generation this condition was computed for.")


class LayoutStatus(_Wire):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    moe_tp: int = Field(0, ge=0)
    moe_ep: int = Field(1, ge=1)


class AnchorRef(_Wire):
    key: str = Field(description="engine/precision the anchor serves.")
    id: str = Field(description="Anchor id: kernel-set key and layout label.")
    provenance: str = Field("", description="How it was measured: harvest, public, passive (live traffic), canary.")


class MissingAnchor(_Wire):
    engine: str
    model: str
    gpu: str
    precision: str
    layout: LayoutStatus = Field(description="Layout a harvest would measure (the smallest that fits).")
    gpu_hours: float = Field(ge=0, description="Estimated GPU-hours of the harvest.")
    reason: str = Field("", description="Why it is not harvested (budget, not allowed, no image), if it is not.")


class Harvest(_Wire):
    job: str = Field(description="Name of the harvest Job (deterministic: hash of kernel set and layout).")
    # One Job per anchor in the whole cluster: another tuning's, in its namespace, may serve this one.
    job_namespace: str = Field("", description="Namespace of the Job; empty: the tuning's own.")
    engine: str
    precision: str
    layout: LayoutStatus
    gpu_hours: float = Field(ge=0, description="Budgeted GPU-hours.")
    state: Literal["Pending", "Running", "Succeeded", "Failed"] = "Pending"
    started: str = ""
    reason: str = Field("", description="Why its pod is not running yet: the scheduler's message.")


class AnchorsStatus(_Wire):
    used: list[AnchorRef] = Field(default_factory=list)
    missing: list[MissingAnchor] = Field(default_factory=list)
    harvesting: list[Harvest] = Field(default_factory=list)
    gpu_hours_budgeted: float = Field(0.0, ge=0, description="GPU-hours committed to harvest Jobs so far.")


# A candidate's `carries`: at most this many reasons of at most CARRY_CHARS characters each.
CARRIES_MAX = 8
CARRY_CHARS = 300


class Predicted(_Wire):
    throughput_per_gpu: float | None = Field(None, description="Output tokens/s per GPU at the SLO.")
    max_request_rate_per_replica: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    ttft_p90_ms: float | None = None
    itl_p90_ms: float | None = None
    cost_per_million_tokens: float | None = None
    interval: float | None = Field(None, description="Prediction interval, +- on a log scale.")
    stage: int | None = Field(None, description="1: analytical estimate, 2: discrete-event simulation.")


class Candidate(_Wire):
    engine: str
    precision: str
    layout: LayoutStatus
    layout_label: str
    replicas: int = Field(ge=1)
    gpus: int = Field(ge=1)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    predicted: Predicted = Field(default_factory=Predicted)
    meets_slo: bool = False
    extrapolated: bool = False
    measurement_free: bool = Field(
        False, description="Priced without an anchor of its own kernel set, from the population of the other kernel "
                           "sets' anchors; its interval is that population's leave-one-out error.")
    carries: list[str] = Field(
        default_factory=list, max_length=CARRIES_MAX,
        description="What the prediction carries from its anchor (another layout, lengths, concurrency, a "
                    "parameter its anchor leaves to priors): what its interval is wide for.")
    anchor: str | None = None
    confirm_gpu_hours: float | None = Field(None, ge=0, description="GPU-hours a canary of it would cost.")


class EnvVar(_Wire):
    name: str
    value: str = ""


class Recommendation(Candidate):
    image: str = ""
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    resources: dict[str, dict[str, str]] = Field(default_factory=dict, description="requests / limits.")
    manifest: str = Field("", description="The rendered manifests (YAML), ready to apply or commit.")
    manifest_config_map: str = Field("", description="ConfigMap (same namespace) holding the manifest.")


class HistoryEntry(_Wire):
    time: str
    generation: int | None = None
    reason: str = Field(description="Why this tuning ran (created, spec changed, drift, schedule, anchors).")
    engine: str | None = None
    layout_label: str | None = None
    gpus: int | None = None
    throughput_per_gpu: float | None = None
    request_rate: float | None = None


class Canary(_Wire):
    name: str = Field(description="Canary Deployment (owned by the ServingTuning).")
    engine: str
    precision: str = ""
    layout: LayoutStatus | None = None
    layout_label: str
    gpus: int = Field(1, ge=1)
    image: str = Field("", description="Engine image the canary ran.")
    parent_anchor: str = Field("", description="Id of the anchor the prediction was made with (empty: unanchored).")
    predicted_ttft_p90_ms: float | None = None
    predicted_itl_p90_ms: float | None = None
    measured_ttft_p90_ms: float | None = None
    measured_itl_p90_ms: float | None = None
    measured_request_rate: float | None = None
    measured_requests: float | None = Field(None, description="Requests the canary served in its window.")
    recommended: bool = Field(False, description="This canary runs the recommendation itself (the short list's first).")
    prediction_error: float | None = Field(None, description="Measured / predicted ITL p90 - 1.")
    agrees: bool | None = Field(None, description=(
        "Whether the measured ITL p90 is within the tolerance of the prediction at the resolution of the "
        "engine's histogram buckets (the p90 is read back by histogram_quantile)."))
    measured_itl_mean_ms: float | None = Field(None, description="Mean inter-token latency over the window.")
    measured_ttft_mean_ms: float | None = Field(None, description="Mean time to first token over the window.")
    measured_in_flight: float | None = Field(None, description="Mean requests in flight (running + waiting).")
    anchor: str = Field("", description="ServingAnchor (provenance canary) that stores this measurement.")
    calibration_scale: float | None = Field(
        None, description="Step-time scale of the parent anchor that reproduces the measured ITL (1 = exact).")
    state: Literal["Pending", "Running", "Measured", "Failed"] = "Pending"
    running_since: str = Field("", description="When the canary was first seen available: its window starts then.")
    message: str = ""


class ConfirmationStatus(_Wire):
    mode: Literal["none", "canary", "argo-rollouts"] = "none"
    canaries: list[Canary] = Field(default_factory=list)
    analysis_template: str = Field("", description="Argo Rollouts AnalysisTemplate carrying the thresholds.")
    started: str = ""


class SearchStats(_Wire):
    candidates: int = Field(0, ge=0)
    seconds: float = Field(0.0, ge=0)
    workload: str = Field("", description="The workload searched for, in words.")
    stage2_top: int | None = Field(None, ge=0, description="Candidates the simulator refined (stage 2).")
    quick: bool = Field(False, description="Searched under a burst with a smaller stage 2; refined in the "
                                           "background once the search queue is empty.")


class QueueStatus(_Wire):
    """The tuning's place in the operator's search queue (fair across namespaces), while it waits."""

    position: int = Field(1, ge=1, le=1_000_000, description="1: the next search to start.")
    length: int = Field(1, ge=1, le=1_000_000, description="Searches waiting, this one included.")
    workers: int = Field(1, ge=1, le=1024, description="Searches that run at once (the pool's size).")


class PassiveAnchorStatus(_Wire):
    """The passive anchor of the target Deployment's kernel set, fitted from its own Prometheus series."""

    state: Literal["Fitted", "NotIdentifiable", "ObservationFailed", "Unreadable", "Waiting"] = "Waiting"
    message: str = Field("", description="What the fit found, or what is missing for one.")
    anchor: str = Field("", description="ServingAnchor (provenance passive) holding the fit.")
    anchor_id: str = Field("", description="Anchor id: kernel-set key and layout label.")
    deployment: str = Field("", description="namespace/name of the live Deployment it was fitted on.")
    kernel_set: str = Field("", description="The running kernel set, in words.")
    window: str = Field("", description="ISO 8601 interval of the windows used.")
    windows: int | None = Field(None, ge=0, description="Observation windows used as fit points.")
    rms_log_error: float | None = Field(None, ge=0, description="Fit residual (rms of log errors).")
    fitted_at: str = ""
    since: str = Field("", description="A change was detected then: refits read only windows after it.")


class MetricValues(_Wire):
    ttft_ms: float | None = Field(None, description="Mean time to first token.")
    itl_ms: float | None = Field(None, description="Mean inter-token latency.")
    throughput: float | None = Field(None, description="Output tokens/s, all replicas.")


class PredictionErrorStatus(_Wire):
    """Observed against predicted for the running configuration, over a recent window."""

    observed: MetricValues = Field(default_factory=MetricValues)
    predicted: MetricValues = Field(default_factory=MetricValues)
    relative: MetricValues = Field(default_factory=MetricValues, description="observed / predicted - 1.")
    worst: float | None = Field(None, ge=0, description="Largest |relative error|.")
    threshold: float | None = Field(None, gt=0, description="retune.predictionErrorThreshold.")
    anchor: str = Field("", description="Id of the anchor the prediction was made with.")
    provenance: str = Field("", description="Its provenance method (harvest, passive, ...).")
    concurrency: float | None = Field(None, ge=0, description="Requests in flight per replica in the window.")
    window: str = Field("", description="ISO 8601 interval observed.")
    checked_at: str = ""
    message: str = Field("", description="Why no error could be computed, when none was.")


class TuningStatus(_Wire):
    """The ServingTuning status, as the operator writes it (merge-patched on /status)."""

    observed_generation: int | None = Field(None, ge=0)
    phase: Phase = "Pending"
    message: str = ""
    conditions: list[Condition] = Field(default_factory=list)
    observed_workload: ObservedWorkload | None = None
    anchors: AnchorsStatus = Field(default_factory=AnchorsStatus)
    recommendation: Recommendation | None = None
    shortlist: list[Candidate] = Field(default_factory=list, max_length=SHORTLIST_SIZE)
    history: list[HistoryEntry] = Field(default_factory=list, max_length=HISTORY_SIZE)
    search: SearchStats | None = None
    queue: QueueStatus | None = Field(None, description="Place in the search queue while phase is Queued.")
    confirmation: ConfirmationStatus | None = None
    passive_anchor: PassiveAnchorStatus | None = None
    prediction_error: PredictionErrorStatus | None = None
    last_tune_time: str = ""
    retries: int = Field(0, ge=0, description="Consecutive failed observations (backoff).")


class AnchorStatus(_Wire):
    """ServingAnchor status: where it came from in the cluster."""

    harvested_by: str = Field("", description="namespace/name of the ServingTuning whose Job measured it.")
    canary: str = Field("", description="namespace/name of the canary Deployment it was measured on.")
    deployment: str = Field("", description="namespace/name of the live Deployment a passive anchor was fitted on.")
    job: str = ""
    imported_at: str = ""


def dump(model: BaseModel) -> dict[str, Any]:
    """The wire form (camelCase, no nulls: a merge-patch null would delete, and absent reads the same)."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")

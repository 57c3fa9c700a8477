"""The anchored predictor: fit a kernel set's anchor rows, then predict other deployments.

This is the glue between measured benchmark rows (validation CSVs, shipped anchors) and the
physics of `steptime` + `transfer` + `model.steady`. `AnchoredPredictor` implements the
`Predictor` protocol of `inferasim.validate`; it sees only the anchor rows of a kernel set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from inferasim.catalog.checkpoints import priced_precision
from inferasim.catalog.engines import UnknownEngineError, normalize_engine
from inferasim.catalog.gpus import GPU, UnknownGPUError, get_gpu, siblings
from inferasim.catalog.models import ModelConfigError, ModelSpec, UnknownModelError, get_model
from inferasim.catalog.precision import benchmark_kv_dtype as precision_benchmark_kv
from inferasim.core.layout import Layout, LayoutError
from inferasim.core.runs import BenchRow, RowPrediction, recorded_clients
from inferasim.core.runs import Layout as RowLayout
from inferasim.errors import CannotPredict
from inferasim.model.anchors import Anchor, BenchPoint, FitReport, KernelSet, LayoutModel, Provenance
from inferasim.model.fit import FitPoint, FitResult, fit_anchor_params, predict_points
from inferasim.model.identify import Identification, anchor_slopes, identify_fit, leaning
from inferasim.model.layoutcost import LayoutCost, layout_cost
from inferasim.model.memory import layout_problems
from inferasim.model.population import FittedMember, Population
from inferasim.model.steady import EngineSched, engine_sched
from inferasim.model.stepfit import engine_params_from_steps
from inferasim.model.steptime import STEP_MODEL_REVISION, StepParams, default_params, step_time
from inferasim.model.transfer import disagg_point

# Interval: +-z x (fit rms in log space, widened off the anchor's layout and lengths).
INTERVAL_Z = 1.64
# Log-spread each way a prediction carries away from its anchor, added to the anchor's own fit residual
# in quadrature, per engine and metric: a step for another layout (growing a little per doubling of
# the GPU count), a part per doubling of the prompt or output length beyond the anchor's range, and
# one for a concurrency outside its sweep. Sized on shared/data/aic-silicon (`inferasim validate
# --split-by reach,engine`) so that the nominal 90% band holds about 90% of the measured values in
# each group of what a prediction carries (another layout, other lengths, both), for each engine:
# vLLM's TTFT carried to another layout misses by a median |log error| of 0.12 at 2x the GPUs and
# 0.17 at 4x, and SGLang's TTFT carried to 8x longer prompts or outputs by 0.20 (p90 0.90, against
# 0.36 for vLLM). Before (one engine-blind step of 0.14 each), the TTFT band was a factor 2.0 either
# way for another layout and held 79% of SGLang's longer-length rows. ATOM, with no data here,
# takes vLLM's (mixed batches too); where an engine has no offline figure, its offline metrics take
# TPOT's.
@dataclass(frozen=True)
class TransferSpread:
    layout: float
    layout_per_doubling: float
    length: float  # per doubling of isl or osl beyond the anchor's range
    range: float  # concurrency outside the anchor's sweep


# Offline batches (vLLM's benchmark_latency / benchmark_throughput) sized on
# shared/data/argonne-offline the same way.
_OFFLINE_SPREAD = TransferSpread(0.14, 0.10, 0.02, 0.0)
# vLLM's TTFT length part: 0.05 held 83.5% at other lengths once the reach split compared layouts as
# the predictor prices them (42 squared-width Kimi-K2.5 rows moved there); 0.06 holds 88% there and
# 95% where both layout and lengths change (0.07: 91% / 96%).
_MIXED_SPREADS = {"tpot": TransferSpread(0.06, 0.10, 0.03, 0.15), "ttft": TransferSpread(0.14, 0.30, 0.06, 0.0),
                  "batch_latency": _OFFLINE_SPREAD, "throughput": _OFFLINE_SPREAD}
TRANSFER_SPREADS: dict[str, dict[str, TransferSpread]] = {
    "vllm": _MIXED_SPREADS,
    "atom": _MIXED_SPREADS,
    "sglang": {"tpot": TransferSpread(0.16, 0.30, 0.05, 0.15), "ttft": TransferSpread(0.16, 0.0, 0.14, 0.10)},
}
# A measurement-free (unanchored) estimate: its default residual plus this, for ranking only.
UNANCHORED_SPREAD: dict[str, float] = {"tpot": 0.14, "ttft": 0.28}


def _doublings_outside(value: int, measured: tuple[int, int]) -> float:
    """How many doublings `value` lies beyond the measured range (0 inside it)."""
    lo, hi = measured
    if value <= 0 or lo <= value <= hi:
        return 0.0
    return abs(math.log2(value / (lo if value < lo else hi)))


def to_layout(row_layout: RowLayout) -> Layout:
    """The deployment a row's layout fields price. The engines spread a MoE layer's experts over
    every GPU of the attention ranks (moe_tp x moe_ep = tp x dp); a row whose MoE fields say
    otherwise (left empty, which reads as 1, or 0) keeps its ep and takes moe_tp from it, or, where
    its ep does not divide tp x dp either, both are derived (ep 1). Priced as written, an MoE model
    at tp 8 with empty MoE fields held every expert on every GPU: DeepSeek-R1 "did not fit" 8 MI355X
    and gpt-oss-120b's TPOT read 2.7x high."""
    width = row_layout.tp * row_layout.dp
    if row_layout.moe_tp * row_layout.moe_ep == width:
        try:
            return Layout(tp=row_layout.tp, pp=row_layout.pp, dp=row_layout.dp, moe_tp=row_layout.moe_tp,
                          moe_ep=row_layout.moe_ep)
        except LayoutError:
            pass
    ep = row_layout.moe_ep if row_layout.moe_ep >= 1 and width % row_layout.moe_ep == 0 else 1
    return Layout(tp=row_layout.tp, pp=row_layout.pp, dp=row_layout.dp, moe_ep=ep)


def resolve(row: BenchRow) -> tuple[str, ModelSpec, GPU]:
    try:
        engine = normalize_engine(row.backend)
        model = get_model(row.model_path)
        gpu = get_gpu(row.system)
    except (UnknownEngineError, UnknownModelError, ModelConfigError, UnknownGPUError) as exc:
        raise CannotPredict(str(exc)) from None
    return engine, model, gpu


def benchmark_kv_dtype(precision: str) -> str:
    """KV-cache dtype of a benchmark row, which the public rows do not record.

    Quantized (fp8 / fp4) runs use an fp8 KV cache: with it, the concurrency at which the dev
    data's TTFT explodes (the KV pool filling up) matches the memory model on H100 and B200
    alike; with a 16-bit cache it would saturate at half the concurrency it does. Any spelling of
    those precisions counts (fp8_block, fp8_e4m3fn, nvfp4 ...): catalog.precision's table says
    which precisions the benchmarks pair with which cache."""
    return precision_benchmark_kv(precision)


def _priced(precision: str, model_id: str, model: ModelSpec) -> str:
    """catalog.checkpoints.priced_precision of a precision as written (empty reads as auto); a spelling nothing
    knows is returned as written, for layout_cost to name in its refusal."""
    try:
        return priced_precision(precision or "auto", model_id, model)
    except ValueError:
        return precision or "auto"


def row_precision(row: BenchRow, model: ModelSpec) -> str:
    """The precision a row's deployment is priced at: its precision cell normalised, or where the
    cell is empty (auto), the weight format of the checkpoint its model_path names:
    amd/Llama-3.1-70B-Instruct-FP8-KV is fp8 although the catalog prices it by the BF16
    Llama-3.1-70B config."""
    return _priced(row.precision, row.model_path, model)


def clients(row: BenchRow) -> int:
    """Closed-loop clients behind a row.

    In the aiconfigurator silicon schema (shared/data/aic-silicon), `batch_size` of an aggregated
    row with attention data parallelism is the batch of one attention-DP rank: on every such row
    that also records the run's client count in `silicon_data_source` ("silicon_concurrency=N"),
    N = batch_size x attention_dp_size (vLLM, SGLang and TRT-LLM rows alike). The benchmark
    therefore ran batch_size x dp clients. Where a row records N, N is what ran, whichever way its
    batch_size was written (all 1752 dev rows that record it agree with batch_size x dp)."""
    if row.mode == "agg" and row.scenario != "offline":
        return recorded_clients(row) or row.concurrency * max(row.layout.dp, 1)
    return row.concurrency


def refuse_unstartable(model: ModelSpec, layout: Layout, engine: str, what: str = "", written: str = "as written",
                       after: str = "") -> None:
    """CannotPredict naming the engine's reasons when it refuses `layout` at start-up
    (`memory.layout_problems`: tp must divide the attention heads, ep the experts ...)."""
    problems = layout_problems(model, layout, engine)
    if problems:
        raise CannotPredict(f"{engine} cannot start {what}{layout.label()} {written} ({'; '.join(problems)}){after}")


def fit_point(row: BenchRow) -> FitPoint:
    return FitPoint(
        isl=row.isl, osl=row.osl, concurrency=clients(row), scenario=row.scenario,
        ttft=row.ttft_ms / 1e3 if row.ttft_ms else None,
        tpot=row.tpot_ms / 1e3 if row.tpot_ms else None,
        batch_latency=row.batch_latency_s, throughput=row.throughput_tok_s,
    )


@dataclass
class FittedAnchor:
    """A kernel set fitted at its anchor layout; predicts any layout of the same kernels."""

    engine: str
    engine_version: str
    model: ModelSpec
    gpu: GPU
    precision: str
    kv_dtype: str
    layout: Layout
    fit: FitResult
    anchor_id: str
    conc_range: tuple[int, int]
    isl_range: tuple[int, int]
    osl_range: tuple[int, int]
    # The GPU the anchor was measured on, when it is a sibling of `gpu` (carry_to_gpu); "" when
    # measured on `gpu` itself.
    measured_on: str = ""
    # Priced from the population of other kernel sets' anchors (model.population): the half-width
    # of each metric's 90% band, measured as that population's leave-one-out error; empty otherwise.
    population_spread: dict[str, float] = field(default_factory=dict)
    # The measured points the fit saw (what it identifies, model.identify); empty for a
    # measurement-free or steps-only anchor.
    points: tuple[FitPoint, ...] = ()
    _identity: Identification | None = field(default=None, repr=False, compare=False)
    _seen: dict[str, dict[str, float]] | None = field(default=None, repr=False, compare=False)

    @property
    def params(self) -> StepParams:
        return self.fit.params

    def _anchor_pricing(self) -> tuple[LayoutCost, EngineSched]:
        gpu = get_gpu(self.measured_on) if self.measured_on else self.gpu
        return (layout_cost(self.model, gpu, self.layout, self.precision, self.kv_dtype, self.engine,
                            self.engine_version),
                engine_sched(self.engine, self.model, gpu, self.layout, self.precision, self.engine_version,
                             self.kv_dtype))

    def identification(self) -> Identification | None:
        """Which parameters the anchor's points decide and which its priors do (None without points)."""
        if not self.points or self.population_spread:
            return None
        if self._identity is None:
            cost, sched = self._anchor_pricing()
            gpu = get_gpu(self.measured_on) if self.measured_on else self.gpu
            self._identity = identify_fit(cost, sched, self.points, default_params(gpu, self.engine,
                                                                                   self.engine_version), self.params)
        return self._identity

    def leans_on(self, layout: Layout, isl: int, osl: int, concurrency: int,
                 scenario: str = "closed") -> dict[str, dict[str, float]]:
        """Per metric, the prior-led parameters a prediction here depends on beyond what the
        anchor's points showed (model.identify.leaning)."""
        ident = self.identification()
        if ident is None or not ident.prior_led():
            return {}
        if self._seen is None:
            a_cost, a_sched = self._anchor_pricing()
            self._seen = anchor_slopes(ident, self.params, a_cost, a_sched, self.points)
        cost = layout_cost(self.model, self.gpu, layout, self.precision, self.kv_dtype, self.engine,
                           self.engine_version)
        sched = engine_sched(self.engine, self.model, self.gpu, layout, self.precision, self.engine_version,
                             self.kv_dtype)
        return leaning(self._seen, self.params, cost, sched,
                       FitPoint(isl=isl, osl=osl, concurrency=concurrency, scenario=scenario))

    def spread(self, extrapolated: bool, layout: Layout, isl: int, osl: int, metric: str = "tpot",
                concurrency: int | None = None) -> float:
        """Half-width (log) of the nominal 90% band of `metric` at a target deployment."""
        if self.population_spread:
            return self.population_spread.get(metric, self.population_spread.get("tpot", 0.5))
        res = self.fit.residuals.get(metric)
        base = max(float(np.sqrt(np.mean(np.square(res)))) if res else self.fit.rms_log_error, 0.03)
        parts = [base]
        by_metric = TRANSFER_SPREADS.get(self.engine, _MIXED_SPREADS)
        spread = by_metric.get(metric, by_metric["tpot"])  # offline batch latency, throughput: as TPOT
        if layout != self.layout and self.isl_range[1] > 0:  # measurement-free: no layout of its own
            doublings = abs(math.log2(layout.gpus / self.layout.gpus))
            parts.append(spread.layout * (1.0 + spread.layout_per_doubling * doublings))
        if self.measured_on:
            # Another GPU of the same die: sized as a layout transfer (shared/data holds no sibling
            # pair to measure it on).
            parts.append(spread.layout)
        if self.isl_range[1] <= 0:  # unanchored: no measured range to measure distances from
            parts.append(UNANCHORED_SPREAD.get(metric, UNANCHORED_SPREAD["tpot"]))
        else:
            lengths = _doublings_outside(isl, self.isl_range) + _doublings_outside(osl, self.osl_range)
            parts.append(spread.length * lengths)
            outside = (not self.conc_range[0] <= concurrency <= self.conc_range[1]) if concurrency is not None \
                else (extrapolated and lengths == 0.0)
            if outside:
                parts.append(spread.range)
        return INTERVAL_Z * float(np.sqrt(np.sum(np.square(parts))))

    def carries(self, layout: Layout, isl: int, osl: int, concurrency: int | None = None) -> list[str]:
        """What a prediction at this deployment carries from the anchor, in words (what widens
        its interval): another layout, lengths beyond the measured range, a concurrency outside
        the sweep. Empty at the anchor's own layout, lengths and sweep."""
        if self.population_spread:
            return [f"no measurement: {self.fit.message.removeprefix('measurement-free: ')}"]
        if self.isl_range[1] <= 0:
            return ["no measurement: GPU-family defaults (rank within one engine only)"]
        out = []
        if self.measured_on:
            out.append(f"measured on {self.measured_on}, carried to {self.gpu.name} (same die: its efficiencies, "
                       f"{self.gpu.name}'s peaks and memory)")
        if layout != self.layout:
            ratio = layout.gpus / self.layout.gpus
            out.append(f"layout {self.layout.label()} -> {layout.label()} (x{ratio:g} GPUs)")
        for name, value, rng in (("prompt", isl, self.isl_range), ("output", osl, self.osl_range)):
            doublings = _doublings_outside(value, rng)
            if doublings > 0:
                measured = f"{rng[0]}" if rng[0] == rng[1] else f"{rng[0]}-{rng[1]}"
                out.append(f"{name} {value} tokens, {doublings:.1f} doublings from the anchor's {measured}")
        if concurrency is not None and not self.conc_range[0] <= concurrency <= self.conc_range[1]:
            out.append(f"concurrency {concurrency} outside the anchor's {self.conc_range[0]}-{self.conc_range[1]}")
        if concurrency is not None:
            for metric, names in self.leans_on(layout, isl, osl, concurrency).items():
                if metric in ("ttft", "tpot"):
                    out.append(f"{metric.upper()} leans on {', '.join(names)}, which the anchor's points leave to "
                               "priors (`inferasim anchors check` shows what they identify)")
        return out

    def beyond_measured(self, conc: int, isl: int, osl: int) -> bool:
        if self.measured_on:  # measured on another GPU: beyond what was measured, whatever the point
            return True
        return not (self.conc_range[0] <= conc <= self.conc_range[1] and
                    self.isl_range[0] <= isl <= self.isl_range[1] and
                    self.osl_range[0] <= osl <= self.osl_range[1])

    def predict_layout(self, layout: Layout, isl: int, osl: int, concurrency: int,
                       scenario: str = "closed") -> dict[str, float]:
        cost = layout_cost(self.model, self.gpu, layout, self.precision, self.kv_dtype, self.engine,
                           self.engine_version)
        sched = engine_sched(self.engine, self.model, self.gpu, layout, self.precision, self.engine_version,
                             self.kv_dtype)
        pred = predict_points(self.params, cost, sched,
                              [FitPoint(isl=isl, osl=osl, concurrency=concurrency, scenario=scenario)])
        return {k: float(v[0]) for k, v in pred.items()}

    def _require_fit(self, layout: Layout, what: str = "") -> None:
        """Refuse a deployment the engine refuses at start-up (`memory.layout_problems`: tp must
        divide the attention heads, ep the experts ...) or the memory model cannot hold (no KV
        cache left after the weights): the row's layout fields then do not say how it ran, and a
        price would be noise."""
        refuse_unstartable(self.model, layout, self.engine, what)
        sched = engine_sched(self.engine, self.model, self.gpu, layout, self.precision, self.engine_version,
                             self.kv_dtype)
        if sched.kv_tokens <= 0:
            raise CannotPredict(f"{self.model.name} does not fit {self.gpu.name} at {what}{layout.label()} by the "
                                "memory model")

    def predict(self, row: BenchRow) -> RowPrediction:
        extrapolated = self.beyond_measured(clients(row), row.isl, row.osl)
        if row.mode == "disagg":
            if row.prefill is None or row.decode is None:
                raise CannotPredict("disaggregated row lacks its prefill or decode pool layout")
            prefill, decode = to_layout(row.prefill.layout), to_layout(row.decode.layout)
            self._require_fit(prefill, "the prefill pool's ")
            self._require_fit(decode, "the decode pool's ")
            d = disagg_point(self, prefill, row.prefill.workers, decode, row.decode.workers, row.isl, row.osl,
                             row.concurrency)
            s_ttft = self.spread(True, decode, row.isl, row.osl, "ttft")
            s_tpot = self.spread(True, decode, row.isl, row.osl, "tpot")
            return RowPrediction(
                ttft_ms=d["ttft"] * 1e3, tpot_ms=d["tpot"] * 1e3,
                interval={"ttft": (d["ttft"] * 1e3 * math.exp(-s_ttft), d["ttft"] * 1e3 * math.exp(s_ttft)),
                          "tpot": (d["tpot"] * 1e3 * math.exp(-s_tpot), d["tpot"] * 1e3 * math.exp(s_tpot))},
                extrapolated=True, anchor=self.anchor_id)
        layout = to_layout(row.layout)
        self._require_fit(layout)
        pred = self.predict_layout(layout, row.isl, row.osl, clients(row), row.scenario)

        def band(metric: str, v: float | None, scale: float = 1.0) -> tuple[float, float] | None:
            if v is None or not np.isfinite(v):
                return None
            spread = self.spread(extrapolated, layout, row.isl, row.osl, metric, concurrency=clients(row))
            return (v * scale * math.exp(-spread), v * scale * math.exp(spread))

        interval = {k: b for k, b in (("ttft", band("ttft", pred["ttft"], 1e3)),
                                      ("tpot", band("tpot", pred["tpot"], 1e3)),
                                      ("batch_latency", band("batch_latency", pred["batch_latency"])),
                                      ("throughput", band("throughput", pred["throughput"]))) if b}
        offline = row.scenario == "offline"
        return RowPrediction(
            ttft_ms=None if offline else pred["ttft"] * 1e3,
            tpot_ms=None if offline else pred["tpot"] * 1e3,
            batch_latency_s=pred["batch_latency"] if offline else None,
            throughput_tok_s=pred["throughput"] if offline else None,
            interval=interval, extrapolated=extrapolated, anchor=self.anchor_id,
        )

    def step_ms(self, layout: Layout, n_dec: float, ctx: float, n_pref: float = 0.0,
                ctx_pref: float = 0.0) -> float:
        cost = layout_cost(self.model, self.gpu, layout, self.precision, self.kv_dtype, self.engine,
                           self.engine_version)
        return float(step_time(self.params, cost, n_dec, ctx, n_pref, ctx_pref)) * 1e3


def fit_anchor_rows(rows: list[BenchRow]) -> FittedAnchor:
    if not rows:
        raise CannotPredict("no anchor rows")
    first = rows[0]
    engine, model, gpu = resolve(first)
    layout = to_layout(first.layout)
    # The rows did not run as written: no anchor for a layout nobody can deploy.
    refuse_unstartable(model, layout, engine, written="as the rows write it",
                       after=": no anchor for a layout nobody can deploy")
    precision = row_precision(first, model)
    kv_dtype = benchmark_kv_dtype(precision)
    try:
        cost = layout_cost(model, gpu, layout, precision, kv_dtype, engine, first.backend_version)
        sched = engine_sched(engine, model, gpu, layout, precision, first.backend_version, kv_dtype)
    except ValueError as exc:
        raise CannotPredict(str(exc)) from None
    if sched.kv_tokens <= 0:
        raise CannotPredict(f"{model.name} does not fit {gpu.name} at {layout.label()} by the memory model")
    points = [fit_point(r) for r in rows]
    result = fit_anchor_params(cost, sched, points, default_params(gpu, engine, first.backend_version))
    concs = [clients(r) for r in rows]  # clients, as predictions are held against (not the per-rank batch)
    return FittedAnchor(
        engine=engine, engine_version=first.backend_version, model=model, gpu=gpu, precision=precision,
        kv_dtype=kv_dtype, layout=layout, fit=result, anchor_id=f"{engine}:{first.backend_version or '?'}:{model.name}:"
        f"{gpu.name}:{precision}:{layout.label()}",
        conc_range=(min(concs), max(concs)), isl_range=(min(r.isl for r in rows), max(r.isl for r in rows)),
        osl_range=(min(r.osl for r in rows), max(r.osl for r in rows)), points=tuple(points),
    )


class AnchoredPredictor:
    """`inferasim.validate.Predictor`: fit on the anchor rows, predict the rest; or, measurement-free
    (`validate --measurement-free`), price each kernel set from the others' anchors alone."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, ...], list[BenchRow]] = {}
        self._population: Population | None = None

    def fit(self, kernel_key: tuple[str, ...], anchor_rows: list[BenchRow]) -> FittedAnchor:
        self._rows[kernel_key] = anchor_rows
        return fit_anchor_rows(anchor_rows)

    def learn_population(self, fitted: Mapping[tuple[str, ...], FittedAnchor]) -> None:
        """The population of these fitted kernel sets (their anchor rows as given to fit)."""
        self._population = Population({
            k: FittedMember(key=k, fitted=f, layout=f.layout, points=[fit_point(r) for r in self._rows.get(k, [])])
            for k, f in fitted.items()})

    def population(self, kernel_key: tuple[str, ...], row: BenchRow) -> FittedAnchor:
        """`row`'s kernel set priced from the population without it (leave one kernel set out)."""
        if self._population is None:
            raise CannotPredict("no population learned (learn_population first)")
        base = self.unanchored(kernel_key, row)
        fit, spread = self._population.fit_for(kernel_key, base.engine, base.engine_version, base.model, base.gpu,
                                               base.precision)
        return replace(base, fit=fit, population_spread=spread)

    def unanchored(self, kernel_key: tuple[str, ...], row: BenchRow) -> FittedAnchor:
        """A kernel set without an anchor of its own (disaggregated rows only), priced from the
        GPU family's defaults (`unanchored`): flagged, with the wide measurement-free interval."""
        engine, model, gpu = resolve(row)
        precision = row_precision(row, model)
        kv_dtype = benchmark_kv_dtype(precision)
        try:  # the kernel set's own refusals (a precision nothing prices); each row's layout is checked in predict
            layout_cost(model, gpu, Layout(), precision, kv_dtype, engine)
        except ValueError as exc:
            raise CannotPredict(str(exc)) from None
        return unanchored(engine, model, gpu, precision, Layout(), row.backend_version, kv_dtype)


# ------------------------------------------------------------------------------------------------
# Anchors on disk <-> fitted anchors
# ------------------------------------------------------------------------------------------------

def kernel_set_of(row: BenchRow) -> KernelSet:
    return KernelSet(engine=row.backend, engine_version=row.backend_version, model=row.model_path,
                     gpu=row.system, precision=row.precision, kv_dtype=_row_kv_dtype(row))


def _row_kv_dtype(row: BenchRow) -> str:
    """The KV dtype fit_anchor_rows prices a row's kernel set at (its precision, or where the cell
    is empty, its checkpoint's)."""
    try:
        return benchmark_kv_dtype(row_precision(row, get_model(row.model_path)))
    except (UnknownModelError, ModelConfigError):
        return benchmark_kv_dtype(row.precision)


def anchor_from_rows(rows: list[BenchRow], source: str, notes: str = "") -> Anchor:
    """Fit a kernel set's anchor rows and package the result as an Anchor (public data). Rows whose
    layout columns name a layout the engine refuses at start-up (SGLang DeepSeek at tp 72 without DP
    attention) did not run as written: fit_anchor_rows refuses them, no anchor is stored."""
    fitted = fit_anchor_rows(rows)
    first = rows[0]
    points = [BenchPoint(isl=r.isl, osl=r.osl, concurrency=clients(r),
                         scenario="offline" if r.scenario == "offline" else "closed",
                         ttft_ms=r.ttft_ms, tpot_ms=r.tpot_ms, batch_latency_s=r.batch_latency_s,
                         throughput_tok_s=r.throughput_tok_s, row_id=r.id) for r in rows]
    fit = fitted.fit
    return Anchor(
        kernel_set=kernel_set_of(first),
        layout=LayoutModel.from_layout(fitted.layout),
        points=points,
        params=fitted.params.as_dict(),
        fit=FitReport(n_points=fit.n_points, rms_log_error=fit.rms_log_error,
                      max_abs_log_error=fit.max_abs_log_error, per_metric=fit.per_metric_mape,
                      converged=fit.converged, message=fit.message, step_model=STEP_MODEL_REVISION),
        provenance=Provenance(method="public-data", source=source, rows=[r.id for r in rows],
                              measured_by="inferasim anchors build (min-gpus anchor rule)", notes=notes),
    )


def fit_points(points: Sequence[BenchPoint]) -> list[FitPoint]:
    """An anchor's stored points (ms) as the fit's points (s)."""
    return [FitPoint(isl=p.isl, osl=p.osl, concurrency=p.concurrency, scenario=p.scenario,
                     ttft=p.ttft_ms / 1e3 if p.ttft_ms else None, tpot=p.tpot_ms / 1e3 if p.tpot_ms else None,
                     batch_latency=p.batch_latency_s, throughput=p.throughput_tok_s) for p in points]


def stale_params(anchor: Anchor) -> str | None:
    """Why `anchor`'s stored parameters are not read as they are: fitted under another revision of
    the step-time model (steptime.STEP_MODEL_REVISION) while it holds benchmark points to refit
    from. None when they are used as stored (current revision, no revision recorded, or nothing
    to refit from)."""
    if not anchor.params or anchor.fit is None or not anchor.fit.step_model or not (anchor.points or anchor.steps):
        return None
    if anchor.fit.step_model == STEP_MODEL_REVISION:
        return None
    what = f"{len(anchor.points)} points" if anchor.points else f"{len(anchor.steps)} steps"
    return (f"parameters fitted under step-time model {anchor.fit.step_model}, this inferasim is "
            f"{STEP_MODEL_REVISION}: refitted from the anchor's {what}")


def fitted_from_anchor(anchor: Anchor) -> FittedAnchor:
    """A FittedAnchor from a stored anchor: its parameters if it has them and they were fitted under
    this step-time model (or record no revision), else a fresh fit of its points."""
    ks = anchor.kernel_set
    try:
        engine = normalize_engine(ks.engine)
        model = get_model(ks.model)
        gpu = get_gpu(ks.gpu)
    except (UnknownEngineError, UnknownModelError, ModelConfigError, UnknownGPUError) as exc:
        raise CannotPredict(f"anchor {anchor.id}: {exc}") from None
    layout = anchor.layout.to_layout()
    precision = _priced(ks.precision, ks.model, model)
    kv_dtype = ks.kv_dtype
    points = fit_points(anchor.points)
    stale = stale_params(anchor)
    if anchor.params and stale is None:
        params = StepParams.from_dict(anchor.params)
        rep = anchor.fit
        result = FitResult(params=params, rms_log_error=rep.rms_log_error if rep else 0.1,
                           max_abs_log_error=rep.max_abs_log_error if rep else 0.1,
                           per_metric_mape=dict(rep.per_metric) if rep else {}, n_points=len(points),
                           iterations=0, converged=True, message="stored parameters")
    elif not points:
        # Isolated step timings only (a PyTorch harvest): GPU terms from the steps, host terms
        # from the engine's prior (model.stepfit.engine_params_from_steps).
        cost = layout_cost(model, gpu, layout, precision, kv_dtype, engine, ks.engine_version)
        params, sfit = engine_params_from_steps(cost, anchor.steps, default_params(gpu, engine, ks.engine_version))
        result = FitResult(params=params, rms_log_error=sfit.rms_log_error, max_abs_log_error=sfit.max_abs_log_error,
                           per_metric_mape={"step": sfit.median_abs_error}, n_points=sfit.n_points,
                           iterations=sfit.iterations, converged=sfit.converged,
                           message=(f"{stale}; " if stale else "") + "fitted from isolated steps")
    else:
        cost = layout_cost(model, gpu, layout, precision, kv_dtype, engine, ks.engine_version)
        sched = engine_sched(engine, model, gpu, layout, precision, ks.engine_version, kv_dtype)
        # inferasim's own harvester holds a connection per client: its points never show a client cap.
        result = fit_anchor_params(cost, sched, points, default_params(gpu, engine, ks.engine_version),
                                   read_client_cap=anchor.provenance.method != "harvest")
        if stale:
            result.message = f"{stale}; {result.message}"[:500]
    # A steps-only anchor spans the decode batches and the prompt chunks and contexts it timed.
    concs = [p.concurrency for p in anchor.points] or [s.n_decode for s in anchor.steps if s.n_decode] or [1]
    isls = [p.isl for p in anchor.points] or [s.n_prefill_tokens for s in anchor.steps if s.n_prefill_tokens] or [1]
    osls = [p.osl for p in anchor.points] or [1, *(int(s.decode_context) for s in anchor.steps)]
    return FittedAnchor(engine=engine, engine_version=ks.engine_version, model=model, gpu=gpu,
                        precision=precision, kv_dtype=kv_dtype, layout=layout, fit=result, anchor_id=anchor.id,
                        conc_range=(min(concs), max(concs)), isl_range=(min(isls), max(isls)),
                        osl_range=(min(osls), max(osls)), points=tuple(points))


def carry_to_gpu(fitted: FittedAnchor, gpu: GPU) -> FittedAnchor:
    """An anchor measured on a sibling of `gpu` (catalog.gpus.siblings: the same die with other
    memory, clocks or power) carried to it. The step-time model prices every term from the GPU's
    peaks times fitted efficiencies, so the efficiencies and host costs carry and `gpu`'s own
    bandwidth, FLOP/s and memory (the KV pool) do the rest: an H100 anchor predicts an H200 with
    its 4.8 TB/s and 141 GB, where a measurement-free default would put two GPUs of one engine on
    different footings (H200 once came out slower than the H100 beside it)."""
    if gpu.name not in siblings(fitted.gpu):
        raise ValueError(f"{fitted.gpu.name} and {gpu.name} are not the same die: an anchor does not carry "
                         "between them")
    return replace(fitted, gpu=gpu, measured_on=fitted.gpu.name, anchor_id=f"{fitted.anchor_id}@{fitted.gpu.name}")


def unanchored(engine: str, model: ModelSpec, gpu: GPU, precision: str, layout: Layout,
               engine_version: str = "", kv_dtype: str = "auto") -> FittedAnchor:
    """Measurement-free estimate from GPU-family defaults: for ranking within one engine only."""
    params = default_params(gpu, engine, engine_version)
    result = FitResult(params=params, rms_log_error=0.35, max_abs_log_error=0.35, per_metric_mape={},
                       n_points=0, iterations=0, converged=True,
                       message="unanchored: use for ranking within one engine")
    return FittedAnchor(engine=engine, engine_version=engine_version, model=model, gpu=gpu,
                        precision=precision, kv_dtype=kv_dtype, layout=layout, fit=result,
                        anchor_id="unanchored", conc_range=(0, 0), isl_range=(0, 0), osl_range=(0, 0))

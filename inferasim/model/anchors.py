"""Anchors: the brief measurements of one kernel set that every prediction is carried from.

A **kernel set** (DESIGN.md section 1) is what decides which kernels run: engine, engine build,
model, GPU, precision, KV dtype, attention backend, graph mode and speculative method. An
**anchor** is a measurement of one kernel set at one layout: end-to-end benchmark points, and/or
per-iteration step times, the step-time parameters fitted to them, and where they came from.

The pydantic models here are the single source of the anchor JSON schema; the Kubernetes CRD
``ServingAnchor`` is generated from them, so every field carries a description and the models
forbid unknown keys (a typo in a hand-written anchor is an error, not a silently ignored field).

Anchor files are read (:func:`load_anchor`, every problem named) and written (:func:`write_anchor_file`)
here; the store that picks an anchor for a kernel set and layout is
:class:`inferasim.model.anchor_store.AnchorStore`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator, model_validator

from inferasim.core.layout import Layout, LayoutError
from inferasim.errors import UserError

__all__ = [
    "ENGINES",
    "SCHEMA_VERSION",
    "Anchor",
    "AnchorFileError",
    "BenchPoint",
    "FitReport",
    "KernelSet",
    "LayoutModel",
    "MeasuredRange",
    "Provenance",
    "StepPoint",
    "anchor_json_schema",
    "load_anchor",
    "write_anchor_file",
]

# 1: the first schema. 2: fit.step_model (the step-time model revision of the parameters); files of
# version 1 still read, their parameters used as stored.
SCHEMA_VERSION = 2
# The anchors shipped beside the package (a checkout or an editable install): the default store
# of every command and of the search.
SHIPPED_ANCHORS = Path(__file__).resolve().parents[2] / "anchors"

# The target engines (DESIGN.md section 7: TRT-LLM is not one).
ENGINES: tuple[str, ...] = ("vllm", "sglang", "atom")

# Kubernetes structural schemas know no `prefixItems`, which pydantic emits for tuples; a
# fixed-length array keeps the generated CRD valid while Python still sees a tuple.
IntRange = Annotated[
    tuple[int, int],
    WithJsonSchema({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}),
]
FloatRange = Annotated[
    tuple[float, float],
    WithJsonSchema({"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}),
]

_STRICT = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------
# kernel set and layout
# --------------------------------------------------------------------------------------------


class KernelSet(BaseModel):
    """What decides the kernels that run; two deployments with equal kernel sets share anchors.

    String fields other than ``engine`` are compared as raw strings, as given (an empty engine
    version is its own kernel set, DESIGN.md section 7).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str = Field(
        description="Serving engine: one of vllm, sglang, atom (lower-cased on input).",
        json_schema_extra={"enum": list(ENGINES)},
    )
    engine_version: str = Field("", description="Engine release or build as given; empty = unknown.")
    model: str = Field(description="Hugging Face model id as given, e.g. 'meta-llama/Llama-3.1-70B'.")
    gpu: str = Field(description="GPU: canonical catalog name or the raw system string, e.g. 'h100_sxm'.")
    precision: str = Field("", description="Weight precision as given: fp8, fp4, bf16, int4, or empty.")
    kv_dtype: str = Field("auto", description="KV-cache dtype flag value; 'auto' = the engine default.")
    attention_backend: str = Field("auto", description="Attention backend; 'auto' = the engine's choice.")
    graph_mode: str = Field("default", description="CUDA/HIP graphs or eager; 'default' = engine default.")
    spec_method: str = Field("none", description="Speculative decoding method; 'none' = off.")

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_known(cls, value: Any) -> str:
        name = value.strip().lower() if isinstance(value, str) else value
        if name not in ENGINES:
            raise ValueError(f"engine {value!r} is not supported; accepted engines: {', '.join(ENGINES)}")
        return name

    def _canonical_json(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))

    def key(self) -> str:
        """Stable short hash: sha256 of the canonical JSON (sorted keys), first 12 hex chars."""
        return hashlib.sha256(self._canonical_json().encode()).hexdigest()[:12]

    def differences(self, other: KernelSet) -> list[tuple[str, str, str]]:
        """(field, value here, value in ``other``) for every field that differs, in field order.
        Names compare as `normalized` resolves them: `h100` and `h100_sxm` are not a difference."""
        mine, theirs = self.normalized(), other.normalized()
        return [
            (name, getattr(self, name), getattr(other, name))
            for i, name in enumerate(type(self).model_fields)
            if mine[i] != theirs[i]
        ]

    def normalized(self) -> tuple[str, ...]:
        """The kernel set with names resolved through the catalogs, so that `h100_sxm` and
        `NVIDIA-H100-80GB-HBM3`, or `meta-llama/Llama-3.1-70B` and `...Meta-Llama-3.1-70B`,
        compare equal. Names the catalogs do not know compare as given."""
        from inferasim.catalog.checkpoints import priced_precision
        from inferasim.catalog.gpus import UnknownGPUError, normalize_gpu_name
        from inferasim.catalog.models import ModelConfigError, UnknownModelError, get_model, resolve_model_name

        try:
            gpu = normalize_gpu_name(self.gpu)
        except UnknownGPUError:
            gpu = self.gpu
        precision = self.precision.lower()
        try:
            model = resolve_model_name(self.model)
        except UnknownModelError:
            model = self.model
        else:
            # The weights that run: an empty precision is the checkpoint's own format, so that
            # nvidia/DeepSeek-R1-FP4 (which prices as DeepSeek-R1's architecture) at "" is fp4, not
            # the FP8 of deepseek-ai/DeepSeek-R1 at "".
            try:
                precision = priced_precision(self.precision or "auto", self.model, get_model(model))
            except (ModelConfigError, ValueError):
                pass
        return (self.engine, self.engine_version, model, gpu, precision, self.kv_dtype,
                self.attention_backend, self.graph_mode, self.spec_method)

    def same_kernels(self, other: KernelSet) -> bool:
        return self == other or self.normalized() == other.normalized()

    def describe(self) -> str:
        """Human-readable one-liner: engine, version, model, GPU, precision, then non-defaults."""
        words = [self.engine, self.engine_version or "(unknown version)", self.model, "on", self.gpu]
        if self.precision:
            words.append(self.precision)
        for name, field in type(self).model_fields.items():
            if name in ("engine", "engine_version", "model", "gpu", "precision"):
                continue
            if getattr(self, name) != field.default:
                words.append(f"{name}={getattr(self, name)}")
        return " ".join(words)


class LayoutModel(BaseModel):
    """How one replica is split over GPUs; mirror of :class:`inferasim.core.layout.Layout`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(1, ge=1, description="Tensor-parallel width of attention and dense layers.")
    pp: int = Field(1, ge=1, description="Pipeline-parallel stages.")
    dp: int = Field(1, ge=1, description="Attention data-parallel ranks.")
    moe_tp: int = Field(0, ge=0, description="Tensor slices of each expert; 0 = derived: tp x dp / moe_ep.")
    moe_ep: int = Field(1, ge=1, description="Expert-parallel shards of the routed experts.")

    @model_validator(mode="after")
    def _possible(self) -> Self:
        # Layout owns the rules (moe_ep divides tp x dp, ...); surface its message unchanged.
        try:
            self.to_layout()
        except LayoutError as exc:
            raise ValueError(str(exc)) from None
        return self

    def to_layout(self) -> Layout:
        return Layout(tp=self.tp, pp=self.pp, dp=self.dp, moe_tp=self.moe_tp, moe_ep=self.moe_ep)

    @classmethod
    def from_layout(cls, layout: Layout) -> LayoutModel:
        return cls(**layout.as_dict())


# --------------------------------------------------------------------------------------------
# measurements
# --------------------------------------------------------------------------------------------


class BenchPoint(BaseModel):
    """One end-to-end benchmark measurement at a fixed (isl, osl, concurrency)."""

    model_config = _STRICT

    isl: int = Field(gt=0, description="Input (prompt) length in tokens.")
    osl: int = Field(gt=0, description="Output length in tokens.")
    concurrency: int = Field(
        gt=0, description="Client concurrency (closed) or requests submitted at once (offline)."
    )
    scenario: Literal["closed", "offline"] = Field(
        "closed",
        description="closed: fixed concurrency with refill; offline: all requests at once, no refill.",
    )
    ttft_ms: float | None = Field(None, gt=0, description="Mean time to first token, milliseconds.")
    tpot_ms: float | None = Field(None, gt=0, description="Mean time per output token after the first, ms.")
    batch_latency_s: float | None = Field(
        None, gt=0, description="Offline: seconds until the whole batch finished."
    )
    throughput_tok_s: float | None = Field(
        None, gt=0, description="Output tokens per second, all GPUs of the replica together."
    )
    row_id: str = Field("", description="Provenance: id of the source row.")

    @model_validator(mode="after")
    def _has_metric(self) -> Self:
        if all(getattr(self, m) is None for m in _POINT_METRICS):
            metrics = ", ".join(_POINT_METRICS)
            raise ValueError(f"a benchmark point needs at least one measured metric: {metrics}")
        return self


_POINT_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "batch_latency_s", "throughput_tok_s")


class StepPoint(BaseModel):
    """One measured engine iteration (from a PyTorch harvest or engine logs)."""

    model_config = _STRICT

    n_decode: int = Field(ge=0, description="Decode sequences in the step (one token each).")
    decode_context: float = Field(ge=0, description="Mean context length of the decode sequences, tokens.")
    n_prefill_tokens: int = Field(ge=0, description="Prefill tokens in the step (sum of the chunks).")
    prefill_context: float = Field(0.0, ge=0, description="Cached prefix before the prefill chunk, tokens.")
    step_ms: float = Field(gt=0, description="Measured step time, milliseconds (mean over repeats).")
    repeats: int = Field(1, ge=1, description="How many times the step was timed.")
    std_ms: float = Field(0.0, ge=0, description="Standard deviation over the repeats, milliseconds.")

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if self.n_decode + self.n_prefill_tokens <= 0:
            raise ValueError("a step needs n_decode + n_prefill_tokens > 0")
        return self

    @property
    def tokens(self) -> int:
        return self.n_decode + self.n_prefill_tokens


class Provenance(BaseModel):
    """Where an anchor's measurements come from and what they cost."""

    model_config = _STRICT

    method: Literal["public-data", "harvest", "passive", "canary", "pytorch", "synthetic"] = Field(
        description=(
            "public-data: rows of a public data set; harvest: the harvester drove an engine; passive: "
            "observed live traffic; canary: a canary deployment's live traffic over its confirmation window "
            "(one operating point, calibrated on a parent anchor); pytorch: isolated step timings; "
            "synthetic: made up (tests, demos)."
        )
    )
    source: str = Field(description="Where: file and rows, cluster and namespace, URL of the data set ...")
    measured_at: str = Field("", description="ISO date/time of the measurement, as given.")
    engine_image: str = Field("", description="Container image of the engine that was measured.")
    measured_by: str = Field("", description="Who or what measured it (tool and version, person).")
    rows: list[str] = Field(default_factory=list, description="Ids of the source rows used.")
    gpu_seconds: float = Field(0.0, ge=0, description="GPU-seconds the measurement cost.")
    notes: str = Field("", description="Free text.")


class FitReport(BaseModel):
    """How well the fitted step-time parameters reproduce the anchor's own measurements."""

    model_config = _STRICT

    n_points: int = Field(ge=0, description="Measurements the fit used.")
    rms_log_error: float = Field(ge=0, description="Root mean square of log(predicted / measured).")
    max_abs_log_error: float = Field(ge=0, description="Largest |log(predicted / measured)|.")
    per_metric: dict[str, float] = Field(
        default_factory=dict,
        description="Metric -> median absolute percentage error at the anchor's points (a fraction).",
    )
    converged: bool = Field(True, description="Whether the optimiser converged.")
    message: str = Field("", description="Optimiser or fit message.")
    step_model: str = Field(
        "",
        description="Revision of inferasim's step-time model the parameters were fitted under "
        "(steptime.STEP_MODEL_REVISION); parameters of another revision are refitted from the points "
        "when read. Empty: not recorded (older writers); the parameters are used as stored.",
    )


class MeasuredRange(BaseModel):
    """The region the anchor measured; predictions outside it carry an extrapolation flag."""

    model_config = _STRICT

    concurrency: IntRange = Field(description="[min, max] concurrency measured.")
    isl: IntRange = Field(description="[min, max] input length measured, tokens.")
    osl: IntRange = Field(description="[min, max] output length measured, tokens.")
    tokens_per_step: FloatRange | None = Field(
        None, description="[min, max] tokens per engine step measured (from step points)."
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        for name in ("concurrency", "isl", "osl", "tokens_per_step"):
            span = getattr(self, name)
            if span is not None and span[0] > span[1]:
                raise ValueError(f"{name} range [{span[0]}, {span[1]}] has min above max")
        return self

    def contains(
        self, concurrency: int, isl: int, osl: int, tokens_per_step: float | None = None
    ) -> list[str]:
        """Reasons the point lies outside the measured range; empty when inside."""
        checks: list[tuple[str, float, tuple[float, float] | None]] = [
            ("concurrency", concurrency, self.concurrency),
            ("isl", isl, self.isl),
            ("osl", osl, self.osl),
        ]
        if tokens_per_step is not None:
            checks.append(("tokens per step", tokens_per_step, self.tokens_per_step))
        reasons: list[str] = []
        for name, value, span in checks:
            if span is None:
                continue
            lo, hi = span
            if value > hi:
                reasons.append(f"{name} {_num(value)} above measured {_num(hi)}")
            elif value < lo:
                reasons.append(f"{name} {_num(value)} below measured {_num(lo)}")
        return reasons

    @classmethod
    def from_measurements(cls, points: list[BenchPoint], steps: list[StepPoint]) -> MeasuredRange | None:
        """The range spanned by ``points`` (and ``steps`` for tokens per step); None without points.

        A step carries no request lengths, so a steps-only anchor has no range in request terms.
        """
        if not points:
            return None
        tokens = [s.tokens for s in steps]
        return cls(
            concurrency=(min(p.concurrency for p in points), max(p.concurrency for p in points)),
            isl=(min(p.isl for p in points), max(p.isl for p in points)),
            osl=(min(p.osl for p in points), max(p.osl for p in points)),
            tokens_per_step=(float(min(tokens)), float(max(tokens))) if tokens else None,
        )


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# --------------------------------------------------------------------------------------------
# the anchor
# --------------------------------------------------------------------------------------------


class Anchor(BaseModel):
    """Measurements of one kernel set at one layout, their fit, and their provenance."""

    model_config = _STRICT

    schema_version: int = Field(
        SCHEMA_VERSION, ge=1, description="Version of this schema the file was written with."
    )
    kernel_set: KernelSet = Field(description="The kernels this anchor measured.")
    layout: LayoutModel = Field(description="The layout it was measured at.")
    points: list[BenchPoint] = Field(default_factory=list, description="End-to-end benchmark points.")
    steps: list[StepPoint] = Field(default_factory=list, description="Measured engine iterations.")
    params: dict[str, float] = Field(
        default_factory=dict,
        description="Fitted step-time parameters (names defined by inferasim.model.steptime).",
    )
    fit: FitReport | None = Field(None, description="Quality of the fit; absent until fitted.")
    measured_range: MeasuredRange | None = Field(
        None, description="Measured region; computed from the points when not given."
    )
    provenance: Provenance = Field(description="Where the measurements come from.")

    @field_validator("params")
    @classmethod
    def _usable_params(cls, value: dict[str, float]) -> dict[str, float]:
        # Checked here, not at use: an anchor with e_bw 0 or a negative host cost would predict
        # negative latencies or divide by zero in every command that reads it.
        from inferasim.model.steptime import param_error

        # A name this version does not know is kept and not used (StepParams.from_dict): an anchor
        # written by a newer harvester must still load; `anchors check` names such parameters.
        for name, v in value.items():
            error = param_error(name, v)
            if error and not error.startswith("unknown"):
                raise ValueError(error)
        return value

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {value} is newer than this inferasim reads ({SCHEMA_VERSION}); "
                "upgrade inferasim"
            )
        return value

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if not self.points and not self.steps:
            raise ValueError("an anchor needs at least one benchmark point or step")
        if self.measured_range is None:
            self.measured_range = MeasuredRange.from_measurements(self.points, self.steps)
        return self

    @property
    def id(self) -> str:
        """Kernel-set key plus layout label, e.g. ``3fa2c1d9e0ab-tp4-ep4``."""
        return f"{self.kernel_set.key()}-{self.layout.to_layout().label()}"

    def filename(self) -> str:
        """Readable, filesystem-safe file name; the key suffix keeps kernel sets apart."""
        ks = self.kernel_set
        label = self.layout.to_layout().label()
        parts = [ks.engine, ks.model.replace("/", "--"), ks.gpu, ks.precision, label]
        slug = "-".join(_safe(p) for p in parts if p)
        # A passive anchor of the same kernels and layout as a harvested one is kept beside it.
        # So is a canary anchor (live traffic of a canary, one operating point).
        suffix = f"-{self.provenance.method}" if self.provenance.method in ("passive", "canary") else ""
        return f"{slug}-{ks.key()[:6]}{suffix}.json"


def _safe(text: str) -> str:
    # "_" for anything unsafe keeps the "-" between parts and the "--" of the model readable.
    return re.sub(r"[^a-z0-9._-]+", "_", text.lower())


def anchor_json_schema() -> dict[str, Any]:
    """The JSON schema of an anchor file (and of the ServingAnchor CRD spec)."""
    return Anchor.model_json_schema()


class AnchorFileError(UserError):
    """A bad anchor file; the message names the file and each problem's location."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        self.path = Path(path)
        self.problems = problems
        super().__init__(f"{self.path}: " + "; ".join(problems))


def _location(loc: tuple[int | str, ...]) -> str:
    """pydantic's ('points', 0, 'ttft_ms') -> points[0].ttft_ms."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain_errors(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors(include_url=False):
        where = _location(tuple(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            problems.append(f"field {where} is missing")
        elif where:
            if err["type"] == "extra_forbidden":
                problems.append(f"field {where} is not part of the anchor schema")
            else:
                problems.append(f"field {where}: {msg} (got {_short(err['input'])})")
        else:
            problems.append(msg)
    return problems


def load_anchor(path: str | Path) -> Anchor:
    """Read one anchor file; AnchorFileError (naming the file and the fields) when it is bad."""
    path = Path(path)
    if path.is_dir():
        raise AnchorFileError(path, ["is a folder, not an anchor file: give one .json file, or the folder as "
                                     "--anchors (a folder of anchors)"])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AnchorFileError(path, [f"cannot read: {exc}"]) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        raise AnchorFileError(path, [problem]) from None
    try:
        return Anchor.model_validate(data)
    except ValidationError as exc:
        raise AnchorFileError(path, _plain_errors(exc)) from None


# Where a replaced anchor file goes: a subfolder, so that a store reading the folder's *.json sees
# only the new anchor, while the measurement it replaces stays on disk.
REPLACED_FOLDER = "replaced"


def write_anchor_file(anchor: Anchor, path: str | Path, *, keep_previous: bool = True) -> Path | None:
    """Write ``anchor`` as pretty JSON to ``path``, through a temporary file and a rename so that a
    reader never sees half a file. A different file already at ``path`` is moved into
    ``replaced/`` beside it (named by its modification time) unless ``keep_previous`` is False:
    a harvest costs GPU hours and a re-run must not silently drop the one before. Returns where
    the previous file went (None: there was none, it held the same text, or it was not kept)."""
    path = Path(path)
    text = anchor.model_dump_json(indent=2) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    # The new text is written first: a full disk leaves the old anchor in place and active.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # not *.json: readers skip it
    tmp.write_text(text, encoding="utf-8")
    kept: Path | None = None
    try:
        if keep_previous and path.is_file() and path.read_text(encoding="utf-8", errors="replace") != text:
            stamp = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
            aside = path.parent / REPLACED_FOLDER
            aside.mkdir(exist_ok=True)
            kept = aside / f"{path.stem}.{stamp}{path.suffix}"
            n = 1
            while kept.exists():
                n += 1
                kept = aside / f"{path.stem}.{stamp}-{n}{path.suffix}"
            # A copy, not a move: the active file stays until the rename below replaces it.
            shutil.copy2(path, kept)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return kept

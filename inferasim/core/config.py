"""One serving configuration (:class:`ServingConfig`): engine, model, GPU, layout and the engine knobs
a deployment sets, checked on construction (a ValueError names the field and what is accepted), and
the per-engine spellings of its KV-cache dtype and speculative-decoding method.

Source tags in the comments are those of ``shared/notes/engine-facts.md`` section 0 (as in
:mod:`inferasim.core.engine_args`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import GPU, get_gpu
from inferasim.catalog.precision import PRECISIONS
from inferasim.core.layout import Layout

# Speculative decoding methods and their per-engine spellings.
SPEC_METHODS: tuple[str, ...] = ("none", "eagle", "eagle3", "mtp", "ngram")
SPEC_SPELLING: dict[str, dict[str, str]] = {
    # V10 --speculative-config {"method": ...}; "mtp" is the generic name of newer vLLM (older
    # releases used "deepseek_mtp"); the value list is unverified in the notes (5.1).
    "vllm": {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "ngram": "ngram"},
    # S --speculative-algorithm EAGLE | EAGLE3 | NEXTN | STANDALONE | NGRAM (notes 5.2).
    "sglang": {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "ngram": "NGRAM"},
    # A --method mtp | eagle3 | dspark (notes 5.3).
    "atom": {"eagle3": "eagle3", "mtp": "mtp"},
}
SPEC_NEEDS_DRAFT = frozenset({"eagle", "eagle3"})

DISAGG_ROLES: tuple[str, ...] = ("prefill", "decode")

# KV-cache dtype: ServingConfig spelling -> engine value (None: leave the engine default).
KV_DTYPES: dict[str, dict[str, str | None]] = {
    # V10 --kv-cache-dtype auto | fp8 | fp8_e4m3 | fp8_e5m2 | fp8_inc; "auto" is the model dtype,
    # so a bf16 request needs no flag.
    "vllm": {
        "auto": None,
        "bf16": None,
        "bfloat16": None,
        "fp8": "fp8",
        "fp8_e4m3": "fp8_e4m3",
        "fp8_e5m2": "fp8_e5m2",
        "fp8_inc": "fp8_inc",
    },
    # S --kv-cache-dtype auto | fp8_e5m2 | fp8_e4m3 | bf16 | ... (SGLang has no bare "fp8").
    "sglang": {
        "auto": None,
        "bf16": "bf16",
        "bfloat16": "bf16",
        "fp8": "fp8_e4m3",
        "fp8_e4m3": "fp8_e4m3",
        "fp8_e5m2": "fp8_e5m2",
    },
    # A --kv_cache_dtype bf16 (default) | fp8.
    "atom": {"auto": None, "bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8"},
}


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingConfig:
    """One serving deployment: engine, model, hardware, layout and engine knobs.

    ``None`` for a knob leaves the engine's own default (no flag is rendered). ``engine`` is
    normalised to its canonical name ("vllm", "sglang", "atom") on construction. Field errors raise
    ValueError naming the field and the accepted values.
    """

    engine: str
    model: str
    gpu: str
    layout: Layout
    replicas: int = 1
    precision: str = "auto"
    kv_cache_dtype: str = "auto"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None
    memory_fraction: float | None = None
    spec_method: str = "none"
    num_speculative_tokens: int = 0
    max_model_len: int | None = None
    image: str | None = None
    engine_version: str = ""
    disagg_role: str | None = None
    extra_args: tuple[str, ...] = ()
    draft_model: str | None = None  # draft checkpoint for eagle / eagle3 speculative decoding

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", normalize_engine(self.engine))
        if not isinstance(self.layout, Layout):
            raise ValueError(f"layout must be an inferasim.core.layout.Layout, got {type(self.layout).__name__}")
        if not isinstance(self.model, str) or not self.model.strip() or self.model.startswith("-"):
            raise ValueError(f"model must be a Hugging Face id or path, got {self.model!r}")
        if any(c.isspace() for c in self.model):
            raise ValueError(f"model must not contain whitespace, got {self.model!r}")
        gpu = get_gpu(self.gpu)  # UnknownGPUError (a ValueError) lists the accepted names
        if self.engine == "atom" and gpu.vendor != "amd":
            raise ValueError(
                f"ATOM is ROCm-only (AMD Instinct GPUs); gpu={self.gpu!r} is an NVIDIA GPU. "
                "Use engine vllm or sglang on NVIDIA GPUs."
            )
        _check_int(self.replicas, "replicas", minimum=1)
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None:
                _check_int(value, name, minimum=1)
        for name in ("chunked_prefill", "prefix_caching"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be true, false or None (engine default), got {value!r}")
        if self.memory_fraction is not None:
            mf = self.memory_fraction
            if isinstance(mf, bool) or not isinstance(mf, int | float) or not 0 < mf <= 1:
                raise ValueError(
                    f"memory_fraction must be a number in (0, 1] (the engine's gpu_memory_utilization / "
                    f"mem_fraction_static), got {mf!r}"
                )
        if normalize_knob(self.precision) not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not accepted; accepted: {', '.join(PRECISIONS)}")
        kv_map = KV_DTYPES[self.engine]
        if normalize_knob(self.kv_cache_dtype) not in kv_map:
            raise ValueError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} is not accepted for {self.engine}; "
                f"accepted: {', '.join(kv_map)}"
            )
        self._check_spec()
        if self.disagg_role is not None and self.disagg_role not in DISAGG_ROLES:
            raise ValueError(
                f"disagg_role={self.disagg_role!r} is not accepted; accepted: None, {', '.join(DISAGG_ROLES)}"
            )
        if isinstance(self.extra_args, list):  # e.g. from YAML / pydantic; keep the config hashable
            object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if not isinstance(self.extra_args, tuple) or not all(isinstance(a, str) for a in self.extra_args):
            raise ValueError(f"extra_args must be a tuple of strings, got {self.extra_args!r}")
        if self.image is not None and (not isinstance(self.image, str) or not self.image.strip()):
            raise ValueError(f"image must be a non-empty image reference or None, got {self.image!r}")

    def _check_spec(self) -> None:
        method = normalize_knob(self.spec_method)
        if method not in SPEC_METHODS:
            raise ValueError(f"spec_method={self.spec_method!r} is not accepted; accepted: {', '.join(SPEC_METHODS)}")
        _check_int(self.num_speculative_tokens, "num_speculative_tokens", minimum=0)
        if method == "none":
            if self.num_speculative_tokens:
                raise ValueError(
                    f"num_speculative_tokens={self.num_speculative_tokens} needs spec_method "
                    f"({', '.join(SPEC_METHODS[1:])}); spec_method is 'none'"
                )
            return
        supported = SPEC_SPELLING[self.engine]
        if method not in supported:
            raise ValueError(
                f"spec_method={self.spec_method!r} is not supported by {self.engine}; "
                f"accepted: none, {', '.join(supported)}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"spec_method={method} needs num_speculative_tokens >= 1, got {self.num_speculative_tokens}"
            )
        if method in SPEC_NEEDS_DRAFT and not self.draft_model:
            raise ValueError(f"spec_method={method} needs draft_model (the draft checkpoint's Hugging Face id)")

    @property
    def gpu_spec(self) -> GPU:
        return get_gpu(self.gpu)

    @property
    def gpus_per_replica(self) -> int:
        return self.layout.gpus


def _check_int(value: Any, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def normalize_knob(value: str) -> str:
    return str(value).strip().lower().replace("-", "_") if value is not None else ""

"""The one precision vocabulary: every spelling of a weight format that inferasim reads (engines'
flags, data sets' columns, Hugging Face and torch dtype names), what each means, and the classes of
weights a precision asks for. How a checkpoint's own format is read is `catalog.checkpoints`.

Adding a precision is one entry in PRECISIONS_TABLE (and, for a new weight layout, one in
WEIGHT_FORMATS): its spellings, the bytes its weights take, the tensor-core rate its GEMMs run at,
what checkpoint serves it, its population-prior family and the KV cache the public benchmarks pair
with it all follow from there (tests/unit/test_precision_table.py adds one and follows it through).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores one kind of weight."""

    name: str
    bytes_per_param: float  # block scales included
    compute: str  # the tensor-core dtype its GEMMs run in (a key of catalog.gpus.DTYPES)


# Bytes per parameter: NVFP4 carries one fp8 scale per 16 values (NVIDIA, "Introducing NVFP4",
# 2025), MXFP4 one e8m0 scale per 32 values (OCP Microscaling Formats v1.0), int4 weight-only
# (compressed-tensors / AWQ / GPTQ) one bf16 scale per group of 32 to 128 values (0.5 + 2/32 taken
# as the conservative case). Weight-only int4 is dequantized and multiplied in BF16 (Marlin). A
# float32 checkpoint is served in 16 bits (vLLM's --dtype auto casts float32 down): its GEMMs run
# in bf16, while its bytes stay the checkpoint's.
WEIGHT_FORMATS: dict[str, WeightFormat] = {f.name: f for f in (
    WeightFormat("fp32", 4.0, "bf16"),
    WeightFormat("bf16", 2.0, "bf16"),
    WeightFormat("fp16", 2.0, "fp16"),
    WeightFormat("fp8", 1.0, "fp8"),
    WeightFormat("int8", 1.0, "int8"),
    WeightFormat("nvfp4", 0.5 + 1.0 / 16, "fp4"),
    WeightFormat("mxfp4", 0.5 + 1.0 / 32, "fp4"),
    WeightFormat("int4", 0.5 + 2.0 / 32, "bf16"),
)}


@dataclass(frozen=True)
class Precision:
    """One serving precision and everything that follows from it."""

    name: str  # canonical
    offered: tuple[str, ...]  # spellings offered as --precision choices besides the name
    read: tuple[str, ...]  # further spellings read from data files, engine flags and dtype names
    weight_format: str  # a key of WEIGHT_FORMATS
    bits: int  # 16, 8 or 4: kernel sets of one width share a population prior (model.priors)
    weight_class: str  # the checkpoints that serve it (a 4-bit float request: NVFP4 or MXFP4)
    # 4-bit MoE checkpoints quantize the routed experts only (ModelSpec.weight_formats).
    experts_only_in_moe: bool = False
    # The KV cache the public benchmarks run it with (the default of predict and tune).
    benchmark_kv: str = "auto"


PRECISIONS_TABLE: tuple[Precision, ...] = (
    Precision("bf16", (), ("bfloat16",), "bf16", 16, "16-bit"),
    Precision("fp16", (), ("float16", "half"), "fp16", 16, "16-bit"),
    # torch / HF dtype names of the OCP and AMD (fnuz) e4m3 flavours, vLLM's dynamic per-token
    # scheme, AMD Quark's per-token-per-channel FP8 and SGLang's --quantization w8a8_fp8.
    Precision("fp8", ("w8a8",), ("fp8_e4m3", "e4m3", "fp8_block", "block_fp8", "fp8_e4m3fn", "fp8_e4m3fnuz",
                                 "float8_e4m3fn", "float8_e4m3fnuz", "e4m3fnuz", "fp8_dynamic", "ptpc_fp8",
                                 "fp8_ptpc", "w8a8_fp8"), "fp8", 8, "fp8", benchmark_kv="fp8"),
    Precision("int8", (), ("w8a8_int8",), "int8", 8, "int8"),
    # The public data calls gpt-oss's MXFP4 "fp4": a 4-bit float request is met by either.
    Precision("fp4", ("nvfp4",), (), "nvfp4", 4, "fp4", experts_only_in_moe=True, benchmark_kv="fp8"),
    Precision("mxfp4", (), (), "mxfp4", 4, "fp4", experts_only_in_moe=True, benchmark_kv="fp8"),
    Precision("int4", ("w4a16", "awq", "gptq"), (), "int4", 4, "int4", experts_only_in_moe=True),
)
_BY_NAME: dict[str, Precision] = {p.name: p for p in PRECISIONS_TABLE}

# Serving precision names accepted from users and data files -> canonical precision.
PRECISION_ALIASES: dict[str, str] = {"": "auto", "auto": "auto", "none": "auto"} | {
    spelling: p.name for p in PRECISIONS_TABLE for spelling in (p.name, *p.offered, *p.read)}
# Precision spellings accepted in ServingConfig.precision (and --precision choices).
PRECISIONS: tuple[str, ...] = ("auto", *(s for p in PRECISIONS_TABLE for s in (p.name, *p.offered)))


def normalize_precision(precision: str) -> str:
    key = (precision or "").strip().lower().replace("-", "_")
    if key not in PRECISION_ALIASES:
        raise ValueError(
            f"unknown precision {precision!r}; accepted: {', '.join(sorted(set(PRECISION_ALIASES) - {''}))}"
        )
    return PRECISION_ALIASES[key]


def precision_spec(precision: str) -> Precision | None:
    """The table entry of a precision (any spelling); None for auto (the checkpoint's own)."""
    return _BY_NAME.get(normalize_precision(precision))


def weight_class(precision: str) -> str | None:
    """The weights a precision asks for or a checkpoint format holds (None: auto): the 16-bit
    formats are one class, and a 4-bit float request is met by NVFP4 and MXFP4 checkpoints alike."""
    spec = precision_spec(precision)
    return None if spec is None else spec.weight_class


def kernel_class(precision: str) -> str:
    """The weights as an anchor's kernels see them: every 4-bit float format is one class (an
    mxfp4 checkpoint is served by the fp4 kernels of its anchor), bf16 and fp16 stay apart."""
    spec = precision_spec(precision)
    if spec is None:
        return "auto"
    return spec.name if spec.bits == 16 else spec.weight_class


def precision_family(precision: str) -> str:
    """Precisions that run the same GEMM kinds: 16bit, 8bit or 4bit (auto counts as 16-bit); a
    spelling the table does not know is its own family."""
    try:
        spec = precision_spec(precision)
    except ValueError:
        return (precision or "").strip().lower()
    return f"{spec.bits if spec else 16}bit"


def benchmark_kv_dtype(precision: str) -> str:
    """The KV cache dtype the public benchmarks run a precision with (fp8 beside FP8 and 4-bit
    float weights), "auto" otherwise and for spellings the table does not know."""
    try:
        spec = precision_spec(precision)
    except ValueError:
        return "auto"
    return spec.benchmark_kv if spec else "auto"

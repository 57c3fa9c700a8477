"""The one precision vocabulary: every spelling of a weight format that inferasim reads (engines'
flags, data sets' columns, Hugging Face and torch dtype names), what each means, and the classes of
weights a precision asks for. How a checkpoint's own format is read is `catalog.checkpoints`."""

from __future__ import annotations

# Serving precision names accepted from users and data files -> canonical precision.
PRECISION_ALIASES: dict[str, str] = {
    "": "auto",
    "auto": "auto",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "e4m3": "fp8",
    "fp8_block": "fp8",
    "block_fp8": "fp8",
    # torch / HF dtype names of the OCP and AMD (fnuz) e4m3 flavours, vLLM's dynamic per-token
    # scheme, AMD Quark's per-token-per-channel FP8 and SGLang's --quantization w8a8_fp8.
    "fp8_e4m3fn": "fp8",
    "fp8_e4m3fnuz": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "e4m3fnuz": "fp8",
    "fp8_dynamic": "fp8",
    "ptpc_fp8": "fp8",
    "fp8_ptpc": "fp8",
    "w8a8_fp8": "fp8",
    "w8a8": "fp8",
    "w8a8_int8": "int8",
    "none": "auto",
    "int8": "int8",
    "fp4": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "mxfp4",
    "int4": "int4",
    "w4a16": "int4",
    "awq": "int4",
    "gptq": "int4",
}
# Precision spellings accepted in ServingConfig.precision.
PRECISIONS: tuple[str, ...] = (
    "auto",
    "bf16",
    "fp16",
    "fp8",
    "fp4",
    "mxfp4",
    "nvfp4",
    "int4",
    "int8",
    "w4a16",
    "w8a8",
    "awq",
    "gptq",
)


def normalize_precision(precision: str) -> str:
    key = (precision or "").strip().lower().replace("-", "_")
    if key not in PRECISION_ALIASES:
        raise ValueError(
            f"unknown precision {precision!r}; accepted: {', '.join(sorted(set(PRECISION_ALIASES) - {''}))}"
        )
    return PRECISION_ALIASES[key]


def weight_class(precision: str) -> str | None:
    """The weights a precision asks for or a checkpoint format holds (None: auto). The catalog's
    normalize_precision folds the aliases (nvfp4, w8a8, awq ...); on top of it the 16-bit formats
    are one class, and a 4-bit float request is met by NVFP4 and MXFP4 checkpoints alike (the
    public data calls gpt-oss's MXFP4 "fp4")."""
    p = normalize_precision(precision)
    return None if p == "auto" else {"bf16": "16-bit", "fp16": "16-bit", "mxfp4": "fp4"}.get(p, p)

"""Checkpoint rules: the weight format a model id names or holds, the precision a deployment of it
runs at, and whether an engine would serve it at a precision asked for."""

from __future__ import annotations

import re
from pathlib import Path

from inferasim.catalog.engines import flag_for, normalize_engine
from inferasim.catalog.models import ModelSpec, exact_catalog_id, get_model, sibling_checkpoints
from inferasim.catalog.precision import normalize_precision, weight_class

# Model ids that already name a quantised checkpoint: the engine reads the scheme from the
# checkpoint's config.json and an explicit --quantization would have to match it, so none is passed.
_PREQUANTIZED_ID = re.compile(
    r"(fp8|fp4|int4|int8|awq|gptq|w8a8|w4a16|w4a8|quark|mxfp|nvfp|ptpc|bnb|gguf)", re.IGNORECASE
)

# A quantised checkpoint's format from its id where the catalog does not hold that exact id
# (RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8, Qwen/Qwen3-235B-A22B-Instruct-2507-FP8).
_ID_FORMAT = (("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("fp4", "nvfp4"), ("fp8", "fp8"), ("w8a8", "fp8"),
              ("ptpc", "fp8"), ("int8", "int8"), ("int4", "int4"), ("awq", "int4"), ("gptq", "int4"),
              ("w4a16", "int4"), ("w4a8", "int4"))


def names_quantized_checkpoint(model: str) -> bool:
    """Whether the model id names a quantised checkpoint (-FP8, -AWQ, Quark, ...): the engine then
    reads the scheme from its config.json, and no online --quantization is passed."""
    return _PREQUANTIZED_ID.search(model) is not None


def checkpoint_format(model: str) -> str | None:
    """The weight format of the checkpoint ``model`` names, as the engine will load it: a
    config.json path's own, an exact catalog id's, the format an id spells out (-FP8, -AWQ ...),
    else that of the catalog model it is a variant of (an -Instruct of a BF16 base is BF16).
    None when nothing says (an unknown id, or a scheme the catalog does not price)."""
    try:
        path = Path(model)
        if model.endswith(".json") or path.is_dir():
            return get_model(model).checkpoint_format
        exact = exact_catalog_id(model)
        if exact is not None:
            return get_model(exact).checkpoint_format
        if _PREQUANTIZED_ID.search(model):
            tokens = set(re.split(r"[^a-z0-9]+", model.lower()))
            return next((fmt for token, fmt in _ID_FORMAT if token in tokens), None)
        return get_model(model).checkpoint_format
    except (ValueError, OSError):
        return None


def priced_precision(precision: str, model_id: str, model: ModelSpec) -> str:
    """The precision a deployment of ``model_id`` (as the user named it; ``model`` is the catalog
    model it is priced by) runs at, normalised (nvfp4 -> fp4): ``auto`` reads the weights of the
    named checkpoint (checkpoint_format: an -FP8 variant of a BF16 catalog model is fp8), else
    those of the catalog model. Every command resolves ``--precision`` / ``precision`` this way."""
    if normalize_precision(precision) == "auto":
        precision = checkpoint_format(model_id) or model.checkpoint_format
    return normalize_precision(precision)


def precision_error(engine: str, model: str, precision: str) -> str | None:
    """Why ``engine`` would not serve ``model`` (the id or config path as the user wrote it) at
    ``precision`` (None: it would). The engine runs the weights of the checkpoint it loads: a
    quantised checkpoint at its own format, a 16-bit one at 16 bits or, where the engine quantises
    online (vLLM and SGLang --quantization fp8), at fp8. Rendering ``deepseek-ai/DeepSeek-R1``
    (FP8) for a price at fp4 would run twice the weight bytes that were priced. A checkpoint whose
    format nothing states (checkpoint_format) is not judged."""
    want = weight_class(precision)
    if want is None:  # auto: the checkpoint's own format, which is what the price uses
        return None
    fmt = checkpoint_format(model)
    if fmt is None:
        return None
    have = weight_class(fmt)
    if have == want:
        return None
    online = flag_for(normalize_engine(engine), "quantization") is not None
    if want == "fp8" and have == "16-bit" and online:
        return None
    how = ("quantises online only from 16-bit weights to fp8" if online else "has no online quantization")
    siblings = [hf for hf, f in sibling_checkpoints(model).items() if weight_class(f) == want]
    fix = (f"point the model at {' or '.join(siblings)}" if siblings else
           f"point the model at a {precision} checkpoint of it")
    return (f"{engine} would serve {model} at {fmt}, not {precision}: the checkpoint holds {fmt} weights and "
            f"{engine} {how}; {fix}, or choose precision {fmt if have != '16-bit' else 'bf16'}")

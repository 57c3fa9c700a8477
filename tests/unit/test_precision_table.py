"""catalog.precision's table is the one place a precision is described: every consumer (spellings,
checkpoint classes, weight bytes, GEMM rates, population-prior families, the benchmark KV cache,
the kernel class of an anchor) reads its entry, so adding one entry is adding a precision."""

from __future__ import annotations

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import WEIGHT_FORMAT_BYTES, get_model
from inferasim.catalog.precision import (
    PRECISIONS,
    PRECISIONS_TABLE,
    WEIGHT_FORMATS,
    benchmark_kv_dtype,
    kernel_class,
    normalize_precision,
    precision_family,
    weight_class,
)
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import compute_dtype, layout_cost
from inferasim.model.priors import precision_class

DENSE, MOE = get_model("meta-llama/Meta-Llama-3.1-8B"), get_model("Qwen/Qwen3-30B-A3B")


@pytest.mark.parametrize("spec", PRECISIONS_TABLE, ids=lambda p: p.name)
def test_every_consumer_reads_the_entry(spec) -> None:  # noqa: ANN001
    fmt = WEIGHT_FORMATS[spec.weight_format]
    for spelling in (spec.name, *spec.offered, *spec.read):
        assert normalize_precision(spelling) == spec.name
        assert normalize_precision(spelling.upper().replace("_", "-")) == spec.name
    assert spec.name in PRECISIONS and all(s in PRECISIONS for s in spec.offered)
    assert weight_class(spec.name) == spec.weight_class
    assert precision_family(spec.name) == precision_class(spec.name) == f"{spec.bits}bit"
    assert benchmark_kv_dtype(spec.name) == spec.benchmark_kv
    assert kernel_class(spec.name) in (spec.name, spec.weight_class)
    # Weights: a dense model stores every linear layer in the entry's format, a MoE model its
    # experts (and the rest too, unless the entry quantizes experts only).
    dense = DENSE.weight_formats(spec.name)
    assert dense["dense_mlp"] == dense["attention"] == spec.weight_format
    assert WEIGHT_FORMAT_BYTES[dense["dense_mlp"]] == fmt.bytes_per_param
    moe = MOE.weight_formats(spec.name)
    assert moe["routed_experts"] == spec.weight_format
    assert (moe["attention"] != spec.weight_format) == spec.experts_only_in_moe
    # GEMMs run at the format's rate.
    assert compute_dtype(spec.name, "dense_mlp", DENSE) == fmt.compute
    gpu = get_gpu("B200")
    cost = layout_cost(DENSE, gpu, Layout(), spec.name, "auto", "vllm", "")
    assert cost.peak_flops_dense == gpu.peak_flops(fmt.compute)


def test_spellings_are_unique_and_auto_is_the_checkpoints() -> None:
    spellings = [s for p in PRECISIONS_TABLE for s in (p.name, *p.offered, *p.read)]
    assert len(spellings) == len(set(spellings))
    assert normalize_precision("") == normalize_precision("none") == "auto"
    assert weight_class("auto") is None and benchmark_kv_dtype("auto") == "auto"
    with pytest.raises(ValueError, match="unknown precision 'fp7'"):
        normalize_precision("fp7")
    # A 4-bit float request is met by NVFP4 and MXFP4 checkpoints alike, and one anchor's kernels.
    assert weight_class("nvfp4") == weight_class("mxfp4") == kernel_class("mxfp4") == "fp4"

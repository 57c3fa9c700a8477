"""Tests for inferasim.catalog.gpus: name resolution, dtype fallbacks and figure sanity."""

from __future__ import annotations

import pytest

from inferasim.catalog.gpus import (
    GPU,
    Link,
    UnknownGPUError,
    get_gpu,
    list_gpus,
    normalize_gpu_name,
)

CANONICAL = ["MI250", "MI250X", "MI300X", "MI325X", "MI350X", "MI355X",
             "H100", "H200", "B200", "B300", "GB200", "GB300", "A100", "GH200"]

# Forms seen in the wild (node labels, data sets, nvidia-smi / rocm-smi, vLLM device names).
WILD_FORMS: dict[str, list[str]] = {
    "MI300X": ["mi300x", "AMD_Instinct_MI300X_OAM", "AMD Instinct MI300X", "amd-instinct-mi300x", "mi300x_sxm"],
    "MI325X": ["mi325x", "AMD_Instinct_MI325_OAM", "AMD_Instinct_MI325X"],
    "MI250": ["mi250", "AMD Instinct MI250", "mi250_oam", "MI250-GCD"],
    "MI250X": ["mi250x", "AMD_Instinct_MI250X"],
    "MI350X": ["mi350x", "AMD_Instinct_MI350X", "AMD Instinct MI350X OAM", "mi350x_sxm"],
    "MI355X": [
        "mi355x",
        "mi355x_sxm",
        "MI355X",
        "AMD_Instinct_MI355X",
        "AMD_Instinct_MI355_OAM",
        "amd instinct mi355x oam",
    ],
    "H100": ["h100", "h100_sxm", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB", "H100_80GB_HBM3"],
    "H200": ["h200", "h200_sxm", "NVIDIA-H200", "H200 SXM"],
    "B200": ["b200", "b200_sxm", "NVIDIA-B200", "NVIDIA B200"],
    "B300": ["b300", "b300_sxm", "NVIDIA-B300-SXM6-AC", "nvidia b300 sxm6 ac"],
    "GB200": ["gb200", "NVIDIA-GB200", "GB200_NVL72"],
    "GB300": ["gb300", "NVIDIA-GB300"],
    "A100": ["a100", "a100_sxm", "A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "nvidia a100 sxm4 80gb"],
    "GH200": ["gh200", "NVIDIA-GH200-480GB", "GH200"],
}

UNKNOWN_NAMES = [
    "h20",
    "mi210",  # one CDNA 2 GCD on a PCIe card: other clocks and memory than an MI250 GCD
    "mi300",  # ambiguous (MI300A is an APU)
    "mi350p",  # the MI350 series' PCIe card: other clocks and power than the OAM parts
    "mi350",  # the series: MI350X or MI355X
    "h100_pcie",
    "NVIDIA-H100-NVL",
    "h200_nvl",
    "A100-SXM4-40GB",
    "a100_pcie",
    "gh200_144gb",
    "amd_h100",  # vendor mismatch
    "v100",
    "",
    "nvidia",
]


def test_list_gpus_has_all_canonical_names_in_stable_order() -> None:
    names = [gpu.name for gpu in list_gpus()]
    assert names == CANONICAL
    assert [gpu.name for gpu in list_gpus()] == names  # stable across calls
    assert len(set(names)) == len(names)


def test_list_gpus_returns_a_copy() -> None:
    gpus = list_gpus()
    gpus.clear()
    assert len(list_gpus()) == len(CANONICAL)


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_canonical_label_and_aliases_resolve(gpu: GPU) -> None:
    for spelling in (gpu.name, gpu.name.lower(), gpu.product_label, *gpu.aliases):
        assert normalize_gpu_name(spelling) == gpu.name, spelling
        assert get_gpu(spelling) is gpu


@pytest.mark.parametrize(
    ("canonical", "form"),
    [(canonical, form) for canonical, forms in WILD_FORMS.items() for form in forms],
)
def test_wild_forms_resolve(canonical: str, form: str) -> None:
    assert normalize_gpu_name(form) == canonical
    assert normalize_gpu_name(form.upper()) == canonical
    # separators are interchangeable
    for sep in ("-", "_", " "):
        respelled = form.replace("-", sep).replace("_", sep).replace(" ", sep)
        assert normalize_gpu_name(respelled) == canonical
    assert get_gpu(form).name == canonical


def test_data_set_system_names_resolve() -> None:
    # the "system" column values used under shared/data
    expected = {
        "h100_sxm": "H100",
        "b200_sxm": "B200",
        "b300_sxm": "B300",
        "gb200": "GB200",
        "gb300": "GB300",
        "a100_sxm": "A100",
        "gh200": "GH200",
        "A100-SXM4-80GB": "A100",
        "H100_80GB_HBM3": "H100",
    }
    for raw, canonical in expected.items():
        assert normalize_gpu_name(raw) == canonical


@pytest.mark.parametrize("name", UNKNOWN_NAMES)
def test_unknown_names_raise_listing_canonical_names(name: str) -> None:
    with pytest.raises(UnknownGPUError) as info:
        normalize_gpu_name(name)
    message = str(info.value)
    for canonical in CANONICAL:
        assert canonical in message
    with pytest.raises(UnknownGPUError):
        get_gpu(name)


def test_unknown_gpu_error_is_value_error() -> None:
    with pytest.raises(ValueError):
        get_gpu("h20")


def test_variant_qualifier_is_explained() -> None:
    with pytest.raises(UnknownGPUError, match="pcie"):
        get_gpu("h100_pcie")


# --- peak_flops ------------------------------------------------------------------------------


def test_fp4_on_hopper_runs_at_the_bf16_rate() -> None:
    # No FP4 tensor cores: 4-bit weights are dequantized into BF16 GEMMs (weight-only kernels),
    # which is slower than the FP8 rate Hopper does have.
    h100 = get_gpu("h100")
    assert "fp4" not in h100.flops
    assert h100.peak_flops("fp4") == h100.flops["bf16"] < h100.flops["fp8"]
    assert h100.peak_flops("nvfp4") == h100.flops["bf16"]
    assert h100.peak_flops("mxfp4") == h100.flops["bf16"]
    assert h100.peak_flops("fp6") == h100.flops["bf16"]
    # MI300X has FP8 but no FP4 either; MI355X and B200 have FP4.
    assert get_gpu("MI300X").peak_flops("fp4") == get_gpu("MI300X").flops["bf16"]
    assert get_gpu("B200").peak_flops("fp4") > get_gpu("B200").peak_flops("fp8")


def test_fp8_and_fp4_on_a100_fall_back_to_bf16() -> None:
    a100 = get_gpu("a100")
    assert "fp8" not in a100.flops
    assert a100.peak_flops("fp8") == a100.flops["bf16"] == pytest.approx(312e12)
    assert a100.peak_flops("fp8_e4m3") == a100.flops["bf16"]
    assert a100.peak_flops("fp4") == a100.flops["bf16"]


def test_tf32_on_mi355x_falls_back_to_fp32() -> None:
    mi355x = get_gpu("mi355x")
    assert "tf32" not in mi355x.flops
    assert mi355x.peak_flops("tf32") == mi355x.flops["fp32"]


def test_native_dtypes_use_their_own_rate() -> None:
    b200 = get_gpu("b200")
    assert b200.peak_flops("fp4") == pytest.approx(9e15)
    assert b200.peak_flops("fp8") == pytest.approx(4.5e15)
    mi355x = get_gpu("mi355x")
    assert mi355x.peak_flops("fp4") == pytest.approx(10066.3e12)


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("fp8_e4m3", "fp8"),
        ("e4m3", "fp8"),
        ("fp8_block", "fp8"),
        ("nvfp4", "fp4"),
        ("mxfp4", "fp4"),
        ("float32", "fp32"),
    ],
)
def test_dtype_aliases(alias: str, canonical: str) -> None:
    for gpu in list_gpus():
        assert gpu.peak_flops(alias) == gpu.peak_flops(canonical)


@pytest.mark.parametrize("weight_only", ["int4", "w4a16", "int4_wo", "INT4"])
def test_weight_only_int4_runs_at_bf16_rate(weight_only: str) -> None:
    for gpu in list_gpus():
        assert gpu.peak_flops(weight_only) == gpu.peak_flops("bf16")


@pytest.mark.parametrize("bad", ["fp12", "int3", "", "bfloat8"])
def test_unknown_dtype_raises_naming_accepted_values(bad: str) -> None:
    gpu = get_gpu("h100")
    with pytest.raises(ValueError) as info:
        gpu.peak_flops(bad)
    message = str(info.value)
    for accepted in ("bf16", "fp16", "fp8", "fp4", "bfloat16"):
        assert accepted in message


# --- invariants ------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_invariants(gpu: GPU) -> None:
    f = gpu.flops
    assert set(f) <= {"fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp6", "fp4"}
    assert all(v > 0 for v in f.values())
    assert "bf16" in f and "fp16" in f and "fp32" in f
    assert f["bf16"] > f["fp32"]
    if "fp8" in f:
        assert f["fp8"] >= f["bf16"]
    if "fp6" in f:
        assert "fp8" in f and f["fp6"] >= f["fp8"]
    if "fp4" in f:
        assert "fp8" in f and f["fp4"] >= f["fp8"]
    if "tf32" in f:
        assert f["fp32"] <= f["tf32"] <= f["bf16"]
    # every dtype resolves to something positive
    for dtype in ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp6", "fp4"):
        assert gpu.peak_flops(dtype) > 0

    assert gpu.hbm_bytes > 0 and gpu.hbm_bandwidth > 0
    assert gpu.hbm_gb == pytest.approx(gpu.hbm_bytes / 2**30)
    assert 40 <= gpu.hbm_gb <= 300
    assert 1e12 <= gpu.hbm_bandwidth <= 10e12

    for link in (gpu.scale_up, gpu.scale_out, gpu.host_link):
        assert isinstance(link, Link)
        assert link.bandwidth > 0
        assert 0 < link.latency < 1e-4
        assert link.domain >= 1
        assert link.name
    assert gpu.scale_up.bandwidth > gpu.scale_out.bandwidth > 0
    assert gpu.host_link.bandwidth > 0
    assert gpu.host_link.domain == 1
    assert gpu.scale_out.domain == 1
    # a node never holds more GPUs than its scale-up domain spans, except GH200-style
    # single-superchip nodes whose domain is 1
    assert gpu.scale_up.domain >= gpu.gpus_per_node

    assert gpu.gpus_per_node in (1, 4, 8)
    assert gpu.tdp_watts > 0
    assert gpu.vendor in ("amd", "nvidia")
    if gpu.vendor == "amd":
        assert gpu.resource_name == "amd.com/gpu"
        assert gpu.name.startswith("MI")
    else:
        assert gpu.resource_name == "nvidia.com/gpu"
        assert gpu.product_label.startswith("NVIDIA-")


def test_gpus_are_hashable_and_frozen() -> None:
    gpu = get_gpu("h100")
    assert hash(gpu) == hash(get_gpu("NVIDIA-H100-80GB-HBM3"))
    assert len({g for g in list_gpus()}) == len(CANONICAL)
    with pytest.raises(AttributeError):
        gpu.name = "X"  # type: ignore[misc]


def test_invalid_link_rejected() -> None:
    with pytest.raises(ValueError):
        Link("bad", 0.0, 1e-6, 1)
    with pytest.raises(ValueError):
        Link("bad", 1e9, 1e-6, 0)


# --- published figures -----------------------------------------------------------------------


def test_published_figures() -> None:
    mi355x = get_gpu("mi355x")
    assert mi355x.hbm_gb == pytest.approx(288)
    assert mi355x.hbm_bandwidth == pytest.approx(8e12)
    assert mi355x.tdp_watts == 1400

    # MI250: one GCD, the device ROCm (and an engine's tp) counts: half the package's figures.
    mi250 = get_gpu("mi250")
    assert (mi250.hbm_gb, mi250.hbm_bandwidth, mi250.gpus_per_node) == (pytest.approx(64), pytest.approx(1.6384e12), 8)
    assert mi250.peak_flops("bf16") == pytest.approx(362.1e12 / 2) and mi250.peak_flops("fp8") == mi250.flops["bf16"]
    assert get_gpu("mi250x").peak_flops("fp16") == pytest.approx(383e12 / 2)

    # MI350X: MI355X's package at a 2.2 GHz peak clock instead of 2.4 GHz, and 1000 W.
    mi350x = get_gpu("mi350x")
    assert (mi350x.hbm_gb, mi350x.hbm_bandwidth, mi350x.tdp_watts) == (pytest.approx(288), pytest.approx(8e12), 1000)
    for dtype in ("bf16", "fp8", "fp4"):
        assert mi350x.peak_flops(dtype) == pytest.approx(mi355x.peak_flops(dtype) * 2.2 / 2.4, rel=2e-3)
    assert mi350x.peak_flops("bf16") == pytest.approx(2306.9e12)
    assert mi350x.scale_up.bandwidth == mi355x.scale_up.bandwidth

    mi300x = get_gpu("mi300x")
    assert mi300x.hbm_gb == pytest.approx(192)
    assert mi300x.hbm_bandwidth == pytest.approx(5.3e12)
    assert mi300x.peak_flops("bf16") == pytest.approx(1307.4e12)
    assert mi300x.scale_up.bandwidth == pytest.approx(448e9)

    h100 = get_gpu("h100")
    assert h100.hbm_gb == pytest.approx(80)
    assert h100.hbm_bandwidth == pytest.approx(3.35e12)
    assert h100.peak_flops("bf16") == pytest.approx(989.5e12, rel=1e-3)
    assert h100.scale_up.bandwidth == pytest.approx(450e9)

    h200 = get_gpu("h200")
    assert h200.hbm_gb == pytest.approx(141)
    assert h200.hbm_bandwidth == pytest.approx(4.8e12)
    assert h200.flops == h100.flops

    a100 = get_gpu("a100")
    assert a100.hbm_bandwidth == pytest.approx(2.039e12)
    assert a100.host_link.bandwidth == pytest.approx(32e9)

    for name in ("gb200", "gb300"):
        gpu = get_gpu(name)
        assert gpu.scale_up.domain == 72
        assert gpu.gpus_per_node == 4
    assert get_gpu("b300").scale_out.bandwidth == pytest.approx(100e9)
    assert get_gpu("b200").scale_out.bandwidth == pytest.approx(50e9)


def test_amd_product_labels_match_rocm_node_labeller() -> None:
    assert get_gpu("mi300x").product_label == "AMD_Instinct_MI300X_OAM"
    assert get_gpu("mi325x").product_label == "AMD_Instinct_MI325_OAM"
    assert get_gpu("mi355x").product_label == "AMD_Instinct_MI355_OAM"

"""GPU catalog: peak compute, memory and interconnect figures for datacenter accelerators.

Units are SI throughout:

* memory capacity in bytes (``1 GB = 1e9 bytes``; vendors quote decimal GB, noted where a
  vendor figure is really GiB or a per-rack total divided by GPU count),
* bandwidth in bytes/s, **one direction** (vendors usually quote NVLink / Infinity Fabric /
  PCIe as bidirectional aggregates; those are halved here and the comment says so),
* compute in FLOP/s (or OP/s for int8), **dense** (no 2:4 structured sparsity),
* latency in seconds, power in watts.

Every number carries a comment naming the vendor's public datasheet or product page it comes
from. Link latencies are not datasheet figures: they are typical small-message startup costs
(NCCL/RCCL and verbs measurements reported in the field) and are marked "typical/assumed".

Names: :func:`get_gpu` / :func:`normalize_gpu_name` accept, case-insensitively and with ``-``,
``_`` and space interchangeable, the canonical name, the Kubernetes node-label value
(``nvidia.com/gpu.product`` from the NVIDIA GPU feature discovery, ``amd.com/gpu.product-name``
from the ROCm node labeller), the forms used in the data sets under ``shared/data``
(``h100_sxm``, ``b200_sxm``, ``gb200``, ``gh200`` ...) and ``nvidia-smi`` / ``rocm-smi`` device
names. A name with a qualifier that denotes a *different* SKU (``h100_pcie``, ``a100-40gb``,
``h200_nvl``, ``mi350x``, ``h20``, ``mi250``) is never mapped to a nearby entry: it raises
:class:`UnknownGPUError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from inferasim.errors import UserError

__all__ = [
    "DTYPES",
    "GPU",
    "Link",
    "UnknownGPUError",
    "get_gpu",
    "list_gpus",
    "normalize_dtype",
    "normalize_gpu_name",
    "siblings",
]

# Canonical dtype keys a GPU's ``flops`` dict may use, widest first.
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp6", "fp4")

_GB = 1e9  # vendor GB (decimal)
# HBM capacities: vendors write "GB" but the parts hold that many GiB. nvidia-smi reports an H100
# 80GB as 81,559 MiB, an H200 as 143,771 MiB, and rocm-smi an MI300X as 196,592 MiB (SGLang's
# memory rule in shared/notes/engine-facts.md works from those MiB figures). Engines apply
# gpu_memory_utilization to these byte counts, so HBM is stored in GiB-based bytes.
_HBM_GB = 2**30
_TB = 1e12  # vendor TB/s (decimal)
_T = 1e12  # TFLOP/s
_P = 1e15  # PFLOP/s
_GBIT = 1e9 / 8  # 1 Gb/s in bytes/s


@dataclass(frozen=True)
class Link:
    """One interconnect as seen by a single GPU."""

    name: str  # "xGMI", "NVLink 4", "InfiniBand NDR", "PCIe 5.0 x16" ...
    bandwidth: float  # bytes/s, per GPU, ONE direction (unidirectional)
    latency: float  # seconds, per hop / message startup (typical, see module docstring)
    domain: int  # GPUs reachable on this link at full bandwidth (1 for a host link)

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"Link {self.name!r}: bandwidth must be > 0, got {self.bandwidth}")
        if not self.latency >= 0:
            raise ValueError(f"Link {self.name!r}: latency must be >= 0, got {self.latency}")
        if self.domain < 1:
            raise ValueError(f"Link {self.name!r}: domain must be >= 1, got {self.domain}")


# ---------------------------------------------------------------------------------------------
# dtype normalisation
# ---------------------------------------------------------------------------------------------

# Spelling -> canonical dtype key. Weight-only quantisation (int4/int8 weights, 16-bit
# activations) dequantises into the 16-bit units, so it runs at the bf16 rate; w4a8 runs on the
# fp8 units.
_DTYPE_ALIASES: dict[str, str] = {
    # fp32
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "single": "fp32",
    # tf32
    "tf32": "tf32",
    "tensorfloat32": "tf32",
    "xf32": "tf32",
    # bf16
    "bf16": "bf16",
    "bfloat16": "bf16",
    # fp16
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    # fp8 (all OCP fp8 flavours and block/MX-scaled fp8 run on the fp8 tensor units)
    "fp8": "fp8",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e4m3fn": "fp8",
    "fp8_e4m3fnuz": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e5m2": "fp8",
    "e5m2": "fp8",
    "fp8_block": "fp8",
    "mxfp8": "fp8",
    "w8a8_fp8": "fp8",
    "w4a8": "fp8",
    "w4a8_fp8": "fp8",
    # int8 (weights and activations)
    "int8": "int8",
    "i8": "int8",
    "w8a8": "int8",
    "w8a8_int8": "int8",
    # fp6
    "fp6": "fp6",
    "mxfp6": "fp6",
    "fp6_e2m3": "fp6",
    "fp6_e3m2": "fp6",
    # fp4
    "fp4": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
    "fp4_e2m1": "fp4",
    "e2m1": "fp4",
    # weight-only quantisation: matmuls run on the 16-bit units
    "int4": "bf16",
    "int4_wo": "bf16",
    "w4a16": "bf16",
    "int8_wo": "bf16",
    "w8a16": "bf16",
    "awq": "bf16",
    "gptq": "bf16",
}

# When a dtype is not native on a GPU, peak_flops() uses the rate its kernels fall back to:
# fp4 -> bf16, fp6 -> bf16, fp8 -> bf16, int8 -> bf16, tf32 -> fp32, and fp16 <-> bf16. 4- and
# 6-bit weights without tensor cores of their width are dequantized and multiplied in BF16
# (weight-only kernels: Marlin and Triton's MXFP4 MoE for gpt-oss on Hopper in vLLM and SGLang),
# not in FP8. On
# shared/data/aic-silicon, gpt-oss-120b on H100 (61 vLLM rows) then fits TTFT 18.9% -> 17.2% and
# TPOT 10.0% -> 8.0% against the FP8 rate.
_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp4": ("fp4", "bf16", "fp16"),
    "fp6": ("fp6", "bf16", "fp16"),
    "fp8": ("fp8", "bf16", "fp16"),
    "int8": ("int8", "bf16", "fp16"),
    "bf16": ("bf16", "fp16"),
    "fp16": ("fp16", "bf16"),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
}


def normalize_dtype(dtype: str) -> str:
    """Map a dtype spelling ("bfloat16", "nvfp4", "fp8_e4m3", "w4a16", ...) to a key of DTYPES.

    Weight-only formats ("int4", "w4a16", "int8_wo") map to "bf16" (they compute on the 16-bit
    units). Raises ValueError naming the accepted spellings for anything else.
    """
    key = str(dtype).strip().lower()
    key = key.removeprefix("torch.")
    key = re.sub(r"[-\s]+", "_", key)
    try:
        return _DTYPE_ALIASES[key]
    except KeyError:
        accepted = ", ".join(sorted(_DTYPE_ALIASES))
        raise ValueError(f"Unknown dtype {dtype!r}. Accepted values: {accepted}") from None


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPU:
    """Per-GPU peak figures of one accelerator SKU (see the module docstring for units)."""

    name: str  # canonical: "MI300X", "H100", ...
    vendor: str  # "amd" | "nvidia"
    hbm_bytes: float  # HBM capacity, bytes (the vendor's "GB" figure read as GiB, see _HBM_GB)
    hbm_bandwidth: float  # bytes/s peak
    # Dense peak FLOP/s per native dtype. Excluded from hashing so GPU stays hashable.
    # Treat as read-only: catalog entries are shared.
    flops: dict[str, float] = field(hash=False)
    scale_up: Link  # xGMI / NVLink
    scale_out: Link  # per-GPU NIC
    host_link: Link  # PCIe, or NVLink-C2C to Grace
    gpus_per_node: int  # GPUs per Kubernetes node (8 HGX/OAM, 4 per GB200/GB300 tray)
    resource_name: str  # "amd.com/gpu" or "nvidia.com/gpu"
    product_label: str  # amd.com/gpu.product-name or nvidia.com/gpu.product label value
    aliases: tuple[str, ...]  # extra accepted spellings
    tdp_watts: float  # board power, W
    # Dies with an L2 cache of their own that the GPU spreads one kernel's workgroups over (CDNA 3 and
    # 4: 8 XCDs, workgroups dispatched round-robin across them, each XCD with a private 4 MB L2; AMD
    # CDNA 3 white paper and "MI300X workload tuning" guide). Blocks that read the same data land on
    # different L2s there: what one die would read once from HBM, each XCD fetches again.
    l2_domains: int = 1

    def __post_init__(self) -> None:
        if self.vendor not in ("amd", "nvidia"):
            raise ValueError(f"GPU {self.name}: vendor must be 'amd' or 'nvidia', got {self.vendor!r}")
        unknown = set(self.flops) - set(DTYPES)
        if unknown:
            raise ValueError(f"GPU {self.name}: unknown flops keys {sorted(unknown)}; allowed {DTYPES}")
        if "bf16" not in self.flops and "fp16" not in self.flops:
            raise ValueError(f"GPU {self.name}: needs a 16-bit (bf16/fp16) rate")
        for key, value in self.flops.items():
            if not value > 0:
                raise ValueError(f"GPU {self.name}: flops[{key!r}] must be > 0, got {value}")
        if not (self.hbm_bytes > 0 and self.hbm_bandwidth > 0 and self.tdp_watts > 0):
            raise ValueError(f"GPU {self.name}: hbm_bytes, hbm_bandwidth and tdp_watts must be > 0")
        if self.gpus_per_node < 1:
            raise ValueError(f"GPU {self.name}: gpus_per_node must be >= 1")

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s (OP/s for int8) for ``dtype`` on this GPU.

        ``dtype`` is normalised first ("bfloat16" -> "bf16", "float16"/"half" -> "fp16",
        "fp8_e4m3"/"e4m3" -> "fp8", "nvfp4"/"mxfp4" -> "fp4"; weight-only "int4"/"w4a16" ->
        "bf16"). If the dtype has no native tensor-core rate on this GPU, the rate its kernels
        fall back to is returned (see _FALLBACK): fp4 -> bf16 (4-bit weights on H100 run as
        weight-only BF16 kernels), fp8 -> bf16 (A100), fp6 -> bf16, int8 -> bf16,
        tf32 -> fp32, fp16 <-> bf16. Unknown spellings raise ValueError.
        """
        canonical = normalize_dtype(dtype)
        for candidate in _FALLBACK[canonical]:
            rate = self.flops.get(candidate)
            if rate is not None:
                return rate
        raise ValueError(f"GPU {self.name} has no native rate for {dtype!r} nor any wider fallback")

    @property
    def hbm_gb(self) -> float:
        """HBM capacity as the vendor states it ("192 GB" is 192 GiB of bytes)."""
        return self.hbm_bytes / _HBM_GB


class UnknownGPUError(UserError):
    """Raised for a GPU name that does not resolve to a catalog entry."""


# ---------------------------------------------------------------------------------------------
# Shared link definitions
# ---------------------------------------------------------------------------------------------

# Latencies (typical/assumed, not datasheet figures):
_NVLINK_LATENCY = 2e-6  # typical NCCL small-message startup over NVLink/NVSwitch, ~2 us
_XGMI_LATENCY = 3e-6  # typical RCCL small-message startup over Infinity Fabric, ~3 us
_IB_LATENCY = 5e-6  # typical InfiniBand inter-node message startup incl. NCCL proxy, ~5 us
_ROCE_LATENCY = 6e-6  # typical RoCEv2 (Ethernet) inter-node startup, ~6 us
_PCIE_LATENCY = 5e-6  # typical small host<->device DMA (cudaMemcpyAsync/hipMemcpyAsync), ~5 us
_C2C_LATENCY = 2e-6  # typical NVLink-C2C (coherent) host<->device small-transfer startup, ~2 us

# PCIe: "x16 Gen4 64 GB/s" / "Gen5 128 GB/s" are bidirectional in NVIDIA/AMD datasheets.
_PCIE4_X16 = Link("PCIe 4.0 x16", 64e9 / 2, _PCIE_LATENCY, 1)  # A100 datasheet: PCIe Gen4 64 GB/s
_PCIE5_X16 = Link("PCIe 5.0 x16", 128e9 / 2, _PCIE_LATENCY, 1)  # Gen5 x16: 128 GB/s bidirectional

# Per-GPU NICs.
# DGX A100 user guide: 8x ConnectX-6 200 Gb/s HDR InfiniBand for compute (one per GPU).
_IB_HDR_200 = Link("InfiniBand HDR 200G", 200 * _GBIT, _IB_LATENCY, 1)
# DGX H100/H200 and DGX B200 datasheets: 8x ConnectX-7 single-port 400 Gb/s (NDR), one per GPU;
# GB200 NVL72 compute tray: 4x ConnectX-7 400 Gb/s per 4 GPUs. MI300X/MI325X OEM platforms
# (e.g. Azure ND MI300X v5, Dell XE9680) likewise carry one 400 Gb/s NIC per GPU.
_IB_NDR_400 = Link("InfiniBand NDR 400G", 400 * _GBIT, _IB_LATENCY, 1)
# HGX/DGX B300 and GB300 NVL72: ConnectX-8 SuperNIC, 800 Gb/s per GPU (XDR / 800G Ethernet).
_CX8_800 = Link("ConnectX-8 800G (InfiniBand XDR)", 800 * _GBIT, _IB_LATENCY, 1)
# AMD Pensando Pollara 400 AI NIC product page: 400 Gb/s RoCEv2 (UEC-ready), one per MI355X.
_POLLARA_400 = Link("AMD Pensando Pollara 400 (RoCEv2)", 400 * _GBIT, _ROCE_LATENCY, 1)

# NVLink per GPU (NVIDIA datasheets quote total bidirectional bandwidth per GPU).
# A100 datasheet: NVLink 600 GB/s (3rd gen, 12 links); NVSwitch in HGX A100 8-GPU.
_NVLINK3_8 = Link("NVLink 3", 600e9 / 2, _NVLINK_LATENCY, 8)
# H100 / H200 SXM datasheets: NVLink 900 GB/s (4th gen, 18 links); HGX 8-GPU NVSwitch domain.
_NVLINK4_8 = Link("NVLink 4", 900e9 / 2, _NVLINK_LATENCY, 8)
# HGX B200 / HGX B300 pages: NVLink 5 "1.8 TB/s GPU-to-GPU" per GPU; 8-GPU NVSwitch domain.
_NVLINK5_8 = Link("NVLink 5", 1.8e12 / 2, _NVLINK_LATENCY, 8)
# GB200 / GB300 NVL72 pages: 72-GPU NVLink domain, 130 TB/s total = 1.8 TB/s per GPU.
_NVLINK5_72 = Link("NVLink 5 (NVL72)", 1.8e12 / 2, _NVLINK_LATENCY, 72)
# GH200 datasheet: NVLink-C2C 900 GB/s bidirectional between Grace and Hopper.
_C2C_GH200 = Link("NVLink-C2C", 900e9 / 2, _C2C_LATENCY, 1)
# GB200 / GB300 NVL72 pages: NVLink-C2C 900 GB/s bidirectional Grace<->Blackwell. One Grace
# serves two GPUs, so when both move data to the host at once each gets about half of this.
_C2C_GRACE_BLACKWELL = Link("NVLink-C2C", 900e9 / 2, _C2C_LATENCY, 1)


def _xgmi(aggregate_bidirectional: float) -> Link:
    """Infinity Fabric (xGMI) on an 8-GPU OAM board: 7 point-to-point links per GPU.

    AMD quotes the aggregate over all 7 links, both directions. A collective that uses every
    peer (ring/all-to-all across 8 GPUs) sees the aggregate; a single peer pair only 1/7 of it.
    """
    return Link("xGMI (Infinity Fabric)", aggregate_bidirectional / 2, _XGMI_LATENCY, 8)


# ---------------------------------------------------------------------------------------------
# Catalog
# ---------------------------------------------------------------------------------------------

# CDNA 2 (MI250, MI250X): one OAM package holds two graphics compute dies (GCDs), and ROCm shows
# each GCD as a device of its own (ROCm docs, "AMD Instinct MI250 microarchitecture"): an engine's
# tp counts GCDs, and 4 packages make a node of 8. So these entries are one GCD, half a package.
_MI250 = GPU(
    name="MI250",
    vendor="amd",
    # AMD Instinct MI250 datasheet: 128 GB HBM2e, 3.2768 TB/s per package; ROCm docs: 1.6 TB/s per
    # GCD. Half of each per GCD.
    hbm_bytes=64 * _HBM_GB,
    hbm_bandwidth=1.6384 * _TB,
    # AMD Instinct MI250 datasheet, per package: FP16/BF16 362.1 TF, INT8 362.1 TOPS, FP32 matrix
    # 90.5 TF; half per GCD. CDNA 2 has no FP8: fp8 and fp4 fall back to the bf16 rate.
    flops={
        "fp32": 45.25 * _T,
        "bf16": 181.05 * _T,
        "fp16": 181.05 * _T,
        "int8": 181.05 * _T,
    },
    # ROCm docs: a GCD drives up to 8 Infinity Fabric links of 50 GB/s per direction (25 GT/s x 16),
    # four of them to its sibling GCD in the package; the 8-GCD node is not fully connected. An
    # all-reduce over the node sees about 3 links' worth per direction: 300 GB/s aggregate.
    scale_up=_xgmi(300e9),
    scale_out=_IB_HDR_200,  # MI250 systems of its time: 200 Gb/s HDR InfiniBand
    host_link=_PCIE4_X16,  # AMD Instinct MI250 datasheet: PCIe Gen4 x16
    gpus_per_node=8,  # 4 OAM packages x 2 GCDs
    resource_name="amd.com/gpu",
    # Not confirmed from a labelled node; placement also matches the device id (render.AMD_DEVICE_IDS).
    product_label="AMD_Instinct_MI250",
    aliases=("mi250", "MI250_OAM", "AMD_Instinct_MI250", "AMD Instinct MI250", "mi250_gcd"),
    tdp_watts=250,  # AMD Instinct MI250 datasheet: 500 W per package, two GCDs
)

# MI250X: the same package with 220 CUs against the MI250's 208 (the X also links Infinity Fabric to
# the host CPU, not to more GPUs): AMD Instinct MI250X datasheet, per package FP16/BF16 383 TF,
# INT8 383 TOPS, FP32 matrix 95.7 TF, 560 W; half of each per GCD, memory and links as the MI250's.
_MI250X = replace(
    _MI250,
    name="MI250X",
    flops={"fp32": 47.85 * _T, "bf16": 191.5 * _T, "fp16": 191.5 * _T, "int8": 191.5 * _T},
    product_label="AMD_Instinct_MI250X",  # not confirmed from a labelled node (see MI250)
    aliases=("mi250x", "MI250X_OAM", "AMD_Instinct_MI250X", "AMD Instinct MI250X", "mi250x_gcd"),
    tdp_watts=280,
)

_MI300X = GPU(
    name="MI300X",
    vendor="amd",
    # AMD Instinct MI300X datasheet / product page (amd.com, 2023): 192 GB HBM3, 5.3 TB/s.
    hbm_bytes=192 * _HBM_GB,
    hbm_bandwidth=5.3 * _TB,
    # AMD Instinct MI300X datasheet, dense: FP32 matrix 163.4 TF, TF32 653.7 TF,
    # FP16/BF16 1307.4 TF, FP8 2614.9 TF, INT8 2614.9 TOPS (sparse figures are 2x).
    flops={
        "fp32": 163.4 * _T,
        "tf32": 653.7 * _T,
        "bf16": 1307.4 * _T,
        "fp16": 1307.4 * _T,
        "fp8": 2614.9 * _T,
        "int8": 2614.9 * _T,
    },
    # AMD Instinct MI300X datasheet: 7 Infinity Fabric links x 128 GB/s = 896 GB/s peak
    # aggregate (bidirectional) -> 448 GB/s per direction (64 GB/s per peer per direction).
    scale_up=_xgmi(896e9),
    scale_out=_IB_NDR_400,  # typical MI300X platform: one 400 Gb/s NIC per GPU
    host_link=_PCIE5_X16,  # AMD Instinct MI300X datasheet: PCIe Gen5 x16, 128 GB/s
    gpus_per_node=8,  # AMD Instinct MI300X Platform: 8 OAM GPUs per UBB board
    resource_name="amd.com/gpu",
    product_label="AMD_Instinct_MI300X_OAM",  # ROCm node labeller amd.com/gpu.product-name
    aliases=("mi300x", "MI300X_OAM", "AMD_Instinct_MI300X", "AMD Instinct MI300X", "mi300x_vf"),
    tdp_watts=750,  # AMD Instinct MI300X datasheet: 750 W peak board power
    l2_domains=8,  # 8 XCDs (AMD CDNA 3 / CDNA 4 white papers)
)

_MI325X = GPU(
    name="MI325X",
    vendor="amd",
    # AMD Instinct MI325X datasheet (amd.com, 2024): 256 GB HBM3E, 6 TB/s.
    hbm_bytes=256 * _HBM_GB,
    hbm_bandwidth=6.0 * _TB,
    # AMD Instinct MI325X datasheet: same CDNA 3 compute as MI300X, dense FP32 matrix 163.4 TF,
    # TF32 653.7 TF, FP16/BF16 1307.4 TF, FP8 2614.9 TF, INT8 2614.9 TOPS.
    flops={
        "fp32": 163.4 * _T,
        "tf32": 653.7 * _T,
        "bf16": 1307.4 * _T,
        "fp16": 1307.4 * _T,
        "fp8": 2614.9 * _T,
        "int8": 2614.9 * _T,
    },
    # AMD Instinct MI325X datasheet: 896 GB/s aggregate Infinity Fabric (7 links x 128 GB/s).
    scale_up=_xgmi(896e9),
    scale_out=_IB_NDR_400,  # typical MI325X platform: one 400 Gb/s NIC per GPU
    host_link=_PCIE5_X16,  # AMD Instinct MI325X datasheet: PCIe Gen5 x16, 128 GB/s
    gpus_per_node=8,  # AMD Instinct MI325X Platform: 8 OAM GPUs
    resource_name="amd.com/gpu",
    product_label="AMD_Instinct_MI325_OAM",  # ROCm node labeller amd.com/gpu.product-name
    aliases=("mi325x", "mi325", "MI325X_OAM", "AMD_Instinct_MI325X", "AMD_Instinct_MI325X_OAM"),
    tdp_watts=1000,  # AMD Instinct MI325X datasheet: 1000 W peak board power
    l2_domains=8,  # 8 XCDs (AMD CDNA 3 / CDNA 4 white papers)
)

_MI355X = GPU(
    name="MI355X",
    vendor="amd",
    # AMD Instinct MI355X datasheet / product page (amd.com, 2025): 288 GB HBM3E, 8 TB/s.
    hbm_bytes=288 * _HBM_GB,
    hbm_bandwidth=8.0 * _TB,
    # AMD Instinct MI355X datasheet, dense: FP32 157.3 TF, FP16/BF16 2516.6 TF (2.5 PF),
    # FP8 5033.2 TF (5.0 PF), INT8 5033.2 TOPS, MXFP6 and MXFP4 10066.3 TF (10.1 PF).
    # CDNA 4 drops the TF32 (xf32) matrix path, so tf32 falls back to fp32 in peak_flops().
    flops={
        "fp32": 157.3 * _T,
        "bf16": 2516.6 * _T,
        "fp16": 2516.6 * _T,
        "fp8": 5033.2 * _T,
        "int8": 5033.2 * _T,
        "fp6": 10066.3 * _T,
        "fp4": 10066.3 * _T,
    },
    # AMD Instinct MI355X datasheet: 7 Infinity Fabric links x 153.6 GB/s = 1075.2 GB/s peak
    # aggregate (bidirectional) -> 537.6 GB/s per direction.
    scale_up=_xgmi(1075.2e9),
    scale_out=_POLLARA_400,  # AMD MI355X platform with Pensando Pollara 400, one per GPU
    host_link=_PCIE5_X16,  # AMD Instinct MI355X datasheet: PCIe Gen5 x16, 128 GB/s
    gpus_per_node=8,  # AMD Instinct MI355X Platform: 8 OAM GPUs
    resource_name="amd.com/gpu",
    product_label="AMD_Instinct_MI355_OAM",  # ROCm node labeller amd.com/gpu.product-name
    aliases=("mi355x", "mi355", "MI355X_OAM", "AMD_Instinct_MI355X", "AMD_Instinct_MI355X_OAM"),
    tdp_watts=1400,  # AMD Instinct MI355X datasheet: 1400 W peak board power (liquid cooled)
    l2_domains=8,  # 8 XCDs (AMD CDNA 3 / CDNA 4 white papers)
)

_MI350X = GPU(
    name="MI350X",
    vendor="amd",
    # AMD Instinct MI350X product page (amd.com, 2025): 288 GB HBM3E, 8 TB/s; the same CDNA 4
    # package as the MI355X, air-cooled at 1000 W with a 2.2 GHz peak engine clock instead of
    # 2.4 GHz (AMD, Hot Chips 2025), hence 2.2/2.4 of the MI355X's matrix rates.
    hbm_bytes=288 * _HBM_GB,
    hbm_bandwidth=8.0 * _TB,
    # AMD Instinct MI350X product page, dense: FP32 144.2 TF, FP16/BF16 2306.9 TF (2.3 PF),
    # FP8 4613.7 TF (4.6 PF), INT8 4613.7 TOPS, MXFP6 and MXFP4 9227.5 TF (9.2 PF); the 8-GPU
    # platform is listed at 18.5 PF FP16. No TF32 matrix path (CDNA 4), as on the MI355X.
    flops={
        "fp32": 144.2 * _T,
        "bf16": 2306.9 * _T,
        "fp16": 2306.9 * _T,
        "fp8": 4613.7 * _T,
        "int8": 4613.7 * _T,
        "fp6": 9227.5 * _T,
        "fp4": 9227.5 * _T,
    },
    # Same 4th-generation Infinity Fabric as the MI355X: 7 links x 153.6 GB/s = 1075.2 GB/s.
    scale_up=_xgmi(1075.2e9),
    scale_out=_POLLARA_400,  # AMD MI350 series platform with Pensando Pollara 400, one per GPU
    host_link=_PCIE5_X16,  # AMD Instinct MI350X product page: PCIe Gen5 x16, 128 GB/s
    gpus_per_node=8,  # AMD Instinct MI350X Platform: 8 OAM GPUs
    resource_name="amd.com/gpu",
    # Not confirmed from a labelled node: the MI355X's pattern. Placement also matches the device id
    # (render.AMD_DEVICE_IDS, 0x75a0 from vLLM's rocm.py), which the labeller emits by default.
    product_label="AMD_Instinct_MI350_OAM",
    # Not "mi350": the MI350 series names both the MI350X and the MI355X.
    aliases=("mi350x", "MI350X_OAM", "AMD_Instinct_MI350X", "AMD_Instinct_MI350X_OAM"),
    tdp_watts=1000,  # AMD, Hot Chips 2025: MI350X 1000 W total board power (air-cooled)
    l2_domains=8,  # 8 XCDs (AMD CDNA 4 white paper)
)

# Hopper dense rates, NVIDIA H100 / H200 Tensor Core GPU datasheets (SXM column; datasheets list
# sparse figures, dense = half): FP32 67 TF, TF32 989 TF sparse -> 494.5, BF16/FP16 1979 sparse
# -> 989.5, FP8 3958 sparse -> 1979, INT8 3958 TOPS sparse -> 1979. Hopper has no fp6/fp4.
_HOPPER_FLOPS: dict[str, float] = {
    "fp32": 67 * _T,
    "tf32": 494.5 * _T,
    "bf16": 989.5 * _T,
    "fp16": 989.5 * _T,
    "fp8": 1979 * _T,
    "int8": 1979 * _T,
}

_H100 = GPU(
    name="H100",
    vendor="nvidia",
    # NVIDIA H100 Tensor Core GPU datasheet (SXM): 80 GB HBM3, 3.35 TB/s. (Physical capacity is
    # 80 GiB = 85.9e9 bytes; nvidia-smi reports 81559 MiB, slightly under it.)
    hbm_bytes=80 * _HBM_GB,
    hbm_bandwidth=3.35 * _TB,
    flops=dict(_HOPPER_FLOPS),  # see _HOPPER_FLOPS
    scale_up=_NVLINK4_8,  # H100 datasheet: NVLink 900 GB/s
    scale_out=_IB_NDR_400,  # DGX H100 datasheet: 8x ConnectX-7 400 Gb/s
    host_link=_PCIE5_X16,  # H100 datasheet: PCIe Gen5 128 GB/s
    gpus_per_node=8,  # HGX / DGX H100: 8 GPUs
    resource_name="nvidia.com/gpu",
    product_label="NVIDIA-H100-80GB-HBM3",  # GPU feature discovery nvidia.com/gpu.product
    aliases=(
        "h100_sxm",
        "h100_sxm5",
        "NVIDIA-H100-SXM5-80GB",
        "H100_80GB_HBM3",
        "NVIDIA H100 80GB HBM3",
    ),
    tdp_watts=700,  # H100 datasheet (SXM): up to 700 W
)

_H200 = GPU(
    name="H200",
    vendor="nvidia",
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s.
    hbm_bytes=141 * _HBM_GB,
    hbm_bandwidth=4.8 * _TB,
    flops=dict(_HOPPER_FLOPS),  # H200 datasheet: same Tensor Core figures as H100 SXM
    scale_up=_NVLINK4_8,  # H200 datasheet: NVLink 900 GB/s
    scale_out=_IB_NDR_400,  # DGX H200 datasheet: 8x ConnectX-7 400 Gb/s
    host_link=_PCIE5_X16,  # H200 datasheet: PCIe Gen5 128 GB/s
    gpus_per_node=8,  # HGX / DGX H200: 8 GPUs
    resource_name="nvidia.com/gpu",
    product_label="NVIDIA-H200",  # GPU feature discovery nvidia.com/gpu.product
    aliases=("h200_sxm", "NVIDIA-H200-141GB-HBM3e", "NVIDIA H200"),
    tdp_watts=700,  # H200 datasheet (SXM): up to 700 W
)

_B200 = GPU(
    name="B200",
    vendor="nvidia",
    # NVIDIA DGX B200 datasheet: 1,440 GB HBM3e total for 8 GPUs -> 180 GB each;
    # HGX B200 page: 64 TB/s aggregate HBM bandwidth for 8 GPUs -> 8 TB/s each.
    hbm_bytes=180 * _HBM_GB,
    hbm_bandwidth=8.0 * _TB,
    # NVIDIA HGX B200 page (8 GPUs, sparse unless noted): FP4 144 PF sparse / 72 PF dense,
    # FP8/FP6 72 PF, INT8 72 POPS, FP16/BF16 36 PF, TF32 18 PF, FP32 600 TF. Per GPU, dense:
    flops={
        "fp32": 75 * _T,
        "tf32": 1.125 * _P,
        "bf16": 2.25 * _P,
        "fp16": 2.25 * _P,
        "fp8": 4.5 * _P,
        "int8": 4.5 * _P,
        "fp6": 4.5 * _P,
        "fp4": 9.0 * _P,
    },
    scale_up=_NVLINK5_8,  # HGX B200 page: NVLink 5, 1.8 TB/s per GPU
    scale_out=_IB_NDR_400,  # DGX B200 datasheet: 8x ConnectX-7 400 Gb/s
    host_link=_PCIE5_X16,  # DGX B200 datasheet: host via PCIe Gen5 (x16 per GPU)
    gpus_per_node=8,  # HGX / DGX B200: 8 GPUs
    resource_name="nvidia.com/gpu",
    product_label="NVIDIA-B200",  # GPU feature discovery nvidia.com/gpu.product
    aliases=("b200_sxm", "b200_sxm6", "NVIDIA B200", "NVIDIA-B200-180GB-HBM3e"),
    tdp_watts=1000,  # HGX B200 / Blackwell datasheet: up to 1000 W per GPU
)

_B300 = GPU(
    name="B300",
    vendor="nvidia",
    # NVIDIA HGX B300 / DGX B300 pages: 2.3 TB HBM3e for 8 GPUs -> 288 GB each, 8 TB/s per GPU.
    # (nvidia-smi reports 275040 MiB = 288.4e9 bytes per device.)
    hbm_bytes=288 * _HBM_GB,
    hbm_bandwidth=8.0 * _TB,
    # NVIDIA HGX B300 page (8 GPUs): FP4 144 PF sparse / 108 PF dense, FP8/FP6 72 PF sparse,
    # FP16/BF16 36 PF sparse, TF32 18 PF sparse, FP32 600 TF, INT8 2 POPS sparse. Per GPU,
    # dense: FP4 13.5 PF, FP8 4.5 PF, BF16 2.25 PF. Blackwell Ultra cut INT8 tensor throughput
    # to ~0.125 POPS dense (NVIDIA figure /8/2; third-party tables say ~0.15) - int8 W8A8 is
    # effectively not a fast path on this part.
    flops={
        "fp32": 75 * _T,
        "tf32": 1.125 * _P,
        "bf16": 2.25 * _P,
        "fp16": 2.25 * _P,
        "fp8": 4.5 * _P,
        "int8": 0.125 * _P,
        "fp6": 4.5 * _P,
        "fp4": 13.5 * _P,
    },
    scale_up=_NVLINK5_8,  # HGX B300 page: NVLink 5, 1.8 TB/s per GPU
    scale_out=_CX8_800,  # HGX B300 page: ConnectX-8 SuperNIC, 800 Gb/s per GPU
    # Blackwell Ultra GPUs support PCIe Gen6 x16, but the DGX/HGX B300 host CPUs (Xeon 6) are
    # PCIe Gen5, so a host transfer runs at Gen5 x16 (128 GB/s bidirectional).
    host_link=_PCIE5_X16,
    gpus_per_node=8,  # HGX / DGX B300: 8 GPU packages
    resource_name="nvidia.com/gpu",
    product_label="NVIDIA-B300-SXM6-AC",  # GPU feature discovery nvidia.com/gpu.product
    aliases=("b300_sxm", "b300_sxm6", "NVIDIA B300 SXM6 AC", "NVIDIA-B300-SXM6-PC"),
    tdp_watts=1100,  # HGX/DGX B300 configuration: 1100 W per GPU (GB300 runs at 1400 W)
)

_GB200 = GPU(
    name="GB200",
    vendor="nvidia",
    # NVIDIA GB200 NVL72 page: up to 13.4 TB HBM3e and 576 TB/s for 72 GPUs -> 186 GB, 8 TB/s
    # per GPU (the GB200 superchip page says up to 384 GB = 2 x 192 GB physical).
    hbm_bytes=186 * _HBM_GB,
    hbm_bandwidth=8.0 * _TB,
    # NVIDIA GB200 NVL72 page (72 GPUs): FP4 1,440 PF sparse / 720 PF dense, FP8/FP6 720 PF
    # sparse, INT8 720 POPS sparse, FP16/BF16 360 PF sparse, TF32 180 PF sparse, FP32 5,760 TF.
    # Per GPU, dense:
    flops={
        "fp32": 80 * _T,
        "tf32": 1.25 * _P,
        "bf16": 2.5 * _P,
        "fp16": 2.5 * _P,
        "fp8": 5.0 * _P,
        "int8": 5.0 * _P,
        "fp6": 5.0 * _P,
        "fp4": 10.0 * _P,
    },
    scale_up=_NVLINK5_72,  # GB200 NVL72 page: 72-GPU NVLink domain, 1.8 TB/s per GPU
    scale_out=_IB_NDR_400,  # GB200 NVL72 compute tray: ConnectX-7 400 Gb/s per GPU
    host_link=_C2C_GRACE_BLACKWELL,  # GB200 page: NVLink-C2C 900 GB/s to Grace
    gpus_per_node=4,  # GB200 NVL72 compute tray: 2 Grace + 4 Blackwell GPUs per node
    resource_name="nvidia.com/gpu",
    product_label="NVIDIA-GB200",  # GPU feature discovery nvidia.com/gpu.product
    aliases=("gb200_nvl72", "NVIDIA GB200"),
    tdp_watts=1200,  # GB200 NVL72 configuration: 1200 W per Blackwell GPU
)

_GB300 = GPU(
    name="GB300",
    vendor="nvidia",
    # NVIDIA GB300 NVL72 page: up to 20.7 TB HBM3e and 576 TB/s for 72 GPUs -> 288 GB,
    # 8 TB/s per GPU (Blackwell Ultra: 8 x 12-high HBM3e stacks = 288 GB).
    hbm_bytes=288 * _HBM_GB,
    hbm_bandwidth=8.0 * _TB,
    # NVIDIA GB300 NVL72 page (72 GPUs): FP4 1,440 PF sparse / 1,080 PF dense, FP8/FP6 720 PF
    # sparse, FP16/BF16 360 PF sparse, TF32 180 PF sparse. Per GPU, dense: FP4 15 PF, FP8 5 PF,
    # BF16 2.5 PF, TF32 1.25 PF. FP32 ~80 TF and INT8 ~0.165 POPS dense are from per-GPU
    # tables derived from NVIDIA's Blackwell Ultra figures (INT8 cut as on B300; unverified).
    flops={
        "fp32": 80 * _T,
        "tf32": 1.25 * _P,
        "bf16": 2.5 * _P,
        "fp16": 2.5 * _P,
        "fp8": 5.0 * _P,
        "int8": 0.165 * _P,
        "fp6": 5.0 * _P,
        "fp4": 15.0 * _P,
    },
    scale_up=_NVLINK5_72,  # GB300 NVL72 page: 72-GPU NVLink domain, 130 TB/s = 1.8 TB/s/GPU
    scale_out=_CX8_800,  # GB300 NVL72 page: 72 ConnectX-8 SuperNICs, 800 Gb/s per GPU
    host_link=_C2C_GRACE_BLACKWELL,  # GB300 page: NVLink-C2C 900 GB/s to Grace
    gpus_per_node=4,  # GB300 NVL72 compute tray: 2 Grace + 4 Blackwell Ultra GPUs per node
    resource_name="nvidia.com/gpu",
    product_label="NVIDIA-GB300",  # GPU feature discovery nvidia.com/gpu.product
    aliases=("gb300_nvl72", "NVIDIA GB300"),
    tdp_watts=1400,  # GB300 NVL72 configuration: 1400 W per Blackwell Ultra GPU
)

_A100 = GPU(
    name="A100",
    vendor="nvidia",
    # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: 80 GB HBM2e, 2,039 GB/s.
    hbm_bytes=80 * _HBM_GB,
    hbm_bandwidth=2.039 * _TB,
    # A100 datasheet, dense: FP32 19.5 TF, TF32 156 TF, BF16/FP16 312 TF, INT8 624 TOPS.
    # Ampere has no fp8/fp6/fp4: those fall back to the bf16 rate.
    flops={
        "fp32": 19.5 * _T,
        "tf32": 156 * _T,
        "bf16": 312 * _T,
        "fp16": 312 * _T,
        "int8": 624 * _T,
    },
    scale_up=_NVLINK3_8,  # A100 datasheet: NVLink 600 GB/s
    scale_out=_IB_HDR_200,  # DGX A100 user guide: 8x ConnectX-6 200 Gb/s HDR
    host_link=_PCIE4_X16,  # A100 datasheet: PCIe Gen4 64 GB/s
    gpus_per_node=8,  # HGX / DGX A100: 8 GPUs
    resource_name="nvidia.com/gpu",
    product_label="NVIDIA-A100-SXM4-80GB",  # GPU feature discovery nvidia.com/gpu.product
    aliases=("a100_sxm", "a100_sxm4", "A100-SXM4-80GB", "a100_80gb", "NVIDIA A100-SXM4-80GB"),
    tdp_watts=400,  # A100 datasheet (80GB SXM): 400 W
)

_GH200 = GPU(
    name="GH200",
    vendor="nvidia",
    # NVIDIA GH200 Grace Hopper Superchip datasheet, 96 GB HBM3 variant: 96 GB, 4 TB/s (the
    # 144 GB HBM3e / 4.9 TB/s variant is a different SKU and is not catalogued).
    hbm_bytes=96 * _HBM_GB,
    hbm_bandwidth=4.0 * _TB,
    # GH200 datasheet: Hopper GPU with the H100 SXM Tensor Core figures (FP8 3,958 TF sparse,
    # BF16 1,979 sparse, TF32 989 sparse, INT8 3,958 TOPS sparse, FP32 67 TF); dense = half.
    flops=dict(_HOPPER_FLOPS),
    # GH200 datasheet: NVLink 4, 900 GB/s. The common GH200 node (MGX, one superchip per node,
    # as in the Argonne runs with TP=1) has no NVLink peer, so the domain is 1; NVL32 racks
    # are not modelled.
    scale_up=Link("NVLink 4", 900e9 / 2, _NVLINK_LATENCY, 1),
    scale_out=_IB_NDR_400,  # typical GH200 node: one ConnectX-7 400 Gb/s per superchip
    host_link=_C2C_GH200,  # GH200 datasheet: NVLink-C2C 900 GB/s to Grace (480 GB LPDDR5X)
    gpus_per_node=1,  # single-superchip MGX node
    resource_name="nvidia.com/gpu",
    product_label="NVIDIA-GH200-480GB",  # GPU feature discovery nvidia.com/gpu.product
    aliases=("gh200_96gb", "NVIDIA GH200 480GB"),
    # GH200 datasheet: module power configurable 450 W - 1000 W (CPU + GPU + memory); the
    # maximum is kept.
    tdp_watts=1000,
)

_CATALOG: tuple[GPU, ...] = (
    _MI250,
    _MI250X,
    _MI300X,
    _MI325X,
    _MI350X,
    _MI355X,
    _H100,
    _H200,
    _B200,
    _B300,
    _GB200,
    _GB300,
    _A100,
    _GH200,
)
_BY_NAME: dict[str, GPU] = {gpu.name: gpu for gpu in _CATALOG}

# ---------------------------------------------------------------------------------------------
# Name resolution
# ---------------------------------------------------------------------------------------------

# Leading vendor/brand tokens that may be dropped, and the vendor they imply.
_VENDOR_TOKENS: dict[str, str] = {"nvidia": "nvidia", "amd": "amd", "instinct": "amd"}

# canonical name -> (model tokens, qualifier tokens that still denote this exact SKU).
# Qualifiers naming a different SKU (pcie, nvl, 40gb, 144gb, ...) are deliberately absent.
_NAME_RULES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # Data sets that name every system "<gpu>_sxm" (shared/data/aic-silicon's convention) may write
    # an Instinct part so too; its only form factor is OAM, so "sxm" names no other variant.
    "MI250": (frozenset({"mi250"}), frozenset({"oam", "sxm", "gcd", "64gb", "128gb", "hbm2e"})),
    "MI250X": (frozenset({"mi250x"}), frozenset({"oam", "sxm", "gcd", "64gb", "128gb", "hbm2e"})),
    "MI300X": (frozenset({"mi300x"}), frozenset({"oam", "sxm", "vf", "192gb", "hbm3"})),
    "MI325X": (frozenset({"mi325x", "mi325"}), frozenset({"oam", "sxm", "vf", "256gb", "hbm3e"})),
    "MI350X": (frozenset({"mi350x"}), frozenset({"oam", "sxm", "vf", "288gb", "hbm3e"})),
    "MI355X": (frozenset({"mi355x", "mi355"}), frozenset({"oam", "sxm", "vf", "288gb", "hbm3e"})),
    "H100": (frozenset({"h100"}), frozenset({"sxm", "sxm5", "80gb", "hbm3"})),
    "H200": (frozenset({"h200"}), frozenset({"sxm", "sxm5", "141gb", "hbm3e"})),
    "B200": (frozenset({"b200"}), frozenset({"sxm", "sxm6", "180gb", "hbm3e"})),
    "B300": (frozenset({"b300"}), frozenset({"sxm", "sxm6", "ac", "pc", "288gb", "hbm3e"})),
    "GB200": (frozenset({"gb200"}), frozenset({"nvl72", "nvl"})),
    "GB300": (frozenset({"gb300"}), frozenset({"nvl72", "nvl"})),
    "A100": (frozenset({"a100"}), frozenset({"sxm", "sxm4", "80gb", "hbm2e"})),
    "GH200": (frozenset({"gh200"}), frozenset({"480gb", "96gb", "hbm3"})),
}


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[-_\s]+", name.strip().lower()) if t]


def _build_exact_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for gpu in _CATALOG:
        for spelling in (gpu.name, gpu.product_label, *gpu.aliases):
            key = "_".join(_tokens(spelling))
            other = index.setdefault(key, gpu.name)
            if other != gpu.name:  # pragma: no cover - catalog consistency guard
                raise RuntimeError(f"GPU spelling {spelling!r} claimed by {other} and {gpu.name}")
    return index


_EXACT: dict[str, str] = _build_exact_index()


def _unknown(name: str, detail: str = "") -> UnknownGPUError:
    names = ", ".join(gpu.name for gpu in _CATALOG)
    extra = f" ({detail})" if detail else ""
    return UnknownGPUError(
        f"Unknown GPU {name!r}{extra}. Accepted canonical names: {names} "
        "(case-insensitive; node-label and data-set forms such as 'h100_sxm', "
        "'NVIDIA-H100-80GB-HBM3' or 'AMD_Instinct_MI300X_OAM' are also accepted)."
    )


def normalize_gpu_name(name: str) -> str:
    """Return the canonical catalog name for ``name`` or raise UnknownGPUError.

    Case-insensitive; ``-``, ``_`` and whitespace are interchangeable. Accepts the canonical
    name, node-label values, listed aliases, and "<vendor> <model> <qualifiers>" forms whose
    qualifiers (e.g. "SXM5", "80GB", "HBM3", "OAM") still denote the catalogued SKU.
    """
    if not isinstance(name, str):
        raise _unknown(repr(name), "not a string")
    tokens = _tokens(name)
    if not tokens:
        raise _unknown(name, "empty name")
    exact = _EXACT.get("_".join(tokens))
    if exact is not None:
        return exact

    implied_vendors: set[str] = set()
    while tokens and tokens[0] in _VENDOR_TOKENS:
        implied_vendors.add(_VENDOR_TOKENS[tokens.pop(0)])
    if not tokens:
        raise _unknown(name, "no model in name")
    model, qualifiers = tokens[0], set(tokens[1:])
    for canonical, (models, allowed) in _NAME_RULES.items():
        if model not in models:
            continue
        gpu = _BY_NAME[canonical]
        if implied_vendors - {gpu.vendor}:
            raise _unknown(name, f"{canonical} is not made by {'/'.join(sorted(implied_vendors))}")
        extra = qualifiers - allowed
        if extra:
            raise _unknown(
                name,
                f"model {canonical} matched, but qualifier(s) {sorted(extra)} denote a variant "
                f"that is not catalogued; accepted qualifiers: {sorted(allowed)}",
            )
        return canonical
    raise _unknown(name)


def get_gpu(name: str) -> GPU:
    """Look up a GPU by any accepted spelling (see normalize_gpu_name)."""
    return _BY_NAME[normalize_gpu_name(name)]


def list_gpus() -> list[GPU]:
    """All catalogued GPUs, in a stable order (AMD by generation, then NVIDIA, GH200 last)."""
    return list(_CATALOG)


# Parts of one silicon design that differ in memory, clocks or power, not in their kernels: an
# anchor's efficiencies and host costs measured on one carry to the others (predictor.carry_to_gpu),
# priced at the target's own peaks, bandwidth and memory. H200 and GH200 are the H100's GH100 die
# with HBM3e (GH200 beside a Grace CPU); GB200 is B200's die in a Grace rack, GB300 B300's; MI325X
# is MI300X's CDNA3 die with HBM3e; MI350X is MI355X's CDNA4 package, air-cooled at lower clocks.
# B300 (Blackwell Ultra) changes the tensor cores and is not B200's sibling, nor is MI355X (CDNA4)
# MI300X's.
_SIBLINGS: tuple[tuple[str, ...], ...] = (
    ("H100", "H200", "GH200"),
    ("B200", "GB200"),
    ("B300", "GB300"),
    ("MI250", "MI250X"),
    ("MI300X", "MI325X"),
    ("MI350X", "MI355X"),
)


def siblings(gpu: GPU) -> tuple[str, ...]:
    """The catalogued GPUs of `gpu`'s silicon design, itself excluded (see _SIBLINGS)."""
    for family in _SIBLINGS:
        if gpu.name in family:
            return tuple(n for n in family if n != gpu.name)
    return ()

"""One description per device: limits, throughputs and dtype sizes.

Everything the planner's cost model and the fit check know about a GPU lives in one ``Device``;
no other module states a device number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from pyrunner.errors import UserError

DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}
"""Bytes per element of every dtype a plan may name."""

ASYNC_COPY_BYTES = 16
"""cp.async and TMA move 16-byte aligned chunks: a tensor whose rows are not a multiple of 16 bytes
(n = 50257 in bf16) is read with synchronous per-element loads instead."""


def rows_async(inner: int, dtype: str) -> bool:
    """Whether rows of ``inner`` elements of ``dtype`` can be copied asynchronously (cp.async, TMA)."""
    return inner * DTYPE_BYTES[dtype] % ASYNC_COPY_BYTES == 0


@dataclass(frozen=True)
class Device:
    """A GPU as the planner and the fit check see it.

    Limits are the hardware's (CUDA occupancy tables for the architecture); throughputs are
    measured where DESIGN gives a measurement, else the vendor's figure.
    """

    name: str
    arch: str
    """CUDA architecture TileLang targets (``sm_90a``: Hopper with wgmma/TMA; ``sm_80``: Ampere)."""
    sms: int
    smem_per_block: int
    """Largest dynamic shared memory one block may opt in to, in bytes."""
    smem_per_sm: int
    regs_per_sm: int
    regs_per_thread: int
    """Largest register count ptxas gives one thread; more spills to local memory."""
    max_threads: int
    warp: int
    l2_bytes: int
    tc_flops: float
    """Dense fp16/bf16 tensor-core FLOP/s."""
    cc_flops: float
    """fp32 CUDA-core element operations per second."""
    sfu_ops: float
    """Transcendental (special-function unit) evaluations per second."""
    hbm_bw: float
    """Bytes/s to and from HBM."""
    l2_bw: float
    """Bytes/s for re-reads that hit L2."""
    launch_us: float
    """Per-kernel launch and tail latency."""
    hbm_latency_s: float
    """Load latency from HBM under load: a loop without tensor cores waits it out once per
    ``stages`` steps (Little's law: a block has ``stages`` tiles in flight)."""
    l2_latency_s: float
    """The same where the kernel's data stays in L2 between calls (it fits in half of ``l2_bytes``:
    ``planner.cost.l2_resident``)."""
    smem_wavefronts_per_s: float
    """Shared-memory passes (wavefronts) one SM serves per second: one per clock. Fitted on run 82's
    transposed add, whose time grew by one pass per warp read at 1.75 GHz (``planner.banks``)."""
    tma_wgmma: bool = False
    """The GPU has TMA bulk copies, mbarrier transaction counts and warpgroup MMA (wgmma): the
    explicitly warp-specialised forms exist for it (``FitModel.renders_async``). Compute capability 9.0a."""
    dtype_bytes: dict[str, int] = field(default_factory=lambda: dict(DTYPE_BYTES))


H200 = Device(
    name="H200",
    arch="sm_90a",
    sms=132,
    # Hopper (compute capability 9.0): 228 KiB of shared memory per SM, of which one block may
    # opt in to 227 KiB (232,448 B); 64K 32-bit registers per SM and at most 255 per thread.
    # These are the hardware limits; the fit check adds TileLang's own register overhead and
    # layout-bridge buffers explicitly instead of shaving the limits (the planner used to
    # assume 200 KiB and 192 registers, the compile stage 227 KiB and 255: one model now).
    smem_per_block=227 * 1024,
    smem_per_sm=228 * 1024,
    regs_per_sm=64 * 1024,
    regs_per_thread=255,
    max_threads=1024,
    warp=32,
    l2_bytes=50 * 1024 * 1024,
    tc_flops=790e12,   # measured bf16 cuBLAS ceiling (DESIGN section 5)
    cc_flops=60e12,
    sfu_ops=4.0e12,
    hbm_bw=4.27e12,    # measured copy bandwidth (DESIGN section 5)
    l2_bw=12e12,
    launch_us=4.0,
    # fitted on H200 runs 40 and 45 (streamed reductions, 3 stages): logsumexp over 32000
    # (65 MB, beyond L2) 0.23 us per step and block, variance over 1000 (8 MB) 0.09
    hbm_latency_s=0.7e-6,
    l2_latency_s=0.3e-6,
    smem_wavefronts_per_s=1.75e9,
    tma_wgmma=True,
)

H100 = replace(
    H200,
    # The H100 SXM5 (80 GB HBM3): the H200's GH100 die with the same 132 SMs, clocks, shared memory,
    # registers, 50 MB of L2 and 700 W limit, so every limit, compute ceiling (the H200's measured bf16
    # cuBLAS ceiling included), L2 figure and fitted latency is the H200's, argued equal, not measured
    # here. Only the memory differs (80 GB of HBM3 at 3.35 TB/s against 141 GB of HBM3e at 4.8): not the
    # H200's measured 4.27e12, but the vendor's 3.35 TB/s scaled by the fraction of its 4.8 TB/s vendor
    # figure the H200's copy reached (4.27 / 4.8 = 0.89), since the cost terms take ``hbm_bw`` as a
    # copy's rate (``HOPPER_TERMS.memory_efficiency`` is of it). Unmeasured.
    name="H100",
    hbm_bw=3.35e12 * 4.27 / 4.8,
)

A100 = Device(
    name="A100",
    arch="sm_80",
    sms=108,
    # Ampere (compute capability 8.0): 164 KiB of shared memory per SM, of which one block may opt
    # in to 163 KiB (166,912 B); 64K 32-bit registers per SM, at most 255 per thread; 40 MB of L2.
    smem_per_block=163 * 1024,
    smem_per_sm=164 * 1024,
    regs_per_sm=64 * 1024,
    regs_per_thread=255,
    max_threads=1024,
    warp=32,
    l2_bytes=40 * 1024 * 1024,
    # Vendor figures, none measured here: every A100 time the planner gives is modelled from them.
    tc_flops=312e12,   # dense bf16/fp16 mma.sync
    cc_flops=19.5e12,  # fp32 non-tensor
    sfu_ops=2.4e12,    # 16 SFU lanes per SM at 1.41 GHz
    hbm_bw=1.56e12,    # A100 40 GB HBM2
    l2_bw=5.0e12,      # about 2.3 times V100's L2, as the vendor states it
    launch_us=4.0,
    hbm_latency_s=0.7e-6,  # the Hopper-fitted latencies: not measured on Ampere
    l2_latency_s=0.3e-6,
    smem_wavefronts_per_s=1.41e9,  # one shared-memory pass per clock at the 1.41 GHz boost clock
)

DEVICES: dict[str, Device] = {"h200": H200, "h100": H100, "a100": A100}
"""Every device plans can be made for, by the name ``--device`` takes. Adding a GPU is one entry here with its
``REPORTED_NAMES`` and its line in ``backend.tilelang.targets.TARGETS`` (plus, when its instruction set differs,
one backend module under ``pyrunner/backend``): the H100 was added so."""

DEFAULT_DEVICE = "h200"
"""The one default device, by its key: what plans are made for when the caller names none and no GPU says
otherwise (planning needs no GPU). The CLI, the tuning database, the compile targets, the runner and the
GPU scripts import it; changing the default is this line."""

DEFAULT_TARGET: Device = DEVICES[DEFAULT_DEVICE]
"""The default device's numbers."""

REPORTED_NAMES: dict[str, tuple[str, ...]] = {
    "h200": ("NVIDIA H200", "NVIDIA H200 NVL"),
    "h100": ("NVIDIA H100 80GB HBM3",),
    "a100": ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"),
}
"""What the driver calls each device's products (``torch.cuda.get_device_name``, ``nvidia-smi
--query-gpu=name``). Each is the entry of its model number whatever its memory size and form factor:
the entry's numbers are one variant's (the A100's HBM bandwidth is the 40 GB parts' 1,555 GB/s; NVIDIA's A100
datasheet gives the 80 GB parts 1,935 GB/s in PCIe and 2,039 GB/s in SXM), so a time modelled for another
variant is that variant's only as far as they agree. No entry is made from a neighbour's numbers."""

DEFAULT_GPU_NAME: str = REPORTED_NAMES[DEFAULT_DEVICE][0]
"""What the driver calls the default device: the card the committed results tables are about
(``log.tables``: a row timed on another card is marked with its name)."""

OTHER_PARTS: dict[str, tuple[str, ...]] = {"h100": ("NVIDIA H100 PCIe", "NVIDIA H100 NVL")}
"""Products that share an entry's model number but are other GPUs than its numbers describe, so they are not
that entry (``device_key_of`` gives None: an unknown GPU, its times filed under its own name): the H100 PCIe
has 114 SMs and 2.0 TB/s of HBM2e, the H100 NVL 94 GB of HBM3 at 3.9 TB/s and lower clocks, against the
H100 SXM's 132 SMs and 3.35 TB/s."""

_PREFIX = re.compile(r"^(?:gpu\s+\d+\s*:\s*)?(?:nvidia\s+)?(?:tesla\s+)?", re.I)
_SUFFIX = re.compile(r"\s*\(uuid:[^)]*\)\s*$", re.I)


def gpu_model(name: str) -> str:
    """The model number a GPU name leads with, lower case: 'NVIDIA A100-SXM4-40GB' -> 'a100', 'NVIDIA H200 NVL'
    -> 'h200', 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)' (``nvidia-smi -L``) -> 'h100', 'a100' -> 'a100'."""
    s = _SUFFIX.sub("", _PREFIX.sub("", name.strip()))
    return re.split(r"[\s_-]+", s.lower(), maxsplit=1)[0]


def _product(name: str) -> str:
    """A GPU name as ``gpu_model`` reads it (no index, vendor or UUID), lower case, single-spaced:
    'GPU 0: NVIDIA H100 PCIe (UUID: ...)' -> 'h100 pcie'."""
    return " ".join(_SUFFIX.sub("", _PREFIX.sub("", name.strip())).lower().split())


def device_key_of(name: str) -> str | None:
    """The key of ``DEVICES`` that ``name`` (a key, any case, or a GPU name the driver reports) names, or None
    (also for a product of a known model that ``OTHER_PARTS`` says is another GPU)."""
    key = name.strip().lower()
    if key in DEVICES:
        return key
    model = gpu_model(name)
    if model not in DEVICES:
        return None
    others = {_product(n) for n in OTHER_PARTS.get(model, ())}
    return None if _product(name) in others else model


def known_devices() -> str:
    """The known devices and GPU names each answers to, for an error line: ``a100 (NVIDIA A100-SXM4-40GB, ...)``."""
    return ", ".join(f"{k} ({', '.join(REPORTED_NAMES.get(k, ()))})" for k in sorted(DEVICES))


def device_named(name: str) -> Device:
    """The device called ``name``: a key of ``DEVICES`` (case-insensitive) or a GPU name the driver reports
    (``NVIDIA A100-SXM4-80GB`` is the A100). UserError for any other name, saying what is known: an
    unknown GPU (a GH200, an H100 PCIe, a B200) has no numbers here, and none are borrowed from a neighbour."""
    key = device_key_of(name)
    if key is None:
        model = gpu_model(name)
        what = f" (model {model!r})" if model and model != name.strip().lower() else ""
        raise UserError(f"unknown device {name!r}{what}: no device numbers for it; known: {known_devices()}")
    return DEVICES[key]

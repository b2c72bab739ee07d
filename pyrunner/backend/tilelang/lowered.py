"""Checks on the CUDA that TileLang lowers a rendered kernel to, for hazards no plan check can see.

The one hazard checked today: a shared tile filled by a TMA load that thread code reads before
waiting on the load's mbarrier. TileLang 0.1.15's warp specialisation places the wait for a
prologue TMA load just before the first GEMM that reads the tile, so an elementwise read earlier
in the prologue (attention on RMS-normalised Q read Q's tile to form its statistics) raced the copy
and read stale shared memory: right on the CPU, wrong on the Hopper GPU (sweep run 4, error 18). The
renderer now loads such tiles synchronously; this check keeps any lowering that reintroduces the
pattern out of a compiled kernel (tests run it over every planned kernel).

The check reads the source text: a TMA load ``tma_load(desc, mbarrier[N], &((T*)buf)[...], ...)``
with a constant barrier index (a load outside a pipelined loop), then the following lines up to
``mbarrier[N].wait``; a line there that reads ``((T*)buf)`` other than to build a wgmma descriptor
or issue another TMA load is a race.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TMA_CALL = re.compile(r"tma_load\(([^;]*)\);")
_BARRIER = re.compile(r"mbarrier\[([^\]]*)\]")
_SMEM = re.compile(r"\(\(\w+\*\)(\w+)\)")
_NOT_A_READ = ("tma_load", "initialize_wgmma_descriptor", "arrive_and_expect_tx", "expect_transaction")


def _tma_load(line: str) -> tuple[str, str] | None:
    """(barrier index expression, shared buffer) of a TMA load on this line, either argument order
    (tiled: descriptor, barrier, smem, coords; bulk: smem, global, barrier, bytes)."""
    call = _TMA_CALL.search(line)
    if call is None:
        return None
    barrier, smem = _BARRIER.search(call.group(1)), _SMEM.search(call.group(1))
    return (barrier.group(1), smem.group(1)) if barrier and smem else None


def _buffer_access(buf: str) -> re.Pattern:
    """A typed access ``((T*)buf)`` to a shared buffer in the lowered source."""
    return re.compile(r"\(\(\w+\*\)" + re.escape(buf) + r"\)")


@dataclass(frozen=True)
class TmaRace:
    """A shared buffer read by threads before the TMA load that fills it is waited on."""

    buffer: str
    barrier: int
    load_line: int
    read_line: int

    def __str__(self) -> str:
        return (f"shared buffer {self.buffer!r} is read on line {self.read_line} before the TMA load on line "
                f"{self.load_line} is waited on (mbarrier[{self.barrier}])")


def tma_races(cuda_source: str) -> list[TmaRace]:
    """Every unwaited read of a TMA-loaded shared tile in one kernel's CUDA source."""
    lines = cuda_source.splitlines()
    found: list[TmaRace] = []
    for i, line in enumerate(lines):
        load = _tma_load(line)
        if load is None or not load[0].isdigit():
            continue
        barrier, buf = int(load[0]), load[1]
        read = _buffer_access(buf)
        for j in range(i + 1, len(lines)):
            text = lines[j]
            if f"mbarrier[{barrier}].wait" in text:
                break
            if read.search(text) and not any(k in text for k in _NOT_A_READ):
                found.append(TmaRace(buf, barrier, i + 1, j + 1))
                break
    return found


def warp_specialised_thread_reads(cuda_source: str) -> list[str]:
    """Shared tiles that a warp-specialised pipelined loop fills with TMA and reads with thread code.

    Such a read races the stage's release (``emit.NO_WARP_SPECIALISATION`` says why); the renderer
    turns warp specialisation off for kernels whose loops read a pipelined tile, so this is empty for
    every kernel it emits.
    """
    if "warpgroup_reg_alloc" not in cuda_source:  # TileLang's producer/consumer register split
        return []
    loads = [_tma_load(ln) for ln in cuda_source.splitlines()]
    staged = {ld[1] for ld in loads if ld is not None and not ld[0].isdigit()}
    found = []
    for buf in sorted(staged):
        read = _buffer_access(buf)
        if any(read.search(ln) and not any(k in ln for k in _NOT_A_READ) for ln in cuda_source.splitlines()):
            found.append(buf)
    return found


_EMPTY_ARRIVE = re.compile(r"(\w+)\[[^\]]*\]\.arrive\(\)")


def releases_in_flight(cuda_source: str) -> list[str]:
    """Stage releases issued while the wgmma batch committed last may still read the stage.

    An explicitly warp-specialised loop (``render_ws``) frees a ring slot with an arrive on its
    empty mbarrier; the producer may then overwrite the slot at once. So between the last
    ``warpgroup_commit_batch`` and such an arrive there must be a ``wait_wgmma``. (TileLang's own
    ``wg_wait`` annotation breaks exactly this.) Returns "line N: barrier" for each offender.
    """
    found: list[str] = []
    in_flight = False
    for n, line in enumerate(cuda_source.splitlines(), 1):
        if "warpgroup_commit_batch" in line:
            in_flight = True
        elif "wait_wgmma" in line:
            in_flight = False
        else:
            m = _EMPTY_ARRIVE.search(line)
            if m and m.group(1).endswith("_empty") and in_flight:
                found.append(f"line {n}: {m.group(1)}")
    return found


_LOCAL_ARRAY = re.compile(r"^\s+(float|half_t|bfloat16_t|int|uint|signed char|bool)\s+(\w+)\[(\d+)\];", re.M)
_WORDS = {"float": 1.0, "int": 1.0, "uint": 1.0, "half_t": 0.5, "bfloat16_t": 0.5, "signed char": 0.25, "bool": 0.25}
MAX_LOCAL_WORDS = 1024
"""Most 4-byte words of per-thread arrays a kernel may declare: four times the 255 registers a thread
has, a margin for the arrays the compiler keeps apart; beyond it a fragment layout replicated every
element to every thread (a [16, 4, 256] tile reduced over its middle axis lowered to 2048 floats per
thread, and nvcc took ten minutes on that one kernel)."""


def local_words(cuda_source: str) -> tuple[float, str]:
    """4-byte words of the per-thread arrays the kernel declares, and the largest array's name."""
    arrays = [(_WORDS[m.group(1)] * int(m.group(3)), m.group(2)) for m in _LOCAL_ARRAY.finditer(cuda_source)]
    return sum(w for w, _ in arrays), max(arrays, default=(0.0, ""))[1]


def oversized_fragments(cuda_source: str) -> str | None:
    """Why the kernel's per-thread arrays cannot live in registers, or None."""
    words, largest = local_words(cuda_source)
    if words <= MAX_LOCAL_WORDS:
        return None
    return (f"its per-thread arrays take {words:.0f} 4-byte words (largest {largest!r}); a thread has 255 "
            f"registers and more than {MAX_LOCAL_WORDS} words is a fragment layout gone wrong")

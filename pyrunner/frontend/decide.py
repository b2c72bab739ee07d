"""Keep a Superopt region only where it is measured faster than the fallback compiler's code for the same ops.

The cost model ranks plans; only a measurement says whether a region beats
inductor's code for it at that shape. When the graph is compiled the two are timed
once on inputs of the region's shapes (``Measure``: on the GPU both replayed from CUDA
graphs, as a model is timed; ``gpu_measure``); a region that loses leaves its ops in
the graph, which the fallback compiler then compiles whole, and the decision is written to
``$SUPEROPT_CACHE_DIR/decisions/<tilelang>/<device>/<dtype>/<graph hash>-<method>.json``
(the region graph fixes the ops and the shape bucket), so a second process, or
another layer with the same graph, measures nothing. One log line per region
says what was chosen and why. Without a GPU nothing is measured: the region is
"planned, not measured" and PyTorch runs it.

``Measure`` is the seam: anything callable as ``measure(label, superopt, fallback)``
returning the two times in microseconds (tests inject a fake one).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("pyrunner.frontend")


class Measure(Protocol):
    """Times ``superopt()`` and ``fallback()`` (each runs the region once on its inputs); microseconds each, and
    optionally a third value: a note on how, for the report."""

    def __call__(self, label: str, superopt: Callable[[], object],
                 fallback: Callable[[], object]) -> tuple[float, ...] | tuple[float, float, str]: ...


MEASURED_BY = "graph"
"""How ``gpu_measure`` times a region and the fallback's code: replayed from one CUDA graph of back-to-back
calls, as the layer itself is timed (``benchmarks/hf_layers.py``) and as the cost model is fitted (launch per
kernel under graph replay). Part of every decision's key, so a decision measured otherwise is not reused."""


def gpu_measure(label: str, superopt: Callable[[], object],  # noqa: ARG001 - label: for other measures' logs
                fallback: Callable[[], object]) -> tuple[float, float, str]:
    """Both timed alike and interleaved (``run.timing.side_by_side_us``, 3 rounds): CUDA-graph replay when
    both can be captured, else ``do_bench`` with L2 flushed for both. Streamed one call at a time, a region
    op's host work (argument checks, allocation, one TileLang call per kernel, layout copies: ~300 us for the
    Llama-3-8B-shaped layer's 3- and 4-kernel regions, run 113) was timed as if it were the kernels', though
    a model replayed from a CUDA graph never pays it. A side that fails to run loses. The note (third value)
    says how both were timed and, replayed, what the region took streamed one call at a time (its host work);
    where ``superopt`` carries ``kernels_only`` (``runtime.kernels_only``), its kernels alone are timed in the
    same rounds, which shows how much of a loss is the region op's own copies rather than its kernels."""
    from pyrunner.run.timing import median_us, side_by_side_us

    try:
        superopt()
    except Exception as e:  # noqa: BLE001 - kernels that cannot run lose to code that can
        log.warning("superopt: %s: the region's kernels failed to run (%s: %s); the fallback compiler's code "
                    "is kept", label, type(e).__name__, " ".join(str(e).split())[:200])
        times, _, _ = side_by_side_us({"fallback": fallback}, rounds=3)
        return float("inf"), times["fallback"], "its kernels failed to run"
    try:
        fallback()
    except Exception as e:  # noqa: BLE001 - code that cannot run (a training graph's compile, say) loses
        log.warning("superopt: %s: the fallback compiler's code failed to run (%s: %s); the region's kernels "
                    "are kept", label, type(e).__name__, " ".join(str(e).split())[:200])
        times, _, _ = side_by_side_us({"superopt": superopt}, rounds=3)
        return times["superopt"], float("inf"), "the fallback compiler's code failed to run"
    fns = {"superopt": superopt, "fallback": fallback}
    kernels = getattr(superopt, "kernels_only", None)
    if kernels is not None:
        fns["kernels"] = kernels
    times, method, _ = side_by_side_us(fns, rounds=3)
    if method.get("superopt") == "graph":
        note = f"CUDA-graph replay; {median_us(superopt):.2f} us streamed one call at a time"
    else:
        note = f"{method.get('superopt', 'do_bench')}: not capturable in a CUDA graph"
    if "kernels" in times:
        note += f"; its kernels alone {times['kernels']:.2f} us (the rest: the region op's layout copies and reshapes)"
    return times.get("superopt", float("inf")), times["fallback"], note


@dataclass(frozen=True)
class DecisionKey:
    """Everything a measured decision depends on: the region graph (ops and sizes: the shape bucket), the
    kernels' dtype, the device and the TileLang version."""

    graph_hash: str
    sizes: tuple[tuple[str, int], ...]
    dtype: str
    device: str
    tilelang: str
    method: str = MEASURED_BY
    """How it was measured (``MEASURED_BY``)."""

    def path(self, root: Path) -> Path:
        slug = [re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_") or "unknown" for s in (self.tilelang, self.device,
                                                                                       self.dtype, self.method)]
        return root / "decisions" / slug[0] / slug[1] / slug[2] / f"{self.graph_hash}-{slug[3]}.json"


def decision_key(graph: Any, dtype: str, device: str, tilelang: str | None = None) -> DecisionKey:
    """The key of a region graph (IR) planned in ``dtype`` on ``device`` (``cpu`` or a CUDA device name)."""
    from pyrunner.ir.graph_json import graph_to_json
    from pyrunner.plan.schema import canonical_json
    from pyrunner.target.tuning import tilelang_version

    h = hashlib.sha256(canonical_json(graph_to_json(graph)).encode()).hexdigest()[:24]
    return DecisionKey(h, tuple(sorted(graph.sizes.items())), dtype, device, tilelang or tilelang_version())


@dataclass
class Decision:
    choice: str
    """``superopt`` or ``fallback``."""
    superopt_us: float
    fallback_us: float
    sizes: tuple[tuple[str, int], ...] = ()
    note: str = ""
    """How it was measured (the measure's own words), for the report."""

    @property
    def why(self) -> str:
        return (f"measured {self.superopt_us:.2f} us (Superopt) vs {self.fallback_us:.2f} us (fallback compiler)"
                + (f"; {self.note}" if self.note else ""))


def decide(superopt_us: float, fallback_us: float, sizes: tuple = (), note: str = "") -> Decision:
    """Superopt only when strictly faster; a tie keeps the fallback compiler's code."""
    return Decision("superopt" if superopt_us < fallback_us else "fallback", superopt_us, fallback_us, sizes,
                    " ".join(str(note).split())[:200])


class DecisionCache:
    """Decisions on disk under ``root`` (default ``$SUPEROPT_CACHE_DIR``), one small JSON file each, written
    whole or not at all."""

    def __init__(self, root: Path | None = None) -> None:
        from pyrunner.frontend.cache import cache_root

        self.root = Path(root) if root is not None else cache_root()

    def get(self, key: DecisionKey) -> Decision | None:
        p = key.path(self.root)
        try:
            d = json.loads(p.read_text())
            out = Decision(str(d["choice"]), float(d["superopt_us"]), float(d["fallback_us"]),
                           tuple((str(a), int(n)) for a, n in d.get("sizes", ())),
                           " ".join(str(d.get("note", "")).split())[:200])
        except (OSError, ValueError, KeyError, TypeError):  # absent or unreadable: measure again
            return None
        return out if out.choice in ("superopt", "fallback") and out.sizes == key.sizes else None

    def put(self, key: DecisionKey, decision: Decision) -> None:
        from pyrunner.files import output_dir, write_text_atomic

        p = key.path(self.root)
        output_dir(p.parent, "decision cache folder")
        body = {**asdict(decision), "key": asdict(key)}
        write_text_atomic(p, json.dumps(body, indent=1, sort_keys=True) + "\n", "decision cache file")


def decide_once(label: str, key: DecisionKey, measure: Measure, superopt: Callable[[], object],
                fallback: Callable[[], object], cache: DecisionCache) -> tuple[Decision, str]:
    """The cached decision for ``key``, else one measurement (then cached); with how it was reached.
    One log line says what was chosen and why."""
    cached = cache.get(key)
    if cached is not None:
        d, how = cached, "from the decision cache"
    else:
        got = measure(label, superopt, fallback)
        d, how = decide(got[0], got[1], key.sizes, got[2] if len(got) > 2 else ""), "measured now"
        try:
            cache.put(key, d)
        except Exception as e:  # noqa: BLE001 - an unwritable cache costs a re-measure, not the model
            how += f" (not cached: {e})"
    log.info("superopt: %s at %s: %s (%s, %s)", label, dict(key.sizes),
             "Superopt kernels" if d.choice == "superopt" else "the fallback compiler's code", d.why, how)
    return d, how

"""Search: derivations x kernel partitions x loop structure x tile configs.

1. Derivations: breadth-first application of the algebraic rules (bounded by
   ``max_variants``, fewer for large graphs), each variant remembering the rule
   applications that produced it; products are put in a canonical factor order
   first (``canonical_products``) so parenthesisation does not decide fusion.
2. Partitions: which intermediates reach global memory. Reductions,
   contractions and computed GEMM operands (``ELEMENTWISE_TERMS``, in a second
   pass) are the cut candidates (other elementwise work is fused into a
   neighbour). Few candidates: every subset. More: a cost-guided beam search
   over cut sets, from "cut every one" and "cut none", toggling one cut at a time.
3. Loop structure: for each kernel, every axis it reduces may be streamed
   (``lower.lower``); infeasible structures are dropped.
4. Tile configs: ``cost.best_config`` per kernel, among configs that fit the device
   (``target.fit``); the emitted tuning space keeps only fitting ones. Plans rank by total
   predicted time; ties prefer shorter derivations.

The whole search runs under budgets counted in work (terms of the partitions evaluated and of the
merges lowered, a unit for a merge the kernel cache answers), never in seconds: the same graph, options
and tuning file give the same plan on any machine and under any load. When a budget cuts the search,
the plan says what was not explored (``provenance.search_cut``, printed by ``--explain``).
When it finds nothing, the naive plan (every op its own kernel) is the answer;
"no feasible plan" means that even the naive plan has a kernel whose smallest
tile does not fit the device, and the message names the resource.

Why one module: the four levels above share one ``Planner`` (its kernel cache, budget and
rejection reasons); the tile memo and the lowering live in ``memo.py`` and ``lower.py``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyrunner.planner.lower as lower_module
import pyrunner.planner.prefetch as prefetch
from pyrunner import __version__
from pyrunner.errors import GraphError, PlanError
from pyrunner.ir.axes import axes_of
from pyrunner.ir.brief import brief
from pyrunner.ir.graph import Graph, Term, result_axes, subterms
from pyrunner.ir.merge_axes import AxisMerge, merge_all
from pyrunner.ir.split_axes import AxisSplit, apply_split, chunk_counts, split_names, split_problem
from pyrunner.ir.unit_axes import AxisUnit, add_unit, unit_candidate
from pyrunner.plan.certificate import Certificate
from pyrunner.plan.schema import (
    AxisMergeSpec,
    AxisSplitSpec,
    AxisUnitSpec,
    CostEstimate,
    GlobalTensor,
    Kernel,
    KernelCost,
    Plan,
    Provenance,
    Step,
    with_hash,
)
from pyrunner.planner.aliases import distinct_outputs, graph_hash, with_aliases
from pyrunner.planner.calibration import calibrate
from pyrunner.planner.coschedule import pairings
from pyrunner.planner.cost import (
    DEFAULT_MACHINE,
    DTYPE_BYTES,
    Estimate,
    Machine,
    grid_blocks,
    machine_for,
    ranked_configs,
)
from pyrunner.planner.lower import (
    Infeasible,
    Lowered,
    Roots,
    as_roots,
    cone,
    kernel_computes,
    lower,
    stream_candidates,
)
from pyrunner.planner.memo import TileMemo, kernel_of
from pyrunner.planner.merge import Group, merge_siblings
from pyrunner.planner.space import param_space
from pyrunner.target.device import Device
from pyrunner.target.fit import FitModel

__all__ = ["Budget", "Planner", "kernel_of", "search"]

_log = logging.getLogger("pyrunner.planner")

PRECISION_PENALTY = 0.05
"""Ranking surcharge per precision risk (``Candidate.precision_risks``): a GEMM operand that carries a
scale (``scaled_gemm_operands``: moving it onto the float32 result avoids a rounding), or a variance
taken in one pass by ``variance_sum_of_squares`` (cancellation when the mean dwarfs the spread). The
riskier form wins only when predicted more than 5% faster per risk."""
CANCELLING_RULES = ("variance_sum_of_squares",)


def ranked_us(total_us: float, precision_risks: int) -> float:
    """The time plans are ranked by: predicted time plus ``PRECISION_PENALTY`` per precision risk."""
    return total_us * (1.0 + PRECISION_PENALTY * precision_risks)
MAX_VARIANTS = 48
MAX_DEPTH = 6
MAX_EXHAUSTIVE_CUTS = 6
"""Up to this many cut candidates, every subset is tried (2**6 partitions per variant)."""
BEAM_WIDTH = 4
OPERAND_PASS_VARIANTS = 8
"""Variants (those of the best plans of the first pass) searched again with their computed GEMM
operands as cut candidates too."""
OPERAND_PASS_WRITTEN = False
"""The operand pass also cuts the graph as written when its best variants leave it out. Derivations pull a
scale out of each GEMM operand apart, so one operand several GEMMs share (a norm's output times its weight)
becomes one per GEMM, none worth cutting alone, while the first pass ranks the written graph low (each GEMM
recomputes the shared operand there): the Llama MLP's backward recomputed the normalised input in
d_W_gate's GEMM (427.6 us modelled) beside d_W_up's GEMM reading it (315.2); 1689.2 -> 1576.9 us. It also
re-plans forward graphs (LayerNormMatmul: the normalised operand in one kernel, then a plain GEMM, 54.8 ->
51.0 us modelled). A planner switch (``benchmarks/switches.py``), read last in its condition, so
``switch_cases.py`` lists the cases it changes; off until a GPU sweep of those cases and a timing decide."""
OPERAND_PASS_SHARE = 0.25
"""Work the operand pass gets on top of what the first pass left, as a share of the budget. A large graph's
first pass spends the whole budget on derivation variants (many differing only in where a constant sits),
and the operand pass, which alone can store a norm's or an activation's output as the next GEMM's bf16
operand, never ran: a transformer layer's LayerNorm and GELU-tanh were recomputed inside the FFN GEMMs'
main loops from float32 tensors (issue 40, GPT-2-medium's layer region: 128.7 us modelled, 319 measured).
Granted on top rather than kept back from the first pass, so no plan the first pass finds is lost."""
MAX_WORK = 140_000
"""Partition-search work per search: each partition evaluated costs its graph's term count, each merge
attempt ``MERGE_WORK`` per term it lowers (one unit where the kernel cache answers it). Deterministic
(the same plans on any machine), and it bounds time and memory on large graphs. 140k (100k before
issue 46) lets the QK-norm attention's search run to completion (120k units) with some margin; searches
that spend the whole budget take longer (a chain of 40 GEMMs 2.4 -> 3.1 CPU-s; a sum of 8 softmaxes,
whose merges also got cheaper, 3.2 -> 7.9; docs/planner.md)."""
DEPENDENT_MERGE_CANDIDATES = 8
"""Best partitions (distinct variant and cut) the dependent-merge pass revisits."""
DEPENDENT_MERGE_WORK = 20_000
"""Budget of that pass (deterministic, like ``MAX_WORK``)."""
UNBOUNDED_WORK = 1 << 62
"""The prefetch helper's budget: it runs each variant through; the search keeps the real one."""
MERGE_WORK = 8
"""Budget a merge attempt costs per term of the union it lowers, where the kernel cache does not hold
that union yet (a lowering and a tile search); one unit where it does (an earlier partition tried the
same merge: a cone walk and a lookup). It was 16 per term, cached or not: ScaledAttention's backward
spent 92% of its budget on merges that took 30% of its time (most answered by the cache) and the QK-norm
attention more than half of its budget on 6% of its time (issue 46). Measured, a merge lowered costs 1.4
to 2 partition units per term (QK-norm attention, a sum of 8 softmaxes), but at 2 the softmax sum, whose
partitions lower several new kernels for the units of their terms, planned in 15 s instead of 2.6: 8
keeps it near 8 s while the QK-norm search completes within ``MAX_WORK``."""
MAX_KERNEL_TERMS = 60
"""Most terms one kernel's cone may hold (its own computation and the tensors it reads). A kernel
recomputes the elementwise work between the tensors it reads and what it stores, so in a deep chain
of softmaxes or norms each reduction's cone reaches back to the input: lowering and tile-searching
them all is quadratic in depth, and TileLang's lowering of one such kernel takes minutes and
gigabytes (``backend.tilelang.limits.MAX_KERNEL_OPS``). Larger cones are refused (the search then cuts
them, or falls back to the naive plan).
The largest catalog or corpus graph has 37 terms, so no plan of theirs is affected."""
VARIANT_TERMS = 6000
"""Variants x graph terms kept below this: large graphs get fewer derivation variants."""


@dataclass
class Variant:
    graph: Graph
    steps: list[Step]
    _meta: dict = field(default_factory=dict, repr=False)


@dataclass
class KernelChoice:
    low: Lowered
    kernel: Kernel
    """The kernel with its full tuning space (defaults: the first values); ``to_plan`` narrows it."""
    est: Estimate
    sizes: dict[str, int] = field(default_factory=dict, repr=False)
    machine: Machine = DEFAULT_MACHINE
    _fit: FitModel | None = field(default=None, repr=False)

    @property
    def fit(self) -> FitModel:
        """The kernel's fit model, built on first use (most lowerings never need one)."""
        if self._fit is None:
            self._fit = FitModel(self.kernel, self.sizes, self.machine.device)
        return self._fit


@dataclass
class Candidate:
    variant: Variant
    kernels: list[KernelChoice]
    tensors: list[GlobalTensor]
    total_us: float
    unguarded: int = 0
    scaled_operands: int = 0
    cut: tuple[Term, ...] = ()

    def signature(self) -> tuple:
        """Kernel structure: candidates differing only in algebra that lowers alike count once."""
        def kinds(ops: list) -> tuple[str, ...]:
            return tuple(sorted(op.op for op in ops if op.op in ("load", "gemm", "reduce", "store")))

        return tuple((tuple(tuple(axes_of(r)) for r in k.low.roots), k.low.stream, kinds(k.low.prologue),
                      kinds(k.low.body), kinds(k.low.epilogue), tuple(sorted(k.est.config.items())))
                     for k in self.kernels)

    def rank(self) -> tuple:
        return (self.unguarded, round(self.ranked_us, 2), len(self.variant.steps), len(self.kernels))

    @property
    def precision_risks(self) -> int:
        """Scaled GEMM operands, plus variances taken as mean(x^2) - mean(x)^2 (cancellation)."""
        return self.scaled_operands + sum(1 for st in self.variant.steps if st.rule in CANCELLING_RULES)

    @property
    def ranked_us(self) -> float:
        """Predicted time with ``PRECISION_PENALTY`` per precision risk: precision breaks near-ties."""
        return ranked_us(self.total_us, self.precision_risks)


def _scales_pulled_out(g: Graph, limit: int = 16) -> Variant | None:
    """g with every scale that can leave a GEMM operand moved onto its result (the rules applied to a
    fixed point): seeded beside the breadth-first variants, which a bounded search may not reach
    (two normalised operands take two more steps than the plain graph; ``scaled_gemm_operands``)."""
    from pyrunner.rules.certify import rewrite_step
    from pyrunner.rules.registry import RULES, iter_rewrites

    rules = [RULES["matmul_row_scale_commute"], RULES["matmul_div_commute"]]
    v = Variant(g, [])
    for _ in range(limit):
        step = next(((g2, r, m) for r in rules for g2, m in iter_rewrites(v.graph, r)), None)
        if step is None:
            break
        v = Variant(step[0], v.steps + [rewrite_step(step[1].name, step[2], step[1].apply(step[2]))])
    return v if v.steps else None


def variant_name(v: Variant) -> str:
    """A derivation variant in words: the rules that produced it (for ``search_cut`` notes)."""
    if not v.steps:
        return "the graph as written"
    rules = [st.rule for st in v.steps]
    return "the variant by " + ", ".join(rules[:4]) + (f" and {len(rules) - 4} more" if len(rules) > 4 else "")


def max_variants(g: Graph) -> int:
    return max(2, min(MAX_VARIANTS, VARIANT_TERMS // max(1, len(g.terms()))))


def derive(g: Graph, limit: int | None = None, cut: list[str] | None = None) -> list[Variant]:
    """Graphs reachable by the algebraic rules (bounded), shortest derivation first. When the bound
    stops the derivation with new graphs still reachable, a note is appended to ``cut``."""
    from pyrunner.rules.certify import rewrite_step
    from pyrunner.rules.products import canonical_products
    from pyrunner.rules.registry import RULES, iter_rewrites

    cap = limit if limit is not None else max_variants(g)
    algebraic = [r for r in RULES.values() if r.kind == "algebraic" and r.saturate]
    variants = [Variant(g, [])]
    seen = {g.key()}
    canon = canonical_products(g)
    if canon is not None and canon[0].key() not in seen and cap > 1:
        seen.add(canon[0].key())
        variants.append(Variant(canon[0], canon[1]))
    pulled = _scales_pulled_out(g)
    if pulled is not None and pulled.graph.key() not in seen and cap > len(variants):
        seen.add(pulled.graph.key())
        variants.append(pulled)
    frontier = list(variants)
    for _ in range(MAX_DEPTH):
        nxt: list[Variant] = []
        for v in frontier:
            for rule in algebraic:
                for g2, matched in iter_rewrites(v.graph, rule):
                    if g2.key() in seen:
                        continue
                    if len(variants) >= cap:
                        if cut is not None:
                            cut.append(f"derivation (at most {cap} variants for a graph of {len(g.terms())} "
                                       f"terms): stopped at depth {len(v.steps) + 1} with rewrites left")
                        return variants + _pulled_variants(variants, seen)
                    seen.add(g2.key())
                    nv = Variant(g2, v.steps + [rewrite_step(rule.name, matched, rule.apply(matched))])
                    variants.append(nv)
                    nxt.append(nv)
        frontier = nxt
        if not frontier:
            break
    return variants + _pulled_variants(variants, seen)


def _pulled_variants(variants: list[Variant], seen: set) -> list[Variant]:
    """The scales-pulled-out form of every overflow-safe variant that still has a scaled GEMM operand
    (those rank first, and the bounded search may stop short of pulling both scales of a product)."""
    out: list[Variant] = []
    for v in variants:
        if unguarded_exps(v.graph) or not scaled_gemm_operands(v.graph):
            continue
        p = _scales_pulled_out(v.graph)
        if p is not None and p.graph.key() not in seen:
            seen.add(p.graph.key())
            out.append(Variant(p.graph, v.steps + p.steps))
    return out


@dataclass
class _Layout:
    """Per-variant facts every partition of it shares (computed once)."""

    terms: list[Term]
    inner: list[Term]
    anchors: list[Term]
    names: dict[Term, str]
    outputs: dict[Term, str]
    unguarded: int
    scaled_operands: int
    gemm_operands_only: frozenset[Term] = frozenset()
    """Terms every user of which is a GEMM: materialised, they are stored in the compute dtype, which
    the GEMM rounds them to anyway (same values, half the bytes, a tile TMA can feed to the MMA)."""
    primary: list[Term] = field(default_factory=list)
    """The anchors that are reductions or contractions (the first pass cuts only these)."""


class Budget:
    """Search work left, counted in work units (never seconds, so plans do not depend on the machine
    or its load), and what the search left unexplored once it ran out (``cut``, for the plan)."""

    def __init__(self, work: int = MAX_WORK, name: str = "partition search") -> None:
        self.work = work
        self.left = work
        self.name = name
        self.cut: list[str] = []

    def spend(self, cost: int = 1) -> bool:
        """Pay for one partition evaluation or merge; False once the budget is gone."""
        self.left -= cost
        return self.left >= 0

    def exhausted(self) -> bool:
        return self.left <= 0

    def grant(self, work: int) -> None:
        """Add ``work`` for a later pass (from zero where an earlier pass overspent)."""
        self.left = max(self.left, 0) + work

    def skipped(self, what: str) -> None:
        """Record that ``what`` was not explored because this budget ran out."""
        note = f"{self.name} (work budget {self.work}): {what}"
        if note not in self.cut:
            self.cut.append(note)


class Planner:
    """Plans one graph at one dtype; caches kernel lowerings across partitions."""

    def __init__(self, graph: Graph, dtype: str, machine: Machine = DEFAULT_MACHINE, *,
                 source: Graph | None = None, merges: tuple[AxisMerge, ...] = (),
                 split: AxisSplit | None = None, units: tuple[AxisUnit, ...] = ()) -> None:
        self.unsplit = graph  # derivations start here; with ``split``, each is then split
        self.split = split
        self.graph = graph if split is None else apply_split(graph, split)
        self.source = source or graph  # as its author wrote it; ``graph`` is it with ``units``, then ``merges`` applied
        self.merges = merges
        self.units = units
        self.dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)
        if self.dtype not in ("float16", "bfloat16"):
            raise GraphError(f"unsupported dtype {dtype!r}; use fp16 or bf16")
        self.machine = machine
        self.sizes = self.graph.sizes
        self._cache: dict[tuple, KernelChoice | None] = {}
        self._tensors: dict[tuple[Term, str, str], GlobalTensor] = {}
        self.tiles = TileMemo(self.sizes, machine)
        self._why: dict[tuple, list[str]] = {}
        self._coschedule_memo: dict = {}
        self._prefetch: prefetch.Prefetch | None = None  # the helper process's kernels (``prefetch``)
        self._send: Callable[[tuple, object], None] | None = None  # set in the helper: where its kernels go
        self.rejections: dict[str, int] = {}  # why candidate kernels were dropped, for the error message
        self.cut: list[str] = []  # what a work budget left unexplored (``provenance.search_cut``)
        self.derive_cut = False  # derivation stopped at ``max_variants`` with rewrites left

    @property
    def label(self) -> str:
        """Which graph this planner searches, in words (for ``search_cut`` notes)."""
        parts = (["a unit axis added"] if self.units else []) + (["axes merged"] if self.merges else []) \
            + ([f"{self.split.axis} split into chunks"] if self.split else [])
        return "the graph" + (" with " + ", ".join(parts) if parts else "")

    def _skipped(self, budget: Budget, what: str) -> None:
        """Note that ``budget`` ran out before ``what`` was explored."""
        budget.skipped(f"{self.label}: {what}")
        for note in budget.cut:
            if note not in self.cut:
                self.cut.append(note)

    def _reject(self, why: str) -> None:
        self.rejections[why] = self.rejections.get(why, 0) + 1

    # --- tensors --------------------------------------------------------------
    def _tensor(self, name: str, t: Term, role: str, gemm_operand: bool = False) -> GlobalTensor:
        key = (t, name, role, gemm_operand)
        got = self._tensors.get(key)
        if got is None:
            axes = list(axes_of(t))
            dtype = self.dtype if role != "intermediate" or gemm_operand else "float32"
            if role != "intermediate" and name in self.source.float32_io:  # a statistic a backward reads
                dtype = "float32"
            got = GlobalTensor(name=name, axes=axes, shape=[self.sizes[a] for a in axes], dtype=dtype, role=role)
            self._tensors[key] = got
        return got

    def layout(self, v: Variant) -> _Layout:
        if "layout" not in v._meta:
            v._meta["layout"] = _layout(v.graph)
        return v._meta["layout"]

    def _kernel(self, root: Roots, boundary: dict[Term, str], tensors: dict[str, GlobalTensor], labels: dict[Term, str],
                out_name: str | tuple[str, ...], reserved: frozenset[str],
                streams: tuple[str | None, ...] | None = None) -> tuple[KernelChoice | None, list[Term]]:
        """The cheapest lowering of root's kernel (None if none fits) and the tensors it reads.
        Several roots (with one output name each): one multi-output kernel. ``streams``: the loop
        axes to try (default: every candidate)."""
        terms, leaves, key = self._kernel_key(root, boundary, tensors, out_name, streams)
        roots = as_roots(root)
        outs = [out_name] if isinstance(out_name, str) else list(out_name)
        if key in self._cache:
            for why in self._why.get(key, ()):
                self._reject(why)
            return self._cache[key], leaves
        if len(terms) > MAX_KERNEL_TERMS:
            why = (f"a kernel would compute {len(terms)} terms (at most {MAX_KERNEL_TERMS} fuse into one: "
                   "elementwise work is recomputed in every kernel that reads it, so deep chains grow each cone)")
            self._cache[key], self._why[key] = None, [why]
            self._reject(why)
            return None, leaves
        mixed = self._mixes_split_stages(kernel_computes(root, terms, boundary))
        if mixed:
            self._cache[key], self._why[key] = None, [mixed]
            self._reject(mixed)
            return None, leaves
        got = self._prefetch.take(key) if self._prefetch is not None else None
        if got is not None:  # the helper lowered and priced it: the same value, computed there
            parts, whys = got
            best = None
            if parts is not None:  # the plan kernel is rebuilt here: cheaper than unpickling one
                low, est = parts
                kernel = kernel_of(low, outs[0], param_space(low, self.sizes, self.machine.device.sms))
                best = KernelChoice(low, kernel, est, self.sizes, self.machine)
            return self._cached(key, best, whys), leaves
        dtypes = {boundary[t]: tensors[boundary[t]].dtype for t in leaves}
        nbytes = {n: DTYPE_BYTES[tensors[n].dtype] * _prod(tensors[n].shape) for n in [*dtypes, *outs]}
        best: KernelChoice | None = None
        whys: list[str] = []
        for s in stream_candidates(root, terms, boundary):
            if streams is not None and s not in streams:
                continue
            try:
                low = lower(root, boundary, dtypes, self.sizes, self.dtype, s, labels, out_name, reserved, terms)
            except Infeasible as e:
                whys.append(str(e))
                continue
            kernel, est, why, fit = self.tiles.best(low, outs[0], nbytes)
            if est is None:
                what = " and ".join(brief(r, 60) for r in roots)
                whys.append(f"the smallest tile of the kernel computing {what} does not fit the device: {why}")
                continue
            if best is None or est.time_us < best.est.time_us:
                best = KernelChoice(low, kernel, est, self.sizes, self.machine, fit)
        if self._send is not None:
            self._send(key, (None if best is None else (best.low, best.est), whys))
        return self._cached(key, best, whys), leaves

    def _cached(self, key: tuple, best: KernelChoice | None, whys: list[str]) -> KernelChoice | None:
        """Keep a lowered kernel (or, when none fits, why not) under its cache key."""
        self._cache[key] = best
        if best is None:
            self._why[key] = whys
            for why in whys:
                self._reject(why)
        return best

    @staticmethod
    def _kernel_key(root: Roots, boundary: dict[Term, str], tensors: dict[str, GlobalTensor],
                    out_name: str | tuple[str, ...],
                    streams: tuple[str | None, ...] | None) -> tuple[list[Term], list[Term], tuple]:
        """The cone of ``root``'s kernel, the tensors it reads and its key in the kernel cache."""
        terms = cone(root, boundary)
        roots = as_roots(root)
        leaves = [t for t in terms if all(t is not r for r in roots) and t in boundary]
        key = (root, out_name, tuple((t, boundary[t], tensors[boundary[t]].dtype) for t in leaves), streams)
        return terms, leaves, key

    def _merge_work(self, roots: Roots, boundary: dict[Term, str], tensors: dict[str, GlobalTensor],
                    writes: tuple[str, ...], streams: tuple[str | None, ...] | None) -> int:
        """What lowering the union of a merge costs: ``MERGE_WORK`` per term of its cone, or one unit
        where the kernel cache already holds it (no lowering or tile search runs)."""
        terms, _, key = self._kernel_key(roots, boundary, tensors, writes, streams)
        return 1 if key in self._cache else MERGE_WORK * len(terms)

    def _mixes_split_stages(self, computed: list[Term]) -> str:
        """Why a kernel of a split graph would reduce a chunk and combine chunks at once ('' when not):
        such a kernel holds every chunk of its rows, so the split buys no parallelism, and the chunk
        axis held in a tile beside a streamed one lowered to replicated fragments (sweep 29)."""
        if self.split is None:
            return ""
        reduced = {t.axis for t in computed if t.op in ("reduce", "matmul")}
        if set(self.split.parts) <= reduced:
            return f"a kernel would reduce both {self.split.parts[1]!r} and the chunks {self.split.parts[0]!r}"
        return ""

    def partition(self, v: Variant, cut: tuple[Term, ...] | frozenset[Term]) -> Candidate | None:
        """The partition of ``v`` materialising ``cut``, one kernel per materialised term (None if
        a kernel is infeasible)."""
        got = self.partitions(v, cut, merge=False)
        return got[0] if got else None

    def partitions(self, v: Variant, cut: tuple[Term, ...] | frozenset[Term], merge: bool = True,
                   budget: Budget | None = None, dependent: bool = False) -> list[Candidate]:
        """The partition materialising ``cut`` and, with ``merge``, the same partition with sibling
        kernels (with ``dependent``, also a kernel and one it reads) merged into multi-output kernels
        where the cost model predicts a gain (each merge tried is paid from ``budget``, by the terms
        it lowers)."""
        lay = self.layout(v)
        labels = v.graph.labels
        tensors: dict[str, GlobalTensor] = {}
        boundary: dict[Term, str] = {}
        for t in lay.terms:
            if t.op == "input":
                tensors[t.name] = self._tensor(t.name, t, "input")
                boundary[t] = t.name
        for t in cut:
            name = lay.names[t]
            boundary[t] = name
            tensors[name] = self._tensor(name, t, "intermediate", t in lay.gemm_operands_only)
        for t, n in lay.outputs.items():
            if t.op == "input":
                return []
            boundary[t] = n
            tensors[n] = self._tensor(n, t, "output")
        kernels: list[KernelChoice] = []
        consumed: set[Term] = set()
        reserved = frozenset(boundary.values())
        for t in lay.terms:
            if t not in boundary or t.op == "input":
                continue
            kc, leaves = self._kernel(t, boundary, tensors, labels, boundary[t], reserved)
            if kc is None:
                return []
            kernels.append(kc)
            consumed.update(leaves)
        if any(t not in consumed for t in cut):
            return []
        kernels, total = self._coscheduled(kernels, tensors)
        cand = Candidate(v, kernels, list(tensors.values()), total, lay.unguarded, lay.scaled_operands, tuple(cut))
        merged = (self._merged(cand, boundary, tensors, labels, reserved, budget, dependent,
                               frozenset(lay.outputs.values())) if merge else None)
        return [cand] if merged is None else [cand, merged]

    def _merged(self, cand: Candidate, boundary: dict[Term, str], tensors: dict[str, GlobalTensor],
                labels: dict[Term, str], reserved: frozenset[str], budget: Budget | None,
                dependent: bool = False, outputs: frozenset[str] = frozenset()) -> Candidate | None:
        """``cand`` with sibling kernels merged (``merge.merge_siblings``); None if none merge."""
        def group(members: tuple[int, ...], kc: KernelChoice) -> Group[KernelChoice]:
            return Group(members, frozenset(kc.low.reads), frozenset(kc.low.writes), merge_key(kc.low), kc,
                         kc.est.time_us)

        # the partition's own term objects: a cached kernel's roots may be another variant's equal terms,
        # and a cone mixing the two finds a root's equal below another root and reads it as a leaf
        # (``loop_body.is_leaf`` tells roots by identity), so a merge's feasibility would depend on which
        # variant first lowered each kernel
        own = {t: t for t in boundary}

        def try_merge(a: Group[KernelChoice], b: Group[KernelChoice]) -> Group[KernelChoice] | None:
            la, lb = a.choice.low, b.choice.low
            roots, writes = tuple(own.get(r, r) for r in la.roots + lb.roots), (*la.writes, *lb.writes)

            def paid(streams: tuple[str | None, ...] | None) -> bool:
                if budget is None or budget.spend(self._merge_work(roots, boundary, tensors, writes, streams)):
                    return True
                self._skipped(budget, f"kernel merges not tried in partitions of {variant_name(cand.variant)}")
                return False

            # kernels of different grids (a statistic returned beside what it scales, merge._pairs):
            # the union picks its own loop axis, or none
            streams = (la.stream,) if a.key == b.key else None
            if not paid(streams):
                return None
            kc, _ = self._kernel(roots, boundary, tensors, labels, writes, reserved, streams=streams)
            if kc is None and streams is not None and la.stream is None and paid(None):
                # held whole, the union's tiles may not fit: stream one of its axes
                kc, _ = self._kernel(roots, boundary, tensors, labels, writes, reserved)
            return None if kc is None else group(a.members + b.members, kc)

        groups = [group((i,), kc) for i, kc in enumerate(cand.kernels)]
        out = merge_siblings(groups, try_merge, dependent, outputs)
        if len(out) == len(groups):
            return None
        kernels, total = self._coscheduled([g.choice for g in out], {t.name: t for t in cand.tensors})
        return Candidate(cand.variant, kernels, cand.tensors, total, cand.unguarded, cand.scaled_operands, cand.cut)

    def _coscheduled(self, kernels: list[KernelChoice],
                     tensors: dict[str, GlobalTensor]) -> tuple[list[KernelChoice], float]:
        """The kernels (in launch order) with each kernel that ``coschedule.pairings`` puts beside the
        next re-tiled for it, and their predicted total (a pair counts its longer kernel)."""
        total = sum(k.est.time_us for k in kernels)
        pairs = pairings(kernels, self.sizes, tensors, self.machine, self._coschedule_memo)
        if not pairs:
            return kernels, total
        out = list(kernels)
        for p in pairs:
            a = out[p.ahead]
            out[p.ahead] = KernelChoice(a.low, a.kernel, p.estimate, a.sizes, a.machine, a._fit)
            total -= p.saved_us
        return out, total

    # --- partition search ------------------------------------------------------------
    def _explore(self, v: Variant, budget: Budget, operands: bool = False) -> list[Candidate]:
        """Partitions of ``v`` cutting reductions and contractions (with ``operands``: also its computed
        GEMM operands)."""
        lay = self.layout(v)
        anchors = lay.anchors if operands else lay.primary
        if len(anchors) <= MAX_EXHAUSTIVE_CUTS:
            out = []
            cost = len(self.layout(v).terms)
            total, done = 2 ** len(anchors), 0
            for r in range(len(anchors) + 1):
                for c in itertools.combinations(anchors, r):
                    if not budget.spend(cost):
                        self._skipped(budget, f"{total - done} of {total} partitions of {variant_name(v)} "
                                              "not evaluated")
                        return out
                    done += 1
                    out.extend(self.partitions(v, c, budget=budget))
            return out
        return self._beam(v, anchors, budget)

    def _beam(self, v: Variant, anchors: list[Term], budget: Budget) -> list[Candidate]:
        """Cost-guided local search over cut sets: keep the BEAM_WIDTH cheapest, toggle one cut."""
        order = {t: i for i, t in enumerate(anchors)}
        cost = len(self.layout(v).terms)
        results: dict[frozenset[Term], Candidate | None] = {}
        alternatives: list[Candidate] = []  # merged partitions, offered beside the unmerged ones

        def evaluate(cut: frozenset[Term]) -> Candidate | None:
            if cut not in results:
                got = self.partitions(v, tuple(sorted(cut, key=order.__getitem__)), budget=budget)
                alternatives.extend(got[1:])
                results[cut] = min(got, key=Candidate.rank) if got else None
            return results[cut]

        # fusing everything is worth a look only while one kernel could plausibly hold it
        starts = [frozenset(anchors)] + ([frozenset()] if len(anchors) <= 2 * MAX_EXHAUSTIVE_CUTS else [])
        primary = frozenset(self.layout(v).primary)  # computed operands left fused
        if primary not in starts:
            starts.append(primary)
        beam = []
        for s in starts:
            budget.spend(cost)
            if evaluate(s) is not None:
                beam.append(s)
        best = min((results[s].rank() for s in beam), default=None)
        while beam:
            scored: list[tuple[tuple, frozenset[Term]]] = []
            for cut in beam:
                for a in anchors:
                    nb = cut ^ {a}
                    if nb in results:
                        continue
                    if not budget.spend(cost):
                        self._skipped(budget, f"the beam search over partitions of {variant_name(v)} stopped "
                                              f"after {len(results)} cut sets")
                        return [c for c in results.values() if c is not None] + alternatives
                    c = evaluate(nb)
                    if c is not None:
                        scored.append((c.rank(), nb))
            scored.sort(key=lambda x: x[0])
            beam = [cut for _, cut in scored[:BEAM_WIDTH]]
            if not scored or (best is not None and scored[0][0] >= best):
                break
            best = scored[0][0]
        return [c for c in results.values() if c is not None] + alternatives

    def variants(self) -> list[Variant]:
        """The derivations of the graph; with a split, each derivation split (``ir.split_axes``), as the
        split's rescaled form depends on the max-shifted form the rules reach."""
        notes: list[str] = []
        found = derive(self.unsplit, cut=notes)
        self.cut.extend(n for n in notes if n not in self.cut)
        if self.split is None:
            return found
        out: list[Variant] = []
        seen: set = set()
        for v in found:
            g = apply_split(v.graph, self.split)
            if g.key() not in seen:
                seen.add(g.key())
                out.append(Variant(g, v.steps + [Step(rule="split_reduction", at=self.split.describe())]))
        return out

    def candidates(self, naive: bool = False, budget: Budget | None = None) -> list[Candidate]:
        if naive:
            v = Variant(self.graph, [])
            c = self.partition(v, tuple(self.layout(v).inner))
            return [c] if c is not None else []
        budget = budget or Budget()
        variants = self.variants()
        self._prefetch = prefetch.start(len(variants), (t for v in variants for t in v.graph.terms()),
                                        lambda send, stop, next_pass: self._helper(variants, send, stop, next_pass))
        if self._prefetch is not None:
            self.tiles.take = self._prefetch.take
        try:
            return self._passes(variants, budget)
        finally:
            if self._prefetch is not None:
                self._prefetch.close()
                self._prefetch = self.tiles.take = None

    def _passes(self, variants: list[Variant], budget: Budget) -> list[Candidate]:
        """The first partition pass over every variant, the operand pass over the best, the dependent
        merges; ranked."""
        out: list[Candidate] = []
        for i, v in enumerate(variants):
            if self._prefetch is not None:
                self._prefetch.reached(i)
            out.extend(self._explore(v, budget))
            if budget.exhausted():
                left = variants[i + 1:]
                if left:
                    names = ", ".join(variant_name(x) for x in left[:3]) + (", ..." if len(left) > 3 else "")
                    self._skipped(budget, f"{len(left)} of {len(variants)} derivation variants not explored "
                                          f"({names})")
                break
        out.sort(key=Candidate.rank)
        # second pass, with what the first left of the budget plus its own share: the best variants again,
        # computed GEMM operands also cut (more cut candidates per variant would crowd other variants out of
        # the first)
        if any(self._has_operand_cuts(c.variant) for c in out[:OPERAND_PASS_VARIANTS]):
            budget.grant(int(budget.work * OPERAND_PASS_SHARE))
        best = [v for v in _best_variants(out, OPERAND_PASS_VARIANTS) if self._has_operand_cuts(v)]
        if not best:  # the best variants have nothing to cut: the best ones that have, if any
            best = _best_variants(out, OPERAND_PASS_VARIANTS, self._has_operand_cuts)
        written = next((v for v in variants if not v.steps), None)
        if (written is not None and self._has_operand_cuts(written) and not any(written is v for v in best)
                and OPERAND_PASS_WRITTEN):
            best.append(written)
        if self._prefetch is not None:
            index = {id(v): i for i, v in enumerate(variants)}
            self._prefetch.next_pass([index[id(v)] for v in best])
        for i, v in enumerate(best):
            if budget.exhausted():
                self._skipped(budget, "computed GEMM operands not tried as cuts of the best variants")
                break
            if self._prefetch is not None:
                self._prefetch.reached(i)
            out.extend(self._explore(v, budget, operands=True))
        out.sort(key=Candidate.rank)
        out.extend(self._dependent_merges(out))
        out.sort(key=Candidate.rank)
        return out

    def _helper(self, variants: list[Variant], send: prefetch.Send, stop: prefetch.Stop,
                next_pass: prefetch.NextPass) -> None:
        """The helper process's work (``prefetch``): each pass's variants from the last back, each kernel
        sent as it is priced, until the search has reached the variant in hand; then the next pass."""
        number, at = 0, len(variants)

        def sent(key: tuple, value: object) -> None:
            if stop(number, at):
                raise prefetch.Met
            send(key, value)

        self._send = self.tiles.send = sent
        listed: Sequence[int] | None = range(len(variants))
        while listed is not None:
            try:
                for at in range(len(listed) - 1, -1, -1):
                    if stop(number, at):
                        break
                    self._explore(variants[listed[at]], Budget(UNBOUNDED_WORK), operands=number > 0)
            except prefetch.Met:
                pass
            number += 1
            listed = next_pass(number)

    def _has_operand_cuts(self, v: Variant) -> bool:
        """``v`` has computed GEMM operands, cut candidates of the second pass only."""
        lay = self.layout(v)
        return len(lay.anchors) > len(lay.primary)

    def _dependent_merges(self, ranked: list[Candidate]) -> list[Candidate]:
        """The best partitions again, a kernel now also merged with one whose output it reads where a
        third kernel reads that output too (a split reduction's chunk maxima feed the chunk's sums and
        the combine): a last pass on a budget of its own, as such merges are too many to try everywhere."""
        budget = Budget(DEPENDENT_MERGE_WORK, "dependent-merge pass")
        out: list[Candidate] = []
        seen: set[tuple[int, tuple[Term, ...]]] = set()
        for c in ranked:
            if len(seen) >= DEPENDENT_MERGE_CANDIDATES:
                break
            if budget.exhausted():
                self._skipped(budget, "dependent kernel merges not tried for the remaining best partitions")
                break
            key = (id(c.variant), c.cut)
            if key in seen or len(c.kernels) < 2:
                continue
            seen.add(key)
            out.extend(self.partitions(c.variant, c.cut, budget=budget, dependent=True)[1:])
        return out


def _best_variants(ranked: list[Candidate], n: int, keep: Callable[[Variant], bool] = lambda v: True) -> list[Variant]:
    """The first ``n`` distinct variants of ranked candidates that ``keep`` accepts. The operand pass walks
    those of the first ``n`` that have computed GEMM operands; where none has, the first ``n`` that have:
    the best first-pass plans of an attention can be a dozen variants differing only where a constant
    sits, none with an operand to cut (QK-norm attention, issue 46), and the pass then did nothing once
    the budget let the first pass reach them all."""
    out: list[Variant] = []
    for c in ranked:
        if len(out) >= n:
            break
        if keep(c.variant) and not any(c.variant is v for v in out):
            out.append(c.variant)
    return out


def merge_key(low: Lowered) -> tuple:
    """What two kernels must share to merge: the loop axis (or none) and the grid axes."""
    return low.stream, tuple(sorted(g.axis for g in low.grid))


ELEMENTWISE_TERMS = ("unary", "binary", "ternary")
"""Term kinds whose value a GEMM operand may be: a cut there materialises the operand, so the GEMM's loop
only loads tiles (warp-specialised, ``-nows`` avoided) and the elementwise work runs once, in its
producer's epilogue or a kernel of its own, instead of on every tile the GEMM loads."""


def _full_inputs(t: Term) -> set[str]:
    """The graph inputs ``t`` reads that span all of its axes. A GEMM operand computed elementwise from two
    or more of them (a GLU's gradient ``dY * U * silu'(G)`` once the backward saves G and U) is a cut
    candidate too: fused, the GEMM loads and combines a full tile of each on every pass over the operand;
    cut, one kernel writes it once. A broadcast factor (a row scale, a norm's weight) is nearly free to
    re-load, so it does not count."""
    full = set(result_axes(t))
    return {u.name for u in subterms([t]) if u.op == "input" and set(u.axes) == full}


def _layout(g: Graph) -> _Layout:
    terms = g.terms()
    outs = {t: n for n, t in g.outputs}
    inner = [t for t in terms if t.op not in ("input", "const", "axis_size") and t not in outs]
    used = {t.name for t in terms if t.op == "input"} | set(outs.values())
    names: dict[Term, str] = {}
    for i, t in enumerate(inner):
        base = g.labels.get(t, f"tmp{i}")
        name, j = base, 1
        while name in used:
            j += 1
            name = f"{base}_{j}"
        used.add(name)
        names[t] = name
    users: dict[Term, set[str]] = {}
    for t in terms:
        for a in t.args:
            users.setdefault(a, set()).add(t.op)
    gemm_only = frozenset(t for t in inner if users.get(t) == {"matmul"})
    computed = {t for t in terms if t.op in ("reduce", "matmul")}
    for t in terms:  # elementwise values of a reduction or contraction
        if t.op in ELEMENTWISE_TERMS and any(a in computed for a in t.args):
            computed.add(t)
    sums = _sums_of_contractions(inner)
    primary = [t for t in inner if t.op in ("reduce", "matmul") or t in sums]
    anchors = [t for t in inner if (t in computed and (t.op in ("reduce", "matmul") or t in gemm_only))
               or (t in gemm_only and t.op in ELEMENTWISE_TERMS and len(_full_inputs(t)) >= 2) or t in sums]
    return _Layout(terms, inner, anchors, names, outs, unguarded_exps(terms), scaled_gemm_operands(terms), gemm_only,
                   primary)


def _sums_of_contractions(inner: list[Term]) -> list[Term]:
    """Sums of contractions (``a @ W + b @ V``, nested), cut candidates where one tile accumulates them
    (``lower.SHARED_ACCUMULATOR``): cut at the sum, a kernel writes it once, where a cut at each
    contraction writes two tensors the next kernel reads and adds."""
    if not lower_module.SHARED_ACCUMULATOR:
        return []
    sums: set[Term] = set()
    for t in inner:  # operands first
        if t.op == "binary" and t.fn == "add" and t.args[0] != t.args[1] \
                and all(a.op == "matmul" or a in sums for a in t.args):
            sums.add(t)
    return [t for t in inner if t in sums]


def _guarded(arg: Term) -> bool:
    """arg is x - max_a(x), possibly scaled by a positive constant (1/sqrt(d) too): exp(arg) <= 1."""
    from pyrunner.rules.registry import strip_positive_scale

    arg = strip_positive_scale(arg)
    if arg.op == "binary" and arg.fn == "sub":
        x, m = arg.args
        return m.op == "reduce" and m.fn == "max" and m.args[0] == x
    return False


def unguarded_exps(terms: Graph | list[Term]) -> int:
    """Exponentials that can overflow: ranked before speed, as correctness comes first."""
    ts = terms.terms() if isinstance(terms, Graph) else terms
    return sum(1 for t in ts if t.op == "unary" and t.fn in ("exp", "exp2") and not _guarded(t.args[0]))


def scaled_gemm_operands(terms: Graph | list[Term]) -> int:
    """GEMM operands scaled by a factor free of the contracted axis: a ranking surcharge.

    Such an operand is rounded to the storage dtype after scaling, for the tensor cores, where the
    scale could be applied to the float32 result instead (``matmul_row_scale_commute``,
    ``matmul_div_commute``). Unscaled attention scores on RMS-normalised Q and K (random graph 0)
    amplified that rounding through exp past the bf16 bound; the pulled-out form was as fast.
    """
    from pyrunner.rules.registry import matmul_div_commute, matmul_row_scale_commute

    ts = terms.terms() if isinstance(terms, Graph) else terms
    return sum(1 for t in ts if t.op == "matmul" and (matmul_row_scale_commute(t) is not None
                                                      or matmul_div_commute(t) is not None))


def _prod(xs: list[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def to_plan(planner: Planner, c: Candidate, naive: bool, cut: list[str] | None = None) -> Plan:
    from pyrunner.ir.graph_json import graph_to_json

    kernels: list[Kernel] = []
    costs: list[KernelCost] = []
    for i, kc in enumerate(c.kernels):
        name = f"k{i}_{kc.low.writes[0]}"
        defaults = {p: kc.est.config[p] for p in kc.kernel.params}
        params = planner.tiles.fitting(kc.kernel, defaults)
        kernels.append(kc.kernel.model_copy(update={"name": name, "params": params, "defaults": defaults}))
        costs.append(KernelCost(kernel=name, flops=kc.est.flops, bytes=kc.est.bytes, time_us=round(kc.est.time_us, 3),
                                bound=kc.est.bound))
    derivation, cert = _certified(planner, c, kernels)
    steps = ([Step(rule="unit_axis", at=u.describe()) for u in planner.units]
             + [Step(rule="merge_axes", at=m.describe()) for m in planner.merges] + derivation)
    for k in kernels:
        for r in k.fused_rules:
            steps.append(Step(rule=r, at=k.name))
    plan = Plan(
        workload=planner.graph.name, dtype=planner.dtype, graph=graph_to_json(planner.source), derivation=steps,
        tensors=c.tensors, kernels=kernels,
        cost=CostEstimate(total_us=round(c.total_us, 3), kernels=costs, launches=len(kernels),
                          model=planner.machine.as_dict()),
        provenance=Provenance(planner="superopt-python" + ("-naive" if naive else ""), version=__version__,
                              graph_hash=graph_hash(planner.source), search_cut=list(cut or [])),
        axis_merges=[AxisMergeSpec(axis=m.axis, parts=list(m.parts), sizes=list(m.sizes)) for m in planner.merges],
        axis_splits=[AxisSplitSpec(axis=s.axis, parts=list(s.parts), sizes=list(s.sizes))
                     for s in ([planner.split] if planner.split else [])],
        axis_units=[AxisUnitSpec(axis=u.axis, inputs=[n for n, _ in u.inputs], positions=[p for _, p in u.inputs])
                    for u in planner.units],
        certificate=cert,
    )
    return with_hash(plan)


def _certified(planner: Planner, c: Candidate, kernels: list[Kernel]) -> tuple[list[Step], Certificate]:
    """The candidate's derivation steps with their certificate fields, and the plan's certificate
    (``rules.certify``): replayed from the graph the derivation started at to the candidate's graph."""
    from pyrunner.rules.certify import certificate, certify_steps
    from pyrunner.rules.terms_table import TermTable

    table = TermTable()
    split = planner.split
    steps, derived = certify_steps(planner.unsplit, c.variant.steps,
                                   (lambda g: apply_split(g, split)) if split is not None else None, table)
    if derived.key() != c.variant.graph.key():
        raise AssertionError(f"certify: the derivation of {planner.graph.name!r} does not give the planned graph")
    cert = certificate(c.variant.graph, [(k.name, kc.low.roots, k.writes) for k, kc in zip(kernels, c.kernels,
                                                                                       strict=True)], table)
    return steps, cert


def _no_plan(planner: Planner, graph: Graph) -> GraphError:
    if any(t.op == "input" for _, t in graph.outputs):
        return GraphError(f"graph {graph.name!r}: an output is an input tensor itself; nothing to compute")
    why = sorted(planner.rejections.items(), key=lambda kv: -kv[1])
    tile = [w for w, _ in why if "does not fit the device" in w]
    return GraphError(f"no feasible plan for graph {graph.name!r} at sizes {graph.sizes}: "
                      + "; ".join((tile or [w for w, _ in why])[:2]))


def _naive_with_unit(graph: Graph, dtype: str, machine) -> list[tuple[Planner, list[Candidate]]]:
    """The naive plan of ``graph`` with its one-sided batched contractions given a row axis of extent 1
    (``ir.unit_axes``), where the plain naive plan has none: such a contraction (decode attention's
    ``Q[b, h, d] @d K[b, h, t, d]``, or its backward's) has no free axis on one operand, so no tile GEMM,
    and one kernel per op leaves no rewrite to sum it otherwise. The unit axis changes no value and no
    byte; without it a graph whose fused plans all fail to build had no fallback (projected decode's
    backward, run 127). Empty when ``graph`` has no such contraction or the widened naive plan does not fit
    either."""
    unit = unit_candidate(graph)
    if unit is None:
        return []
    up = Planner(add_unit(graph, unit), dtype, machine, source=graph, units=(unit,))
    cands = up.candidates(naive=True)
    return [(up, cands)] if cands else []


def search(graph: Graph, dtype: str = "fp16", *, top: int = 1, naive: bool = False,
           calibration: Path | None = None, budget: Budget | None = None, tuning=None,
           device: Device | None = None) -> list[Plan]:
    """The `top` cheapest distinct plans for `graph` (the naive plan with naive=True).

    Without a plan from the search, the naive plan is returned (its provenance
    says so); only a graph whose naive plan does not fit the device has none.
    ``tuning``: the tuning database (``target.tuning.TuningDB``) whose measured times and configs take
    precedence over the model's; None or False: the model alone. The committed database is passed
    explicitly (``target.tuning.committed_tuning()``, as the ``superopt`` command does), so a library
    call's plan does not change when GPU timings are merged. ``device``: the GPU planned for (its fit
    limits and cost model; default ``target.device.DEFAULT_TARGET``).
    """
    unique, aliases = distinct_outputs(graph)
    if aliases:  # outputs that are one value under several names: planned once, stored per name
        plans = search(unique, dtype, top=top, naive=naive, calibration=calibration, budget=budget, tuning=tuning,
                       device=device)
        return [with_aliases(p, graph, aliases) for p in plans]
    machine = calibrate(calibration, Planner, DEFAULT_MACHINE if device is None else machine_for(device))
    planner = Planner(graph, dtype, machine)
    searched = [(planner, planner.candidates(naive=naive, budget=budget))]
    merged, merges = (graph, []) if naive else merge_all(graph)
    if merges:  # the same graph with shared-operand axes merged: bigger GEMM tiles (``ir.merge_axes``)
        mp = Planner(merged, dtype, machine, source=graph, merges=tuple(merges))
        searched.append((mp, mp.candidates(budget=budget)))
    for sp in [] if naive else split_candidates(merged, machine):  # a long reduction over few tiles
        pp = Planner(merged, dtype, machine, source=graph, merges=tuple(merges), split=sp)
        searched.append((pp, pp.candidates(budget=Budget(SPLIT_WORK) if budget is None else budget)))
    unit = None if naive else unit_candidate(graph)
    if unit is not None:  # a batched GEMV given a row axis of extent 1: a tensor-core tile (``ir.unit_axes``)
        widened, wmerges = merge_all(add_unit(graph, unit))
        up = Planner(widened, dtype, machine, source=graph, merges=tuple(wmerges), units=(unit,))
        searched.append((up, up.candidates(budget=budget)))
    fallback = False
    if not any(cands for _, cands in searched) and not naive:
        planner.rejections.clear()
        searched = [(planner, planner.candidates(naive=True))]
        fallback = True
    if not any(cands for _, cands in searched) and (naive or fallback):
        searched = _naive_with_unit(graph, dtype, machine) or searched
    if not any(cands for _, cands in searched):
        raise _no_plan(planner, graph)
    if tuning is True:
        raise TypeError("search(tuning=True): pass the database, e.g. target.tuning.committed_tuning()")
    tuning = tuning or False
    lookahead = max(top, TUNED_LOOKAHEAD) if tuning is not False and tuning.entries else top
    cut: list[str] = []
    for p, _ in searched:
        cut.extend(n for n in p.cut if n not in cut)
    ranked: list[tuple[tuple[int, int], int, Plan]] = []
    spare: list[tuple[Planner, Candidate]] = []
    for p, cands in searched:
        seen: set[tuple] = set()
        for c in cands:
            sig = c.signature()
            if sig in seen:
                continue
            seen.add(sig)
            if len(seen) > lookahead + SPARE_PLANS:
                break
            if len(seen) > lookahead:
                spare.append((p, c))
                continue
            ranked.append(((c.unguarded, c.precision_risks), len(ranked), to_plan(p, c, naive or fallback, cut)))
    bias = 1.0
    if tuning is not False and tuning.entries:
        modelled = [p.cost.total_us for _, _, p in ranked]
        ranked = [(u, i, prefer_measured(p, tuning, machine)) for u, i, p in ranked]
        bias = model_bias([(p.cost.total_us, model) for (_, _, p), model in zip(ranked, modelled, strict=True)
                           if p.cost.model.get("measured")])

    def key(x: tuple) -> tuple:
        (unguarded, risks), i, p = x
        us = p.cost.total_us * (1.0 if p.cost.model.get("measured") else bias)
        return unguarded, round(ranked_us(us, risks), 2), i

    ranked.sort(key=key)
    later = (to_plan(p, c, naive or fallback, cut) for p, c in spare)  # built only if a ranked plan is refused
    return valid_first(itertools.chain((p for _, _, p in ranked), later), top, graph)


def model_bias(pairs: list[tuple[float, float]]) -> float:
    """How far the cost model undershot on this graph: the smallest ratio of measured to modelled
    time over the candidates the tuning database has measured (``(measured, modelled)`` pairs),
    never below 1. Unmeasured candidates are ranked at their modelled time times this, so a plan
    measured at twice its model does not lose to an alternative the same model prices optimistically
    (run 103: the vocabulary softmax's measured 92 us against a three-kernel plan modelled at 78.5,
    which runs the same 58 us statistics kernel twice). A model that overshoots leaves the
    alternatives as priced."""
    ratios = [measured / modelled for measured, modelled in pairs if modelled > 0]
    return max(1.0, min(ratios)) if ratios else 1.0


def valid_first(plans: Iterable[Plan], top: int, graph: Graph) -> list[Plan]:
    """The first ``top`` plans that pass the plan checks the runner applies to a plan file.

    A plan the checks reject is a planner bug; the user gets the next-ranked plan and a warning
    naming the rejected one, rather than a file the runner refuses.
    """
    from pyrunner.plan.validate import check_plan

    out: list[Plan] = []
    errors: list[str] = []
    for p in plans:
        try:
            check_plan(p)
        except PlanError as e:
            errors.append(str(e))
            _log.warning("planner bug: a plan for %r fails the plan checks and is skipped: %s", graph.name, e)
            continue
        out.append(p)
        if len(out) == top:
            break
    if not out:
        raise PlanError(f"every plan found for graph {graph.name!r} fails the plan checks (a planner bug); "
                        f"the first: {errors[0]}")
    return out


TUNED_LOOKAHEAD = 12
"""Distinct plans looked up in the tuning database before the top ones are taken."""
SPARE_PLANS = 4
"""Distinct candidates per searched graph kept past the ranked ones, made into plans only when a ranked
plan fails the plan checks (``valid_first`` then hands out the next one; without a tuning database the
ranked ones are only ``top``, so a refused plan would otherwise leave nothing)."""

SPLIT_WORK = 32_000
"""Partition-search work per split graph (each has its own budget: the unsplit search may spend all of its own;
a quarter of ``MAX_WORK`` before issue 46 raised that). 32k: the held-out decode graphs' split searches finish
(attention_mha_decode_batched spends 31,931, decode_key_bias 28,884) with the plans they had when cut."""
SPLIT_MIN_EXTENT = 1024
"""Shortest reduced axis worth splitting into chunks (each chunk streams at least 128 of it)."""
SPLIT_TILE = 128
SPLIT_TILE_ELEMENTS = SPLIT_TILE * SPLIT_TILE
"""Output elements one block computes, for counting how many blocks the unsplit graph can keep busy (also
counted as 128-wide tiles per axis, so a one-row product's thin tiles count too)."""


def split_candidates(g: Graph, machine: Machine = DEFAULT_MACHINE) -> list[AxisSplit]:
    """Splits worth a search: a long reduced axis of a graph whose outputs give fewer blocks than a
    quarter of the SMs, in the chunk counts that fill the machine (``split_axes.chunk_counts``)."""
    sms = machine.device.sms
    parallel = max(max(-(-_prod([g.sizes[a] for a in result_axes(t)]) // SPLIT_TILE_ELEMENTS),
                       _prod([-(-g.sizes[a] // SPLIT_TILE) for a in result_axes(t)])) for _, t in g.outputs)
    if parallel * 4 > sms:
        return []
    out: list[AxisSplit] = []
    reduced = dict.fromkeys(t.axis for t in g.terms() if t.op in ("reduce", "matmul"))
    for a in reduced:
        if g.sizes[a] < SPLIT_MIN_EXTENT:
            continue
        for c in chunk_counts(g.sizes[a], parallel, sms):
            if split_problem(g, a, c) is None:
                out.append(AxisSplit(a, split_names(g, a), (c, g.sizes[a] // c)))
    return out


MODEL_TOTAL = "model_total_us"
"""Key of ``cost.model`` holding the cost model's own total where ``total_us`` is a tuning-database
measurement (``cost.model["measured"]``): a prediction and a measurement are never one number."""


def prefer_measured(plan: Plan, db, machine: Machine = DEFAULT_MACHINE) -> Plan:
    """The plan at its tuned config with its measured time as the estimate, where ``db`` (a
    ``target.tuning.TuningDB``) has it for ``machine``'s device and backend (an A100 plan never takes a
    time measured on another device, whichever database it is given)."""
    from pyrunner.target.tuning import apply_tuned

    entry = db.lookup(plan, machine.device.name, backend=machine.terms.backend)
    if entry is None:
        return plan
    tuned = apply_tuned(plan, entry, machine.device)
    cost = tuned.cost.model_copy(update={"total_us": round(entry.time_us, 3),
                                         "model": {**tuned.cost.model, "measured": 1.0,
                                                   MODEL_TOTAL: plan.cost.total_us}})
    return with_hash(tuned.model_copy(update={"cost": cost}))


def ranked_plan_configs(graph: Graph, plan: Plan, n: int = 8, calibration: Path | None = None,
                        device: Device | None = None) -> list[dict]:
    """Up to ``n`` whole-plan configs for autotuning, best first by the cost model, from the fitting space.

    Each kernel's configs are ranked on their own (kernels run one after another, so their
    times add), a kernel co-scheduled beside the next (``coschedule.pairings``) among the configs
    whose grid fits the SMs that kernel leaves idle; the i-th whole-plan config takes each kernel's
    i-th best (its last when it has fewer).
    """
    from pyrunner.target.tuning import structure_hash

    original = graph
    graph, aliases = distinct_outputs(graph)
    machine = calibrate(calibration, Planner, DEFAULT_MACHINE if device is None else machine_for(device))
    if plan.axis_merges or plan.axis_splits or plan.axis_units:
        from pyrunner.plan.views import merged_graph, merges_of, splits_of, units_of

        splits = splits_of(plan)
        planner = Planner(merged_graph(plan, graph), plan.dtype, machine, source=graph,
                          merges=tuple(merges_of(plan)), split=splits[0] if splits else None,
                          units=tuple(units_of(plan)))
    else:
        planner = Planner(graph, plan.dtype, machine)
    want = structure_hash(plan)
    naive = plan.provenance.planner.endswith("-naive")
    for c in planner.candidates(naive=naive):
        candidate = to_plan(planner, c, naive)
        if aliases:
            candidate = with_aliases(candidate, original, aliases)
        if len(c.kernels) != len(plan.kernels) or structure_hash(candidate) != want:
            continue
        tb = {t.name: _prod(t.shape) * DTYPE_BYTES[t.dtype] for t in c.tensors}
        pairs = pairings(c.kernels, planner.sizes, {t.name: t for t in c.tensors}, machine)
        beside = {p.ahead: p.idle_sms for p in pairs}  # its grid fits the SMs the next kernel leaves idle
        beside |= {p.ahead + 1: grid_blocks(c.kernels[p.ahead + 1].low, c.kernels[p.ahead + 1].est.config,
                                            planner.sizes) for p in pairs}  # and that kernel's grid stays
        per_kernel = []
        for i, (k, kc) in enumerate(zip(plan.kernels, c.kernels, strict=True)):
            if i in beside:  # co-scheduled: only configs that keep the pair's SM split
                cfgs = [cfg for cfg in ranked_configs(kc.low, k.params, planner.sizes, tb, kc.fit, 10_000, machine)
                        if grid_blocks(kc.low, cfg, planner.sizes) <= beside[i]][:n]
            else:
                cfgs = ranked_configs(kc.low, k.params, planner.sizes, tb, kc.fit, n, machine)
            per_kernel.append((k.name, cfgs or [dict(k.defaults)]))
        width = max(len(cfgs) for _, cfgs in per_kernel)
        out: list[dict] = []
        for i in range(width):
            cfg = {name: cfgs[min(i, len(cfgs) - 1)] for name, cfgs in per_kernel}
            if cfg not in out:
                out.append(cfg)
        return out[:n]
    return []

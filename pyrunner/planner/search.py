"""Search: derivations x kernel partitions x loop structure x tile configs.

1. Derivations: breadth-first saturation of the algebraic rules (bounded),
   each variant remembering the rule applications that produced it.
2. Partitions: which intermediates reach global memory. Reductions and
   contractions are the only cut candidates (elementwise work is always fused
   into a neighbour); every subset of them is tried when there are few,
   small subsets otherwise.
3. Loop structure: for each kernel, every axis it reduces may be streamed
   (``lower.lower``); infeasible structures are dropped.
4. Tile configs: ``cost.best_config`` per kernel, among configs that fit the device
   (``target.fit``); the emitted tuning space keeps only fitting ones. Plans rank by total
   predicted time; ties prefer shorter derivations.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path

from pyrunner import __version__
from pyrunner.errors import GraphError
from pyrunner.ir.graph import Graph, Term, result_axes, show, subterms
from pyrunner.plan.analysis import STAGES_PARAM, THREADS_PARAM, block_param
from pyrunner.plan.schema import (
    CostEstimate,
    GlobalTensor,
    Kernel,
    KernelCost,
    Plan,
    Provenance,
    Step,
    StreamLoop,
    canonical_json,
    with_hash,
)
from pyrunner.planner.calibration import calibrate
from pyrunner.planner.cost import (
    DTYPE_BYTES,
    H200,
    Estimate,
    Machine,
    best_config,
    fitting_space,
    param_space,
    ranked_configs,
)
from pyrunner.planner.lower import Infeasible, Lowered, cone, lower, stream_candidates
from pyrunner.target.fit import FitModel

MAX_VARIANTS = 48
MAX_DEPTH = 6
MAX_EXHAUSTIVE_CUTS = 10


@dataclass
class Variant:
    graph: Graph
    steps: list[Step]


@dataclass
class KernelChoice:
    low: Lowered
    kernel: Kernel
    """The kernel with its full tuning space (defaults: the first values); ``to_plan`` narrows it."""
    fit: FitModel
    est: Estimate


@dataclass
class Candidate:
    variant: Variant
    kernels: list[KernelChoice]
    tensors: list[GlobalTensor]
    total_us: float

    def signature(self) -> tuple:
        """Kernel structure: candidates differing only in algebra that lowers alike count once."""
        def kinds(ops: list) -> tuple[str, ...]:
            return tuple(sorted(op.op for op in ops if op.op in ("load", "gemm", "reduce", "store")))

        return tuple((tuple(result_axes(k.low.root)), k.low.stream, kinds(k.low.prologue), kinds(k.low.body),
                      kinds(k.low.epilogue), tuple(sorted(k.est.config.items()))) for k in self.kernels)


def derive(g: Graph) -> list[Variant]:
    """All graphs reachable by the algebraic rules (bounded), shortest derivation first."""
    from pyrunner.rules.registry import RULES, rewrites

    algebraic = [r for r in RULES.values() if r.kind == "algebraic"]
    variants = [Variant(g, [])]
    seen = {g.key()}
    frontier = [variants[0]]
    for _ in range(MAX_DEPTH):
        nxt: list[Variant] = []
        for v in frontier:
            for rule in algebraic:
                for g2, matched in rewrites(v.graph, rule):
                    if g2.key() in seen or len(variants) >= MAX_VARIANTS:
                        continue
                    seen.add(g2.key())
                    nv = Variant(g2, v.steps + [Step(rule=rule.name, at=_short(show(matched)))])
                    variants.append(nv)
                    nxt.append(nv)
        frontier = nxt
        if not frontier:
            break
    return variants


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Planner:
    """Plans one graph at one dtype; caches kernel lowerings across partitions."""

    def __init__(self, graph: Graph, dtype: str, machine: Machine = H200) -> None:
        self.graph = graph
        self.dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)
        if self.dtype not in ("float16", "bfloat16"):
            raise GraphError(f"unsupported dtype {dtype!r}; use fp16 or bf16")
        self.machine = machine
        self.sizes = graph.sizes
        self._cache: dict[tuple, KernelChoice | None] = {}
        self.rejections: dict[str, int] = {}  # why candidate kernels were dropped, for the error message

    def _reject(self, why: str) -> None:
        self.rejections[why] = self.rejections.get(why, 0) + 1

    # --- tensors --------------------------------------------------------------
    def _tensor(self, name: str, t: Term, role: str) -> GlobalTensor:
        axes = list(result_axes(t))
        dtype = self.dtype if role != "intermediate" else "float32"
        return GlobalTensor(name=name, axes=axes, shape=[self.sizes[a] for a in axes], dtype=dtype, role=role)

    def _kernel(self, root: Term, boundary: dict[Term, str], tensors: dict[str, GlobalTensor], labels: dict[Term, str],
                out_name: str) -> KernelChoice | None:
        relevant = frozenset(b for b in subterms([root]) if b in boundary and b is not root)
        key = (root, relevant, out_name, tuple(sorted((boundary[b], tensors[boundary[b]].dtype) for b in relevant)))
        if key in self._cache:
            return self._cache[key]
        dtypes = {n: t.dtype for n, t in tensors.items()}
        nbytes = {n: DTYPE_BYTES[t.dtype] * _prod(t.shape) for n, t in tensors.items()}
        best: KernelChoice | None = None
        terms = cone(root, boundary)
        for s in stream_candidates(root, terms):
            try:
                low = lower(root, boundary, dtypes, self.sizes, self.dtype, s, labels, out_name)
            except Infeasible as e:
                self._reject(str(e))
                continue
            kernel = kernel_of(low, out_name, param_space(low, self.sizes))
            fit = FitModel(kernel, self.sizes, self.machine.device)
            est = best_config(low, kernel.params, self.sizes, nbytes, fit, self.machine)
            if est is None:
                self._reject(f"no tile configuration of the {show(root)[:60]} kernel fits the device: "
                             "tile extents must divide the axes, and tensor-core tiles need multiples of 16x8")
                continue
            if best is None or est.time_us < best.est.time_us:
                best = KernelChoice(low, kernel, fit, est)
        self._cache[key] = best
        return best

    def partition(self, v: Variant, cut: tuple[Term, ...]) -> Candidate | None:
        labels = dict(v.graph.labels)
        tensors: dict[str, GlobalTensor] = {}
        boundary: dict[Term, str] = {}
        for t in v.graph.inputs():
            tensors[t.name] = self._tensor(t.name, t, "input")
            boundary[t] = t.name
        used = set(tensors)
        out_terms = {t: n for n, t in v.graph.outputs}
        for i, t in enumerate(cut):
            base = labels.get(t, f"tmp{i}")
            name = base
            j = 1
            while name in used or name in out_terms.values():
                j += 1
                name = f"{base}_{j}"
            used.add(name)
            boundary[t] = name
            tensors[name] = self._tensor(name, t, "intermediate")
        for n, t in v.graph.outputs:
            if t.op == "input":
                return None
            boundary[t] = n
            tensors[n] = self._tensor(n, t, "output")
        order = [t for t in v.graph.terms() if t in boundary and t.op != "input"]
        kernels: list[KernelChoice] = []
        consumed: set[Term] = set()
        for t in order:
            kc = self._kernel(t, boundary, tensors, labels, boundary[t])
            if kc is None:
                return None
            kernels.append(kc)
            consumed |= {x for x in cone(t, boundary) if x is not t and x in boundary}
        if any(t not in consumed for t in cut):
            return None
        total = sum(k.est.time_us for k in kernels)
        return Candidate(v, kernels, list(tensors.values()), total)

    def cuts(self, v: Variant, naive: bool) -> list[tuple[Term, ...]]:
        outs = {t for _, t in v.graph.outputs}
        inner = [t for t in v.graph.terms() if t.op not in ("input", "const", "axis_size") and t not in outs]
        if naive:
            return [tuple(inner)]
        anchors = [t for t in inner if t.op in ("reduce", "matmul")]
        if len(anchors) <= MAX_EXHAUSTIVE_CUTS:
            return [c for r in range(len(anchors) + 1) for c in itertools.combinations(anchors, r)]
        return [c for r in range(3) for c in itertools.combinations(anchors, r)]

    def candidates(self, naive: bool = False) -> list[Candidate]:
        variants = [Variant(self.graph, [])] if naive else derive(self.graph)
        out: list[Candidate] = []
        for v in variants:
            for cut in self.cuts(v, naive):
                c = self.partition(v, cut)
                if c is not None:
                    out.append(c)
        out.sort(key=lambda c: (unguarded_exps(c.variant.graph), round(c.total_us, 2), len(c.variant.steps),
                                len(c.kernels)))
        return out


def _guarded(arg: Term) -> bool:
    """arg is x - max_a(x), possibly scaled by a positive constant: exp(arg) <= 1."""
    if arg.op == "binary" and arg.fn == "mul":
        a, b = arg.args
        if b.op == "const" and b.value > 0:
            return _guarded(a)
        if a.op == "const" and a.value > 0:
            return _guarded(b)
        return False
    if arg.op == "binary" and arg.fn == "sub":
        x, m = arg.args
        return m.op == "reduce" and m.fn == "max" and m.args[0] == x
    return False


def unguarded_exps(g: Graph) -> int:
    """Exponentials that can overflow: ranked before speed, as correctness comes first."""
    return sum(1 for t in g.terms() if t.op == "unary" and t.fn in ("exp", "exp2") and not _guarded(t.args[0]))


def _prod(xs: list[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def graph_hash(g: Graph) -> str:
    from pyrunner.ir.graph_json import graph_to_json

    return hashlib.sha256(canonical_json(graph_to_json(g)).encode()).hexdigest()[:16]


def to_plan(planner: Planner, c: Candidate, naive: bool) -> Plan:
    from pyrunner.ir.graph_json import graph_to_json

    kernels: list[Kernel] = []
    costs: list[KernelCost] = []
    for i, kc in enumerate(c.kernels):
        name = f"k{i}_{kc.low.writes[0]}"
        defaults = {p: kc.est.config[p] for p in kc.kernel.params}
        params = fitting_space(kc.kernel.params, defaults, lambda cfg, fit=kc.fit: fit.why_not(cfg) is None)
        kernels.append(kc.kernel.model_copy(update={"name": name, "params": params, "defaults": defaults}))
        costs.append(KernelCost(kernel=name, flops=kc.est.flops, bytes=kc.est.bytes, time_us=round(kc.est.time_us, 3),
                                bound=kc.est.bound))
    steps = list(c.variant.steps)
    for k in kernels:
        for r in k.fused_rules:
            steps.append(Step(rule=r, at=k.name))
    plan = Plan(
        workload=planner.graph.name, dtype=planner.dtype, graph=graph_to_json(planner.graph), derivation=steps,
        tensors=c.tensors, kernels=kernels,
        cost=CostEstimate(total_us=round(c.total_us, 3), kernels=costs, launches=len(kernels),
                          model=planner.machine.as_dict()),
        provenance=Provenance(planner="superopt-python" + ("-naive" if naive else ""), version=__version__,
                              graph_hash=graph_hash(planner.graph)),
    )
    return with_hash(plan)


def kernel_of(low: Lowered, name: str, space: dict[str, list[int]]) -> Kernel:
    """The plan kernel of a lowering, with tuning space ``space`` (defaults: each first value)."""
    loop = None
    if low.stream is not None:
        loop = StreamLoop(axis=low.stream, block=block_param(low.stream), stages=STAGES_PARAM, visible=low.visible)
    return Kernel(
        name=name, grid=low.grid, loop=loop, threads=THREADS_PARAM, buffers=low.buffers,
        prologue=low.prologue, body=low.body, epilogue=low.epilogue, reads=low.reads, writes=low.writes,
        params=space, defaults={p: v[0] for p, v in space.items()}, fused_rules=list(low.rules),
    )


def search(graph: Graph, dtype: str = "fp16", *, top: int = 1, naive: bool = False,
           calibration: Path | None = None, tuning=None) -> list[Plan]:
    """The `top` cheapest distinct plans for `graph` (the naive plan with naive=True).

    ``tuning``: the tuning database whose measured times and configs take precedence over the
    model's (default: the committed one of the target device; False: the model alone).
    """
    machine = calibrate(calibration, Planner)
    planner = Planner(graph, dtype, machine)
    cands = planner.candidates(naive=naive)
    if not cands:
        why = sorted(planner.rejections.items(), key=lambda kv: -kv[1])[:2]
        raise GraphError(f"no feasible plan for graph {graph.name!r} at sizes {graph.sizes}: "
                         + "; ".join(w for w, _ in why))
    if tuning is not False:
        from pyrunner.target.tuning import TuningDB

        tuning = TuningDB.for_device() if tuning is None or tuning is True else tuning
    lookahead = max(top, TUNED_LOOKAHEAD) if tuning is not False and tuning.entries else top
    ranked: list[tuple[int, int, Plan]] = []
    seen: set[tuple] = set()
    for c in cands:
        sig = c.signature()
        if sig in seen:
            continue
        seen.add(sig)
        ranked.append((unguarded_exps(c.variant.graph), len(ranked), to_plan(planner, c, naive)))
        if len(ranked) >= lookahead:
            break
    if tuning is not False and tuning.entries:
        ranked = [(u, i, prefer_measured(p, tuning)) for u, i, p in ranked]
    ranked.sort(key=lambda x: (x[0], round(x[2].cost.total_us, 2), x[1]))
    return [p for _, _, p in ranked[:top]]


TUNED_LOOKAHEAD = 6
"""Distinct plans looked up in the tuning database before the top ones are taken."""


def prefer_measured(plan: Plan, db=None) -> Plan:
    """The plan at its tuned config with its measured time as the estimate, where the database has it."""
    from pyrunner.target.tuning import TuningDB, apply_tuned

    db = TuningDB.for_device() if db is None or db is True else db
    entry = db.lookup(plan)
    if entry is None:
        return plan
    tuned = apply_tuned(plan, entry)
    cost = tuned.cost.model_copy(update={"total_us": round(entry.time_us, 3),
                                         "model": {**tuned.cost.model, "measured": 1.0}})
    return with_hash(tuned.model_copy(update={"cost": cost}))


def ranked_plan_configs(graph: Graph, plan: Plan, n: int = 8, calibration: Path | None = None) -> list[dict]:
    """Up to ``n`` whole-plan configs for autotuning, best first by the cost model, from the fitting space.

    Each kernel's configs are ranked on their own (kernels run one after another, so their
    times add); the i-th whole-plan config takes each kernel's i-th best (its last when it has fewer).
    """
    from pyrunner.target.tuning import structure_hash

    machine = calibrate(calibration, Planner)
    planner = Planner(graph, plan.dtype, machine)
    want = structure_hash(plan)
    naive = plan.provenance.planner.endswith("-naive")
    for c in planner.candidates(naive=naive):
        if len(c.kernels) != len(plan.kernels) or structure_hash(to_plan(planner, c, naive)) != want:
            continue
        tb = {t.name: _prod(t.shape) * DTYPE_BYTES[t.dtype] for t in c.tensors}
        per_kernel = []
        for k, kc in zip(plan.kernels, c.kernels, strict=True):
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

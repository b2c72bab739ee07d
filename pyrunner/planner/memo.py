"""Tile-config search memoised over kernels that differ only in names.

A chain of 1000 matmuls lowers to 1000 kernels with the same structure over
different axes and tensors; the tile search (hundreds of configs each) need run
once. The key is the lowered kernel with every axis, tensor and buffer name
replaced by its order of first appearance, plus the axis sizes and tensor bytes
the cost model reads; the cached choice is translated back to this kernel's names.
A kernel whose most lenient config already exceeds shared memory or registers is
rejected without searching (no smaller tile or more threads exist to try).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pydantic_core import to_json

from pyrunner.plan.analysis import STAGES_PARAM, THREADS_PARAM, AxisRole, block_param
from pyrunner.plan.schema import Kernel, StreamLoop
from pyrunner.planner.cost import (
    Estimate,
    LoweringFacts,
    Machine,
    Verdict,
    best_config,
    config_verdicts,
    fitting_space,
    tile_terms_key,
)
from pyrunner.planner.lower import Lowered
from pyrunner.planner.space import param_space
from pyrunner.target.fit import FitModel

BLOCK_PREFIX = block_param("")


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


def _renamer(names: set[str], sizes: dict[str, int], tok: dict[str, str], *,
             strict: bool) -> tuple[Callable[[object], object], Callable[[str], str]]:
    """A walk that replaces every name in ``names`` by its order of first appearance (``tok``), so two
    kernels equal up to renaming give one key, and that renaming of one string (for text); ``strict``:
    dict keys renamed too and an unknown type raises (the fit key must never hold an object compared by
    identity)."""

    plain = {int, float, bool, type(None)}
    cut = len(BLOCK_PREFIX)
    blocks = {BLOCK_PREFIX + a for a in sizes}  # the block parameter of every axis

    def name(x: str) -> str:
        if x in blocks:
            return BLOCK_PREFIX + name(x[cut:])
        if x not in names:
            return x
        got = tok.get(x)
        if got is None:
            got = tok[x] = f"#{len(tok)}"
        return got

    def walk(x: object) -> object:
        # the common exact types first, leaves without a call (the walk runs over every op of every
        # kernel lowered: model dumps, dicts of dicts of strings)
        kind = type(x)
        if kind is dict:
            return tuple([(walk(k) if strict else k,
                           v if type(v) in plain else name(v) if type(v) is str else walk(v)) for k, v in x.items()])
        if kind is tuple or kind is list:
            return tuple([v if type(v) in plain else name(v) if type(v) is str else walk(v) for v in x])
        if kind in plain:
            return x
        if isinstance(x, str):
            return name(x)
        if isinstance(x, AxisRole):
            return walk((x.axis, x.kind, x.block, x.size))
        if isinstance(x, dict):
            return tuple(((walk(k) if strict else k), walk(v)) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return tuple(walk(v) for v in x)
        if strict and not (x is None or isinstance(x, (int, float))):
            raise TypeError(f"_fit_key: {type(x).__name__} not tokenised")
        return x

    return walk, name


def _tokenise(low: Lowered, sizes: dict[str, int], nbytes: dict[str, int]) -> tuple[tuple, dict[str, str]]:
    names = set(sizes) | {b.name for b in low.buffers} | set(low.reads) | set(low.writes)
    tok: dict[str, str] = {}
    walk, name = _renamer(names, sizes, tok, strict=False)

    head = walk(([(g.axis, g.block) for g in low.grid], low.stream, low.tiled, sorted(low.full.items())))
    # the buffers and ops as JSON text (serialised in Rust), every string value renamed in order of
    # appearance as the walk would (object keys are field names, never renamed): a walk over their
    # dumps cost more than the tile search it saved on the kernels lowered once
    text = to_json([low.buffers, low.prologue, low.body, low.epilogue]).decode()
    if "\\" in text:  # an escaped character in a string (never in a lowering of validated names): the walk
        ops: object = walk([[x.model_dump() for x in xs] for xs in (low.buffers, low.prologue, low.body,
                                                                     low.epilogue)])
    else:  # strings are the odd pieces between quotes; a key is followed by a colon
        parts = text.split('"')
        renamed = names | {BLOCK_PREFIX + a for a in sizes}  # what ``name`` changes
        for i in range(1, len(parts) - 1, 2):
            if parts[i] in renamed and parts[i + 1][:1] != ":":
                parts[i] = name(parts[i])
        ops = '"'.join(parts)
    tail = walk((
        low.reads, low.writes,
        [(ld.tensor, ld.axes, ld.in_loop) for ld in low.loads],
        [(g.m_axis, g.n_axis, g.k_axis, g.streamed, g.flops, g.a_in_registers) for g in low.gemms],
    ))
    structure = (head, ops, tail)
    measures = tuple((t, sizes.get(n), nbytes.get(n)) for n, t in tok.items())
    return (structure, measures, low.ew_by_axes), tok


def _fit_key(fit: FitModel, space: dict[str, list[int]], sizes: dict[str, int]) -> tuple:
    """What ``cost.config_verdicts`` reads of a kernel: the fit model's config-independent summary
    (never its ops: two kernels that differ in an elementwise op but hold the same tiles, fragments
    and GEMMs get the same verdicts) and the space in the order the search walks it, names replaced
    by their order of first appearance, with the extent behind every axis."""
    names = set(sizes) | {b.name for b in fit.kernel.buffers}
    tok: dict[str, str] = {}
    walk, _ = _renamer(names, sizes, tok, strict=True)

    structure = walk((
        [(p, space[p]) for p in sorted(space)],
        fit.roles, fit._stages, fit.kernel.threads, fit.shared, fit._frag_specs, fit._peak_sets, fit.reductions,
        fit.acc_row_reductions, fit.gemms, fit.asynchronous, fit.chain,
        getattr(fit, "chain_gemms", None), getattr(fit, "loaded_axes", None), getattr(fit, "store_tiles", None),
    ))
    return structure, tuple((t, sizes.get(n)) for n, t in tok.items())


def _rename_params(d: dict, mapping: dict[str, str]) -> dict:
    out = {}
    for p, v in d.items():
        if p.startswith(BLOCK_PREFIX) and p[len(BLOCK_PREFIX):] in mapping:
            p = BLOCK_PREFIX + mapping[p[len(BLOCK_PREFIX):]]
        out[p] = v
    return out


def lenient(space: dict[str, list[int]]) -> dict[str, int]:
    """The config with the least shared memory and registers per thread: smallest tiles, most threads."""
    return {p: (max(v) if p == THREADS_PARAM else min(v)) for p, v in space.items()}


def hopeless(fit: FitModel, space: dict[str, list[int]]) -> str | None:
    """Why no config can fit, judged at the most lenient config (resources only); else None."""
    why = fit.why_not(lenient(space))
    if why and ("shared memory" in why or "registers per thread" in why):
        return why
    return None


def _smallest_why(fit: FitModel, space: dict[str, list[int]]) -> str:
    """Why the smallest tiles do not fit, with the fewest threads (the easiest to split a GEMM among)."""
    cfg = {p: min(v) for p, v in space.items()}
    return fit.why_not(cfg) or fit.why_not(lenient(space)) or "no tile extent divides the axes"


class TileMemo:
    """``cost.best_config`` with the memo; one per planner (one machine, one set of sizes)."""

    def __init__(self, sizes: dict[str, int], machine: Machine) -> None:
        self.sizes, self.machine = sizes, machine
        self._memo: dict[tuple, tuple[Estimate | None, str | None]] = {}
        self._spaces: dict[tuple, dict[str, list[int]]] = {}
        self._keys: dict[int, tuple[tuple, dict[str, str]]] = {}
        self._verdict_memo: dict[tuple, list[Verdict]] = {}
        self._tile_terms: dict[tuple, dict] = {}
        self.send: Callable[[tuple, object], None] | None = None  # the prefetch helper's: entries it makes
        self.take: Callable[[tuple], object | None] | None = None  # the search's: entries the helper made

    def best(self, low: Lowered, name: str,
             nbytes: dict[str, int]) -> tuple[Kernel, Estimate | None, str | None, FitModel | None]:
        """The kernel, its cheapest fitting config's estimate (None if none fits) and, then, why not; and
        the kernel's fit model where the search built one (the caller keeps it rather than build it again)."""
        kernel = kernel_of(low, name, param_space(low, self.sizes, self.machine.device.sms))
        key, tok = _tokenise(low, self.sizes, nbytes)
        self._keys[id(kernel)] = key, tok
        fit = None
        if key not in self._memo and self.take is not None:
            got = self.take(("tile", key))
            if got is not None:
                self._memo[key] = got
        if key not in self._memo:
            fit = FitModel(kernel, self.sizes, self.machine.device)
            why = hopeless(fit, kernel.params)
            est = None if why else best_config(low, kernel.params, self.sizes, nbytes, fit, self.machine,
                                                self._verdicts(fit, kernel.params), self._facts(low, nbytes))
            if est is None:
                self._memo[key] = None, why or _smallest_why(fit, kernel.params)
            else:
                self._memo[key] = replace(est, config=_rename_params(est.config, tok)), None
            if self.send is not None:
                self.send(("tile", key), self._memo[key])
        est, why = self._memo[key]
        if est is not None:
            back = {t: n for n, t in tok.items()}
            est = replace(est, config=_rename_params(est.config, back))
        return kernel, est, why, fit

    def _facts(self, low: Lowered, nbytes: dict[str, int]) -> LoweringFacts:
        """``cost.LoweringFacts`` of a lowering, sharing its per-tile terms with every lowering of
        this planner that differs from it only in elementwise work (``cost.tile_terms_key``)."""
        facts = LoweringFacts.of(low, nbytes, self.machine)
        shared = self._tile_terms.setdefault(tile_terms_key(low, facts, nbytes), {})
        return replace(facts, shared_terms=shared)

    def _verdicts(self, fit: FitModel, space: dict[str, list[int]]) -> list[Verdict]:
        """``cost.config_verdicts``, shared by kernels whose fit models agree (``_fit_key``)."""
        key = _fit_key(fit, space, self.sizes)
        got = self._verdict_memo.get(key)
        if got is None and self.take is not None:
            got = self.take(("verdicts", key))
        if got is None:
            got = config_verdicts(space, fit)
            if self.send is not None:
                self.send(("verdicts", key), got)
        self._verdict_memo[key] = got
        return got

    def fitting(self, kernel: Kernel, defaults: dict[str, int]) -> dict[str, list[int]]:
        """``cost.fitting_space`` of a kernel this memo chose a config for, shared by isomorphic kernels."""
        if id(kernel) not in self._keys:  # priced in the prefetch helper (``prefetch``): not memoised here
            fit = FitModel(kernel, self.sizes, self.machine.device)
            return fitting_space(kernel.params, defaults, lambda cfg: fit.why_not(cfg) is None)
        key, tok = self._keys[id(kernel)]
        skey = (key, tuple(sorted(_rename_params(defaults, tok).items())))
        if skey not in self._spaces:
            fit = FitModel(kernel, self.sizes, self.machine.device)
            space = fitting_space(kernel.params, defaults, lambda cfg: fit.why_not(cfg) is None)
            self._spaces[skey] = _rename_params(space, tok)
        back = {t: n for n, t in tok.items()}
        return _rename_params(self._spaces[skey], back)

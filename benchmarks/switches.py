"""Planner switches a benchmark may flip in its own process: ``NAME=1`` / ``NAME=0`` on its command line.

A switch is a module-level boolean the planner (and, for ``ASYNC_PARTIAL_TILES``, the renderer) reads each time
it decides (``target.fit.ASYNC_PARTIAL_TILES``, ``planner.cost.PHASED_BLOCKS``): the first is on since runs
132-133, the second since runs 171-174. ``emit.FOLD_EXP_SHIFT`` is the renderer's alone (the softmax
shift's FMA form, off since run 134). ``search.OPERAND_PASS_WRITTEN`` (off until a GPU sweep decides) lets the
operand pass cut the graph as written too; ``lower.SHARED_ACCUMULATOR`` (on since run 165) accumulates a sum of
contractions over the loop axis in one tile; ``merge.SHARED_INTERMEDIATES`` (off until a GPU sweep decides) lets
a kernel store an intermediate it reads for a third kernel, computing it itself; ``partition.TAIL_CUTS`` (on)
lets the frontend cut a region after its contractions where the pieces model cheaper (the regions, not any
plan, change: a corpus graph is planned alike either way). Setting one here sets the
attribute and empties the process-wide caches keyed without it: the frontend's region plans
(``frontend.region_plans._PLANS``) and derivations (``frontend.training._DERIVED``: the saves are chosen by the
cost model). Everything else the search memoises lives in one search (``planner.memo.TileMemo``, the fit
models), and the committed tuning database is read afresh by each ``committed_tuning()`` call, so a switch
flipped between two searches of one process gives the plan a fresh process with that setting gives
(tests/test_switch_cases.py).
Never read from the environment: only a benchmark option sets a switch.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyrunner.switches import SWITCHES, get, put  # the registry (reading and setting one) live in the package

GUARD_SWITCHES = frozenset({"fit.ASYNC_PARTIAL_TILES"})
"""Switches the renderer reads only in the guard that picks a kernel's asynchronous form: a source that differs
in that guard alone builds the same kernels where the default config decides it alike (``switch_cases``).
``emit.FOLD_EXP_SHIFT`` changes the exponent's arithmetic itself, so any difference in its source counts."""

ALIASES = {
    **{k.lower(): k for k in SWITCHES},
    **{f"{m.removeprefix('pyrunner.')}.{a}".lower(): k for k, (m, a) in SWITCHES.items()},
    **{f"{m}.{a}".lower(): k for k, (m, a) in SWITCHES.items()},
    **{a.lower(): k for k, (_, a) in SWITCHES.items()},
}
"""Accepted spellings (case-insensitive): ``fit.ASYNC_PARTIAL_TILES``, ``target.fit.ASYNC_PARTIAL_TILES``,
``pyrunner.target.fit.ASYNC_PARTIAL_TILES``, ``async_partial_tiles`` (likewise for ``PHASED_BLOCKS``)."""

VALUES = {"1": True, "on": True, "true": True, "0": False, "off": False, "false": False}
CACHES = (("pyrunner.frontend.region_plans", "_PLANS"), ("pyrunner.frontend.training", "_DERIVED"))
"""Process-wide caches keyed without the switches: emptied whenever one is set."""


def resolve(name: str) -> str:
    """The switch ``name`` spells; ``ValueError`` naming the known ones."""
    key = ALIASES.get(name.strip().lower())
    if key is None:
        raise ValueError(f"unknown switch {name!r}: choose from {', '.join(SWITCHES)}")
    return key


def parse(spec: str) -> tuple[str, bool]:
    """``NAME=1`` / ``NAME=0`` (also on/off, true/false; a bare ``NAME`` is on) -> (switch, value)."""
    name, eq, value = spec.partition("=")
    if eq and value.strip().lower() not in VALUES:
        raise ValueError(f"switch {spec!r}: the value must be one of {', '.join(VALUES)}")
    return resolve(name), VALUES[value.strip().lower()] if eq else True


def parse_all(specs: list[str] | None) -> dict[str, bool]:
    """Several ``--switch`` options (each may hold comma-separated specs) -> {switch: value}."""
    out: dict[str, bool] = {}
    for spec in specs or []:
        for part in spec.split(","):
            if part.strip():
                k, v = parse(part)
                out[k] = v
    return out


def clear_caches() -> None:
    """Empty the process-wide caches keyed without the switches (only those already imported)."""
    for module, attr in CACHES:
        if module in sys.modules:
            getattr(sys.modules[module], attr).clear()


def apply(settings: dict[str, bool] | dict[str, Probe]) -> None:
    """Set each switch (for the rest of the process) and empty the caches keyed without them."""
    for key, value in settings.items():
        put(key, value)
    clear_caches()


@contextmanager
def switched(settings: dict[str, bool]) -> Iterator[None]:
    """The switches set inside the block, their earlier values back after it (caches emptied both times)."""
    before = {k: get(k) for k in settings}
    apply(settings)
    try:
        yield
    finally:
        apply(before)


class Probe:
    """Stands in for a switch set off and records whether a decision read it. Each switch is read last in
    its condition (``fit.FitModel.renders_async``: only for a partial tile; ``cost``: only for a block
    alone on its SM), so a search that never read its probe takes every branch it would take with the
    switch on, and would find the same plan: ``switch_cases.py`` then skips that second search."""

    def __init__(self) -> None:
        self.read = False

    def __bool__(self) -> bool:
        self.read = True
        return False


@contextmanager
def probed(keys: list[str]) -> Iterator[dict[str, Probe]]:
    """The switches of ``keys`` off, each a ``Probe`` inside the block; their earlier values back after it."""
    before = {k: get(k) for k in keys}
    probes = {k: Probe() for k in keys}
    apply(probes)  # type: ignore[arg-type] - a Probe is falsy, as the switch off is
    try:
        yield probes
    finally:
        apply(before)


def label(settings: dict[str, bool]) -> str:
    """``fit.ASYNC_PARTIAL_TILES=1,cost.PHASED_BLOCKS=0`` (empty: the defaults)."""
    return ",".join(f"{k}={int(v)}" for k, v in settings.items())

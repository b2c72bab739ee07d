"""Save or recompute: which forward contractions a backward graph reads from memory, by the cost model.

``ir.grad.derive`` saves what is free or nearly so (the forward outputs, a softmax's log-sum-exp, the
contraction of the D identity) and recomputes the rest from the inputs. Recomputing a contraction
costs its GEMM again in the backward; saving it costs the forward a write and the backward a read
(attention's scores, t_q x t_kv per head, are far dearer to store than to recompute; a GLU's two
projections usually the reverse). The choice is the planner's: each contraction the backward
recomputes (``Backward.recomputed``) is saved when the searched forward-plus-backward plans predict
less time with it saved: every subset of a few, greedily in graph order beyond (deterministic: no
clock decides).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

from pyrunner.ir.grad import Backward, derive
from pyrunner.ir.graph import Graph, Term
from pyrunner.planner.search import search
from pyrunner.target.device import Device


def predicted_us(bwd: Backward, dtype: str, calibration: Path | None = None, device: Device | None = None) -> float:
    """Predicted time of the best forward-with-saves plan plus the best backward plan on ``device``."""
    fwd = search(bwd.forward, dtype, top=1, calibration=calibration, device=device)[0]
    back = search(bwd.graph, dtype, top=1, calibration=calibration, device=device)[0]
    return fwd.cost.total_us + back.cost.total_us


EXHAUSTIVE_SAVES = 3
"""Up to this many recomputed contractions every subset of them is costed (at most 8 pairs of searches);
beyond it, greedy. Greedy alone missed RMSNormMLP's pair: saving either projection alone costs the
forward a write and spares the backward nothing (it still recomputes the normalised input for the
other), saving both spares it the norm and both GEMMs."""


def choose_saves(graph: Graph, dtype: str, calibration: Path | None = None, device: Device | None = None,
                 wrt: Iterable[str] | None = None) -> Backward:
    """The backward of ``graph`` with respect to the inputs ``wrt`` (default: all) whose saved contractions the
    cost model of ``device`` (default: the search's) prefers (see the module doc)."""
    best = derive(graph, wrt=wrt)
    if not best.recomputed:
        return best
    cost = predicted_us(best, dtype, calibration, device)
    terms = best.recomputed
    if len(terms) <= EXHAUSTIVE_SAVES:  # every subset, smallest first: a tie keeps the fewer saves
        for r in range(1, len(terms) + 1):
            for kept in itertools.combinations(terms, r):
                trial = derive(graph, save=kept, wrt=wrt)
                c = predicted_us(trial, dtype, calibration, device)
                if c < cost:
                    best, cost = trial, c
        return best
    kept: tuple[Term, ...] = ()
    for t in terms:
        trial = derive(graph, save=kept + (t,), wrt=wrt)
        c = predicted_us(trial, dtype, calibration, device)
        if c < cost:
            best, cost, kept = trial, c, kept + (t,)
    return best

"""The inputs a backward plan is checked on: forward inputs and cotangents drawn, saved tensors computed.

Why: a backward graph's saved tensors (a softmax's log-sum-exp, the forward output) are functions of the
forward inputs. Drawn on their own they do not belong to the scores the backward recomputes, and
``exp(S - LSE)`` leaves the dtype on an outlier draw where a correct plan never would (issue 44). Every
check that draws inputs for a plan (the CPU executor check, the GPU check, ``pyrunner run``,
``kernel_profile``) takes its draws through ``plan_draws``: for a plan whose provenance records its
derivation (``plan.backward_of``) each draw makes the forward's inputs of its kind, computes the saved
tensors from them with the forward's float64 reference, and draws the cotangents; any other plan keeps
its draws as they are. ``linked_inputs`` is the one place the three are put together (``run.grad_check``'s
``backward_inputs`` calls it too; the training path's checks take ``plan_draws`` like any other).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pyrunner.ir.reference import evaluate
from pyrunner.run.draws import Draw

if TYPE_CHECKING:  # pragma: no cover
    from pyrunner.ir.grad import Backward
    from pyrunner.ir.graph import Graph
    from pyrunner.plan.schema import Plan

ForwardValues = Callable[["Graph", dict[str, np.ndarray]], Mapping[str, np.ndarray]]
"""The forward graph's float64 outputs on given inputs (numpy's ``evaluate``, or PyTorch on a device)."""


def numpy_forward(graph: Graph, inputs: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    return evaluate(graph, inputs)


def torch_forward(device: str) -> ForwardValues:
    """The forward's float64 outputs by PyTorch on ``device`` (numpy takes minutes for attention's scores at
    full shapes), back as numpy arrays."""

    def run(graph: Graph, inputs: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        import torch

        from pyrunner.run.baselines import torch_fn

        with torch.no_grad():
            outs = torch_fn(graph)(**{k: torch.from_numpy(np.asarray(v, dtype=np.float64)).to(device)
                                      for k, v in inputs.items()})
        return {n: v.double().cpu().numpy() for n, v in outs.items()}

    return run


def linked_inputs(bwd: Backward, graph: Graph, seed: int, make: Callable[[Graph, int], dict[str, np.ndarray]],
                  forward: ForwardValues = numpy_forward) -> dict[str, np.ndarray]:
    """Inputs of the backward graph ``graph`` (``bwd.graph`` at some sizes) that belong together: the forward's
    inputs made by ``make(forward_graph, seed)``, the saved tensors ``forward`` computes from them, and the
    cotangents from ``make(graph, seed + 1)``."""
    fwd = bwd.forward.with_sizes({a: n for a, n in graph.sizes.items() if a in bwd.forward.sizes})
    values = make(fwd, seed)
    values.update({n: np.asarray(v) for n, v in forward(fwd, values).items() if n in bwd.saved})
    rest = make(graph, seed + 1)
    return {t.name: values[t.name] if t.name in values else rest[t.name] for t in graph.inputs()}


@dataclass(frozen=True)
class BackwardDraw(Draw):
    """A draw of a backward plan: ``base``'s kind of inputs for the forward and the cotangents, the saved
    tensors computed (``linked_inputs``)."""

    base: Draw
    bwd: Backward
    forward: ForwardValues

    def make(self, graph: Graph, seed: int, magnitude: float) -> dict[str, np.ndarray]:
        return linked_inputs(self.bwd, graph, seed, lambda g, s: self.base.make(g, s, magnitude), self.forward)

    def label(self, magnitude: float) -> str:
        return self.base.label(magnitude)

    def applies(self, graph: Graph) -> bool:
        return self.base.applies(graph)

    def accepts(self, prepared: object) -> bool:
        return self.base.accepts(prepared)

    def describe(self, magnitude: float) -> str:
        saved = ", ".join(self.bwd.saved)
        return f"{self.base.describe(magnitude)}; {saved} computed from the forward inputs" if saved else \
            self.base.describe(magnitude)


def plan_draws(plan: Plan, draws: tuple[Draw, ...], forward: ForwardValues = numpy_forward) -> tuple[Draw, ...]:
    """``draws`` as a check of ``plan`` takes them: linked (``BackwardDraw``) for a plan that records its
    derivation, unchanged for any other."""
    from pyrunner.plan.backward_of import derivation_of

    bwd = derivation_of(plan)
    if bwd is None:
        return draws
    return tuple(BackwardDraw(d.name, d.magnitudes, d, bwd, forward) for d in draws)

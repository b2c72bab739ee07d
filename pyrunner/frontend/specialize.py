"""Symbolic shapes in, static Superopt regions out: one specialisation per concrete shape, guarded at run time.

Superopt plans static shapes. When dynamo goes symbolic (``dynamic=True``, or
``dynamic=None`` after a second shape -- every step of a KV-cache decode loop),
giving the whole graph to the fallback compiler would drop every region. Instead
the backend returns a ``Specialized`` callable: at each call it reads the
concrete sizes of its inputs (the guard), and the first time it sees a shape it
copies the symbolic graph, binds the integer inputs to their values and
compiles that copy as a static graph (regions planned, the rest to the fallback
compiler). Plans are cached per region graph, so a shape seen again, or the
layers of a model, plan nothing new. Only the last ``MAX_SHAPES`` shapes stay
compiled (least recently used out), so a long decode loop holds bounded memory.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

MAX_SHAPES = 64
"""Specialisations kept per symbolic graph (least recently used dropped)."""

ShapeKey = tuple


def shape_key(args: tuple) -> ShapeKey:
    """What a specialisation depends on: each tensor's sizes, dtype and device, each integer's value."""
    import torch

    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((tuple(a.shape), str(a.dtype), str(a.device)))
        elif isinstance(a, (int, float, bool)):
            key.append(a)
        else:
            key.append(type(a).__name__)
    return tuple(key)


def bind_scalars(gm: Any, args: tuple) -> Any:
    """``gm`` with every use of an integer/float placeholder replaced by its value in ``args`` (in place)."""
    import torch.fx

    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(phs, args, strict=True):
        if isinstance(value, (int, float, bool)):
            for user in list(node.users):
                user.args = torch.fx.node.map_arg(user.args, lambda n, node=node, value=value:
                                                  value if n is node else n)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n, node=node, value=value:
                                                    value if n is node else n)
    gm.recompile()
    return gm


class Specialized:
    """A symbolic graph compiled once per concrete input shape by ``compile_static(gm, args)``."""

    def __init__(self, gm: Any, compile_static: Callable[[Any, list], Callable],
                 max_shapes: int = MAX_SHAPES) -> None:
        self.gm, self.compile_static, self.max_shapes = gm, compile_static, max_shapes
        self.compiled: OrderedDict[ShapeKey, Callable] = OrderedDict()

    def __call__(self, *args: Any) -> Any:
        key = shape_key(args)
        fn = self.compiled.get(key)
        if fn is None:
            gm = bind_scalars(copy.deepcopy(self.gm), args)
            fn = self.compile_static(gm, list(args))
            self.compiled[key] = fn
            while len(self.compiled) > self.max_shapes:
                self.compiled.popitem(last=False)
        else:
            self.compiled.move_to_end(key)
        return fn(*args)


def is_symbolic(example_inputs: list) -> bool:
    """Whether dynamo handed over symbolic sizes (SymInt inputs or tensors with symbolic shapes)."""
    import torch

    for x in example_inputs:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape):
            return True
    return False

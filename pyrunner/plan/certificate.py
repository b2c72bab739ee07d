"""The certificate models of a plan (``schema.Plan.certificate``, ``schema.Step``'s position and instance).

A certificate lets ``validate`` replay a plan's derivation without search (``rules.replay_plan``):
every term it names is a node of one table (``Certificate.nodes``), hash-consed and operands first.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    """As the plan schema's models: no unknown fields, immutable, finite numbers (parsed strictly too)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TermNode(_Strict):
    """One node of a certificate's term table (``Certificate.nodes``): a ``graph.Term`` whose operands
    are earlier nodes (``args``: their indices). Only the fields of its kind are set."""

    op: Literal["input", "const", "axis_size", "iota", "unary", "binary", "ternary", "reduce", "matmul"]
    fn: str = ""
    axis: str = ""
    name: str = ""
    axes: list[str] = []
    value: Union[float, Literal["-inf", "inf"]] = 0.0
    args: list[Annotated[int, Field(ge=0)]] = []


class Position(_Strict):
    """Where a step applies: the term reached from graph output ``output`` by taking operand ``path[0]``,
    then ``path[1]``, ... (every occurrence of that sub-term is rewritten: equal terms are one value)."""

    output: Annotated[int, Field(ge=0)]
    path: list[Annotated[int, Field(ge=0)]] = []


class Instance(_Strict):
    """A rule's instantiation, enough to replay it without search (``pyrunner.rules.replay``): the bound
    axis, the exponential or elementwise function, the scale term (a ``Certificate.nodes`` index), the
    constant, the operand choices (``choice``, per rule) and, for the product rules, the factors (paths
    below the position) in the order the product is rebuilt."""

    axis: str = ""
    fn: str = ""
    scale: Annotated[int, Field(ge=0)] | None = None
    constant: float | None = None
    choice: list[Annotated[int, Field(ge=0)]] = []
    factors: list[list[Annotated[int, Field(ge=0)]]] = []


class KernelTerms(_Strict):
    """What one kernel computes: for each tensor it writes (in ``writes`` order) the
    ``Certificate.nodes`` index of its term over the tensors the kernel reads (input nodes named as
    those tensors)."""

    kernel: str
    writes: list[Annotated[int, Field(ge=0)]]


class Certificate(_Strict):
    """The derivation's replayable certificate (``pyrunner.rules.replay``): a table of terms (hash-consed,
    operands first), the derived graph's output terms (``derived``, in graph-output order) and what each
    kernel computes; the kernels' terms compose to the derived terms."""

    nodes: list[TermNode]
    derived: list[Annotated[int, Field(ge=0)]]
    kernels: list[KernelTerms]

"""Kernel plan schema (pydantic v2): the contract between planners and runner.

The models here are the schema's source of truth; ``python -m pyrunner schema``
exports them as JSON Schema (``pyrunner/schema/plan.schema.json``) for the Lean
emitter. A kernel is described at the level of TileLang's tile primitives:
copies between memory levels, tile GEMMs, elementwise maps on tiles,
reductions along a tile axis, and state buffers with their init and update.

Tile geometry. A kernel iterates over *grid axes* (one thread block per tile
of every grid axis) and optionally one *streamed axis* (a sequential loop
inside the block). A buffer's axes are graph axis names; the extent of each is
the block size of that axis in this kernel. A grid axis with block 1 is
indexed, never held, so buffers and loads omit it.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from pyrunner.errors import PlanError
from pyrunner.ir.ops import ELEMENTWISE, TILE_REDUCTIONS
from pyrunner.plan.certificate import Certificate, Instance, Position

SCHEMA_VERSION = 1

DType = Literal["float16", "bfloat16", "float32"]
Scope = Literal["shared", "fragment"]


class _Strict(BaseModel):
    """No unknown fields, immutable, finite numbers (``plan.validate.parse_plan`` also validates strictly)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GlobalTensor(_Strict):
    """A tensor in global (HBM) memory; every one a plan materializes is listed."""

    name: str
    axes: list[str]
    shape: list[Annotated[int, Field(gt=0)]]
    dtype: DType
    role: Literal["input", "output", "intermediate"]

    @model_validator(mode="after")
    def _rank(self) -> "GlobalTensor":
        if len(self.axes) != len(self.shape):
            raise ValueError(f"tensor {self.name!r}: {len(self.axes)} axes but {len(self.shape)} extents")
        return self


Block = Union[Annotated[int, Field(gt=0)], str]
"""A tile extent: a literal, or the name of a tuning parameter of the kernel."""


class GridAxis(_Strict):
    axis: str
    block: Block


class Buffer(_Strict):
    """On-chip tile storage. ``state`` buffers live across loop iterations."""

    name: str
    axes: list[str]
    scope: Scope
    dtype: DType
    state: bool = False


class Ref(_Strict):
    kind: Literal["ref"] = "ref"
    buf: str


class Const(_Strict):
    """A number; infinities are the strings "-inf"/"inf" (JSON has no infinity)."""

    kind: Literal["const"] = "const"
    value: Union[float, Literal["-inf", "inf"]]

    def number(self) -> float:
        return {"-inf": -math.inf, "inf": math.inf}[self.value] if isinstance(self.value, str) else self.value


class AxisSize(_Strict):
    """The extent of a graph axis as a float (keeps expressions shape-generic)."""

    kind: Literal["size"] = "size"
    axis: str


FunctionName = Literal[tuple(ELEMENTWISE)]  # type: ignore[valid-type]
"""Every elementwise function of the op table (``pyrunner.ir.ops``)."""

TileReduction = Literal[TILE_REDUCTIONS]  # type: ignore[valid-type]
"""The reductions a tile Reduce op performs."""
class Index(_Strict):
    """The global index (0 .. extent-1) along a graph axis of the element being computed, as a float
    (a graph's ``iota``). Tile index predicates (masks) are built from it."""

    kind: Literal["index"] = "index"
    axis: str


class Call(_Strict):
    kind: Literal["call"] = "call"
    fn: FunctionName
    args: list["Expr"]


Expr = Annotated[Union[Ref, Const, AxisSize, Index, Call], Field(discriminator="kind")]
Call.model_rebuild()


class StreamLoop(_Strict):
    """The sequential loop over one axis, tiled by ``block``, software-pipelined.

    ``visible``, when given, is an index predicate (an expression over ``index`` values, constants,
    ``add``/``sub``/``mul``, ``lt``/``le`` and ``min``/``max`` as and/or): the planner proved that a
    loop step whose tile has it false at every element leaves every loop state unchanged (the
    ``masked_tile_skip`` rule), so the loop runs only over the steps where it can hold somewhere
    (bounds from interval reasoning, ``pyrunner.plan.masks``).
    """

    axis: str
    block: Block
    stages: Block = 2
    visible: Expr | None = None


EXPR_FUNCTIONS = {
    # unary
    "exp": 1, "exp2": 1, "log": 1, "neg": 1, "recip": 1, "sqrt": 1, "rsqrt": 1,
    "square": 1, "silu": 1, "sigmoid": 1, "tanh": 1, "gelu": 1, "relu": 1, "abs": 1,
    # binary
    "add": 2, "sub": 2, "mul": 2, "div": 2, "max": 2, "min": 2,
    # comparisons (1.0 where true, else 0.0) and select (second argument where the first is != 0)
    "lt": 2, "le": 2, "where": 3,
}
EXPR_FUNCTIONS = {op.name: op.arity for op in ELEMENTWISE.values()}
"""Function name -> number of arguments, for every function a Map expression may call."""


class Load(_Strict):
    """Copy the tile of a global tensor at the block's coordinates into a buffer."""

    op: Literal["load"] = "load"
    src: str
    dst: str


class Store(_Strict):
    """Copy a buffer to the tile of a global tensor at the block's coordinates."""

    op: Literal["store"] = "store"
    src: str
    dst: str


class Fill(_Strict):
    op: Literal["fill"] = "fill"
    dst: str
    value: Union[float, Literal["-inf", "inf"]]


class Gemm(_Strict):
    """``c (+)= a @ b`` contracting ``contract``; operand layouts follow buffer axes."""

    op: Literal["gemm"] = "gemm"
    a: str
    b: str
    c: str
    contract: str
    clear: bool


class Map(_Strict):
    """Elementwise ``dst = expr``; operands broadcast by axis name onto dst's axes."""

    op: Literal["map"] = "map"
    dst: str
    expr: Expr


class Reduce(_Strict):
    """``dst = fn over axis of src``; with ``accumulate`` combined into dst's value."""

    op: Literal["reduce"] = "reduce"
    fn: TileReduction
    src: str
    dst: str
    axis: str
    accumulate: bool


Op = Annotated[Union[Load, Store, Fill, Gemm, Map, Reduce], Field(discriminator="op")]


class Kernel(_Strict):
    name: str
    grid: list[GridAxis]
    loop: StreamLoop | None = None
    threads: Block = 128
    buffers: list[Buffer]
    prologue: list[Op] = []
    body: list[Op] = []
    epilogue: list[Op] = []
    reads: list[str]
    writes: list[str]
    params: dict[str, list[Annotated[int, Field(gt=0)]]] = {}
    defaults: dict[str, Annotated[int, Field(gt=0)]] = {}
    fused_rules: list[str] = []

    @model_validator(mode="after")
    def _params(self) -> "Kernel":
        for p, v in self.defaults.items():
            if p not in self.params:
                raise ValueError(f"kernel {self.name!r}: default for unknown parameter {p!r}")
            if v not in self.params[p]:
                raise ValueError(f"kernel {self.name!r}: default {p}={v} is not in its space {self.params[p]}")
        missing = sorted(set(self.params) - set(self.defaults))
        if missing:
            raise ValueError(f"kernel {self.name!r}: no default for parameter(s) {missing}")
        return self


class Step(_Strict):
    """One rule application of the derivation; ``rule`` is the Lean theorem's name.

    An algebraic step of a certified plan also has its ``position``, ``instance`` and ``term`` (the
    ``Certificate.nodes`` index of the rewritten sub-term): ``validate`` replays it. A graph-view step
    (``unit_axis``, ``merge_axes``, ``split_reduction``) replays the plan's axis lists; a schedule rule
    cites the kernel in ``at``."""

    rule: str
    at: str
    result: str = ""
    position: Position | None = None
    instance: Instance | None = None
    term: Annotated[int, Field(ge=0)] | None = None
    _rewrite: object = PrivateAttr(default=None)
    """While planning: the rewrite made (``rules.certify.Rewrite``), from which ``to_plan`` certifies it."""


class KernelCost(_Strict):
    kernel: str
    flops: float
    bytes: float
    time_us: float
    bound: Literal["compute", "memory", "latency"]


class CostEstimate(_Strict):
    total_us: float
    kernels: list[KernelCost]
    launches: int
    model: dict[str, float]


class BackwardOf(_Strict):
    """What a backward plan's graph was derived from (``ir.grad.derive``): the forward graph as its author
    wrote it, the outputs differentiated, the inputs differentiated and the extra saves (indices into the
    forward graph's terms, operands before users, in the order given). Untrusted like the rest of the plan:
    ``plan.backward_of`` derives the backward again and refuses a plan whose graph is not that derivation.
    The checks draw a backward plan's inputs through it: forward inputs and cotangents random, the saved
    tensors computed from the forward inputs (a random log-sum-exp would not belong to the scores)."""

    forward: dict
    outputs: list[str] = Field(min_length=1)
    wrt: list[str] = Field(min_length=1)
    save: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)


class Provenance(_Strict):
    planner: str
    version: str
    graph_hash: str
    plan_hash: str = ""
    search_cut: list[str] = Field(default_factory=list)
    """What the planner's work budgets left unexplored (empty: the search ran to completion). Budgets
    count work, never seconds, so the same graph gives the same plan, cut or not, on any machine."""
    backward_of: BackwardOf | None = None
    """Set on a plan of a derived backward graph (``plan.backward_of``); absent on every other plan."""


class AxisMergeSpec(_Strict):
    """Two adjacent axes of the plan's graph that the plan's tensors and kernels see as one
    (``ir.merge_axes``): ``axis`` = ``parts[0]`` (outer) x ``parts[1]`` (inner), a row-major reshape."""

    axis: str
    parts: list[str] = Field(min_length=2, max_length=2)
    sizes: list[Annotated[int, Field(gt=0)]] = Field(min_length=2, max_length=2)


class AxisSplitSpec(_Strict):
    """A reduced axis of the plan's graph that the plan's tensors and kernels see as chunks
    (``ir.split_axes``): ``axis`` = ``parts[0]`` (chunk) x ``parts[1]`` (position in the chunk), a
    row-major reshape of the tensors that carry it; its reductions run per chunk, then across chunks."""

    axis: str
    parts: list[str] = Field(min_length=2, max_length=2)
    sizes: list[Annotated[int, Field(gt=0)]] = Field(min_length=2, max_length=2)


class AxisUnitSpec(_Strict):
    """An axis of extent 1 that the plan's tensors and kernels carry and its graph does not
    (``ir.unit_axes``): inserted into input ``inputs[i]`` before its axis ``positions[i]``; every value
    computed from those inputs carries it, outputs too. A view: no byte of any tensor moves."""

    axis: str
    inputs: list[str] = Field(min_length=1)
    positions: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)


class Plan(_Strict):
    """A plan. ``graph`` is the graph as its author wrote it; ``axis_units``, ``axis_merges`` (applied
    in order), then ``axis_splits``, give the graph the tensors and kernels are written against
    (``plan.views.kernel_graph``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    workload: str
    dtype: Literal["float16", "bfloat16"]
    accum_dtype: Literal["float32"] = "float32"
    graph: dict
    derivation: list[Step]
    tensors: list[GlobalTensor]
    kernels: list[Kernel]
    cost: CostEstimate
    provenance: Provenance
    axis_merges: list[AxisMergeSpec] = Field(default_factory=list)
    axis_splits: list[AxisSplitSpec] = Field(default_factory=list)
    axis_units: list[AxisUnitSpec] = Field(default_factory=list)
    certificate: Certificate | None = None


STEP_CERTIFICATE_FIELDS = ("position", "instance", "term")


def plan_document(plan: Plan) -> dict:
    """The plan's JSON document; ``axis_merges``, ``axis_splits``, ``axis_units``, the ``certificate``,
    each step's certificate fields and the provenance's ``search_cut`` and ``backward_of`` only where there
    are any (older plans stay byte-identical, and so do their hashes)."""
    data = plan.model_dump(mode="json")
    for key in ("axis_merges", "axis_splits", "axis_units", "certificate"):
        if not data.get(key):
            data.pop(key, None)
    for step in data.get("derivation", []):
        for key in STEP_CERTIFICATE_FIELDS:
            if step.get(key) is None:
                step.pop(key, None)
    for key in ("search_cut", "backward_of"):
        if not data["provenance"].get(key):
            data["provenance"].pop(key, None)
    return data


def canonical_json(data: dict) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def plan_hash(plan: Plan) -> str:
    """Content hash of a plan, excluding the hash field itself."""
    data = plan_document(plan)
    data["provenance"]["plan_hash"] = ""
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:16]


def with_hash(plan: Plan) -> Plan:
    prov = plan.provenance.model_copy(update={"plan_hash": plan_hash(plan)})
    return plan.model_copy(update={"provenance": prov})


def json_schema() -> dict:
    return Plan.model_json_schema()


def axis_sizes(plan: Plan) -> dict[str, int]:
    """Extent of every axis named by a global tensor (or the source graph); the plan must agree with itself."""
    sizes: dict[str, int] = {}
    for t in plan.tensors:
        for a, n in zip(t.axes, t.shape, strict=True):
            if sizes.setdefault(a, n) != n:
                raise PlanError(f"axis {a!r} has extent {n} in tensor {t.name!r} but {sizes[a]} elsewhere")
    graph_axes = plan.graph.get("axes") if isinstance(plan.graph, dict) else None
    if isinstance(graph_axes, dict):
        for a, n in sorted(graph_axes.items()):
            if isinstance(n, int) and sizes.setdefault(a, n) != n:
                raise PlanError(f"axis {a!r} has extent {n} in the plan's graph but {sizes[a]} in its tensors")
    return sizes

/-!
# Graph IR over named axes

The Lean mirror of `pyrunner/ir/graph.py`. A tensor program is a `Term` tree whose leaves are inputs
(a name and its axes), constants and axis sizes, and whose inner nodes are elementwise unary and
binary functions, reductions along one axis and matrix products contracting one axis. Axes are
names, never positions: a binary op aligns its operands by name, and `Term.resultAxes` computes
the axes of a value exactly as `pyrunner.graph.result_axes` does.

The op vocabularies below (`UnaryOp`, `BinaryOp`, `ReduceOp`) carry the same names, in the same
order, as Python's `UNARY_OPS`, `BINARY_OPS` and `REDUCE_OPS`; `tests/test_lean_sources.py`
checks that by reading this file.

Constants are exact decimals (`Decimal`, written as Lean scientific literals such as `1e-6`), not
`Float`s: a plan carries them as JSON numbers, and `Float.toString` would round them to six
decimals. `Superopt/Json.lean` prints them exactly as Python prints the same float.

Labels (`Graph.labels`) are the names an author gave sub-terms (Python's `name=` arguments); they
take no part in the meaning of a graph, only in the node names of its JSON form.

The sub-graph helpers at the end (`Term.softmax`, `Term.rmsnorm`, `Term.layernorm`) expand into
primitive ops exactly as Python's `GraphBuilder` helpers do, so rewrite rules see through them.
They are written as `let` lines plus one final expression, a form the Python test can evaluate.
-/

namespace Superopt

/-- An axis is named; its extent lives in the graph's `sizes`. -/
abbrev Axis := String

/-- The exact decimal `mantissa * 10^(-exponent)`: a constant of a graph. -/
structure Decimal where
  mantissa : Int
  exponent : Nat
  deriving DecidableEq, Repr, Inhabited

/-- Scientific literals (`1e-6`, `0.5`, `1.4426950408889634`) denote their exact decimal. -/
instance : OfScientific Decimal where
  ofScientific m negExp e :=
    if negExp then ⟨Int.ofNat m, e⟩ else ⟨Int.ofNat (m * 10 ^ e), 0⟩

/-- Natural-number literals are decimals with no fractional part. -/
instance (n : Nat) : OfNat Decimal n := ⟨⟨Int.ofNat n, 0⟩⟩

/-- Elementwise functions of one operand (Python `UNARY_OPS`). -/
inductive UnaryOp where
  | exp | exp2 | log | neg | recip | sqrt | rsqrt | square
  | silu | sigmoid | tanh | gelu | relu | abs | softplus
  deriving DecidableEq, Repr, Inhabited

/-- Elementwise functions of two operands, broadcast by axis name (Python `BINARY_OPS`). -/
inductive BinaryOp where
  | add | sub | mul | div | max | min | lt | le
  deriving DecidableEq, Repr, Inhabited

/-- Elementwise functions of three operands (Python `TERNARY_OPS`). `select c x y` is Python's
`where(c, x, y)` (`where` is a Lean keyword): `x` where `c ≠ 0`, else `y`. -/
inductive TernaryOp where
  | select
  deriving DecidableEq, Repr, Inhabited

/-- Reductions along one named axis (Python `REDUCE_OPS`). -/
inductive ReduceOp where
  | sum | max | mean
  deriving DecidableEq, Repr, Inhabited

/-- The name Python uses for a unary function. -/
def UnaryOp.name : UnaryOp → String
  | .exp => "exp"
  | .exp2 => "exp2"
  | .log => "log"
  | .neg => "neg"
  | .recip => "recip"
  | .sqrt => "sqrt"
  | .rsqrt => "rsqrt"
  | .square => "square"
  | .silu => "silu"
  | .sigmoid => "sigmoid"
  | .tanh => "tanh"
  | .gelu => "gelu"
  | .relu => "relu"
  | .abs => "abs"
  | .softplus => "softplus"

/-- The name Python uses for a binary function. -/
def BinaryOp.name : BinaryOp → String
  | .add => "add"
  | .sub => "sub"
  | .mul => "mul"
  | .div => "div"
  | .max => "max"
  | .min => "min"
  | .lt => "lt"
  | .le => "le"

/-- The name Python uses for a ternary function. -/
def TernaryOp.name : TernaryOp → String
  | .select => "where"

/-- The name Python uses for a reduction. -/
def ReduceOp.name : ReduceOp → String
  | .sum => "sum"
  | .max => "max"
  | .mean => "mean"

/-- Every unary function, in Python's order. -/
def UnaryOp.all : List UnaryOp :=
  [.exp, .exp2, .log, .neg, .recip, .sqrt, .rsqrt, .square,
    .silu, .sigmoid, .tanh, .gelu, .relu, .abs, .softplus]

/-- Every binary function, in Python's order. -/
def BinaryOp.all : List BinaryOp := [.add, .sub, .mul, .div, .max, .min, .lt, .le]

/-- Every reduction, in Python's order. -/
def ReduceOp.all : List ReduceOp := [.sum, .max, .mean]

/-- One node of a tensor program; the Lean twin of Python's `Term`. -/
inductive Term where
  /-- A named input tensor with its axes (in memory order). -/
  | input (name : String) (axes : List Axis)
  /-- A scalar constant, broadcast everywhere. -/
  | const (value : Decimal)
  /-- The constant `-∞`, the value a mask gives hidden scores. Decimals have no infinity, so it is a
  constructor of its own; Python spells it `const` with value `-inf` (`"-inf"` in graph JSON). -/
  | negInf
  /-- The extent of an axis, as a scalar. -/
  | axisSize (axis : Axis)
  /-- The index `0, 1, ...` along an axis, as a value over that axis (masks are built from it). -/
  | iota (axis : Axis)
  /-- An elementwise function of one operand. -/
  | unary (fn : UnaryOp) (arg : Term)
  /-- An elementwise function of two operands, aligned by axis name. -/
  | binary (fn : BinaryOp) (lhs rhs : Term)
  /-- An elementwise function of three operands, aligned by axis name. -/
  | ternary (fn : TernaryOp) (cond lhs rhs : Term)
  /-- A reduction of `arg` along `axis`. -/
  | reduce (fn : ReduceOp) (arg : Term) (axis : Axis)
  /-- The product of `lhs` and `rhs` contracting the axis `contract` both carry. -/
  | matmul (lhs rhs : Term) (contract : Axis)
  deriving Repr, Inhabited, BEq, DecidableEq

/-- Named axes of a term's value, in canonical memory order (Python `result_axes`). -/
def Term.resultAxes : Term → List Axis
  | .input _ axes => axes
  | .const _ => []
  | .negInf => []
  | .axisSize _ => []
  | .iota ax => [ax]
  | .unary _ x => Term.resultAxes x
  | .binary _ a b =>
    let left := Term.resultAxes a
    left ++ (Term.resultAxes b).filter (fun y => decide (y ∉ left))
  | .ternary _ c a b =>
    let left := Term.resultAxes a
    let mid := left ++ (Term.resultAxes b).filter (fun y => decide (y ∉ left))
    mid ++ (Term.resultAxes c).filter (fun y => decide (y ∉ mid))
  | .reduce _ x ax => (Term.resultAxes x).filter (fun y => decide (y ≠ ax))
  | .matmul a b ax =>
    let left := (Term.resultAxes a).filter (fun y => decide (y ≠ ax))
    left ++ (Term.resultAxes b).filter (fun y => decide (y ≠ ax ∧ y ∉ left))

/-- The inputs a term reads, left to right, repeats included. -/
def Term.inputs : Term → List (String × List Axis)
  | .input n axes => [(n, axes)]
  | .const _ => []
  | .axisSize _ => []
  | .negInf => []
  | .iota _ => []
  | .unary _ x => Term.inputs x
  | .binary _ a b => Term.inputs a ++ Term.inputs b
  | .ternary _ c a b => Term.inputs c ++ Term.inputs a ++ Term.inputs b
  | .reduce _ x _ => Term.inputs x
  | .matmul a b _ => Term.inputs a ++ Term.inputs b

/-- Keeps the first entry of each name, in order. -/
def dedupByName (l : List (String × List Axis)) : List (String × List Axis) :=
  l.foldl (fun acc p => if acc.any (fun q => q.1 == p.1) then acc else acc ++ [p]) []

/--
A named set of output terms plus the extents of the axes they use (Python `Graph`), and the
names the author gave sub-terms (`labels`, first entry of a term wins, as Python's `setdefault`).
-/
structure Graph where
  name : String
  sizes : List (Axis × Nat)
  outputs : List (String × Term)
  labels : List (Term × String)
  deriving Repr, Inhabited

/-- The graph's distinct inputs in order of first use (Python `Graph.inputs`). -/
def Graph.inputs (g : Graph) : List (String × List Axis) :=
  dedupByName (g.outputs.foldl (fun acc o => acc ++ o.2.inputs) [])

/-- The graph with one axis resized; an unknown axis or a zero size is refused. -/
def Graph.resize (g : Graph) (a : Axis) (n : Nat) : Except String Graph :=
  if !(g.sizes.any fun p => p.1 == a) then
    .error s!"--shape names axis '{a}', but graph {g.name} has axes {g.sizes.map (·.1)}"
  else if n == 0 then
    .error s!"axis '{a}' must have a positive size, got {n}"
  else
    .ok { g with sizes := g.sizes.map fun p => if p.1 == a then (a, n) else p }

/-- The graph with several axes resized, in order (Python `Graph.with_sizes`). -/
def Graph.withSizes (g : Graph) (shapes : List (Axis × Nat)) : Except String Graph :=
  shapes.foldlM (fun acc p => acc.resize p.1 p.2) g

/-! ## Sub-graph helpers (same expansions as Python's `GraphBuilder`) -/

/-- `x` where the predicate `keep` holds, `-inf` elsewhere (Python `GraphBuilder.masked`). -/
def Term.masked (x : Term) (keep : Term) : Term :=
  Term.ternary .select keep x Term.negInf

/-- `softmax` along `ax`: `exp x / sum_ax (exp x)`. -/
def Term.softmax (x : Term) (ax : Axis) : Term :=
  let e := Term.unary .exp x
  Term.binary .div e (Term.reduce .sum e ax)

/-- `rmsnorm` along `ax`: `x * rsqrt (mean_ax (x^2) + eps)`, no learned weight. -/
def Term.rmsnorm (x : Term) (ax : Axis) (eps : Decimal) : Term :=
  let ms := Term.reduce .mean (Term.unary .square x) ax
  Term.binary .mul x (Term.unary .rsqrt (Term.binary .add ms (Term.const eps)))

/-- `layernorm` along `ax` without affine weights. -/
def Term.layernorm (x : Term) (ax : Axis) (eps : Decimal) : Term :=
  let centered := Term.binary .sub x (Term.reduce .mean x ax)
  let variance := Term.reduce .mean (Term.unary .square centered) ax
  Term.binary .mul centered (Term.unary .rsqrt (Term.binary .add variance (Term.const eps)))

end Superopt

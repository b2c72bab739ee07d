import Lean.Data.Json
import Superopt.Replay

/-!
# Reading a plan's certificate and replaying it in Lean

The Python planner writes each plan's derivation as a certificate (`pyrunner/plan/certificate.py`):
a table of term nodes (`certificate.nodes`, operands before users), each algebraic step's rule,
instantiation (`instance`: axis, function, scale node, constant, operand choices) and position
(`position`: an output and a path), the node of its result (`term`), the derived outputs
(`certificate.derived`) and each kernel's terms over the tensors it reads (`certificate.kernels`).

`checkCertificate` parses that, builds the steps as `Rule`s (`Superopt/Replay.lean`), runs them
one by one from the Lean graph's outputs, and requires each step's rewrite to be the recorded
term, `replay` (the function `replay_sound` is about) to give the derived outputs, and the
kernels' terms, each tensor they read replaced by what the kernel writing it computes, to give
the derived outputs too. Terms are compared with their decimals normalised (`1024.0` and `1024`
are one number), as Python compares floats.

It answers `true` when it replayed the derivation and `false` when the plan is outside what the
Lean rules cover (axis views: `unit_axis`, `merge_axes`, `split_reduction`; a rule or variant with
no `Rule` constructor): such a plan is checked by Python's replay (`python -m pyrunner validate`)
and by the rule-name check of `checkPlan` only.
-/

namespace Superopt

/-- `d` with trailing zeros of its fraction dropped (`fuel` bounds the steps). -/
def Decimal.normAux : Nat → Int → Nat → Decimal
  | 0, m, e => ⟨m, e⟩
  | fuel + 1, m, e => if e > 0 ∧ m % 10 = 0 then Decimal.normAux fuel (m / 10) (e - 1) else ⟨m, e⟩

/-- The decimal without trailing zeros of its fraction: equal numbers, equal forms. -/
def Decimal.norm (d : Decimal) : Decimal := Decimal.normAux d.exponent d.mantissa d.exponent

/-- The term with every constant's decimal normalised. -/
def Term.normDecimals : Term → Term
  | .const d => .const d.norm
  | .unary f x => .unary f (Term.normDecimals x)
  | .binary f a b => .binary f (Term.normDecimals a) (Term.normDecimals b)
  | .ternary f c a b => .ternary f (Term.normDecimals c) (Term.normDecimals a) (Term.normDecimals b)
  | .reduce f x ax => .reduce f (Term.normDecimals x) ax
  | .matmul a b ax => .matmul (Term.normDecimals a) (Term.normDecimals b) ax
  | t => t

/-- Equal as Python reads them: the same tree, constants the same numbers. -/
def Term.same (a b : Term) : Bool := decide (a.normDecimals = b.normDecimals)

/-- The term with each input named in `env` replaced by its term there. -/
def Term.substInputs (env : List (String × Term)) : Term → Term
  | .input n axes =>
    match env.find? (fun p => p.1 == n) with
    | some p => p.2
    | none => .input n axes
  | .unary f x => .unary f (Term.substInputs env x)
  | .binary f a b => .binary f (Term.substInputs env a) (Term.substInputs env b)
  | .ternary f c a b =>
    .ternary f (Term.substInputs env c) (Term.substInputs env a) (Term.substInputs env b)
  | .reduce f x ax => .reduce f (Term.substInputs env x) ax
  | .matmul a b ax => .matmul (Term.substInputs env a) (Term.substInputs env b) ax
  | t => t

/-! ## JSON fields -/

/-- A string field. -/
def jStr (j : Lean.Json) (k : String) : Except String String :=
  match j.getObjValD k with
  | .str s => .ok s
  | _ => .error s!"certificate: field '{k}' is not a string"

/-- A list field. -/
def jList (j : Lean.Json) (k : String) : Except String (List Lean.Json) :=
  match j.getObjValD k with
  | .arr a => .ok a.toList
  | _ => .error s!"certificate: field '{k}' is not a list"

/-- A natural number. -/
def jNat (j : Lean.Json) : Except String Nat :=
  match j with
  | .num n => if n.exponent = 0 ∧ n.mantissa ≥ 0 then .ok n.mantissa.toNat else .error "certificate: not an index"
  | _ => .error "certificate: not an index"

/-- A string. -/
def jString (j : Lean.Json) : Except String String :=
  match j with
  | .str s => .ok s
  | _ => .error "certificate: not a string"

/-- Node `k` of the table. -/
def nodeAt (nodes : Array Term) (k : Nat) : Except String Term :=
  match nodes[k]? with
  | some t => .ok t
  | none => .error s!"certificate: no node {k}"

/-! ## The term table -/

/-- One node, its operands among the nodes read before it. -/
def parseNode (done : Array Term) (j : Lean.Json) : Except String Term := do
  let op ← jStr j "op"
  let ixs ← (← jList j "args").mapM jNat
  let args ← ixs.mapM (nodeAt done)
  let fn ← jStr j "fn"
  let axis ← jStr j "axis"
  match op, args with
  | "input", [] => do
    let axes ← (← jList j "axes").mapM jString
    return .input (← jStr j "name") axes
  | "const", [] =>
    match j.getObjValD "value" with
    | .num n => return .const ⟨n.mantissa, n.exponent⟩
    | .str "-inf" => return .negInf
    | _ => throw "certificate: a constant Lean terms cannot hold"
  | "axis_size", [] => return .axisSize axis
  | "iota", [] => return .iota axis
  | "unary", [x] =>
    match UnaryOp.all.find? (fun f => f.name == fn) with
    | some f => return .unary f x
    | none => throw s!"certificate: unknown unary function '{fn}'"
  | "binary", [a, b] =>
    match BinaryOp.all.find? (fun f => f.name == fn) with
    | some f => return .binary f a b
    | none => throw s!"certificate: unknown binary function '{fn}'"
  | "ternary", [c, a, b] =>
    if fn == "where" then return .ternary .select c a b
    else throw s!"certificate: unknown ternary function '{fn}'"
  | "reduce", [x] =>
    match ReduceOp.all.find? (fun f => f.name == fn) with
    | some f => return .reduce f x axis
    | none => throw s!"certificate: unknown reduction '{fn}'"
  | "matmul", [a, b] => return .matmul a b axis
  | _, _ => throw s!"certificate: a node '{op}' with {args.length} operand(s)"

/-- The whole table. -/
def parseNodes (nodes : List Lean.Json) : Except String (Array Term) :=
  nodes.foldlM (fun done j => do return done.push (← parseNode done j)) #[]

/-! ## Steps -/

/-- An operand choice as a flag (Python's 0 or 1). -/
def flag (n : Nat) : Bool := n == 1

/-- The step's rule with its instantiation; `none` where the Lean rules have no such form. -/
def parseRule (rule : String) (inst : Lean.Json) (nodes : Array Term) : Except String (Option Rule) := do
  let axis ← jStr inst "axis"
  let fn ← jStr inst "fn"
  let choice ← (← jList inst "choice").mapM jNat
  let scale : Option Term ← match inst.getObjValD "scale" with
    | .null => pure none
    | j => do return some (← nodeAt nodes (← jNat j))
  match rule, choice, scale with
  | "softmax_max_shift", [], none =>
    if fn == "exp" then return some (Rule.softmaxMaxShift .exp axis)
    else if fn == "exp2" then return some (Rule.softmaxMaxShift .exp2 axis)
    else throw s!"certificate: softmax_max_shift with function '{fn}'"
  | "matmul_div_commute", [0], some l => return some (Rule.matmulDivLeft l)
  | "matmul_div_commute", [1], some l => return some (Rule.matmulDivRight l)
  | "matmul_row_scale_commute", [0, 1, f], some s => return some (Rule.rowScaleXS s (flag f))
  | "matmul_row_scale_commute", [0, 0, f], some s => return some (Rule.rowScaleSX s (flag f))
  | "matmul_row_scale_commute", [1, 1, f], some s => return some (Rule.rowScaleWXS s (flag f))
  | "matmul_row_scale_commute", [1, 0, f], some s => return some (Rule.rowScaleWSX s (flag f))
  | "exp_to_exp2", [], none =>
    match inst.getObjValD "constant" with
    | .num n =>
      if (Decimal.mk n.mantissa n.exponent).norm = log2eDecimal.norm then return some Rule.expToExp2
      else throw "certificate: exp_to_exp2 with a constant that is not LOG2E"
    | _ => throw "certificate: exp_to_exp2 without its constant"
  | "mean_to_sum_div", [], none => return some (Rule.meanToSumDiv axis)
  | "matmul_as_sum", [b], none => return some (Rule.matmulAsSum axis (flag b))
  | "exp_shift_to_max", [], some c => return (if fn == "exp" then some (Rule.expShiftToMax axis c) else none)
  | "sum_scale_commute", [1, f], some s =>
    if fn == "mul" then return some (Rule.sumScaleRight axis s (flag f))
    else if fn == "div" && f == 0 then return some (Rule.sumScaleDiv axis s)
    else throw "certificate: sum_scale_commute with a bad instance"
  | "sum_scale_commute", [0, f], some s =>
    if fn == "mul" then return some (Rule.sumScaleLeft axis s (flag f))
    else throw "certificate: sum_scale_commute with a bad instance"
  | _, _, _ => return none

/-- One algebraic step: the step and the node of its recorded result; `none` where Lean has no form
of its rule. -/
def parseStep (j : Lean.Json) (nodes : Array Term) : Except String (Option (Step × Nat)) := do
  let pos := j.getObjValD "position"
  let rule ← parseRule (← jStr j "rule") (j.getObjValD "instance") nodes
  let output ← jNat (pos.getObjValD "output")
  let path ← (← jList pos "path").mapM jNat
  let result ← jNat (j.getObjValD "term")
  return rule.map fun r => (Step.mk r output path, result)

/-- Whether a plan field is a non-empty list (an axis view the Lean rules do not replay). -/
def nonEmptyList (j : Lean.Json) : Bool :=
  match j with
  | .arr a => a.size > 0
  | _ => false

/-! ## The check -/

/-- Each step one by one: its rewrite must be the recorded term. -/
def checkSteps (nodes : Array Term) : List Term → List (Step × Nat) → Nat → Except String Unit
  | _, [], _ => pure ()
  | outs, (s, res) :: rest, k => do
    match s.run outs with
    | none => throw s!"derivation step {k} ({s.rule.name}) does not apply in Lean's replay"
    | some (sub, new) =>
      if !(Term.same new (← nodeAt nodes res)) then
        throw s!"derivation step {k} ({s.rule.name}): Lean's replay gives another term than the recorded one"
      checkSteps nodes (outs.map (Term.replace sub new)) rest (k + 1)

/-- The tensor `name`'s term in `env`. -/
def envTerm (env : List (String × Term)) (name : String) : Option Term :=
  (env.find? (fun p => p.1 == name)).map (·.2)

/-- The kernels' terms, composed in kernel order, must give the derived outputs. -/
def checkKernels (g : Graph) (plan : Lean.Json) (cert : Lean.Json) (nodes : Array Term)
    (final : List Term) : Except String Unit := do
  let mut env : List (String × Term) := g.inputs.map fun p => (p.1, Term.input p.1 p.2)
  let kernels ← jList plan "kernels"
  let terms ← jList cert "kernels"
  if kernels.length != terms.length then throw "certificate: one entry per kernel expected"
  for (k, kt) in kernels.zip terms do
    let writes ← (← jList k "writes").mapM jString
    let ixs ← (← jList kt "writes").mapM jNat
    if writes.length != ixs.length then throw "certificate: one term per kernel write expected"
    for (name, ix) in writes.zip ixs do
      env := env ++ [(name, Term.substInputs env (← nodeAt nodes ix))]
  for ((name, _), t) in g.outputs.zip final do
    match envTerm env name with
    | some v => if !(Term.same v t) then throw s!"certificate: the kernels compute output '{name}' otherwise"
    | none => throw s!"certificate: no kernel writes output '{name}'"

/-- Replays the plan's certificate from the Lean graph: `true` when replayed and matching, `false`
when the plan is outside the Lean rules (see the module note), an error when it does not replay. -/
def checkCertificate (g : Graph) (plan : Lean.Json) : Except String Bool := do
  let cert := plan.getObjValD "certificate"
  let steps ← jList plan "derivation"
  match cert with
  | .null => if steps.isEmpty then return false else throw "the plan's derivation has no certificate"
  | _ => pure ()
  if nonEmptyList (plan.getObjValD "axis_units") || nonEmptyList (plan.getObjValD "axis_merges") ||
      nonEmptyList (plan.getObjValD "axis_splits") then
    return false
  let nodes ← parseNodes (← jList cert "nodes")
  let mut algebraic : List (Step × Nat) := []
  for j in steps do
    match j.getObjValD "position" with
    | .null => pure ()
    | _ =>
      match (← parseStep j nodes) with
      | some st => algebraic := algebraic ++ [st]
      | none => return false
  let outs := g.outputs.map (·.2)
  checkSteps nodes outs algebraic 0
  match replay outs (algebraic.map (·.1)) with
  | none => throw "the derivation does not replay in Lean"
  | some final =>
    let derived ← (← jList cert "derived").mapM fun j => do nodeAt nodes (← jNat j)
    if derived.length != final.length then throw "certificate: one derived term per output expected"
    for (t, d) in final.zip derived do
      if !(Term.same t d) then throw "certificate: Lean's replay does not give the derived outputs"
    checkKernels g plan cert nodes final
    return true

end Superopt

import Lean.Data.Json
import Superopt.Replay

/-!
# Reading a plan's certificate and replaying it in Lean

The Python planner writes each plan's derivation as a certificate (`pyrunner/plan/certificate.py`):
a table of term nodes (`certificate.nodes`, operands before users), each algebraic step's rule,
instantiation (`instance`: axis, function, scale node, constant, operand choices) and position
(`position`: an output and a path), the node of its result (`term`), the derived outputs
(`certificate.derived`) and each kernel's terms over the tensors it reads (`certificate.kernels`).

`checkCertificate` parses that and runs the steps one by one from the Lean graph's outputs: each
step's rule instance (`Rule`, `Superopt/Replay.lean`) is read off the sub-term at its position with its
instance fields (`buildRule`, not trusted: `Rule.apply` re-checks it), its rewrite must be the
recorded term, `replay` (the function `replay_sound` is about) to give the derived outputs, and the
kernels' terms, each tensor they read replaced by what the kernel writing it computes, to give
the derived outputs too. Terms are compared with their decimals normalised (`1024.0` and `1024`
are one number), as Python compares floats.

It answers `true` when it replayed the derivation and `false` when the plan is outside what the
Lean rules cover (axis views: `unit_axis`, `merge_axes`, `split_reduction`): such a plan's algebraic
steps are checked by Python's replay (`python -m pyrunner validate`) and its views by the
side-condition checks of `Superopt/Schedule.lean`. Every algebraic rule of the Python registry has a
`Rule` constructor, the product rebuilds included.
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

/-- A step's rule and instance fields as the certificate gives them (not yet read against a term). -/
structure StepSpec where
  rule : String
  axis : String
  fn : String
  choice : List Nat
  scale : Option Term
  /-- Whether the instance's constant is `LOG2E` (only `exp_to_exp2` reads it). -/
  log2e : Bool
  /-- The factor paths below the position (only the product rebuilds read them). -/
  factors : List (List Nat)
  output : Nat
  path : List Nat
  /-- The node of the step's recorded result. -/
  result : Nat

/-- The rules whose every form has a `Rule` constructor: every algebraic rule. -/
def leanRules : List String :=
  ["softmax_max_shift", "softmax_scaled_max_shift", "matmul_div_commute", "matmul_row_scale_commute",
    "exp_to_exp2", "mean_to_sum_div", "variance_sum_of_squares", "matmul_as_sum", "matmul_assoc",
    "exp_shift_to_max", "sum_scale_commute", "elementwise_mul_assoc", "elementwise_mul_comm"]

/-- Whether the instance's scale is the term `t` (constants compared as numbers). -/
def scaleIs (scale : Option Term) (t : Term) : Bool :=
  match scale with
  | some s => Term.same s t
  | none => false

/-- The exponential an instance names (`exp` or `exp2`). -/
def expFn (fn : String) : Option UnaryOp :=
  if fn == "exp" then some .exp else if fn == "exp2" then some .exp2 else none

/--
The rule instance a step means, read off the sub-term at its position with the instance fields
(`none` where the sub-term or the fields do not fit the rule). Not trusted: `Rule.apply` re-checks
that the sub-term is the instance's left-hand side and that its side condition holds.
-/
def buildRule (sp : StepSpec) (sub : Term) : Option Rule :=
  match sp.rule, sp.choice, sub with
  | "softmax_max_shift", [], .binary .div (.unary f x) _ =>
    if expFn sp.fn == some f && sp.scale.isNone then some (.softmaxMaxShift f x sp.axis) else none
  | "softmax_scaled_max_shift", [side], .binary .div (.unary .exp (.binary .mul p q)) _ =>
    if sp.fn != "exp" then none
    else if side == 1 && scaleIs sp.scale q then some (.softmaxScaledMaxShift p q sp.axis false)
    else if side == 0 && scaleIs sp.scale p then some (.softmaxScaledMaxShift q p sp.axis true)
    else none
  | "matmul_div_commute", [0], .matmul (.binary .div p l) v a =>
    if scaleIs sp.scale l then some (.matmulDivLeft p l v a) else none
  | "matmul_div_commute", [1], .matmul v (.binary .div p l) a =>
    if scaleIs sp.scale l then some (.matmulDivRight v p l a) else none
  | "matmul_row_scale_commute", [0, 1, f], .matmul (.binary .mul x s) w a =>
    if scaleIs sp.scale s then some (.rowScaleXS x s w a (flag f)) else none
  | "matmul_row_scale_commute", [0, 0, f], .matmul (.binary .mul s x) w a =>
    if scaleIs sp.scale s then some (.rowScaleSX s x w a (flag f)) else none
  | "matmul_row_scale_commute", [1, 1, f], .matmul w (.binary .mul x s) a =>
    if scaleIs sp.scale s then some (.rowScaleWXS w x s a (flag f)) else none
  | "matmul_row_scale_commute", [1, 0, f], .matmul w (.binary .mul s x) a =>
    if scaleIs sp.scale s then some (.rowScaleWSX w s x a (flag f)) else none
  | "exp_to_exp2", [], .unary .exp x => if sp.log2e then some (.expToExp2 x) else none
  | "mean_to_sum_div", [], .reduce .mean x a =>
    if a == sp.axis then some (.meanToSumDiv x a) else none
  | "variance_sum_of_squares", [], .reduce .mean (.unary .square (.binary .sub x _)) a =>
    if a == sp.axis then some (.varianceSumOfSquares x a) else none
  | "matmul_as_sum", [b], .matmul x w a =>
    if a == sp.axis then some (.matmulAsSum x w a (flag b)) else none
  | "matmul_assoc", [side, bAt, bcSwap, outSwap], .matmul o₀ o₁ k =>
    let inner := if side == 0 then o₀ else o₁
    let other := if side == 0 then o₁ else o₀
    match inner with
    | .matmul i₀ i₁ j =>
      if bAt == 1 then some (.matmulAssoc i₀ i₁ other j k (side == 1) false (flag bcSwap) (flag outSwap))
      else some (.matmulAssoc i₁ i₀ other j k (side == 1) true (flag bcSwap) (flag outSwap))
    | _ => none
  | "exp_shift_to_max", [], .unary f arg =>
    if expFn sp.fn != some f then none
    else
      match sp.scale, arg with
      | none, .binary .sub x n => some (.expShiftToMax f x n none sp.axis)
      | some c, .binary .mul (.binary .sub x n) c' =>
        if Term.same c c' then some (.expShiftToMax f x n (some c') sp.axis) else none
      | _, _ => none
  | "sum_scale_commute", [1, f], .reduce .sum (.binary .mul x s) a =>
    if sp.fn == "mul" && scaleIs sp.scale s then some (.sumScaleRight x s a (flag f)) else none
  | "sum_scale_commute", [0, f], .reduce .sum (.binary .mul s x) a =>
    if sp.fn == "mul" && scaleIs sp.scale s then some (.sumScaleLeft s x a (flag f)) else none
  | "sum_scale_commute", [1, 0], .reduce .sum (.binary .div x s) a =>
    if sp.fn == "div" && scaleIs sp.scale s then some (.sumScaleDiv x s a) else none
  | "elementwise_mul_assoc", [], t => some (.mulAssoc t sp.factors)
  | "elementwise_mul_comm", perm, t =>
    if perm.length == sp.factors.length then some (.mulComm t sp.factors perm) else none
  | _, _, _ => none

/-- Whether an instance's constant is Python's `LOG2E` (compared as numbers). -/
def constIsLog2e (j : Lean.Json) : Bool :=
  match j with
  | .num n => (Decimal.mk n.mantissa n.exponent).norm == log2eDecimal.norm
  | _ => false

/-- One algebraic step's fields. -/
def parseStep (j : Lean.Json) (nodes : Array Term) : Except String StepSpec := do
  let pos := j.getObjValD "position"
  let inst := j.getObjValD "instance"
  let scale : Option Term ← match inst.getObjValD "scale" with
    | .null => pure none
    | s => do return some (← nodeAt nodes (← jNat s))
  let rule ← jStr j "rule"
  let axis ← jStr inst "axis"
  let fn ← jStr inst "fn"
  let choice ← (← jList inst "choice").mapM jNat
  let output ← jNat (pos.getObjValD "output")
  let path ← (← jList pos "path").mapM jNat
  let result ← jNat (j.getObjValD "term")
  let factors : List (List Nat) ← match inst.getObjValD "factors" with
    | .null => pure []
    | _ => do
      let paths ← jList inst "factors"
      paths.mapM fun p => do
        match p with
        | .arr a => a.toList.mapM jNat
        | _ => throw "certificate: a factor path is not a list"
  return { rule := rule, axis := axis, fn := fn, choice := choice, scale := scale,
    log2e := constIsLog2e (inst.getObjValD "constant"), factors := factors, output := output, path := path,
    result := result }

/-- Whether a plan field is a non-empty list (an axis view the Lean rules do not replay). -/
def nonEmptyList (j : Lean.Json) : Bool :=
  match j with
  | .arr a => a.size > 0
  | _ => false

/-! ## The check -/

/-- Each step one by one: its instance is read off the sub-term at its position, its rewrite
(`Step.run`, the function `replay_sound` is about) must be the recorded term; the steps built. -/
def checkSteps (nodes : Array Term) : List Term → List StepSpec → Nat → Except String (List Step)
  | _, [], _ => pure []
  | outs, sp :: rest, k => do
    let some sub := ((outs[sp.output]?).bind fun root => Term.at? root sp.path)
      | throw s!"derivation step {k} ({sp.rule}): its position leaves the terms in Lean's replay"
    let some rule := buildRule sp sub
      | throw s!"derivation step {k} ({sp.rule}): its instance does not fit the term at its position"
    let step : Step := ⟨rule, sp.output, sp.path⟩
    match step.run outs with
    | none => throw s!"derivation step {k} ({sp.rule}) does not apply in Lean's replay (side condition)"
    | some (old, new) =>
      if !(Term.same new (← nodeAt nodes sp.result)) then
        throw s!"derivation step {k} ({sp.rule}): Lean's replay gives another term than the recorded one"
      let built ← checkSteps nodes (outs.map (Term.replace old new)) rest (k + 1)
      return step :: built

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
  let mut algebraic : List StepSpec := []
  for j in steps do
    match j.getObjValD "position" with
    | .null => pure ()
    | _ =>
      let sp ← parseStep j nodes
      if !(leanRules.contains sp.rule) then return false
      algebraic := algebraic ++ [sp]
  let outs := g.outputs.map (·.2)
  let built ← checkSteps nodes outs algebraic 0
  match replay outs built with
  | none => throw "the derivation does not replay in Lean"
  | some final =>
    let derived ← (← jList cert "derived").mapM fun j => do nodeAt nodes (← jNat j)
    if derived.length != final.length then throw "certificate: one derived term per output expected"
    for (t, d) in final.zip derived do
      if !(Term.same t d) then throw "certificate: Lean's replay does not give the derived outputs"
    checkKernels g plan cert nodes final
    return true

end Superopt

import Lean.Data.Json
import Superopt.Graph
import Superopt.Rules
import Superopt.Workloads

/-!
# Plan emission (graph stage) and the `superopt` command line

`superopt WORKLOAD [--shape AXIS=N]...` prints a JSON document with the workload's graph (sizes,
inputs, outputs with their axes and terms) and the names of the proven rewrite rules;
`superopt --rules` prints the rules; `superopt --list` prints the catalog's names.

The full Lean planner (derivation search, kernel partitioning, tiling, cost model and kernel-plan
emission following `pyrunner/schema/plan.schema.json`) is future work: today the executable
Python twin in `pyrunner/` plans, and the document printed here says `"status": "graph-only"`.
What this module already pins down is the part both planners must agree on: the graph and the
rule names. The rule catalog names each theorem through a resolved name (double backquote), so
it cannot drift from `Superopt/Rules.lean`.

Graph JSON format (the same keys the Python side produces): a term is an object with `op` one of
`input`, `const`, `axis_size`, `unary`, `binary`, `reduce`, `matmul`; `fn` for functions and
reductions; `axis` for reductions, contractions and axis sizes; `name`/`axes` for inputs;
`value` for constants; `args` for operands.
-/

namespace Superopt

/-- A rewrite rule: the Lean theorem proving it and its statement in words. -/
structure RuleInfo where
  decl : Lean.Name
  statement : String

/-- The rule's name as plans spell it: the theorem's last name component. -/
def RuleInfo.name (r : RuleInfo) : String :=
  match r.decl with
  | .str _ s => s
  | n => n.toString

/-- Every proven rewrite rule, in the order of `pyrunner.rules.RULE_NAMES`. -/
def ruleCatalog : List RuleInfo := [
  ⟨``softmax_max_shift, "exp(x_i - m) / sum_j exp(x_j - m) = exp(x_i) / sum_j exp(x_j)"⟩,
  ⟨``matmul_div_commute, "(P / l) @ V = (P @ V) / l when l is constant along the contraction"⟩,
  ⟨``matmul_row_scale_commute, "(X * s) @ W = (X @ W) * s when s is constant along the contraction"⟩,
  ⟨``exp_to_exp2, "exp(x) = exp2(x * log2(e))"⟩,
  ⟨``mean_to_sum_div, "mean_a(x) = sum_a(x) / |a|"⟩,
  ⟨``reduction_tiling, "a sum or max over an axis is the combination of its tiles' sums or maxima"⟩,
  ⟨``online_softmax_rescale,
    "the online-softmax state (m, l, o) rescaled to a new shift and merged with a tile equals the direct computation"⟩,
  ⟨``shared_operand_fusion, "two contractions sharing an operand computed in one loop equal the separate ones"⟩,
  ⟨``reduction_in_contraction_loop,
    "a reduction over the contracted axis computed inside the contraction's loop, then used as a row scale"⟩]

/-- The rule names, in catalog order. -/
def ruleNames : List String := ruleCatalog.map (·.name)

/-- The version of this Lean package, reported in its output. -/
def version : String := "0.1.0"

/-- A term as JSON (nested; shared subterms appear once per use). -/
def Term.json : Term → Lean.Json
  | .input n axes =>
    Lean.Json.mkObj [("op", Lean.Json.str "input"), ("name", Lean.Json.str n),
      ("axes", Lean.toJson axes)]
  | .const v => Lean.Json.mkObj [("op", Lean.Json.str "const"), ("value", Lean.toJson v)]
  | .axisSize a => Lean.Json.mkObj [("op", Lean.Json.str "axis_size"), ("axis", Lean.Json.str a)]
  | .unary f x =>
    Lean.Json.mkObj [("op", Lean.Json.str "unary"), ("fn", Lean.Json.str f.name),
      ("args", Lean.Json.arr #[Term.json x])]
  | .binary f a b =>
    Lean.Json.mkObj [("op", Lean.Json.str "binary"), ("fn", Lean.Json.str f.name),
      ("args", Lean.Json.arr #[Term.json a, Term.json b])]
  | .reduce f x ax =>
    Lean.Json.mkObj [("op", Lean.Json.str "reduce"), ("fn", Lean.Json.str f.name),
      ("axis", Lean.Json.str ax), ("args", Lean.Json.arr #[Term.json x])]
  | .matmul a b ax =>
    Lean.Json.mkObj [("op", Lean.Json.str "matmul"), ("axis", Lean.Json.str ax),
      ("args", Lean.Json.arr #[Term.json a, Term.json b])]

/-- An input's name and axes as JSON. -/
def inputJson (p : String × List Axis) : Lean.Json :=
  Lean.Json.mkObj [("name", Lean.Json.str p.1), ("axes", Lean.toJson p.2)]

/-- An output's name, axes and term as JSON. -/
def outputJson (p : String × Term) : Lean.Json :=
  Lean.Json.mkObj [("name", Lean.Json.str p.1), ("axes", Lean.toJson p.2.resultAxes),
    ("term", p.2.json)]

/-- A graph as JSON. -/
def Graph.json (g : Graph) : Lean.Json :=
  Lean.Json.mkObj [
    ("name", Lean.Json.str g.name),
    ("sizes", Lean.Json.mkObj (g.sizes.map fun p => (p.1, Lean.toJson p.2))),
    ("inputs", Lean.Json.arr (g.inputs.map inputJson).toArray),
    ("outputs", Lean.Json.arr (g.outputs.map outputJson).toArray)]

/-- A rule as JSON. -/
def ruleJson (r : RuleInfo) : Lean.Json :=
  Lean.Json.mkObj [("name", Lean.Json.str r.name), ("statement", Lean.Json.str r.statement),
    ("theorem", Lean.Json.str r.decl.toString)]

/-- What `superopt --rules` prints. -/
def rulesDocument : Lean.Json :=
  Lean.Json.mkObj [("rules", Lean.Json.arr (ruleCatalog.map ruleJson).toArray)]

/-- What `superopt WORKLOAD` prints: the graph stage of a plan. -/
def planDocument (g : Graph) : Lean.Json :=
  Lean.Json.mkObj [
    ("planner", Lean.Json.str "lean-superopt"),
    ("version", Lean.Json.str version),
    ("status", Lean.Json.str "graph-only"),
    ("workload", Lean.Json.str g.name),
    ("graph", g.json),
    ("rules", Lean.toJson ruleNames)]

/-- The catalog workload called `name`, ignoring case (like Python's `workloads.get`). -/
def findWorkload (name : String) : Option Graph :=
  Workloads.catalog.find? fun g => g.name.toLower == name.toLower

/-- The catalog's names, comma-separated, for error messages. -/
def catalogNames : String := ", ".intercalate (Workloads.catalog.map (·.name))

/-- The usage line. -/
def usage : String :=
  "usage: superopt WORKLOAD [--shape AXIS=N]... | superopt --rules | superopt --list"

/-- Parses one `AXIS=N`. -/
def parseShape (spec : String) : Except String (Axis × Nat) :=
  match spec.splitOn "=" with
  | [a, n] =>
    match n.toNat? with
    | some k => .ok (a, k)
    | none => .error s!"--shape {spec}: the size must be a natural number"
  | _ => .error s!"--shape {spec}: expected AXIS=N"

/-- Parses the options after the workload name: only `--shape AXIS=N`, repeated. -/
def parseShapes : List String → Except String (List (Axis × Nat))
  | [] => .ok []
  | "--shape" :: spec :: rest => do
    let shape ← parseShape spec
    let tail ← parseShapes rest
    return shape :: tail
  | arg :: _ => .error s!"unexpected argument '{arg}'; {usage}"

/-- The command line; exit code 2 for bad input, as in the Python runner. -/
def runCli (args : List String) : IO UInt32 := do
  match args with
  | [] =>
    IO.eprintln usage
    return 2
  | ["--help"] =>
    IO.println usage
    return 0
  | ["--rules"] =>
    IO.println rulesDocument.pretty
    return 0
  | ["--list"] =>
    IO.println (Lean.toJson (Workloads.catalog.map (·.name))).pretty
    return 0
  | name :: rest =>
    match parseShapes rest with
    | .error e =>
      IO.eprintln s!"superopt: {e}"
      return 2
    | .ok shapes =>
      match findWorkload name with
      | none =>
        IO.eprintln s!"superopt: unknown workload '{name}'; the catalog has: {catalogNames}"
        return 2
      | some g =>
        match g.withSizes shapes with
        | .error e =>
          IO.eprintln s!"superopt: {e}"
          return 2
        | .ok sized =>
          IO.println (planDocument sized).pretty
          return 0

end Superopt

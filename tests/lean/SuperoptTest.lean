import Superopt.Basic

/-!
# Lean-side tests (`lake test`)

Runtime checks of the executable parts of the package: the op vocabularies, `resultAxes` on the
workloads, the catalog, resizing and the rule catalog. The theorems themselves are checked by
`lake build` (the kernel); `tests/test_lean_conformance.py` compares the executable's output
with the Python side where `lake` is available.
-/

open Superopt

/-- The output axes of the first output of the named workload. -/
def outputAxes (name : String) : List Axis :=
  match findWorkload name with
  | some g =>
    match g.outputs with
    | (_, t) :: _ => t.resultAxes
    | [] => []
  | none => []

/-- The sizes of a workload after resizing, or `none` when the resize is refused. -/
def resized (name : String) (shapes : List (Axis × Nat)) : Option (List (Axis × Nat)) :=
  match findWorkload name with
  | some g =>
    match g.withSizes shapes with
    | .ok h => some h.sizes
    | .error _ => none
  | none => none

/-- Each check: a label and whether it holds. -/
def checks : List (String × Bool) := [
  ("14 unary, 6 binary, 3 reduce functions",
    UnaryOp.all.length == 14 && BinaryOp.all.length == 6 && ReduceOp.all.length == 3),
  ("unary names", (UnaryOp.all.map UnaryOp.name) ==
    ["exp", "exp2", "log", "neg", "recip", "sqrt", "rsqrt", "square", "silu", "sigmoid",
      "tanh", "gelu", "relu", "abs"]),
  ("binary names", (BinaryOp.all.map BinaryOp.name) == ["add", "sub", "mul", "div", "max", "min"]),
  ("reduce names", (ReduceOp.all.map ReduceOp.name) == ["sum", "max", "mean"]),
  ("nine workloads", Workloads.catalog.length == 9),
  ("attention output axes", outputAxes "Attention" == ["h", "t_q", "d"]),
  ("gqa output axes", outputAxes "GroupedQueryAttention" == ["kv_h", "group", "t_q", "d"]),
  ("swiglu output axes", outputAxes "SwiGLU" == ["m", "n"]),
  ("rmsnorm output axes", outputAxes "RMSNorm" == ["m", "n"]),
  ("scores axes", (Term.matmul (Term.input "Q" ["h", "t_q", "d"])
      (Term.input "K" ["h", "t_kv", "d"]) "d").resultAxes == ["h", "t_q", "t_kv"]),
  ("broadcast axes", (Term.binary .add (Term.input "A" ["m"]) (Term.input "B" ["n", "m"])).resultAxes
      == ["m", "n"]),
  ("attention inputs", ((findWorkload "Attention").map (·.inputs)) ==
    some [("Q", ["h", "t_q", "d"]), ("K", ["h", "t_kv", "d"]), ("V", ["h", "t_kv", "d"])]),
  ("lookup ignores case", (findWorkload "swiglu").isSome),
  ("unknown workload", (findWorkload "NoSuchWorkload").isNone),
  ("resize", resized "Matmul" [("m", 8), ("n", 16)] == some [("m", 8), ("d", 4096), ("n", 16)]),
  ("resize refuses an unknown axis", resized "Matmul" [("zz", 8)] == none),
  ("resize refuses zero", resized "Matmul" [("m", 0)] == none),
  ("shape parsing", parseShapes ["--shape", "m=8"] matches .ok [("m", 8)]),
  ("bad shape refused", parseShapes ["--shape", "m=x"] matches .error _),
  ("nine rules", ruleNames.length == 9),
  ("rule names", ruleNames == ["softmax_max_shift", "matmul_div_commute",
    "matmul_row_scale_commute", "exp_to_exp2", "mean_to_sum_div", "reduction_tiling",
    "online_softmax_rescale", "shared_operand_fusion", "reduction_in_contraction_loop"])]

/-- Runs every check; exit code 1 when any fails. -/
def main : IO UInt32 := do
  let failed := checks.filter (fun c => !c.2)
  for c in failed do
    IO.eprintln s!"FAIL: {c.1}"
  IO.println s!"{checks.length - failed.length}/{checks.length} Lean checks passed"
  return if failed.isEmpty then 0 else 1

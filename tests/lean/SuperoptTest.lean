import Superopt.Basic

/-!
# Lean-side tests (`lake test`)

Runtime checks of the executable parts of the package: the op vocabularies, `resultAxes`, the
catalog, resizing, option parsing, the rule catalog, the exact number printer, the graph JSON
writer, the derivation replay (`Rule.apply`, positions, `replay`, the product rebuilds) and the loop-form
checks of the schedule rules (`kernelProblem`, `runRange`). The theorems themselves are checked by
`lake build` (the kernel).

`goldenGraphs` holds, for every catalog workload, the text of `json.dumps(graph_to_json(g))` as
Python prints it; `tests/test_lean_protocol.py` checks that these strings are still what Python
prints, and this test checks that `Graph.jsonText` prints them, so the Lean writer and the Python
writer agree without a Lean compiler on the Python side. `numberTable` does the same for the
number printer: Python checks each expected string against its own `repr`.
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

/-- The graph JSON of a workload, resized (empty when anything is refused). -/
def graphText (name : String) (shapes : List (Axis × Nat)) : String :=
  match findWorkload name with
  | some g =>
    match g.withSizes shapes with
    | .ok h => h.jsonText
    | .error _ => ""
  | none => ""

/-- Python's `json.dumps(graph_to_json(CATALOG[name]()))` for every catalog workload. -/
def goldenGraphs : List (String × String) := [
  ("Attention",
    "{\"name\": \"Attention\", \"axes\": {\"h\": 16, \"t_q\": 4096, \"d\": 128, \"t_kv\": 4096}, \"inputs\": {\"Q\": [\"h\", \"t_q\", \"d\"], \"K\": [\"h\", \"t_kv\", \"d\"], \"V\": [\"h\", \"t_kv\", \"d\"]}, \"nodes\": [{\"name\": \"S\", \"op\": \"matmul\", \"args\": [\"Q\", \"K\"], \"contract\": \"d\"}, {\"name\": \"t1\", \"op\": \"exp\", \"args\": [\"S\"]}, {\"name\": \"t2\", \"op\": \"sum\", \"args\": [\"t1\"], \"axis\": \"t_kv\"}, {\"name\": \"P\", \"op\": \"div\", \"args\": [\"t1\", \"t2\"]}, {\"name\": \"O\", \"op\": \"matmul\", \"args\": [\"P\", \"V\"], \"contract\": \"t_kv\"}], \"outputs\": [\"O\"]}"),
  ("SwiGLU",
    "{\"name\": \"SwiGLU\", \"axes\": {\"m\": 1024, \"d\": 2048, \"n\": 2048}, \"inputs\": {\"X\": [\"m\", \"d\"], \"W_gate\": [\"d\", \"n\"], \"W_up\": [\"d\", \"n\"]}, \"nodes\": [{\"name\": \"G\", \"op\": \"matmul\", \"args\": [\"X\", \"W_gate\"], \"contract\": \"d\"}, {\"name\": \"t1\", \"op\": \"silu\", \"args\": [\"G\"]}, {\"name\": \"U\", \"op\": \"matmul\", \"args\": [\"X\", \"W_up\"], \"contract\": \"d\"}, {\"name\": \"Y\", \"op\": \"mul\", \"args\": [\"t1\", \"U\"]}], \"outputs\": [\"Y\"]}"),
  ("Matmul",
    "{\"name\": \"Matmul\", \"axes\": {\"m\": 1024, \"d\": 4096, \"n\": 4096}, \"inputs\": {\"X\": [\"m\", \"d\"], \"W\": [\"d\", \"n\"]}, \"nodes\": [{\"name\": \"Y\", \"op\": \"matmul\", \"args\": [\"X\", \"W\"], \"contract\": \"d\"}], \"outputs\": [\"Y\"]}"),
  ("RMSNorm",
    "{\"name\": \"RMSNorm\", \"axes\": {\"m\": 1024, \"d\": 4096, \"n\": 4096}, \"inputs\": {\"X\": [\"m\", \"d\"], \"W\": [\"d\", \"n\"]}, \"nodes\": [{\"name\": \"t1\", \"op\": \"square\", \"args\": [\"X\"]}, {\"name\": \"t2\", \"op\": \"mean\", \"args\": [\"t1\"], \"axis\": \"d\"}, {\"name\": \"t3\", \"op\": \"add\", \"args\": [\"t2\", 1e-06]}, {\"name\": \"t4\", \"op\": \"rsqrt\", \"args\": [\"t3\"]}, {\"name\": \"N\", \"op\": \"mul\", \"args\": [\"X\", \"t4\"]}, {\"name\": \"Y\", \"op\": \"matmul\", \"args\": [\"N\", \"W\"], \"contract\": \"d\"}], \"outputs\": [\"Y\"]}"),
  ("RMSNormMLP",
    "{\"name\": \"RMSNormMLP\", \"axes\": {\"m\": 1024, \"d\": 1024, \"n\": 1024}, \"inputs\": {\"X\": [\"m\", \"d\"], \"W_up\": [\"d\", \"n\"], \"W_gate\": [\"d\", \"n\"]}, \"nodes\": [{\"name\": \"t1\", \"op\": \"square\", \"args\": [\"X\"]}, {\"name\": \"t2\", \"op\": \"mean\", \"args\": [\"t1\"], \"axis\": \"d\"}, {\"name\": \"t3\", \"op\": \"add\", \"args\": [\"t2\", 1e-06]}, {\"name\": \"t4\", \"op\": \"rsqrt\", \"args\": [\"t3\"]}, {\"name\": \"N\", \"op\": \"mul\", \"args\": [\"X\", \"t4\"]}, {\"name\": \"t5\", \"op\": \"matmul\", \"args\": [\"N\", \"W_up\"], \"contract\": \"d\"}, {\"name\": \"t6\", \"op\": \"matmul\", \"args\": [\"N\", \"W_gate\"], \"contract\": \"d\"}, {\"name\": \"Y\", \"op\": \"mul\", \"args\": [\"t5\", \"t6\"]}], \"outputs\": [\"Y\"]}"),
  ("ScaledAttention",
    "{\"name\": \"ScaledAttention\", \"axes\": {\"h\": 16, \"t_q\": 4096, \"d\": 128, \"t_kv\": 4096}, \"inputs\": {\"Q\": [\"h\", \"t_q\", \"d\"], \"K\": [\"h\", \"t_kv\", \"d\"], \"V\": [\"h\", \"t_kv\", \"d\"]}, \"nodes\": [{\"name\": \"t1\", \"op\": \"matmul\", \"args\": [\"Q\", \"K\"], \"contract\": \"d\"}, {\"name\": \"t2\", \"op\": \"size\", \"axis\": \"d\"}, {\"name\": \"t3\", \"op\": \"rsqrt\", \"args\": [\"t2\"]}, {\"name\": \"S\", \"op\": \"mul\", \"args\": [\"t1\", \"t3\"]}, {\"name\": \"t4\", \"op\": \"exp\", \"args\": [\"S\"]}, {\"name\": \"t5\", \"op\": \"sum\", \"args\": [\"t4\"], \"axis\": \"t_kv\"}, {\"name\": \"P\", \"op\": \"div\", \"args\": [\"t4\", \"t5\"]}, {\"name\": \"O\", \"op\": \"matmul\", \"args\": [\"P\", \"V\"], \"contract\": \"t_kv\"}], \"outputs\": [\"O\"]}"),
  ("GroupedQueryAttention",
    "{\"name\": \"GroupedQueryAttention\", \"axes\": {\"kv_h\": 4, \"group\": 4, \"t_q\": 4096, \"d\": 128, \"t_kv\": 4096}, \"inputs\": {\"Q\": [\"kv_h\", \"group\", \"t_q\", \"d\"], \"K\": [\"kv_h\", \"t_kv\", \"d\"], \"V\": [\"kv_h\", \"t_kv\", \"d\"]}, \"nodes\": [{\"name\": \"t1\", \"op\": \"matmul\", \"args\": [\"Q\", \"K\"], \"contract\": \"d\"}, {\"name\": \"t2\", \"op\": \"size\", \"axis\": \"d\"}, {\"name\": \"t3\", \"op\": \"rsqrt\", \"args\": [\"t2\"]}, {\"name\": \"S\", \"op\": \"mul\", \"args\": [\"t1\", \"t3\"]}, {\"name\": \"t4\", \"op\": \"exp\", \"args\": [\"S\"]}, {\"name\": \"t5\", \"op\": \"sum\", \"args\": [\"t4\"], \"axis\": \"t_kv\"}, {\"name\": \"P\", \"op\": \"div\", \"args\": [\"t4\", \"t5\"]}, {\"name\": \"O\", \"op\": \"matmul\", \"args\": [\"P\", \"V\"], \"contract\": \"t_kv\"}], \"outputs\": [\"O\"]}"),
  ("GeGLU",
    "{\"name\": \"GeGLU\", \"axes\": {\"m\": 1024, \"d\": 2048, \"n\": 2048}, \"inputs\": {\"X\": [\"m\", \"d\"], \"W_gate\": [\"d\", \"n\"], \"W_up\": [\"d\", \"n\"]}, \"nodes\": [{\"name\": \"G\", \"op\": \"matmul\", \"args\": [\"X\", \"W_gate\"], \"contract\": \"d\"}, {\"name\": \"t1\", \"op\": \"gelu\", \"args\": [\"G\"]}, {\"name\": \"U\", \"op\": \"matmul\", \"args\": [\"X\", \"W_up\"], \"contract\": \"d\"}, {\"name\": \"Y\", \"op\": \"mul\", \"args\": [\"t1\", \"U\"]}], \"outputs\": [\"Y\"]}"),
  ("LayerNormMatmul",
    "{\"name\": \"LayerNormMatmul\", \"axes\": {\"m\": 1024, \"d\": 4096, \"n\": 4096}, \"inputs\": {\"X\": [\"m\", \"d\"], \"W\": [\"d\", \"n\"]}, \"nodes\": [{\"name\": \"t1\", \"op\": \"mean\", \"args\": [\"X\"], \"axis\": \"d\"}, {\"name\": \"t2\", \"op\": \"sub\", \"args\": [\"X\", \"t1\"]}, {\"name\": \"t3\", \"op\": \"square\", \"args\": [\"t2\"]}, {\"name\": \"t4\", \"op\": \"mean\", \"args\": [\"t3\"], \"axis\": \"d\"}, {\"name\": \"t5\", \"op\": \"add\", \"args\": [\"t4\", 1e-05]}, {\"name\": \"t6\", \"op\": \"rsqrt\", \"args\": [\"t5\"]}, {\"name\": \"N\", \"op\": \"mul\", \"args\": [\"t2\", \"t6\"]}, {\"name\": \"Y\", \"op\": \"matmul\", \"args\": [\"N\", \"W\"], \"contract\": \"d\"}], \"outputs\": [\"Y\"]}"),
  ("CausalAttention",
    "{\"name\": \"CausalAttention\", \"axes\": {\"h\": 16, \"t_q\": 4096, \"d\": 128, \"t_kv\": 4096}, \"inputs\": {\"Q\": [\"h\", \"t_q\", \"d\"], \"K\": [\"h\", \"t_kv\", \"d\"], \"V\": [\"h\", \"t_kv\", \"d\"]}, \"nodes\": [{\"name\": \"t1\", \"op\": \"iota\", \"axis\": \"t_kv\"}, {\"name\": \"t2\", \"op\": \"iota\", \"axis\": \"t_q\"}, {\"name\": \"causal\", \"op\": \"le\", \"args\": [\"t1\", \"t2\"]}, {\"name\": \"t3\", \"op\": \"matmul\", \"args\": [\"Q\", \"K\"], \"contract\": \"d\"}, {\"name\": \"t4\", \"op\": \"size\", \"axis\": \"d\"}, {\"name\": \"t5\", \"op\": \"rsqrt\", \"args\": [\"t4\"]}, {\"name\": \"S\", \"op\": \"mul\", \"args\": [\"t3\", \"t5\"]}, {\"name\": \"S_masked\", \"op\": \"where\", \"args\": [\"causal\", \"S\", \"-inf\"]}, {\"name\": \"t6\", \"op\": \"exp\", \"args\": [\"S_masked\"]}, {\"name\": \"t7\", \"op\": \"sum\", \"args\": [\"t6\"], \"axis\": \"t_kv\"}, {\"name\": \"P\", \"op\": \"div\", \"args\": [\"t6\", \"t7\"]}, {\"name\": \"O\", \"op\": \"matmul\", \"args\": [\"P\", \"V\"], \"contract\": \"t_kv\"}], \"outputs\": [\"O\"]}"),
  ("SlidingWindowAttention",
    "{\"name\": \"SlidingWindowAttention\", \"axes\": {\"h\": 16, \"t_q\": 4096, \"d\": 128, \"t_kv\": 4096}, \"inputs\": {\"Q\": [\"h\", \"t_q\", \"d\"], \"K\": [\"h\", \"t_kv\", \"d\"], \"V\": [\"h\", \"t_kv\", \"d\"]}, \"nodes\": [{\"name\": \"t1\", \"op\": \"iota\", \"axis\": \"t_kv\"}, {\"name\": \"t2\", \"op\": \"iota\", \"axis\": \"t_q\"}, {\"name\": \"t3\", \"op\": \"le\", \"args\": [\"t1\", \"t2\"]}, {\"name\": \"t4\", \"op\": \"sub\", \"args\": [\"t2\", 1024]}, {\"name\": \"t5\", \"op\": \"lt\", \"args\": [\"t4\", \"t1\"]}, {\"name\": \"window\", \"op\": \"min\", \"args\": [\"t3\", \"t5\"]}, {\"name\": \"t6\", \"op\": \"matmul\", \"args\": [\"Q\", \"K\"], \"contract\": \"d\"}, {\"name\": \"t7\", \"op\": \"size\", \"axis\": \"d\"}, {\"name\": \"t8\", \"op\": \"rsqrt\", \"args\": [\"t7\"]}, {\"name\": \"S\", \"op\": \"mul\", \"args\": [\"t6\", \"t8\"]}, {\"name\": \"S_masked\", \"op\": \"where\", \"args\": [\"window\", \"S\", \"-inf\"]}, {\"name\": \"t9\", \"op\": \"exp\", \"args\": [\"S_masked\"]}, {\"name\": \"t10\", \"op\": \"sum\", \"args\": [\"t9\"], \"axis\": \"t_kv\"}, {\"name\": \"P\", \"op\": \"div\", \"args\": [\"t9\", \"t10\"]}, {\"name\": \"O\", \"op\": \"matmul\", \"args\": [\"P\", \"V\"], \"contract\": \"t_kv\"}], \"outputs\": [\"O\"]}")]

/-- Python's text for Attention resized to `t_kv=64`, `d=32`. -/
def goldenResized : String :=
  "{\"name\": \"Attention\", \"axes\": {\"h\": 16, \"t_q\": 4096, \"d\": 32, \"t_kv\": 64}, \"inputs\": {\"Q\": [\"h\", \"t_q\", \"d\"], \"K\": [\"h\", \"t_kv\", \"d\"], \"V\": [\"h\", \"t_kv\", \"d\"]}, \"nodes\": [{\"name\": \"S\", \"op\": \"matmul\", \"args\": [\"Q\", \"K\"], \"contract\": \"d\"}, {\"name\": \"t1\", \"op\": \"exp\", \"args\": [\"S\"]}, {\"name\": \"t2\", \"op\": \"sum\", \"args\": [\"t1\"], \"axis\": \"t_kv\"}, {\"name\": \"P\", \"op\": \"div\", \"args\": [\"t1\", \"t2\"]}, {\"name\": \"O\", \"op\": \"matmul\", \"args\": [\"P\", \"V\"], \"contract\": \"t_kv\"}], \"outputs\": [\"O\"]}"

/-- Decimals and the text Python's `repr` gives the float nearest to each. -/
def numberTable : List (Decimal × String) := [
  (1e-6, "1e-06"),
  (1e-5, "1e-05"),
  (1.4426950408889634, "1.4426950408889634"),
  (0.5, "0.5"),
  (2, "2.0"),
  (1e16, "1e+16"),
  (1e-4, "0.0001"),
  (123.456, "123.456"),
  (1e22, "1e+22"),
  (0.001, "0.001"),
  (9007199254740992, "9007199254740992.0"),
  (6.02214076e23, "6.02214076e+23"),
  (2.5e-7, "2.5e-07")]

/-- The text a decimal gets after a round trip through `Lean.Json` (parse, then back). -/
def roundTrip (d : Decimal) : Option String :=
  match Lean.Json.parse d.pyRepr with
  | .ok (.num n) => some (Decimal.pyRepr ⟨n.mantissa, n.exponent⟩)
  | _ => none

/-- A row-scaled GEMM `(X * s) @_d W` and its rewrite `(X @_d W) * s`. -/
def scaledGemm (s : Term) : Term :=
  Term.matmul (Term.binary .mul (Term.input "X" ["m", "d"]) s) (Term.input "W" ["d", "n"]) "d"

/-- A sliding window `t_q - 1024 < t_kv` (as `t_q - t_kv - 1023 ≤ 0`) and causality `t_kv ≤ t_q`. -/
def windowMask : Pred :=
  .and (.atom ⟨[("t_q", 1), ("t_kv", -1)], -1023⟩) (.atom ⟨[("t_kv", 1), ("t_q", -1)], 0⟩)

/-- Rows `t_q` 2048..2111 of a query block; key tiles of 64. -/
def queryBlock : Box := fun a => if a = "t_q" then (2048, 2111) else (0, 0)

/-- The masked-tile checks: tiles far behind the window and past the diagonal are all false. -/
def tileChecks : List (String × Bool) :=
  [("a tile far behind the window is masked", windowMask.allFalse (stepBox queryBlock "t_kv" 64 0)),
    ("a tile in the window is not", !(windowMask.allFalse (stepBox queryBlock "t_kv" 64 20))),
    ("a tile past the diagonal is masked", windowMask.allFalse (stepBox queryBlock "t_kv" 64 34)),
    ("the diagonal tile is not", !(windowMask.allFalse (stepBox queryBlock "t_kv" 64 32))),
    ("steps 16..33 run, the rest are masked", skippedOk windowMask queryBlock "t_kv" 64 64 16 33),
    ("a run range that leaves out a visible step is refused",
      !(skippedOk windowMask queryBlock "t_kv" 64 64 17 33)),
    ("a window widened past the run range is refused",
      !(skippedOk (.and (.atom ⟨[("t_q", 1), ("t_kv", -1)], -100000⟩) (.atom ⟨[("t_kv", 1), ("t_q", -1)], 0⟩))
        queryBlock "t_kv" 64 64 16 33))]

/-- The loop-form checks of `Superopt/Schedule.lean` on small kernels: a sizes object, the kernel's
masks (plan expressions) and the kernel, with the answer Python's `pyrunner.plan.schedule_rules` gives
(`tests/test_lean_sources.py` runs these same cases there). -/
def scheduleExamples : List (String × String × Bool) := [
  ("a windowed online-softmax loop skipping the window's masked tiles",
    "{\"sizes\":{\"t_q\":4096,\"t_kv\":4096},\"masks\":[{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}],\"kernel\":{\"name\":\"attn\",\"grid\":[{\"axis\":\"t_q\",\"block\":64}],\"loop\":{\"axis\":\"t_kv\",\"block\":\"bk\",\"visible\":{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}},\"defaults\":{\"bk\":64},\"body\":[{\"op\":\"reduce\",\"fn\":\"max\",\"src\":\"S\",\"dst\":\"m\",\"axis\":\"t_kv\",\"accumulate\":true},{\"op\":\"map\",\"dst\":\"sc\",\"expr\":{\"kind\":\"call\",\"fn\":\"exp2\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"ref\",\"buf\":\"mp\"},{\"kind\":\"ref\",\"buf\":\"m\"}]}]}},{\"op\":\"reduce\",\"fn\":\"sum\",\"src\":\"S\",\"dst\":\"l\",\"axis\":\"t_kv\",\"accumulate\":false},{\"op\":\"gemm\",\"a\":\"P\",\"b\":\"V_s\",\"c\":\"acc\",\"contract\":\"t_kv\",\"clear\":false}],\"fused_rules\":[\"masked_tile_skip\",\"reduction_tiling\",\"online_softmax_rescale\",\"reduction_in_contraction_loop\"]}}",
    true),
  ("a window narrowed in loop.visible is refused",
    "{\"sizes\":{\"t_q\":4096,\"t_kv\":4096},\"masks\":[{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}],\"kernel\":{\"name\":\"attn\",\"grid\":[{\"axis\":\"t_q\",\"block\":64}],\"loop\":{\"axis\":\"t_kv\",\"block\":\"bk\",\"visible\":{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":512}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}},\"defaults\":{\"bk\":64},\"body\":[{\"op\":\"reduce\",\"fn\":\"max\",\"src\":\"S\",\"dst\":\"m\",\"axis\":\"t_kv\",\"accumulate\":true},{\"op\":\"map\",\"dst\":\"sc\",\"expr\":{\"kind\":\"call\",\"fn\":\"exp2\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"ref\",\"buf\":\"mp\"},{\"kind\":\"ref\",\"buf\":\"m\"}]}]}},{\"op\":\"reduce\",\"fn\":\"sum\",\"src\":\"S\",\"dst\":\"l\",\"axis\":\"t_kv\",\"accumulate\":false},{\"op\":\"gemm\",\"a\":\"P\",\"b\":\"V_s\",\"c\":\"acc\",\"contract\":\"t_kv\",\"clear\":false}],\"fused_rules\":[\"masked_tile_skip\",\"reduction_tiling\",\"online_softmax_rescale\",\"reduction_in_contraction_loop\"]}}",
    false),
  ("a skip with no mask in the kernel's terms is refused",
    "{\"sizes\":{\"t_q\":4096,\"t_kv\":4096},\"masks\":[],\"kernel\":{\"name\":\"attn\",\"grid\":[{\"axis\":\"t_q\",\"block\":64}],\"loop\":{\"axis\":\"t_kv\",\"block\":\"bk\",\"visible\":{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}},\"defaults\":{\"bk\":64},\"body\":[{\"op\":\"reduce\",\"fn\":\"max\",\"src\":\"S\",\"dst\":\"m\",\"axis\":\"t_kv\",\"accumulate\":true},{\"op\":\"map\",\"dst\":\"sc\",\"expr\":{\"kind\":\"call\",\"fn\":\"exp2\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"ref\",\"buf\":\"mp\"},{\"kind\":\"ref\",\"buf\":\"m\"}]}]}},{\"op\":\"reduce\",\"fn\":\"sum\",\"src\":\"S\",\"dst\":\"l\",\"axis\":\"t_kv\",\"accumulate\":false},{\"op\":\"gemm\",\"a\":\"P\",\"b\":\"V_s\",\"c\":\"acc\",\"contract\":\"t_kv\",\"clear\":false}],\"fused_rules\":[\"masked_tile_skip\",\"reduction_tiling\",\"online_softmax_rescale\",\"reduction_in_contraction_loop\"]}}",
    false),
  ("masked_tile_skip cited by a loop that skips nothing is refused",
    "{\"sizes\":{\"t_q\":4096,\"t_kv\":4096},\"masks\":[{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}],\"kernel\":{\"name\":\"attn\",\"grid\":[{\"axis\":\"t_q\",\"block\":64}],\"loop\":{\"axis\":\"t_kv\",\"block\":\"bk\"},\"defaults\":{\"bk\":64},\"body\":[{\"op\":\"reduce\",\"fn\":\"max\",\"src\":\"S\",\"dst\":\"m\",\"axis\":\"t_kv\",\"accumulate\":true},{\"op\":\"map\",\"dst\":\"sc\",\"expr\":{\"kind\":\"call\",\"fn\":\"exp2\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"ref\",\"buf\":\"mp\"},{\"kind\":\"ref\",\"buf\":\"m\"}]}]}},{\"op\":\"reduce\",\"fn\":\"sum\",\"src\":\"S\",\"dst\":\"l\",\"axis\":\"t_kv\",\"accumulate\":false},{\"op\":\"gemm\",\"a\":\"P\",\"b\":\"V_s\",\"c\":\"acc\",\"contract\":\"t_kv\",\"clear\":false}],\"fused_rules\":[\"masked_tile_skip\",\"reduction_tiling\",\"online_softmax_rescale\",\"reduction_in_contraction_loop\"]}}",
    false),
  ("a loop skipping tiles without citing masked_tile_skip is refused",
    "{\"sizes\":{\"t_q\":4096,\"t_kv\":4096},\"masks\":[{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}],\"kernel\":{\"name\":\"attn\",\"grid\":[{\"axis\":\"t_q\",\"block\":64}],\"loop\":{\"axis\":\"t_kv\",\"block\":\"bk\",\"visible\":{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}},\"defaults\":{\"bk\":64},\"body\":[{\"op\":\"reduce\",\"fn\":\"max\",\"src\":\"S\",\"dst\":\"m\",\"axis\":\"t_kv\",\"accumulate\":true},{\"op\":\"map\",\"dst\":\"sc\",\"expr\":{\"kind\":\"call\",\"fn\":\"exp2\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"ref\",\"buf\":\"mp\"},{\"kind\":\"ref\",\"buf\":\"m\"}]}]}},{\"op\":\"reduce\",\"fn\":\"sum\",\"src\":\"S\",\"dst\":\"l\",\"axis\":\"t_kv\",\"accumulate\":false},{\"op\":\"gemm\",\"a\":\"P\",\"b\":\"V_s\",\"c\":\"acc\",\"contract\":\"t_kv\",\"clear\":false}],\"fused_rules\":[\"reduction_tiling\",\"online_softmax_rescale\",\"reduction_in_contraction_loop\"]}}",
    false),
  ("an online softmax needs its running max over the loop axis",
    "{\"sizes\":{\"t_q\":4096,\"t_kv\":4096},\"masks\":[{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}],\"kernel\":{\"name\":\"attn\",\"grid\":[{\"axis\":\"t_q\",\"block\":64}],\"loop\":{\"axis\":\"t_kv\",\"block\":\"bk\",\"visible\":{\"kind\":\"call\",\"fn\":\"min\",\"args\":[{\"kind\":\"call\",\"fn\":\"le\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_kv\"},{\"kind\":\"index\",\"axis\":\"t_q\"}]},{\"kind\":\"call\",\"fn\":\"lt\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"index\",\"axis\":\"t_q\"},{\"kind\":\"const\",\"value\":1024}]},{\"kind\":\"index\",\"axis\":\"t_kv\"}]}]}},\"defaults\":{\"bk\":64},\"body\":[{\"op\":\"reduce\",\"fn\":\"max\",\"src\":\"S\",\"dst\":\"m\",\"axis\":\"t_q\",\"accumulate\":true},{\"op\":\"map\",\"dst\":\"sc\",\"expr\":{\"kind\":\"call\",\"fn\":\"exp2\",\"args\":[{\"kind\":\"call\",\"fn\":\"sub\",\"args\":[{\"kind\":\"ref\",\"buf\":\"mp\"},{\"kind\":\"ref\",\"buf\":\"m\"}]}]}},{\"op\":\"reduce\",\"fn\":\"sum\",\"src\":\"S\",\"dst\":\"l\",\"axis\":\"t_kv\",\"accumulate\":false},{\"op\":\"gemm\",\"a\":\"P\",\"b\":\"V_s\",\"c\":\"acc\",\"contract\":\"t_kv\",\"clear\":false}],\"fused_rules\":[\"masked_tile_skip\",\"reduction_tiling\",\"online_softmax_rescale\",\"reduction_in_contraction_loop\"]}}",
    false),
  ("tiles of 32 cover a row of 64",
    "{\"sizes\":{\"m\":64,\"d\":64},\"masks\":[],\"kernel\":{\"name\":\"rows\",\"grid\":[{\"axis\":\"m\",\"block\":16}],\"loop\":{\"axis\":\"d\",\"block\":32},\"body\":[{\"op\":\"load\",\"src\":\"X\",\"dst\":\"X_s\"},{\"op\":\"map\",\"dst\":\"sq\",\"expr\":{\"kind\":\"call\",\"fn\":\"square\",\"args\":[{\"kind\":\"ref\",\"buf\":\"X_s\"}]}},{\"op\":\"reduce\",\"fn\":\"sum\",\"src\":\"sq\",\"dst\":\"ss\",\"axis\":\"d\",\"accumulate\":true}],\"fused_rules\":[\"reduction_tiling\"]}}",
    true),
  ("tiles of 48 leave a partial tile of 64 unmasked",
    "{\"sizes\":{\"m\":64,\"d\":64},\"masks\":[],\"kernel\":{\"name\":\"rows\",\"grid\":[{\"axis\":\"m\",\"block\":16}],\"loop\":{\"axis\":\"d\",\"block\":48},\"body\":[{\"op\":\"load\",\"src\":\"X\",\"dst\":\"X_s\"},{\"op\":\"map\",\"dst\":\"sq\",\"expr\":{\"kind\":\"call\",\"fn\":\"square\",\"args\":[{\"kind\":\"ref\",\"buf\":\"X_s\"}]}},{\"op\":\"reduce\",\"fn\":\"sum\",\"src\":\"sq\",\"dst\":\"ss\",\"axis\":\"d\",\"accumulate\":true}],\"fused_rules\":[\"reduction_tiling\"]}}",
    false),
  ("two contractions over the loop axis share an operand",
    "{\"sizes\":{\"m\":256,\"n\":256,\"d\":512},\"masks\":[],\"kernel\":{\"name\":\"glu\",\"grid\":[{\"axis\":\"m\",\"block\":64},{\"axis\":\"n\",\"block\":64}],\"loop\":{\"axis\":\"d\",\"block\":32},\"body\":[{\"op\":\"load\",\"src\":\"X\",\"dst\":\"X_s\"},{\"op\":\"load\",\"src\":\"A\",\"dst\":\"A_s\"},{\"op\":\"load\",\"src\":\"B\",\"dst\":\"B_s\"},{\"op\":\"gemm\",\"a\":\"X_s\",\"b\":\"A_s\",\"c\":\"ca\",\"contract\":\"d\",\"clear\":false},{\"op\":\"gemm\",\"a\":\"X_s\",\"b\":\"B_s\",\"c\":\"cb\",\"contract\":\"d\",\"clear\":false}],\"fused_rules\":[\"shared_operand_fusion\"]}}",
    true),
  ("fused contractions over different axes are refused",
    "{\"sizes\":{\"m\":256,\"n\":256,\"d\":512},\"masks\":[],\"kernel\":{\"name\":\"glu\",\"grid\":[{\"axis\":\"m\",\"block\":64},{\"axis\":\"n\",\"block\":64}],\"loop\":{\"axis\":\"d\",\"block\":32},\"body\":[{\"op\":\"load\",\"src\":\"X\",\"dst\":\"X_s\"},{\"op\":\"load\",\"src\":\"A\",\"dst\":\"A_s\"},{\"op\":\"load\",\"src\":\"B\",\"dst\":\"B_s\"},{\"op\":\"gemm\",\"a\":\"X_s\",\"b\":\"A_s\",\"c\":\"ca\",\"contract\":\"d\",\"clear\":false},{\"op\":\"gemm\",\"a\":\"X_s\",\"b\":\"B_s\",\"c\":\"cb\",\"contract\":\"n\",\"clear\":false}],\"fused_rules\":[\"shared_operand_fusion\"]}}",
    false),
  ("two contractions over the loop axis accumulate into one tile",
    "{\"sizes\":{\"m\":256,\"n\":256,\"d\":512},\"masks\":[],\"kernel\":{\"name\":\"dx\",\"grid\":[{\"axis\":\"m\",\"block\":64},{\"axis\":\"n\",\"block\":64}],\"loop\":{\"axis\":\"d\",\"block\":32},\"body\":[{\"op\":\"load\",\"src\":\"X\",\"dst\":\"X_s\"},{\"op\":\"load\",\"src\":\"A\",\"dst\":\"A_s\"},{\"op\":\"load\",\"src\":\"Y\",\"dst\":\"Y_s\"},{\"op\":\"load\",\"src\":\"B\",\"dst\":\"B_s\"},{\"op\":\"gemm\",\"a\":\"X_s\",\"b\":\"A_s\",\"c\":\"acc\",\"contract\":\"d\",\"clear\":false},{\"op\":\"gemm\",\"a\":\"Y_s\",\"b\":\"B_s\",\"c\":\"acc\",\"contract\":\"d\",\"clear\":false}],\"fused_rules\":[\"shared_accumulator\"]}}",
    true),
  ("a shared accumulator cited for two tiles is refused",
    "{\"sizes\":{\"m\":256,\"n\":256,\"d\":512},\"masks\":[],\"kernel\":{\"name\":\"dx\",\"grid\":[{\"axis\":\"m\",\"block\":64},{\"axis\":\"n\",\"block\":64}],\"loop\":{\"axis\":\"d\",\"block\":32},\"body\":[{\"op\":\"load\",\"src\":\"X\",\"dst\":\"X_s\"},{\"op\":\"load\",\"src\":\"A\",\"dst\":\"A_s\"},{\"op\":\"load\",\"src\":\"Y\",\"dst\":\"Y_s\"},{\"op\":\"load\",\"src\":\"B\",\"dst\":\"B_s\"},{\"op\":\"gemm\",\"a\":\"X_s\",\"b\":\"A_s\",\"c\":\"acc\",\"contract\":\"d\",\"clear\":false},{\"op\":\"gemm\",\"a\":\"Y_s\",\"b\":\"B_s\",\"c\":\"acc_2\",\"contract\":\"d\",\"clear\":false}],\"fused_rules\":[\"shared_accumulator\"]}}",
    false),
  ("a cited rule needs a loop",
    "{\"sizes\":{\"m\":64},\"masks\":[],\"kernel\":{\"name\":\"k\",\"grid\":[],\"body\":[],\"fused_rules\":[\"reduction_tiling\"]}}",
    false)]


/-- Whether `kernelProblem` accepts a case of `scheduleExamples` (`none` when its JSON does not parse). -/
def scheduleCase (text : String) : Option Bool :=
  match Lean.Json.parse text with
  | .ok j =>
    let sizes : List (Axis × Nat) := match j.getObjValD "sizes" with
      | .obj kvs => kvs.fold (fun (acc : List (Axis × Nat)) (k : String) (v : Lean.Json) => match natOf v with
          | some n => acc ++ [(k, n)]
          | none => acc) []
      | _ => []
    let masks := (lField j "masks").filterMap (exprTerm 64)
    some (kernelProblem sizes masks (j.getObjValD "kernel")).isNone
  | .error _ => none

/-- The axis-view checks of `Superopt/Schedule.lean` on small plan documents, with the answer of
Python's `pyrunner.plan.schedule_rules.view_problem`. -/
def viewExamples : List (String × String × Bool) := [
  ("chunks of 16 x 256 cover an axis of 4096",
    "{\"graph\":{\"axes\":{\"t_kv\":4096,\"d\":64}},\"tensors\":[{\"name\":\"K\",\"axes\":[\"c\",\"i\",\"d\"],\"shape\":[16,256,64]}],\"axis_splits\":[{\"axis\":\"t_kv\",\"parts\":[\"c\",\"i\"],\"sizes\":[16,256]}]}",
    true),
  ("chunks of 16 x 128 miss half of the axis",
    "{\"graph\":{\"axes\":{\"t_kv\":4096,\"d\":64}},\"tensors\":[{\"name\":\"K\",\"axes\":[\"c\",\"i\",\"d\"],\"shape\":[16,128,64]}],\"axis_splits\":[{\"axis\":\"t_kv\",\"parts\":[\"c\",\"i\"],\"sizes\":[16,128]}]}",
    false),
  ("a merge's parts multiply to its extent",
    "{\"graph\":{\"axes\":{\"b\":4,\"t\":128}},\"tensors\":[{\"name\":\"X\",\"axes\":[\"bt\"],\"shape\":[512]}],\"axis_merges\":[{\"axis\":\"bt\",\"parts\":[\"b\",\"t\"],\"sizes\":[4,128]}]}",
    true),
  ("a merge whose parts do not is refused",
    "{\"graph\":{\"axes\":{\"b\":4,\"t\":128}},\"tensors\":[{\"name\":\"X\",\"axes\":[\"bt\"],\"shape\":[256]}],\"axis_merges\":[{\"axis\":\"bt\",\"parts\":[\"b\",\"t\"],\"sizes\":[4,128]}]}",
    false),
  ("a unit axis has extent 1",
    "{\"graph\":{\"axes\":{\"t_kv\":4096,\"d\":64}},\"tensors\":[{\"name\":\"Q\",\"axes\":[\"u\",\"d\"],\"shape\":[1,64]}],\"axis_units\":[{\"axis\":\"u\"}]}",
    true),
  ("a unit axis of extent 2 is refused",
    "{\"graph\":{\"axes\":{\"t_kv\":4096,\"d\":64}},\"tensors\":[{\"name\":\"Q\",\"axes\":[\"u\",\"d\"],\"shape\":[2,64]}],\"axis_units\":[{\"axis\":\"u\"}]}",
    false)]


/-- Whether `viewProblem` accepts a case of `viewExamples` (`none` when its JSON does not parse). -/
def viewCase (text : String) : Option Bool :=
  match Lean.Json.parse text with
  | .ok j => some (viewProblem j (planSizes j)).isNone
  | .error _ => none

/-- The schedule checks: each example gets Python's answer; the run range is Python's `visible_steps`. -/
def scheduleChecks : List (String × Bool) :=
  (scheduleExamples.map fun c => (c.1, scheduleCase c.2.1 == some c.2.2)) ++
  (viewExamples.map fun c => (c.1, viewCase c.2.1 == some c.2.2)) ++
    [("the window's run range is steps 16..33", runRange windowMask queryBlock "t_kv" 64 64 == (16, 33))]

/-- The product rebuilds: a product tree's factors, regrouped and reordered, and nothing else. -/
def productChecks : List (String × Bool) :=
  let x := Term.input "X" ["m", "d"]
  let sc := Term.input "S" ["m"]
  let g := Term.input "G" ["d"]
  let left := Term.binary .mul (Term.binary .mul x sc) g
  let right := Term.binary .mul x (Term.binary .mul sc g)
  [("products regroup left-nested", (Rule.mulAssoc right [[0], [1, 0], [1, 1]]).apply right == some left),
    ("products reorder", (Rule.mulComm left [[0, 0], [0, 1], [1]] [0, 2, 1]).apply left ==
      some (Term.binary .mul (Term.binary .mul x g) sc)),
    ("a reorder that is not a permutation is refused",
      ((Rule.mulComm left [[0, 0], [0, 1], [1]] [0, 0, 1]).apply left).isNone),
    ("factor paths that miss a leaf are refused", ((Rule.mulAssoc right [[0], [1, 0]]).apply right).isNone),
    ("factor paths into a non-product are refused",
      ((Rule.mulAssoc (Term.binary .add x sc) [[0], [1]]).apply (Term.binary .add x sc)).isNone)]

/-- The replay's rules: each applies where its side conditions hold and nowhere else. -/
def replayChecks : List (String × Bool) :=
  let s := Term.input "S" ["m"]
  let x := Term.input "X" ["m", "d"]
  let w := Term.input "W" ["d", "n"]
  let sm := Term.softmax x "d"
  let ta := Term.input "A" ["m", "j"]
  let tb := Term.input "B" ["j", "k"]
  let tc := Term.input "C" ["k", "n"]
  let c := Term.const 0.125
  [("row scale applies", (Rule.rowScaleXS x s w "d" false).apply (scaledGemm s) ==
      some (Term.binary .mul (Term.matmul x w "d") s)),
    ("row scale refuses a scale along the contraction",
      ((Rule.rowScaleXS x x w "d" false).apply (scaledGemm x)).isNone),
    ("row scale refuses another scale term", ((Rule.rowScaleXS x x w "d" false).apply (scaledGemm s)).isNone),
    ("softmax shift applies", ((Rule.softmaxMaxShift .exp x "d").apply sm).isSome),
    ("softmax shift needs the summed axis", ((Rule.softmaxMaxShift .exp x "m").apply sm).isNone),
    ("softmax shift refuses log", ((Rule.softmaxMaxShift .log x "d").apply
      (softmaxOf .log x "d")).isNone),
    ("scaled shift applies", (Rule.softmaxScaledMaxShift x c "d" false).apply
      (Term.softmax (Term.binary .mul x c) "d") ==
        some (softmaxOf .exp (Term.binary .mul (Term.binary .sub x (Term.reduce .max x "d")) c) "d")),
    ("scaled shift refuses a negative scale", ((Rule.softmaxScaledMaxShift x (Term.const ⟨-1, 0⟩) "d" false).apply
      (Term.softmax (Term.binary .mul x (Term.const ⟨-1, 0⟩)) "d")).isNone),
    ("scaled shift refuses a scale with the summed axis", ((Rule.softmaxScaledMaxShift x x "d" false).apply
      (Term.softmax (Term.binary .mul x x) "d")).isNone),
    ("mean to sum", (Rule.meanToSumDiv x "d").apply (Term.reduce .mean x "d") ==
      some (Term.binary .div (Term.reduce .sum x "d") (Term.axisSize "d"))),
    ("variance from sums", (Rule.varianceSumOfSquares x "d").apply
      (Term.reduce .mean (Term.unary .square (Term.binary .sub x (Term.reduce .mean x "d"))) "d") ==
        some (Term.binary .sub (Term.reduce .mean (Term.unary .square x) "d")
          (Term.unary .square (Term.reduce .mean x "d")))),
    ("variance needs the same mean", ((Rule.varianceSumOfSquares x "d").apply
      (Term.reduce .mean (Term.unary .square (Term.binary .sub x (Term.reduce .mean x "m"))) "d")).isNone),
    ("matmul association", (Rule.matmulAssoc ta tb tc "j" "k" false false false false).apply
      (Term.matmul (Term.matmul ta tb "j") tc "k") == some (Term.matmul ta (Term.matmul tb tc "k") "j")),
    ("matmul association refuses one axis twice", ((Rule.matmulAssoc ta tb tc "j" "j" false false false false).apply
      (Term.matmul (Term.matmul ta tb "j") tc "j")).isNone),
    ("matmul association refuses k in A", ((Rule.matmulAssoc tb tb tc "j" "k" false false false false).apply
      (Term.matmul (Term.matmul tb tb "j") tc "k")).isNone),
    ("exp to exp2 uses LOG2E", ((Rule.expToExp2 x).apply (Term.unary .exp x)) ==
      some (Term.unary .exp2 (Term.binary .mul x (Term.const 1.4426950408889634)))),
    ("a path into a term", Term.at? (scaledGemm s) [0, 1] == some s),
    ("a path out of a term", (Term.at? (scaledGemm s) [0, 2]).isNone),
    ("replace rewrites every occurrence", Term.replace x s (Term.binary .add x x) == Term.binary .add s s),
    ("replay of two steps", replay [Term.reduce .mean (scaledGemm s) "n"]
        [⟨Rule.rowScaleXS x s w "d" false, 0, [0]⟩,
          ⟨Rule.meanToSumDiv (Term.binary .mul (Term.matmul x w "d") s) "n", 0, []⟩] ==
      some [Term.binary .div (Term.reduce .sum (Term.binary .mul
        (Term.matmul x w "d") s) "n") (Term.axisSize "n")]),
    ("replay refuses a step at the wrong place", (replay [Term.reduce .mean (scaledGemm s) "n"]
        [⟨Rule.rowScaleXS x s w "d" false, 0, []⟩]).isNone),
    ("decimals compare as numbers", Term.same (Term.const 1024.0) (Term.const 1024))]
    ++ tileChecks ++ scheduleChecks ++ productChecks

/-- Each check: a label and whether it holds. -/
def checks : List (String × Bool) := [
  ("15 unary, 8 binary, 3 reduce functions",
    UnaryOp.all.length == 15 && BinaryOp.all.length == 8 && ReduceOp.all.length == 3),
  ("unary names", (UnaryOp.all.map UnaryOp.name) ==
    ["exp", "exp2", "log", "neg", "recip", "sqrt", "rsqrt", "square", "silu", "sigmoid",
      "tanh", "gelu", "relu", "abs", "softplus"]),
  ("binary names", (BinaryOp.all.map BinaryOp.name) ==
    ["add", "sub", "mul", "div", "max", "min", "lt", "le"]),
  ("ternary name", TernaryOp.name .select == "where"),
  ("reduce names", (ReduceOp.all.map ReduceOp.name) == ["sum", "max", "mean"]),
  ("eleven workloads", Workloads.catalog.length == 11),
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
  ("shape parsing", (parseOptions {} ["--shape", "m=8"]).toOption.map (·.shapes) == some [("m", 8)]),
  ("bad shape refused", (parseOptions {} ["--shape", "m=x"]).toOption.isNone),
  ("zero shape refused", (parseOptions {} ["--shape", "m=0"]).toOption.isNone),
  ("bad dtype refused", (parseOptions {} ["--dtype", "fp8"]).toOption.isNone),
  ("top zero refused", (parseOptions {} ["--top", "0"]).toOption.isNone),
  ("unknown option refused", (parseOptions {} ["--bogus"]).toOption.isNone),
  ("engine command line", ((parseOptions {} ["--top", "3", "--dtype", "bf16", "--calibrate", "r.jsonl"]).toOption.map
      (engineArgs "g.json")) == some ["-m", "pyrunner", "superopt", "--graph", "g.json", "--dtype", "bf16",
        "--top", "3", "--calibrate", "r.jsonl"]),
  ("twenty-two rules", ruleNames.length == 22),
  ("rule names", ruleNames == ["softmax_max_shift", "softmax_scaled_max_shift", "matmul_div_commute",
    "matmul_row_scale_commute", "exp_to_exp2", "mean_to_sum_div", "variance_sum_of_squares",
    "reduction_tiling", "online_softmax_rescale", "shared_operand_fusion",
    "reduction_in_contraction_loop", "elementwise_mul_comm", "elementwise_mul_assoc",
    "masked_tile_skip", "merge_axes", "unit_axis", "split_reduction", "matmul_assoc", "matmul_as_sum",
    "exp_shift_to_max", "sum_scale_commute", "shared_accumulator"]),
  ("last line of an error", lastLine "Traceback\nerror: no plan\n\n" == "error: no plan"),
  ("json string escapes", jsonString "a\"b\\c\n" == "\"a\\\"b\\\\c\\n\""),
  ("graph JSON of the resized Attention", graphText "Attention" [("t_kv", 64), ("d", 32)] == goldenResized)]
  ++ (numberTable.map fun p => (s!"number {p.2}", p.1.pyRepr == p.2))
  ++ (numberTable.map fun p => (s!"number {p.2} survives Lean.Json", roundTrip p.1 == some p.2))
  ++ [("constant 1e-6 in a graph", (1e-6 : Decimal).graphText == "1e-06"),
    ("integral constant in a graph", (2 : Decimal).graphText == "2"),
    ("integral decimal constant in a graph", (2.50e1 : Decimal).graphText == "25")]
  ++ (goldenGraphs.map fun p => (s!"graph JSON of {p.1}", graphText p.1 [] == p.2))
  ++ replayChecks

/-- Runs every check; exit code 1 when any fails. -/
def main : IO UInt32 := do
  let failed := checks.filter (fun c => !c.2)
  for c in failed do
    IO.eprintln s!"FAIL: {c.1}"
  IO.println s!"{checks.length - failed.length}/{checks.length} Lean checks passed"
  return if failed.isEmpty then 0 else 1

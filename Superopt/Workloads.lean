import Superopt.Graph

/-!
# Workload catalog

The workloads of `pyrunner/ir/catalog.py`, with the same names, inputs (names and axes, in
order), default sizes and output terms. DESIGN section 4 fixes the default sizes; every size is
a parameter (`Graph.withSizes`).

Format (read by `tests/test_lean_sources.py`, which evaluates these definitions and compares
them with the Python catalog term by term): each workload is a `def NAME : Graph :=` whose body
is `let` lines, one per line, followed by one `Graph.mk NAME SIZES OUTPUTS LABELS` expression
(LABELS: the sub-terms Python names with `name=`, in the order Python names them); terms
are built only with the `Term` constructors and the helpers of `Superopt/Graph.lean`. Keep that
form when adding a workload, and add it to `catalog` in Python's order.
-/

namespace Superopt.Workloads

/-- softmax_{t_kv}(Q K^T) V per head; no scale, no mask. -/
def attention : Graph :=
  let q := Term.input "Q" ["h", "t_q", "d"]
  let k := Term.input "K" ["h", "t_kv", "d"]
  let v := Term.input "V" ["h", "t_kv", "d"]
  let s := Term.matmul q k "d"
  let p := Term.softmax s "t_kv"
  Graph.mk "Attention" [("h", 16), ("t_q", 4096), ("d", 128), ("t_kv", 4096)]
    [("O", Term.matmul p v "t_kv")] [(s, "S"), (p, "P")]

/-- silu(X W_gate) * (X W_up). -/
def swiglu : Graph :=
  let x := Term.input "X" ["m", "d"]
  let wg := Term.input "W_gate" ["d", "n"]
  let wu := Term.input "W_up" ["d", "n"]
  let g := Term.matmul x wg "d"
  let u := Term.matmul x wu "d"
  Graph.mk "SwiGLU" [("m", 1024), ("d", 2048), ("n", 2048)]
    [("Y", Term.binary .mul (Term.unary .silu g) u)] [(g, "G"), (u, "U")]

/-- X W. -/
def matmul : Graph :=
  let x := Term.input "X" ["m", "d"]
  let w := Term.input "W" ["d", "n"]
  Graph.mk "Matmul" [("m", 1024), ("d", 4096), ("n", 4096)]
    [("Y", Term.matmul x w "d")] []

/-- (X * S) W with S = 1/sqrt(mean_d(X^2) + 1e-6); no learned weight. -/
def rmsnorm : Graph :=
  let x := Term.input "X" ["m", "d"]
  let w := Term.input "W" ["d", "n"]
  let nx := Term.rmsnorm x "d" 1e-6
  Graph.mk "RMSNorm" [("m", 1024), ("d", 4096), ("n", 4096)]
    [("Y", Term.matmul nx w "d")] [(nx, "N")]

/-- (N W_up) * (N W_gate) with N = rmsnorm(X); no silu. -/
def rmsnormMlp : Graph :=
  let x := Term.input "X" ["m", "d"]
  let wu := Term.input "W_up" ["d", "n"]
  let wg := Term.input "W_gate" ["d", "n"]
  let nx := Term.rmsnorm x "d" 1e-6
  Graph.mk "RMSNormMLP" [("m", 1024), ("d", 1024), ("n", 1024)]
    [("Y", Term.binary .mul (Term.matmul nx wu "d") (Term.matmul nx wg "d"))] [(nx, "N")]

/-- softmax(Q K^T / sqrt(d)) V: the scale must travel through the rewrites. -/
def scaledAttention : Graph :=
  let q := Term.input "Q" ["h", "t_q", "d"]
  let k := Term.input "K" ["h", "t_kv", "d"]
  let v := Term.input "V" ["h", "t_kv", "d"]
  let s := Term.binary .mul (Term.matmul q k "d") (Term.unary .rsqrt (Term.axisSize "d"))
  let p := Term.softmax s "t_kv"
  Graph.mk "ScaledAttention" [("h", 16), ("t_q", 4096), ("d", 128), ("t_kv", 4096)]
    [("O", Term.matmul p v "t_kv")] [(s, "S"), (p, "P")]

/-- Grouped-query attention: `group` query heads share each K/V head. -/
def groupedQueryAttention : Graph :=
  let q := Term.input "Q" ["kv_h", "group", "t_q", "d"]
  let k := Term.input "K" ["kv_h", "t_kv", "d"]
  let v := Term.input "V" ["kv_h", "t_kv", "d"]
  let s := Term.binary .mul (Term.matmul q k "d") (Term.unary .rsqrt (Term.axisSize "d"))
  let p := Term.softmax s "t_kv"
  Graph.mk "GroupedQueryAttention"
    [("kv_h", 4), ("group", 4), ("t_q", 4096), ("d", 128), ("t_kv", 4096)]
    [("O", Term.matmul p v "t_kv")] [(s, "S"), (p, "P")]

/-- gelu(X W_gate) * (X W_up), tanh-approximated gelu. -/
def geglu : Graph :=
  let x := Term.input "X" ["m", "d"]
  let wg := Term.input "W_gate" ["d", "n"]
  let wu := Term.input "W_up" ["d", "n"]
  let g := Term.matmul x wg "d"
  let u := Term.matmul x wu "d"
  Graph.mk "GeGLU" [("m", 1024), ("d", 2048), ("n", 2048)]
    [("Y", Term.binary .mul (Term.unary .gelu g) u)] [(g, "G"), (u, "U")]

/-- layernorm(X) W, no affine weight, eps 1e-5. -/
def layernormMatmul : Graph :=
  let x := Term.input "X" ["m", "d"]
  let w := Term.input "W" ["d", "n"]
  let nx := Term.layernorm x "d" 1e-5
  Graph.mk "LayerNormMatmul" [("m", 1024), ("d", 4096), ("n", 4096)]
    [("Y", Term.matmul nx w "d")] [(nx, "N")]

/-- softmax(mask(Q K^T / sqrt(d))) V, key t_kv visible to query t_q iff t_kv <= t_q. -/
def causalAttention : Graph :=
  let q := Term.input "Q" ["h", "t_q", "d"]
  let k := Term.input "K" ["h", "t_kv", "d"]
  let v := Term.input "V" ["h", "t_kv", "d"]
  let s := Term.binary .mul (Term.matmul q k "d") (Term.unary .rsqrt (Term.axisSize "d"))
  let keep := Term.binary .le (Term.iota "t_kv") (Term.iota "t_q")
  let sm := Term.masked s keep
  let p := Term.softmax sm "t_kv"
  Graph.mk "CausalAttention" [("h", 16), ("t_q", 4096), ("d", 128), ("t_kv", 4096)]
    [("O", Term.matmul p v "t_kv")] [(s, "S"), (keep, "causal"), (sm, "S_masked"), (p, "P")]

/-- Causal attention over the last 1024 keys: visible iff t_q - 1024 < t_kv <= t_q. -/
def slidingWindowAttention : Graph :=
  let q := Term.input "Q" ["h", "t_q", "d"]
  let k := Term.input "K" ["h", "t_kv", "d"]
  let v := Term.input "V" ["h", "t_kv", "d"]
  let s := Term.binary .mul (Term.matmul q k "d") (Term.unary .rsqrt (Term.axisSize "d"))
  let kv := Term.iota "t_kv"
  let tq := Term.iota "t_q"
  let causal := Term.binary .le kv tq
  let recent := Term.binary .lt (Term.binary .sub tq (Term.const 1024)) kv
  let keep := Term.binary .min causal recent
  let sm := Term.masked s keep
  let p := Term.softmax sm "t_kv"
  Graph.mk "SlidingWindowAttention" [("h", 16), ("t_q", 4096), ("d", 128), ("t_kv", 4096)]
    [("O", Term.matmul p v "t_kv")] [(s, "S"), (keep, "window"), (sm, "S_masked"), (p, "P")]

/-- Every workload, in the order of Python's `CATALOG`. -/
def catalog : List Graph :=
  [attention, swiglu, matmul, rmsnorm, rmsnormMlp, scaledAttention,
    groupedQueryAttention, geglu, layernormMatmul, causalAttention, slidingWindowAttention]

end Superopt.Workloads

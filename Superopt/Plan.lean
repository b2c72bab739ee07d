import Lean.Data.Json
import Superopt.Graph
import Superopt.Rules
import Superopt.Json
import Superopt.Workloads
import Superopt.Certificate
import Superopt.Schedule

/-!
# The `superopt` command line: Lean is the front, Python the search engine

`superopt W [--shape AXIS=N]... [--dtype fp16|bf16] [--top K] [--naive] [--explain] [--calibrate LOG]`:

1. builds the graph of workload `W` from the Lean catalog (`Superopt/Workloads.lean`), resized;
2. writes it as graph JSON (`Graph.jsonText`, the format of `pyrunner/ir/graph_json.py`) to a
   temporary file;
3. runs the Python engine on it as a subprocess: the interpreter named by `SUPEROPT_PYTHON`, else
   `python3`, with `engineArgs` (`-m pyrunner superopt --graph FILE` plus the options given);
4. parses the plan(s) it prints and checks each one: every derivation step names a rule that has
   a theorem (`ruleCatalog`), the plan's embedded graph is the Lean graph, its certificate
   replays from the Lean graph (`Superopt/Certificate.lean`, where the Lean rules cover it), and
   every kernel's loop has the form its cited schedule rules need, masked-tile skips included
   (`Superopt/Schedule.lean`);
5. prints the engine's output unchanged, so it is byte for byte what
   `python -m pyrunner superopt W ...` prints (the engine's notes, such as `--explain`, go to
   stderr as they came).

A missing Python, an engine error, a failed check, an unknown workload or a bad option is one
`superopt: error: ...` line on stderr and exit code 2. `--list` lists the catalog, `--rules` the
rules with their theorems, `--graph-json W [--shape ...]` prints the graph JSON step 2 writes.

The rule catalog names each theorem through a resolved name (double backquote), so it cannot
drift from `Superopt/Rules.lean`; `tests/test_lean_sources.py` checks it against
`pyrunner.rules.RULE_NAMES`.
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
  ⟨``softmax_scaled_max_shift,
    "exp((y_i - m) * c) / sum_j exp((y_j - m) * c) = exp(y_i * c) / sum_j exp(y_j * c)"⟩,
  ⟨``matmul_div_commute, "(P / l) @ V = (P @ V) / l when l is constant along the contraction"⟩,
  ⟨``matmul_row_scale_commute, "(X * s) @ W = (X @ W) * s when s is constant along the contraction"⟩,
  ⟨``exp_to_exp2, "exp(x) = exp2(x * log2(e))"⟩,
  ⟨``mean_to_sum_div, "mean_a(x) = sum_a(x) / |a|"⟩,
  ⟨``variance_sum_of_squares, "mean_a((x - mean_a(x))^2) = mean_a(x^2) - mean_a(x)^2 over a non-empty axis a"⟩,
  ⟨``reduction_tiling, "a sum or max over an axis is the tiled loop's running sum or max"⟩,
  ⟨``online_softmax_rescale,
    "the online-softmax state (m, l, o) rescaled to a new shift and merged with a tile equals the direct computation"⟩,
  ⟨``shared_operand_fusion, "two contractions sharing an operand computed in one loop equal the separate ones"⟩,
  ⟨``reduction_in_contraction_loop,
    "a reduction over the contracted axis computed inside the contraction's loop, then used as a row scale"⟩,
  ⟨``elementwise_mul_comm, "a * b = b * a for elementwise products"⟩,
  ⟨``elementwise_mul_assoc, "(a * b) * c = a * (b * c) for elementwise products"⟩,
  ⟨``masked_tile_skip,
    "a streamed loop may leave out the tiles whose contribution to every accumulator is its identity"⟩,
  ⟨``merge_axes, "adjacent axes carried together read as one: (j, l) at j * nb + l splits back to (j, l)"⟩,
  ⟨``unit_axis, "an input read with an inserted axis of extent 1 keeps every offset: (j * 1 + 0) * nl + l = j * nl + l"⟩,
  ⟨``split_reduction,
    "chunks reduced under their own shifts, rescaled to a common shift and summed, equal the unsplit sums"⟩,
  ⟨``matmul_assoc, "(A @_j B) @_k C = A @_j (B @_k C) when k is not A's and j not C's: both are sum_j sum_k A B C"⟩,
  ⟨``matmul_as_sum, "x @_a w = sum_a(x * w): a contraction is the sum of the elementwise product"⟩,
  ⟨``exp_shift_to_max, "E((x - n) * c) = E((x - m) * c) * E((m - n) * c) for any m, taken as max_a(x)"⟩,
  ⟨``sum_scale_commute, "sum_a(x * s) = sum_a(x) * s when s is constant along a"⟩,
  ⟨``shared_accumulator, "two contractions over one axis, summed, accumulate into one tile in one loop"⟩]

/-- The rule names, in catalog order. -/
def ruleNames : List String := ruleCatalog.map (·.name)

/-- What `superopt --rules` prints: one object per rule. -/
def rulesDocument : String :=
  jsonObj [("rules", jsonList (ruleCatalog.map fun r =>
    jsonObj [("name", jsonString r.name), ("theorem", jsonString r.decl.toString),
      ("statement", jsonString r.statement)]))]

/-- The catalog workload called `name`, ignoring case (like Python's `workloads.get`). -/
def findWorkload (name : String) : Option Graph :=
  Workloads.catalog.find? fun g => g.name.toLower == name.toLower

/-- The catalog's names, comma-separated, for error messages. -/
def catalogNames : String := ", ".intercalate (Workloads.catalog.map (·.name))

/-- The usage line. -/
def usage : String :=
  "usage: superopt WORKLOAD [--shape AXIS=N]... [--dtype fp16|bf16] [--top K] [--naive] [--explain] " ++
    "[--calibrate LOG.jsonl] | superopt --graph-json WORKLOAD [--shape AXIS=N]... | " ++
    "superopt --list | superopt --rules"

/-- What the command line asks for, besides the workload. -/
structure Options where
  shapes : List (Axis × Nat) := []
  dtype : Option String := none
  top : Option Nat := none
  naive : Bool := false
  explain : Bool := false
  calibrate : Option String := none

/-- Parses one `AXIS=N` with `N` a positive integer. -/
def parseShape (spec : String) : Except String (Axis × Nat) :=
  match spec.splitOn "=" with
  | [a, n] =>
    match n.trim.toNat? with
    | some k => if k = 0 then .error s!"--shape {spec}: the size must be positive" else .ok (a.trim, k)
    | none => .error s!"--shape {spec}: the size must be a positive integer"
  | _ => .error s!"--shape {spec}: expected AXIS=N"

/-- Parses the options after the workload name. -/
def parseOptions (o : Options) : List String → Except String Options
  | [] => .ok o
  | "--shape" :: spec :: rest =>
    match parseShape spec with
    | .ok p => parseOptions { o with shapes := o.shapes ++ [p] } rest
    | .error e => .error e
  | "--dtype" :: d :: rest =>
    if d = "fp16" ∨ d = "bf16" then parseOptions { o with dtype := some d } rest
    else .error s!"--dtype {d}: expected fp16 or bf16"
  | "--top" :: k :: rest =>
    match k.toNat? with
    | some n => if n = 0 then .error "--top must be at least 1" else parseOptions { o with top := some n } rest
    | none => .error s!"--top {k}: expected a positive integer"
  | "--naive" :: rest => parseOptions { o with naive := true } rest
  | "--explain" :: rest => parseOptions { o with explain := true } rest
  | "--calibrate" :: path :: rest => parseOptions { o with calibrate := some path } rest
  | arg :: _ => .error s!"unexpected argument '{arg}'; {usage}"

/-- The options the engine gets besides the graph: the ones given, in a fixed order. -/
def Options.passThrough (o : Options) : List String :=
  (match o.dtype with | some d => ["--dtype", d] | none => []) ++
  (match o.top with | some k => ["--top", toString k] | none => []) ++
  (if o.naive then ["--naive"] else []) ++
  (if o.explain then ["--explain"] else []) ++
  (match o.calibrate with | some p => ["--calibrate", p] | none => [])

/-- The engine's command-line arguments (after the interpreter) for a graph file. -/
def engineArgs (graphFile : String) (o : Options) : List String :=
  ["-m", "pyrunner", "superopt", "--graph", graphFile] ++ o.passThrough

/-- The last non-empty line of a text (the engine's one-line error). -/
def lastLine (text : String) : String :=
  let lines := ((text.splitOn "\n").map String.trim).filter (fun l => !l.isEmpty)
  match lines.reverse with
  | l :: _ => l
  | [] => "(no message)"

/-- Checks one plan against the Lean graph (`g`, and as parsed JSON), the rule catalog, where the
Lean rules cover its derivation the replay of its certificate (`checkCertificate`), and its kernels'
loops against the schedule rules they cite (`checkSchedule`). -/
def checkPlan (g : Graph) (graph : Lean.Json) (plan : Lean.Json) : Except String Unit := do
  if (plan.getObjValD "graph").compress != graph.compress then
    throw "the plan's embedded graph is not the Lean graph"
  match checkCertificate g plan with
  | .error e => throw s!"the plan's certificate does not replay: {e}"
  | .ok _ => pure ()
  match checkSchedule plan with
  | .error e => throw s!"the plan's loops break a schedule rule's side condition: {e}"
  | .ok _ => pure ()
  match plan.getObjValD "derivation" with
  | .arr steps =>
    for step in steps do
      match step.getObjValD "rule" with
      | .str r =>
        if !(ruleNames.contains r) then
          throw s!"the plan's derivation uses rule '{r}', which has no theorem in Superopt/Rules.lean"
      | _ => throw "a derivation step of the plan names no rule"
  | _ => throw "the plan has no derivation list"

/-- Checks the engine's output: one plan, or a list of plans (`--top K`, K > 1). -/
def checkOutput (g : Graph) (output : String) : Except String Unit := do
  let graph ← match Lean.Json.parse g.jsonText with
    | .ok j => pure j
    | .error e => throw s!"internal error: the Lean graph JSON does not parse: {e}"
  let parsed ← match Lean.Json.parse output with
    | .ok j => pure j
    | .error e => throw s!"the engine's output is not JSON: {e}"
  match parsed with
  | .arr plans =>
    if plans.size = 0 then throw "the engine returned no plan"
    for p in plans do
      checkPlan g graph p
  | p => checkPlan g graph p

/-- Prints one error line; the exit code for bad input. -/
def fail (msg : String) : IO UInt32 := do
  IO.eprintln s!"superopt: error: {msg}"
  return 2

/-- The sized graph of a workload, or the error line. -/
def sizedGraph (name : String) (o : Options) : Except String Graph :=
  match findWorkload name with
  | none => .error s!"unknown workload '{name}'; the catalog has: {catalogNames}"
  | some g => g.withSizes o.shapes

/-- Runs `python ARGS`; its standard output and standard error, or the error line. -/
def spawnEngine (python : String) (args : List String) : IO (Except String (String × String)) := do
  try
    let out ← IO.Process.output { cmd := python, args := args.toArray }
    if out.exitCode = 0 then
      return .ok (out.stdout, out.stderr)
    else
      return .error s!"the Python engine failed (exit {out.exitCode}): {lastLine out.stderr}"
  catch e =>
    return .error s!"cannot run the Python engine '{python}' (set SUPEROPT_PYTHON): {e}"

/-- Runs the engine on the graph: its standard output and standard error, or the error line. -/
def runEngine (g : Graph) (o : Options) : IO (Except String (String × String)) := do
  let python := (← IO.getEnv "SUPEROPT_PYTHON").getD "python3"
  let dir := (← IO.getEnv "TMPDIR").getD "/tmp"
  let stamp ← IO.monoNanosNow
  let path := s!"{dir}/superopt-graph-{stamp}.json"
  try
    IO.FS.writeFile (System.FilePath.mk path) (g.jsonText ++ "\n")
  catch e =>
    return .error s!"cannot write the graph file {path}: {e}"
  let result ← spawnEngine python (engineArgs path o)
  try
    IO.FS.removeFile (System.FilePath.mk path)
  catch _ =>
    pure ()
  return result

/-- The command line; exit code 2 for bad input, as in the Python runner. -/
def runCli (args : List String) : IO UInt32 := do
  match args with
  | [] => fail usage
  | ["--help"] =>
    IO.println usage
    return 0
  | ["--rules"] =>
    IO.println rulesDocument
    return 0
  | ["--list"] =>
    for g in Workloads.catalog do
      IO.println g.name
    return 0
  | "--graph-json" :: name :: rest =>
    match parseOptions {} rest with
    | .error e => fail e
    | .ok o =>
      if o.dtype.isSome || o.top.isSome || o.naive || o.explain || o.calibrate.isSome then
        fail "--graph-json takes only --shape options"
      else
        match sizedGraph name o with
        | .error e => fail e
        | .ok g =>
          IO.println g.jsonText
          return 0
  | name :: rest =>
    if name.startsWith "-" then
      fail s!"unexpected argument '{name}'; {usage}"
    else
      match parseOptions {} rest with
      | .error e => fail e
      | .ok o =>
        match sizedGraph name o with
        | .error e => fail e
        | .ok g =>
          match (← runEngine g o) with
          | .error e => fail e
          | .ok (output, notes) =>
            match checkOutput g output with
            | .error e => fail e
            | .ok _ =>
              IO.eprint notes
              IO.print output
              return 0

end Superopt

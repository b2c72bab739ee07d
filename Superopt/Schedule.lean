import Lean.Data.Json
import Superopt.Certificate
import Superopt.Masks
import Superopt.Rules

/-!
# The schedule rules' side conditions, checked on a plan's kernels

A plan's kernels cite the schedule rules their loops rely on (`kernels[].fused_rules`), and the plan
lists its axis views (`axis_merges`, `axis_splits`, `axis_units`). The theorems of those rules
(`Superopt/Rules.lean`) hold under side conditions on the loop's form; `checkSchedule` reads each
kernel's loop from the plan's JSON and checks them, computably, as Python's `validate` does
(`pyrunner/plan/schedule_rules.py`, the same conditions):

* every cited rule needs a loop (`loop`, a streamed axis `s` tiled by `block`);
* `reduction_tiling`: the body reduces over `s`, and the tiles cover the axis: `block` divides its
  extent, or the body masks the partial last tile (a map comparing `index(s)` with `size(s)`, or only
  loaded tiles, zero past the end, feed the sums and contractions over `s`). With `block` dividing the
  extent, `tiled_sum` is `reduction_tiling_range` at this loop's numbers;
* `online_softmax_rescale`: the body keeps a running max over exactly `s` (an accumulating max
  reduction), a sum over `s`, and rescales by an exponential of that running max (or of a map of it);
* `shared_operand_fusion`: two or more contractions over `s` in the one loop, sharing an operand;
* `reduction_in_contraction_loop`: a contraction over `s` and a reduction over `s` in the one loop;
* `shared_accumulator`: two contractions over `s` in the one loop accumulating into one tile `c`;
* `masked_tile_skip`: cited exactly where the loop has a `visible` predicate; every conjunct of that
  predicate is a conjunct of a mask (a `where` condition) of the terms the certificate says the kernel
  computes, and for every block of the grid axes the predicate names, the loop's run range (the steps
  where the predicate is not all false over the tile, by `Pred.allFalse`) passes `skippedOk`.
  `maskedSkip_sound` proves that then every element of every step outside the run range is masked
  by one of the kernel's masks;
* `merge_axes` / `split_reduction`: the parts' extents multiply to the axis's (`chunk_in_axis`,
  `chunk_of_index`: the parts' index pairs and the axis's indices correspond one to one);
* `unit_axis`: the inserted axis has extent 1 and is not an axis of the graph.

What is proved and what is only checked: `maskedSkip_sound`, `tiled_sum`, `chunk_in_axis` and
`chunk_of_index` are theorems about the checks' numbers. That a kernel's ops compute its loop the
way the rule's theorem states (the accumulator updates, the rescale, that a masked element
contributes its accumulator's identity) is checked by the structural conditions above and by
Python's abstract evaluation (`pyrunner/rules/masking.py`), not proved. The renderer's run range
comes from Python's `pyrunner.plan.masks.step_range`; `tests/test_lean_sources.py` checks that it is
the range computed here on the examples of `tests/lean/SuperoptTest.lean`.
-/

namespace Superopt

/-! ## JSON fields, with defaults -/

/-- A string field, `""` when absent. -/
def sField (j : Lean.Json) (k : String) : String :=
  match j.getObjValD k with
  | .str s => s
  | _ => ""

/-- A list field, `[]` when absent. -/
def lField (j : Lean.Json) (k : String) : List Lean.Json :=
  match j.getObjValD k with
  | .arr a => a.toList
  | _ => []

/-- A boolean field, `false` when absent. -/
def bField (j : Lean.Json) (k : String) : Bool :=
  match j.getObjValD k with
  | .bool b => b
  | _ => false

/-- A natural number, `none` for anything else. -/
def natOf (j : Lean.Json) : Option Nat :=
  match j with
  | .num n => if n.exponent = 0 ∧ n.mantissa ≥ 0 then some n.mantissa.toNat else none
  | _ => none

/-- A tile extent: a number, or the name of a parameter with its default in `defaults`. -/
def blockOf (kernel : Lean.Json) (b : Lean.Json) : Option Nat :=
  match b with
  | .str p => natOf ((kernel.getObjValD "defaults").getObjValD p)
  | j => natOf j

/-- The extent of an axis in a list of extents. -/
def extentOf (sizes : List (Axis × Nat)) (a : Axis) : Option Nat :=
  (sizes.find? (fun p => p.1 == a)).map (·.2)

/-- The extents the plan's tensors give their axes, then the graph's own axes. -/
def planSizes (plan : Lean.Json) : List (Axis × Nat) :=
  let fromTensors := (lField plan "tensors").foldl (fun (acc : List (Axis × Nat)) (t : Lean.Json) =>
    acc ++ ((lField t "axes").zip (lField t "shape")).filterMap fun p =>
      match p.1, natOf p.2 with
      | .str a, some n => some (a, n)
      | _, _ => none) []
  let fromGraph := match (plan.getObjValD "graph").getObjValD "axes" with
    | .obj kvs => kvs.fold (fun (acc : List (Axis × Nat)) (k : String) (v : Lean.Json) => match natOf v with
        | some n => acc ++ [(k, n)]
        | none => acc) []
    | _ => []
  fromTensors ++ fromGraph

/-- All elements of a list pass (own recursion, so its lemma is ours). -/
def allOf {β : Type} (f : β → Bool) : List β → Bool
  | [] => true
  | x :: l => f x && allOf f l

theorem allOf_mem {β : Type} (f : β → Bool) : ∀ (l : List β) (x : β), allOf f l = true → x ∈ l → f x = true
  | [], _, _, hx => by cases hx
  | y :: l, x, h, hx => by
    have h' : (f y && allOf f l) = true := h
    cases List.mem_cons.1 hx with
    | inl hxy =>
      rw [hxy]
      exact band_left h'
    | inr hl => exact allOf_mem f l x (band_right h') hl

/-- Each element's list, concatenated. -/
def concatMapL {β γ : Type} (f : β → List γ) : List β → List γ
  | [] => []
  | x :: l => f x ++ concatMapL f l

/-! ## Index predicates from terms -/

/-- The integer a decimal denotes, where it is one. -/
def Decimal.toInt? (d : Decimal) : Option Int :=
  let p : Int := ((10 ^ d.exponent : Nat) : Int)
  if d.mantissa % p = 0 then some (d.mantissa / p) else none

/-- An integer affine form: a coefficient per index and an offset. -/
abbrev Form := List (Axis × Int) × Int

/-- `k * f`. -/
def scaleForm (k : Int) (f : Form) : Form := (f.1.map fun p => (p.1, k * p.2), k * f.2)

/-- `f + g`. -/
def addForm (f g : Form) : Form := (f.1 ++ g.1, f.2 + g.2)

/-- The term as an integer affine form in indices (`iota`), axis extents and integer constants,
as `pyrunner.plan.masks.affine` reads a plan expression. -/
def Term.form (size : Axis → Int) : Term → Option Form
  | .iota a => some ([(a, 1)], 0)
  | .axisSize a => some ([], size a)
  | .const d => d.toInt?.map fun v => ([], v)
  | .unary .neg x => (Term.form size x).map (scaleForm (-1))
  | .binary .add a b =>
    (Term.form size a).bind fun fa => (Term.form size b).map fun fb => addForm fa fb
  | .binary .sub a b =>
    (Term.form size a).bind fun fa => (Term.form size b).map fun fb => addForm fa (scaleForm (-1) fb)
  | .binary .mul a b =>
    (Term.form size a).bind fun fa => (Term.form size b).bind fun fb =>
      if fb.1.isEmpty then some (scaleForm fb.2 fa) else if fa.1.isEmpty then some (scaleForm fa.2 fb) else none
  | _ => none

/-- The term as an index predicate (`pyrunner.plan.masks.predicate`): `lt`/`le` of affine forms
(integers: `a < b` is `a - b + 1 ≤ 0`), `min`/`mul` as `and`, `max` as `or`, a constant as true
(non-zero) or false. -/
def Term.pred (size : Axis → Int) : Term → Option Pred
  | .binary .lt a b =>
    (Term.form size a).bind fun fa => (Term.form size b).map fun fb =>
      Pred.atom ⟨(addForm fa (scaleForm (-1) fb)).1, fa.2 - fb.2 + 1⟩
  | .binary .le a b =>
    (Term.form size a).bind fun fa => (Term.form size b).map fun fb =>
      Pred.atom ⟨(addForm fa (scaleForm (-1) fb)).1, fa.2 - fb.2⟩
  | .binary .min a b => (Term.pred size a).bind fun p => (Term.pred size b).map fun q => Pred.and p q
  | .binary .mul a b => (Term.pred size a).bind fun p => (Term.pred size b).map fun q => Pred.and p q
  | .binary .max a b => (Term.pred size a).bind fun p => (Term.pred size b).map fun q => Pred.or p q
  | .const d => some (Pred.atom ⟨[], if d.mantissa = 0 then 1 else -1⟩)
  | _ => none

/-- A plan expression (`{"kind": "index" | "size" | "const" | "call", ...}`) as a term (`fuel` bounds
the depth). -/
def exprTerm : Nat → Lean.Json → Option Term
  | 0, _ => none
  | fuel + 1, j =>
    match sField j "kind" with
    | "index" => some (Term.iota (sField j "axis"))
    | "size" => some (Term.axisSize (sField j "axis"))
    | "const" =>
      match j.getObjValD "value" with
      | .num n => some (Term.const ⟨n.mantissa, n.exponent⟩)
      | .str "-inf" => some Term.negInf
      | _ => none
    | "call" =>
      let fn := sField j "fn"
      match (lField j "args").mapM (exprTerm fuel) with
      | some [x] => (UnaryOp.all.find? (fun f => f.name == fn)).map fun f => Term.unary f x
      | some [a, b] => (BinaryOp.all.find? (fun f => f.name == fn)).map fun f => Term.binary f a b
      | some [c, a, b] => if fn == "where" then some (Term.ternary .select c a b) else none
      | _ => none
    | _ => none

/-- The conditions of the `where` nodes of a term (the masks it applies). -/
def Term.selectConds : Term → List Term
  | .unary _ x => Term.selectConds x
  | .binary _ a b => Term.selectConds a ++ Term.selectConds b
  | .ternary _ c a b => c :: (Term.selectConds c ++ Term.selectConds a ++ Term.selectConds b)
  | .reduce _ x _ => Term.selectConds x
  | .matmul a b _ => Term.selectConds a ++ Term.selectConds b
  | _ => []

/-! ## `masked_tile_skip`: the loop's visible predicate against the kernel's masks -/

/-- The conjuncts of a predicate: the leaves of its `and` tree. -/
def Pred.conjuncts : Pred → List Pred
  | .atom a => [.atom a]
  | .and p q => Pred.conjuncts p ++ Pred.conjuncts q
  | .or p q => [.or p q]

/-- The indices a predicate names. -/
def Pred.axes : Pred → List Axis
  | .atom a => a.coef.map (·.1)
  | .and p q => Pred.axes p ++ Pred.axes q
  | .or p q => Pred.axes p ++ Pred.axes q

/-- `c` is one of the list's predicates. -/
def memP (c : Pred) : List Pred → Bool
  | [] => false
  | x :: l => decide (c = x) || memP c l

/-- `c` is a conjunct of one of the masks. -/
def coveredBy (c : Pred) : List Pred → Bool
  | [] => false
  | m :: ms => memP c m.conjuncts || coveredBy c ms

theorem memP_sound (c : Pred) : ∀ l : List Pred, memP c l = true → c ∈ l
  | [], h => by
    have h0 : false = true := h
    cases h0
  | x :: l, h => by
    have h' : (decide (c = x) || memP c l) = true := h
    cases hd : decide (c = x) with
    | true => exact List.mem_cons.2 (Or.inl (of_decide_eq_true hd))
    | false =>
      rw [hd] at h'
      exact List.mem_cons.2 (Or.inr (memP_sound c l h'))

theorem coveredBy_sound (c : Pred) : ∀ ms : List Pred, coveredBy c ms = true → ∃ m, m ∈ ms ∧ c ∈ m.conjuncts
  | [], h => by
    have h0 : false = true := h
    cases h0
  | m :: ms, h => by
    have h' : (memP c m.conjuncts || coveredBy c ms) = true := h
    cases hm : memP c m.conjuncts with
    | true => exact ⟨m, List.mem_cons.2 (Or.inl rfl), memP_sound c m.conjuncts hm⟩
    | false =>
      rw [hm] at h'
      obtain ⟨m', hm', hc⟩ := coveredBy_sound c ms h'
      exact ⟨m', List.mem_cons.2 (Or.inr hm'), hc⟩

/-- Where a predicate holds, each of its conjuncts holds. -/
theorem conjunct_holds (idx : Axis → Int) :
    ∀ (p c : Pred), c ∈ p.conjuncts → p.holds idx = true → c.holds idx = true
  | .atom a, c, hc, hp => by
    have hc' : c = .atom a := List.mem_singleton.1 hc
    rw [hc']
    exact hp
  | .or p q, c, hc, hp => by
    have hc' : c = .or p q := List.mem_singleton.1 hc
    rw [hc']
    exact hp
  | .and p q, c, hc, hp => by
    have hp' : (p.holds idx && q.holds idx) = true := hp
    cases List.mem_append.1 hc with
    | inl h => exact conjunct_holds idx p c h (band_left hp')
    | inr h => exact conjunct_holds idx q c h (band_right hp')

/-- Where a predicate fails, one of its conjuncts fails. -/
theorem false_conjunct (idx : Axis → Int) :
    ∀ p : Pred, p.holds idx = false → ∃ c, c ∈ p.conjuncts ∧ c.holds idx = false
  | .atom a, h => ⟨.atom a, List.mem_singleton.2 rfl, h⟩
  | .or p q, h => ⟨.or p q, List.mem_singleton.2 rfl, h⟩
  | .and p q, h => by
    have h' : (p.holds idx && q.holds idx) = false := h
    cases hp : p.holds idx with
    | false =>
      obtain ⟨c, hc, hcf⟩ := false_conjunct idx p hp
      exact ⟨c, List.mem_append.2 (Or.inl hc), hcf⟩
    | true =>
      rw [hp] at h'
      have hq : q.holds idx = false := h'
      obtain ⟨c, hc, hcf⟩ := false_conjunct idx q hq
      exact ⟨c, List.mem_append.2 (Or.inr hc), hcf⟩

/-- Every conjunct of the visible predicate is a conjunct of one of the masks. -/
def allCovered (masks : List Pred) (cs : List Pred) : Bool := allOf (fun c => coveredBy c masks) cs

/-- Where the visible predicate is false and its conjuncts are the masks', some mask is false. -/
theorem visible_false_masked (V : Pred) (masks : List Pred) (hcov : allCovered masks V.conjuncts = true)
    (idx : Axis → Int) (hV : V.holds idx = false) : ∃ m, m ∈ masks ∧ m.holds idx = false := by
  obtain ⟨c, hc, hcf⟩ := false_conjunct idx V hV
  obtain ⟨m, hm, hcm⟩ := coveredBy_sound c masks (allOf_mem _ V.conjuncts c hcov hc)
  refine ⟨m, hm, ?_⟩
  cases hmh : m.holds idx with
  | false => rfl
  | true =>
    have h1 := conjunct_holds idx m c hcm hmh
    rw [hcf] at h1
    cases h1

/--
`masked_tile_skip` at a loop: where the visible predicate's conjuncts are the kernel's masks' and
`skippedOk` holds for the run range `[lo, hi)`, every element of every loop step outside the range
is masked (some mask of the kernel is false there).
-/
theorem maskedSkip_sound (V : Pred) (masks : List Pred) (box : Box) (s : Axis) (block : Int)
    (steps lo hi : Nat) (hcov : allCovered masks V.conjuncts = true)
    (hok : skippedOk V box s block steps lo hi = true) (j : Nat) (hj : j < steps)
    (hout : ¬ (lo ≤ j ∧ j < hi)) (idx : Axis → Int) (hin : InBox (stepBox box s block j) idx) :
    ∃ m, m ∈ masks ∧ m.holds idx = false :=
  visible_false_masked V masks hcov idx (skipped_steps_masked V box s block steps lo hi hok j hj hout idx hin)

/-- The box of a list of per-axis tile bounds (other axes at 0). -/
def toBox (l : List (Axis × Int × Int)) : Box := fun a =>
  match l.find? (fun p => p.1 == a) with
  | some p => p.2
  | none => (0, 0)

/-- Every block of the given grid axes (axis, block, extent): one list of tile bounds per block. -/
def gridBlocks : List (Axis × Nat × Nat) → List (List (Axis × Int × Int))
  | [] => [[]]
  | (a, b, n) :: rest =>
    concatMapL (fun i => (gridBlocks rest).map fun bx =>
      (a, ((i * b : Nat) : Int), ((i * b + b : Nat) : Int) - 1) :: bx) (List.range ((n + b - 1) / b))

/-- The loop steps a block runs: from the first step whose tile is not all false to the last. -/
def runRange (V : Pred) (box : Box) (s : Axis) (block : Int) (steps : Nat) : Nat × Nat :=
  let runs := (List.range steps).filter fun j => !(V.allFalse (stepBox box s block j))
  match runs.head?, runs.getLast? with
  | some lo, some hi => (lo, hi + 1)
  | _, _ => (steps, steps)

/-- The check `masked_tile_skip` needs of a loop: the visible predicate's conjuncts are the masks', and
every block's run range passes `skippedOk` (`maskedSkip_sound`). -/
def maskedSkipOk (V : Pred) (masks : List Pred) (grid : List (Axis × Nat × Nat)) (s : Axis) (block steps : Nat) :
    Bool :=
  allCovered masks V.conjuncts &&
    allOf (fun bx => skippedOk V (toBox bx) s block steps (runRange V (toBox bx) s block steps).1
      (runRange V (toBox bx) s block steps).2) (gridBlocks grid)

/-- Where `maskedSkipOk` holds, every element of every step a block leaves out is masked. -/
theorem maskedSkipOk_sound (V : Pred) (masks : List Pred) (grid : List (Axis × Nat × Nat)) (s : Axis)
    (block steps : Nat) (h : maskedSkipOk V masks grid s block steps = true) (bx : List (Axis × Int × Int))
    (hbx : bx ∈ gridBlocks grid) (j : Nat) (hj : j < steps)
    (hout : ¬ ((runRange V (toBox bx) s block steps).1 ≤ j ∧ j < (runRange V (toBox bx) s block steps).2))
    (idx : Axis → Int) (hin : InBox (stepBox (toBox bx) s block j) idx) :
    ∃ m, m ∈ masks ∧ m.holds idx = false :=
  maskedSkip_sound V masks (toBox bx) s block steps (runRange V (toBox bx) s block steps).1
    (runRange V (toBox bx) s block steps).2 (band_left h)
    (allOf_mem _ (gridBlocks grid) bx (band_right h) hbx) j hj hout idx hin

/-! ## Small lemmas behind the numeric checks -/

/-- A block dividing the extent tiles it exactly. -/
theorem tiles_cover (n b : Nat) (h : n % b = 0) : n / b * b = n := by
  have h1 := Nat.mod_add_div n b
  rw [h, Nat.zero_add, Nat.mul_comm] at h1
  exact h1

/-- `reduction_tiling_range` at a loop whose block divides the extent: the sum over the axis is the
sum over the loop's steps of the sums over their tiles. -/
theorem tiled_sum {α : Type} [ScalarField α] (f : Nat → α) (n b : Nat) (h : n % b = 0) :
    sumUpTo f n = sumUpTo (fun t => sumUpTo (fun j => f (t * b + j)) b) (n / b) := by
  have hc := reduction_tiling_range f (n / b) b
  rw [tiles_cover n b h] at hc
  exact hc

/-- Chunk `j` of `c`, position `l` of `p`, is an index of the axis of extent `c * p`. -/
theorem chunk_in_axis (c p j l : Nat) (hj : j < c) (hl : l < p) : j * p + l < c * p := by
  have h1 : (j + 1) * p ≤ c * p := Nat.mul_le_mul (Nat.succ_le_of_lt hj) (Nat.le_refl p)
  rw [Nat.add_mul, Nat.one_mul] at h1
  omega

/-- Every index of the axis of extent `c * p` is position `k % p` of chunk `k / p`. -/
theorem chunk_of_index (c p k : Nat) (hp : 0 < p) (hk : k < c * p) :
    k / p < c ∧ k % p < p ∧ k / p * p + k % p = k := by
  have h1 := Nat.mod_add_div k p
  rw [Nat.mul_comm] at h1
  have h2 : k % p < p := Nat.mod_lt k hp
  refine ⟨?_, h2, by omega⟩
  cases Nat.lt_or_ge (k / p) c with
  | inl h => exact h
  | inr hc =>
    have h3 : c * p ≤ k / p * p := Nat.mul_le_mul hc (Nat.le_refl p)
    omega

/-! ## The checks on a kernel's JSON -/

/-- Every node of a plan expression (`fuel` bounds the depth). -/
def exprNodes : Nat → Lean.Json → List Lean.Json
  | 0, _ => []
  | fuel + 1, j => j :: concatMapL (exprNodes fuel) (lField j "args")

/-- The expression has a node of the kind with the field (`kind`, `field`, `value`). -/
def exprHas (e : Lean.Json) (kind field value : String) : Bool :=
  (exprNodes 64 e).any fun n => sField n "kind" == kind && sField n field == value

/-- A reduction over `s` (of function `fn`, any with `""`). -/
def reduceOver (s fn : String) (op : Lean.Json) : Bool :=
  sField op "op" == "reduce" && sField op "axis" == s && (fn == "" || sField op "fn" == fn)

/-- A contraction over `s`. -/
def gemmOver (s : String) (op : Lean.Json) : Bool := sField op "op" == "gemm" && sField op "contract" == s

/-- The number of distinct strings. -/
def distinctCount (l : List String) : Nat :=
  (l.foldl (fun (acc : List String) (x : String) => if acc.contains x then acc else acc ++ [x]) []).length

/-- The body masks the partial last tile of `s`, or only loaded tiles (zeros past the end) feed the
sums and contractions over `s` (Python `_masks_tail`). -/
def masksTail (body : List Lean.Json) (s : String) : Bool :=
  body.any (fun op => sField op "op" == "map" && exprHas (op.getObjValD "expr") "size" "axis" s &&
      exprHas (op.getObjValD "expr") "index" "axis" s) ||
    (let loaded := (body.filter fun op => sField op "op" == "load").map fun op => sField op "dst"
     body.all (fun op => !(reduceOver s "" op) || (sField op "fn" == "sum" && loaded.contains (sField op "src"))) &&
       body.all (fun op => !(gemmOver s op) || (loaded.contains (sField op "a") && loaded.contains (sField op "b"))))

/-- The tiles of `block` cover an axis of extent `n`: the block divides it, or the tail is masked. -/
def tilesCover (n block : Nat) (tailMasked : Bool) : Bool := decide (0 < block) && (n % block == 0 || tailMasked)

/-- The side condition of one schedule rule at a loop over `s` (extent `n`, tiles of `block`). -/
def loopRuleOk (body : List Lean.Json) (s : String) (n block : Nat) : String → Bool
  | "reduction_tiling" => body.any (reduceOver s "") && tilesCover n block (masksTail body s)
  | "online_softmax_rescale" =>
    let running := (body.filter fun op => reduceOver s "max" op && bField op "accumulate").map
      fun op => sField op "dst"
    -- the running max, or a map of it (its `-inf`-safe copy): what the rescale's exponential reads
    let maxes := running ++ (body.filter fun op => sField op "op" == "map" &&
      running.any fun m => exprHas (op.getObjValD "expr") "ref" "buf" m).map fun op => sField op "dst"
    body.any (reduceOver s "sum") &&
      body.any (fun op => sField op "op" == "map" &&
        ((exprHas (op.getObjValD "expr") "call" "fn" "exp") || (exprHas (op.getObjValD "expr") "call" "fn" "exp2")) &&
        maxes.any fun m => exprHas (op.getObjValD "expr") "ref" "buf" m)
  | "shared_operand_fusion" =>
    let gemms := body.filter (gemmOver s)
    let anyGemm := body.filter fun op => sField op "op" == "gemm"
    decide (2 ≤ gemms.length) &&
      (decide (distinctCount (anyGemm.map fun op => sField op "a") < anyGemm.length) ||
        decide (distinctCount (anyGemm.map fun op => sField op "b") < anyGemm.length))
  | "reduction_in_contraction_loop" => body.any (gemmOver s) && body.any (reduceOver s "")
  | "shared_accumulator" =>
    let accs := (body.filter (gemmOver s)).map fun op => sField op "c"
    decide (distinctCount accs < accs.length)
  | "masked_tile_skip" => true
  | _ => false

/-- What is wrong with a kernel's loop against the rules it cites (`none`: nothing). `sizes` are the
axis extents, `masks` the `where` conditions of the terms the kernel computes. -/
def kernelProblem (sizes : List (Axis × Nat)) (masks : List Term) (k : Lean.Json) : Option String :=
  let rules := (lField k "fused_rules").map fun r => match r with
    | .str s => s
    | _ => ""
  let loop := k.getObjValD "loop"
  match loop with
  | .null => if rules.isEmpty then none else some s!"cites {rules} but has no loop"
  | _ =>
    let s := sField loop "axis"
    match extentOf sizes s, blockOf k (loop.getObjValD "block") with
    | some n, some block =>
      let body := lField k "body"
      match rules.find? (fun r => !(loopRuleOk body s n block r)) with
      | some r => some s!"the loop over '{s}' (block {block}, extent {n}) is not of the form {r} needs"
      | none =>
        let size : Axis → Int := fun a => ((extentOf sizes a).getD 0 : Int)
        match loop.getObjValD "visible" with
        | .null => if rules.contains "masked_tile_skip" then some "cites masked_tile_skip but skips no tile" else none
        | vis =>
          match (exprTerm 64 vis).bind (Term.pred size) with
          | none => some "loop.visible is not an index predicate"
          | some V =>
            if !(rules.contains "masked_tile_skip") then some "skips tiles without citing masked_tile_skip"
            else
              let grid := (V.axes.filter (· != s)).foldl (fun (acc : List Axis) (a : Axis) =>
                if acc.contains a then acc else acc ++ [a]) []
              let blocks := grid.filterMap fun a =>
                ((lField k "grid").find? (fun g => sField g "axis" == a)).bind fun g =>
                  (blockOf k (g.getObjValD "block")).bind fun b => (extentOf sizes a).map fun m => (a, b, m)
              if blocks.length != grid.length then some "loop.visible names an index the kernel does not iterate"
              else if block == 0 then some "the loop block is 0"
              else if maskedSkipOk V (masks.filterMap (Term.pred size)) blocks s block ((n + block - 1) / block) then
                none
              else some "a tile the loop leaves out is not masked by the kernel's masks (masked_tile_skip)"
    | _, _ => some s!"the loop's axis '{s}' or its block is unknown"

/-- What is wrong with the plan's axis views (`none`: nothing): a merge's or split's parts must
multiply to the axis's extent, a unit axis have extent 1 and not be a graph axis. -/
def viewProblem (plan : Lean.Json) (sizes : List (Axis × Nat)) : Option String :=
  let graphAxes : List Axis := match (plan.getObjValD "graph").getObjValD "axes" with
    | .obj kvs => kvs.fold (fun (acc : List Axis) (k : String) _ => acc ++ [k]) []
    | _ => []
  let pairOk := fun (v : Lean.Json) =>
    match (lField v "sizes").map natOf with
    | [some a, some b] => (extentOf sizes (sField v "axis")).all (· == a * b)
    | _ => false
  let axisOf := fun (v : Lean.Json) => sField v "axis"
  match (lField plan "axis_merges").find? (fun v => !(pairOk v)) with
  | some v => some s!"axis_merges: the parts of '{axisOf v}' do not multiply to its extent"
  | none =>
    match (lField plan "axis_splits").find? (fun v => !(pairOk v)) with
    | some v => some s!"axis_splits: the chunks of '{axisOf v}' do not cover it"
    | none =>
      match (lField plan "axis_units").find? (fun u =>
          graphAxes.contains (axisOf u) || !((extentOf sizes (axisOf u)).all (· == 1))) with
      | some u => some s!"axis_units: '{axisOf u}' is not a new axis of extent 1"
      | none => none

/-- The `where` conditions of the terms the certificate says each kernel computes (none without a
certificate). -/
def kernelMasks (plan : Lean.Json) : Except String (List (List Term)) := do
  let cert := plan.getObjValD "certificate"
  match cert with
  | .null => return (lField plan "kernels").map fun _ => []
  | _ =>
    let nodes ← parseNodes (lField cert "nodes")
    (lField cert "kernels").mapM fun kt => do
      let ixs ← (lField kt "writes").mapM jNat
      let terms ← ixs.mapM (nodeAt nodes)
      return concatMapL Term.selectConds terms

/-- Checks every kernel's loop against the schedule rules it cites, and the plan's axis views. -/
def checkSchedule (plan : Lean.Json) : Except String Unit := do
  let sizes := planSizes plan
  let masks ← kernelMasks plan
  let kernels := lField plan "kernels"
  let mut ki := 0
  for k in kernels do
    let name := sField k "name"
    match kernelProblem sizes (masks.getD ki []) k with
    | some e => throw s!"kernels[{ki}] '{name}': {e}"
    | none => pure ()
    ki := ki + 1
  match viewProblem plan sizes with
  | some e => throw e
  | none => pure ()

end Superopt

import Superopt.Eval

/-!
# Replaying a derivation: each rule as a computable rewrite, proven sound

A plan's certificate (Python `pyrunner/rules/replay_plan.py`) records, for every algebraic step, the
rule, its instantiation and a position: an output of the graph and a path of operand indices. Here
each rule the Lean side proves on terms is a computable `Rule.apply : Rule → Term → Option Term`
(structural matching only): `some t'` when the term has the rule's shape and its side conditions
hold (an axis not among a term's axes, equal sub-terms, the exact constant), `none` otherwise.
`Rule.apply_sound` says a rewrite keeps the value at every index, from the term theorems of
`Superopt/Eval.lean`. `replay` runs the steps from the graph's outputs, each rewriting every
occurrence of the sub-term at its position (as Python does: equal sub-terms are one value), and
`replay_sound` says, by induction over the steps, that the replayed outputs have the graph's values.

What the claim covers and what it does not:

* `exp_to_exp2` multiplies by the decimal constant `log2eDecimal` (Python's `LOG2E`, log2 e rounded
  to float64). Its soundness, and so `replay_sound`, assumes that constant denotes log2 e exactly
  (`hlog`); the float's rounding (relative error below 2^-53) is outside the claim.
* Rules and variants without a theorem on terms have no `Rule` constructor: `softmax_scaled_max_shift`,
  `variance_sum_of_squares`, `matmul_assoc`, the product rebuilds `elementwise_mul_comm` /
  `elementwise_mul_assoc` over many factors, `exp_shift_to_max` for `exp2` or without a scale. A plan
  using them is checked by Python's replay only (`Superopt/Certificate.lean` says so).
* Python also requires a rewrite to keep the term's axis order; that is a layout condition, not a
  value one, and is not re-checked here.
-/

namespace Superopt

/-- Python's `LOG2E`: log2 e rounded to float64, as the exact decimal Python prints. -/
def log2eDecimal : Decimal := 1.4426950408889634

/-- `a * b` or, with `swap`, `b * a` (the product order a step records). -/
def orientMul (swap : Bool) (a b : Term) : Term :=
  match swap with
  | true => .binary .mul b a
  | false => .binary .mul a b

/-- Whether `sub` occurs in `t` (Python's `m in subterms([n])`). -/
def Term.contains (sub : Term) : Term → Bool
  | t@(.unary _ x) => decide (t = sub) || Term.contains sub x
  | t@(.binary _ a b) => decide (t = sub) || Term.contains sub a || Term.contains sub b
  | t@(.ternary _ c a b) =>
    decide (t = sub) || Term.contains sub c || Term.contains sub a || Term.contains sub b
  | t@(.reduce _ x _) => decide (t = sub) || Term.contains sub x
  | t@(.matmul a b _) => decide (t = sub) || Term.contains sub a || Term.contains sub b
  | t => decide (t = sub)

/-- Python's `positive_constant` without its axes test: a positive decimal, an axis size, an
exponential, a root of a positive term, a product or quotient of positive terms. -/
def Term.positive : Term → Bool
  | .const d => decide (d.mantissa > 0)
  | .axisSize _ => true
  | .unary .exp _ => true
  | .unary .exp2 _ => true
  | .unary .sqrt x => Term.positive x
  | .unary .rsqrt x => Term.positive x
  | .binary .mul a b => Term.positive a && Term.positive b
  | .binary .div a b => Term.positive a && Term.positive b
  | _ => false

/-- The algebraic rules with their instantiation, one constructor per proven form. -/
inductive Rule where
  /-- `softmax_max_shift` with `E = fn` over axis `a`. -/
  | softmaxMaxShift (fn : UnaryOp) (a : Axis)
  /-- `matmul_div_commute`, the quotient `p / l` the left operand. -/
  | matmulDivLeft (l : Term)
  /-- `matmul_div_commute`, the quotient the right operand. -/
  | matmulDivRight (l : Term)
  /-- `matmul_row_scale_commute`: `(x * s) @ w`; the result `(x @ w) * s`, or `s * (x @ w)` with `first`. -/
  | rowScaleXS (s : Term) (first : Bool)
  /-- `matmul_row_scale_commute`: `(s * x) @ w`. -/
  | rowScaleSX (s : Term) (first : Bool)
  /-- `matmul_row_scale_commute`: `w @ (x * s)`. -/
  | rowScaleWXS (s : Term) (first : Bool)
  /-- `matmul_row_scale_commute`: `w @ (s * x)`. -/
  | rowScaleWSX (s : Term) (first : Bool)
  /-- `exp_to_exp2` with the constant `log2eDecimal`. -/
  | expToExp2
  /-- `mean_to_sum_div` over axis `a`. -/
  | meanToSumDiv (a : Axis)
  /-- `matmul_as_sum` over axis `a`, the product's operands swapped with `swap`. -/
  | matmulAsSum (a : Axis) (swap : Bool)
  /-- `exp_shift_to_max` for `exp` with the scale `c`, the max over axis `a`. -/
  | expShiftToMax (a : Axis) (c : Term)
  /-- `sum_scale_commute`, `sum_a (x * s)`. -/
  | sumScaleRight (a : Axis) (s : Term) (first : Bool)
  /-- `sum_scale_commute`, `sum_a (s * x)`. -/
  | sumScaleLeft (a : Axis) (s : Term) (first : Bool)
  /-- `sum_scale_commute`, `sum_a (x / s)`. -/
  | sumScaleDiv (a : Axis) (s : Term)

/-- The rule's name as plans spell it. -/
def Rule.name : Rule → String
  | .softmaxMaxShift _ _ => "softmax_max_shift"
  | .matmulDivLeft _ => "matmul_div_commute"
  | .matmulDivRight _ => "matmul_div_commute"
  | .rowScaleXS _ _ => "matmul_row_scale_commute"
  | .rowScaleSX _ _ => "matmul_row_scale_commute"
  | .rowScaleWXS _ _ => "matmul_row_scale_commute"
  | .rowScaleWSX _ _ => "matmul_row_scale_commute"
  | .expToExp2 => "exp_to_exp2"
  | .meanToSumDiv _ => "mean_to_sum_div"
  | .matmulAsSum _ _ => "matmul_as_sum"
  | .expShiftToMax _ _ => "exp_shift_to_max"
  | .sumScaleRight _ _ _ => "sum_scale_commute"
  | .sumScaleLeft _ _ _ => "sum_scale_commute"
  | .sumScaleDiv _ _ => "sum_scale_commute"

/-! ## Each rule's rewrite -/

/-- `E(x) / sum_a E(x)` to `E(x - max_a x) / sum_a E(x - max_a x)`. -/
def applySoftmaxMaxShift (fn : UnaryOp) (a : Axis) : Term → Option Term
  | .binary .div (.unary f x) (.reduce .sum (.unary f' x') a') =>
    if f = fn ∧ f' = fn ∧ x' = x ∧ a' = a ∧ (fn = .exp ∨ fn = .exp2) ∧ a ∈ x.resultAxes then
      some (.binary .div (.unary fn (.binary .sub x (.reduce .max x a)))
        (.reduce .sum (.unary fn (.binary .sub x (.reduce .max x a))) a))
    else none
  | _ => none

/-- `(p / l) @_a v` to `(p @_a v) / l`, `a` not an axis of `l`. -/
def applyMatmulDivLeft (l : Term) : Term → Option Term
  | .matmul (.binary .div p l') v a =>
    if l' = l ∧ a ∉ l.resultAxes then some (.binary .div (.matmul p v a) l) else none
  | _ => none

/-- `v @_a (p / l)` to `(v @_a p) / l`, `a` not an axis of `l`. -/
def applyMatmulDivRight (l : Term) : Term → Option Term
  | .matmul v (.binary .div p l') a =>
    if l' = l ∧ a ∉ l.resultAxes then some (.binary .div (.matmul v p a) l) else none
  | _ => none

/-- `(x * s) @_a w` to `(x @_a w) * s`. -/
def applyRowScaleXS (s : Term) (first : Bool) : Term → Option Term
  | .matmul (.binary .mul x s') w a =>
    if s' = s ∧ a ∉ s.resultAxes then some (orientMul first (.matmul x w a) s) else none
  | _ => none

/-- `(s * x) @_a w` to `(x @_a w) * s`. -/
def applyRowScaleSX (s : Term) (first : Bool) : Term → Option Term
  | .matmul (.binary .mul s' x) w a =>
    if s' = s ∧ a ∉ s.resultAxes then some (orientMul first (.matmul x w a) s) else none
  | _ => none

/-- `w @_a (x * s)` to `(w @_a x) * s`. -/
def applyRowScaleWXS (s : Term) (first : Bool) : Term → Option Term
  | .matmul w (.binary .mul x s') a =>
    if s' = s ∧ a ∉ s.resultAxes then some (orientMul first (.matmul w x a) s) else none
  | _ => none

/-- `w @_a (s * x)` to `(w @_a x) * s`. -/
def applyRowScaleWSX (s : Term) (first : Bool) : Term → Option Term
  | .matmul w (.binary .mul s' x) a =>
    if s' = s ∧ a ∉ s.resultAxes then some (orientMul first (.matmul w x a) s) else none
  | _ => none

/-- `exp x` to `exp2 (x * LOG2E)`. -/
def applyExpToExp2 : Term → Option Term
  | .unary .exp x => some (.unary .exp2 (.binary .mul x (.const log2eDecimal)))
  | _ => none

/-- `mean_a x` to `sum_a x / |a|`. -/
def applyMeanToSumDiv (a : Axis) : Term → Option Term
  | .reduce .mean x a' => if a' = a then some (.binary .div (.reduce .sum x a) (.axisSize a)) else none
  | _ => none

/-- `x @_a w` to `sum_a (x * w)` where an operand has no axis of its own. -/
def applyMatmulAsSum (a : Axis) (swap : Bool) : Term → Option Term
  | .matmul x w a' =>
    if a' = a ∧ (x.resultAxes.filter (fun y => decide (y ≠ a' ∧ y ∉ w.resultAxes)) = [] ∨
        w.resultAxes.filter (fun y => decide (y ≠ a' ∧ y ∉ x.resultAxes)) = []) then
      some (.reduce .sum (orientMul swap x w) a)
    else none
  | _ => none

/-- `exp ((x - n) * c)` to `exp ((x - m) * c) * exp ((m - n) * c)`, `m = max_a x`, where `n` is built
from `m`, is not `m` and has no axis `a` (Python's conditions; the equality holds for any `m`). -/
def applyExpShiftToMax (a : Axis) (c : Term) : Term → Option Term
  | .unary .exp (.binary .mul (.binary .sub x n) c') =>
    if c' = c ∧ c.resultAxes = [] ∧ c.positive = true ∧ a ∈ x.resultAxes ∧ a ∉ n.resultAxes ∧
        n ≠ .reduce .max x a ∧ Term.contains (.reduce .max x a) n = true then
      some (.binary .mul (.unary .exp (.binary .mul (.binary .sub x (.reduce .max x a)) c))
        (.unary .exp (.binary .mul (.binary .sub (.reduce .max x a) n) c)))
    else none
  | _ => none

/-- `sum_a (x * s)` to `sum_a x * s`, `a` not an axis of `s`. -/
def applySumScaleRight (a : Axis) (s : Term) (first : Bool) : Term → Option Term
  | .reduce .sum (.binary .mul x s') a' =>
    if s' = s ∧ a' = a ∧ a ∉ s.resultAxes ∧ a ∈ x.resultAxes then
      some (orientMul first (.reduce .sum x a) s)
    else none
  | _ => none

/-- `sum_a (s * x)` to `sum_a x * s`, `a` not an axis of `s`. -/
def applySumScaleLeft (a : Axis) (s : Term) (first : Bool) : Term → Option Term
  | .reduce .sum (.binary .mul s' x) a' =>
    if s' = s ∧ a' = a ∧ a ∉ s.resultAxes ∧ a ∈ x.resultAxes then
      some (orientMul first (.reduce .sum x a) s)
    else none
  | _ => none

/-- `sum_a (x / s)` to `sum_a x / s`, `a` not an axis of `s`. -/
def applySumScaleDiv (a : Axis) (s : Term) : Term → Option Term
  | .reduce .sum (.binary .div x s') a' =>
    if s' = s ∧ a' = a ∧ a ∉ s.resultAxes ∧ a ∈ x.resultAxes then
      some (.binary .div (.reduce .sum x a) s)
    else none
  | _ => none

/-- The rule applied at the root of a term, or `none` where it does not apply. -/
def Rule.apply : Rule → Term → Option Term
  | .softmaxMaxShift fn a => applySoftmaxMaxShift fn a
  | .matmulDivLeft l => applyMatmulDivLeft l
  | .matmulDivRight l => applyMatmulDivRight l
  | .rowScaleXS s first => applyRowScaleXS s first
  | .rowScaleSX s first => applyRowScaleSX s first
  | .rowScaleWXS s first => applyRowScaleWXS s first
  | .rowScaleWSX s first => applyRowScaleWSX s first
  | .expToExp2 => applyExpToExp2
  | .meanToSumDiv a => applyMeanToSumDiv a
  | .matmulAsSum a swap => applyMatmulAsSum a swap
  | .expShiftToMax a c => applyExpShiftToMax a c
  | .sumScaleRight a s first => applySumScaleRight a s first
  | .sumScaleLeft a s first => applySumScaleLeft a s first
  | .sumScaleDiv a s => applySumScaleDiv a s

/-! ## Soundness of each rewrite -/

section Sound

variable {α : Type} [ScalarField α] [ScalarOps α]

theorem orientMul_eval (ctx : Ctx α) (swap : Bool) (a b : Term) (i : Index) :
    Term.eval ctx (orientMul swap a b) i = Term.eval ctx (.binary .mul a b) i := by
  cases swap with
  | false => rfl
  | true => exact term_elementwise_mul_comm ctx b a i

/-- A reduction of terms with equal values has equal values. -/
theorem reduce_congr (ctx : Ctx α) (f : ReduceOp) (x y : Term) (a : Axis)
    (h : ∀ j, Term.eval ctx x j = Term.eval ctx y j) (i : Index) :
    Term.eval ctx (.reduce f x a) i = Term.eval ctx (.reduce f y a) i := by
  simp only [Term.eval, h]

theorem applySoftmaxMaxShift_sound (ctx : Ctx α) (fn : UnaryOp) (a : Axis) (t t' : Term)
    (h : applySoftmaxMaxShift fn a t = some t') (i : Index) :
    Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applySoftmaxMaxShift at h
  split at h
  · rename_i f x f' x' a'
    split at h
    · rename_i hc
      obtain ⟨rfl, rfl, rfl, rfl, hf, -⟩ := hc
      cases h
      rcases hf with rfl | rfl
      · exact term_softmax_max_shift ctx _ _ i
      · exact term_softmax_max_shift_exp2 ctx _ _ i
    · cases h
  · cases h

theorem applyMatmulDivLeft_sound (ctx : Ctx α) (l t t' : Term)
    (h : applyMatmulDivLeft l t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyMatmulDivLeft at h
  split at h
  · rename_i p l' v a
    split at h
    · rename_i hc
      obtain ⟨rfl, ha⟩ := hc
      cases h
      exact (term_matmul_div_commute ctx p _ v _ ha i).symm
    · cases h
  · cases h

theorem applyMatmulDivRight_sound (ctx : Ctx α) (l t t' : Term)
    (h : applyMatmulDivRight l t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyMatmulDivRight at h
  split at h
  · rename_i v p l' a
    split at h
    · rename_i hc
      obtain ⟨rfl, ha⟩ := hc
      cases h
      exact (term_matmul_div_commute_right ctx v p _ _ ha i).symm
    · cases h
  · cases h

theorem applyRowScaleXS_sound (ctx : Ctx α) (s : Term) (first : Bool) (t t' : Term)
    (h : applyRowScaleXS s first t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyRowScaleXS at h
  split at h
  · rename_i x s' w a
    split at h
    · rename_i hc
      obtain ⟨rfl, ha⟩ := hc
      cases h
      exact (orientMul_eval ctx first _ _ i).trans (term_matmul_row_scale_commute ctx x _ w _ ha i).symm
    · cases h
  · cases h

theorem applyRowScaleSX_sound (ctx : Ctx α) (s : Term) (first : Bool) (t t' : Term)
    (h : applyRowScaleSX s first t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyRowScaleSX at h
  split at h
  · rename_i s' x w a
    split at h
    · rename_i hc
      obtain ⟨rfl, ha⟩ := hc
      cases h
      exact (orientMul_eval ctx first _ _ i).trans
        (term_matmul_row_scale_commute_scale_left ctx _ x w _ ha i).symm
    · cases h
  · cases h

theorem applyRowScaleWXS_sound (ctx : Ctx α) (s : Term) (first : Bool) (t t' : Term)
    (h : applyRowScaleWXS s first t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyRowScaleWXS at h
  split at h
  · rename_i w x s' a
    split at h
    · rename_i hc
      obtain ⟨rfl, ha⟩ := hc
      cases h
      exact (orientMul_eval ctx first _ _ i).trans (term_matmul_row_scale_commute_right ctx w x _ _ ha i).symm
    · cases h
  · cases h

theorem applyRowScaleWSX_sound (ctx : Ctx α) (s : Term) (first : Bool) (t t' : Term)
    (h : applyRowScaleWSX s first t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyRowScaleWSX at h
  split at h
  · rename_i w s' x a
    split at h
    · rename_i hc
      obtain ⟨rfl, ha⟩ := hc
      cases h
      exact (orientMul_eval ctx first _ _ i).trans
        (term_matmul_row_scale_commute_right_scale_left ctx w _ x _ ha i).symm
    · cases h
  · cases h

/-- `exp_to_exp2` over an exact log2 e: sound when the decimal constant denotes log2 e (`hlog`). -/
theorem applyExpToExp2_sound (ctx : Ctx α) (hlog : ScalarOps.ofDecimal log2eDecimal = (ScalarField.log2e : α))
    (t t' : Term) (h : applyExpToExp2 t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyExpToExp2 at h
  split at h
  · rename_i x
    cases h
    exact (term_exp_to_exp2 ctx x log2eDecimal hlog i).symm
  · cases h

theorem applyMeanToSumDiv_sound (ctx : Ctx α) (a : Axis) (t t' : Term)
    (h : applyMeanToSumDiv a t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyMeanToSumDiv at h
  split at h
  · rename_i x a'
    split at h
    · rename_i hc
      subst hc
      cases h
      exact (term_mean_to_sum_div ctx x _ i).symm
    · cases h
  · cases h

theorem applyMatmulAsSum_sound (ctx : Ctx α) (a : Axis) (swap : Bool) (t t' : Term)
    (h : applyMatmulAsSum a swap t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyMatmulAsSum at h
  split at h
  · rename_i x w a'
    split at h
    · rename_i hc
      obtain ⟨rfl, -⟩ := hc
      cases h
      exact (reduce_congr ctx .sum _ _ _ (orientMul_eval ctx swap x w) i).trans
        (term_matmul_as_sum ctx x w _ i).symm
    · cases h
  · cases h

theorem applyExpShiftToMax_sound (ctx : Ctx α) (a : Axis) (c t t' : Term)
    (h : applyExpShiftToMax a c t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applyExpShiftToMax at h
  split at h
  · rename_i x n c'
    split at h
    · rename_i hc
      obtain ⟨rfl, -⟩ := hc
      cases h
      exact (term_exp_shift_to_max ctx x n (.reduce .max x a) _ i).symm
    · cases h
  · cases h

theorem applySumScaleRight_sound (ctx : Ctx α) (a : Axis) (s : Term) (first : Bool) (t t' : Term)
    (h : applySumScaleRight a s first t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applySumScaleRight at h
  split at h
  · rename_i x s' a'
    split at h
    · rename_i hc
      obtain ⟨rfl, rfl, ha, -⟩ := hc
      cases h
      exact (orientMul_eval ctx first _ _ i).trans (term_sum_scale_commute ctx x _ _ ha i).symm
    · cases h
  · cases h

theorem applySumScaleLeft_sound (ctx : Ctx α) (a : Axis) (s : Term) (first : Bool) (t t' : Term)
    (h : applySumScaleLeft a s first t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applySumScaleLeft at h
  split at h
  · rename_i s' x a'
    split at h
    · rename_i hc
      obtain ⟨rfl, rfl, ha, -⟩ := hc
      cases h
      exact (orientMul_eval ctx first _ _ i).trans ((term_sum_scale_commute ctx x _ _ ha i).symm.trans
        (reduce_congr ctx .sum _ _ _ (fun j => term_elementwise_mul_comm ctx x _ j) i))
    · cases h
  · cases h

theorem applySumScaleDiv_sound (ctx : Ctx α) (a : Axis) (s t t' : Term)
    (h : applySumScaleDiv a s t = some t') (i : Index) : Term.eval ctx t' i = Term.eval ctx t i := by
  unfold applySumScaleDiv at h
  split at h
  · rename_i x s' a'
    split at h
    · rename_i hc
      obtain ⟨rfl, rfl, ha, -⟩ := hc
      cases h
      exact (term_sum_scale_commute_div ctx x _ _ ha i).symm
    · cases h
  · cases h

/-- Every rule's rewrite keeps the term's value at every index (`exp_to_exp2` over an exact log2 e). -/
theorem Rule.apply_sound (ctx : Ctx α) (hlog : ScalarOps.ofDecimal log2eDecimal = (ScalarField.log2e : α)) :
    ∀ (r : Rule) (t t' : Term), r.apply t = some t' → ∀ i, Term.eval ctx t' i = Term.eval ctx t i
  | .softmaxMaxShift fn a, t, t', h => applySoftmaxMaxShift_sound ctx fn a t t' h
  | .matmulDivLeft l, t, t', h => applyMatmulDivLeft_sound ctx l t t' h
  | .matmulDivRight l, t, t', h => applyMatmulDivRight_sound ctx l t t' h
  | .rowScaleXS s first, t, t', h => applyRowScaleXS_sound ctx s first t t' h
  | .rowScaleSX s first, t, t', h => applyRowScaleSX_sound ctx s first t t' h
  | .rowScaleWXS s first, t, t', h => applyRowScaleWXS_sound ctx s first t t' h
  | .rowScaleWSX s first, t, t', h => applyRowScaleWSX_sound ctx s first t t' h
  | .expToExp2, t, t', h => applyExpToExp2_sound ctx hlog t t' h
  | .meanToSumDiv a, t, t', h => applyMeanToSumDiv_sound ctx a t t' h
  | .matmulAsSum a swap, t, t', h => applyMatmulAsSum_sound ctx a swap t t' h
  | .expShiftToMax a c, t, t', h => applyExpShiftToMax_sound ctx a c t t' h
  | .sumScaleRight a s first, t, t', h => applySumScaleRight_sound ctx a s first t t' h
  | .sumScaleLeft a s first, t, t', h => applySumScaleLeft_sound ctx a s first t t' h
  | .sumScaleDiv a s, t, t', h => applySumScaleDiv_sound ctx a s t t' h

end Sound

/-! ## Positions, rewriting every occurrence, replay -/

/-- The sub-term reached by taking operand `k` of each node along the path (Python's `args[k]`). -/
def Term.at? : Term → List Nat → Option Term
  | t, [] => some t
  | .unary _ x, 0 :: p => Term.at? x p
  | .binary _ a _, 0 :: p => Term.at? a p
  | .binary _ _ b, 1 :: p => Term.at? b p
  | .ternary _ c _ _, 0 :: p => Term.at? c p
  | .ternary _ _ a _, 1 :: p => Term.at? a p
  | .ternary _ _ _ b, 2 :: p => Term.at? b p
  | .reduce _ x _, 0 :: p => Term.at? x p
  | .matmul a _ _, 0 :: p => Term.at? a p
  | .matmul _ b _, 1 :: p => Term.at? b p
  | _, _ => none

/-- `t` with every occurrence of `old` replaced by `new` (outermost first, as Python's
`substitution_map`: a replaced term is not searched). One equation per constructor, so each
unfolds without side conditions. -/
def Term.replace (old new : Term) : Term → Term
  | .input n axes => if Term.input n axes = old then new else .input n axes
  | .const d => if Term.const d = old then new else .const d
  | .negInf => if Term.negInf = old then new else .negInf
  | .axisSize a => if Term.axisSize a = old then new else .axisSize a
  | .iota a => if Term.iota a = old then new else .iota a
  | .unary f x => if Term.unary f x = old then new else .unary f (Term.replace old new x)
  | .binary f a b =>
    if Term.binary f a b = old then new else .binary f (Term.replace old new a) (Term.replace old new b)
  | .ternary f c a b =>
    if Term.ternary f c a b = old then new
    else .ternary f (Term.replace old new c) (Term.replace old new a) (Term.replace old new b)
  | .reduce f x ax => if Term.reduce f x ax = old then new else .reduce f (Term.replace old new x) ax
  | .matmul a b ax =>
    if Term.matmul a b ax = old then new else .matmul (Term.replace old new a) (Term.replace old new b) ax

/-- One step of a derivation: the rule and where it applies. -/
structure Step where
  rule : Rule
  output : Nat
  path : List Nat

/-- The sub-term at the step's position and its rewrite, or `none` where the rule does not apply. -/
def Step.run (outs : List Term) (s : Step) : Option (Term × Term) :=
  match outs[s.output]? with
  | none => none
  | some root =>
    match Term.at? root s.path with
    | none => none
    | some sub =>
      match s.rule.apply sub with
      | none => none
      | some new => some (sub, new)

/-- The outputs after the steps, each rewriting every occurrence of its sub-term in every output. -/
def replay (outs : List Term) : List Step → Option (List Term)
  | [] => some outs
  | s :: rest =>
    match s.run outs with
    | some (sub, new) => replay (outs.map (Term.replace sub new)) rest
    | none => none

section ReplaySound

variable {α : Type} [ScalarField α] [ScalarOps α]

/-- Two lists of terms, element by element equal in value at every index. -/
def Pointwise (ctx : Ctx α) : List Term → List Term → Prop
  | [], [] => True
  | a :: as, b :: bs => (∀ i, Term.eval ctx a i = Term.eval ctx b i) ∧ Pointwise ctx as bs
  | _, _ => False

theorem Pointwise.refl (ctx : Ctx α) : ∀ l : List Term, Pointwise ctx l l
  | [] => trivial
  | _ :: l => And.intro (fun _ => rfl) (Pointwise.refl ctx l)

theorem Pointwise.trans (ctx : Ctx α) :
    ∀ (a b c : List Term), Pointwise ctx a b → Pointwise ctx b c → Pointwise ctx a c
  | [], [], [], _, _ => trivial
  | _ :: a, _ :: b, _ :: c, h1, h2 =>
    And.intro (fun i => ((And.left h1) i).trans ((And.left h2) i))
      (Pointwise.trans ctx a b c (And.right h1) (And.right h2))
  | [], _ :: _, _, h1, _ => False.elim h1
  | _ :: _, [], _, h1, _ => False.elim h1
  | [], [], _ :: _, _, h2 => False.elim h2
  | _ :: _, _ :: _, [], _, h2 => False.elim h2

theorem Pointwise.map (ctx : Ctx α) (f : Term → Term)
    (hf : ∀ t i, Term.eval ctx (f t) i = Term.eval ctx t i) : ∀ l : List Term, Pointwise ctx (l.map f) l
  | [] => trivial
  | t :: l => And.intro (hf t) (Pointwise.map ctx f hf l)

/-- Replacing a sub-term by one of the same value keeps every term's value. -/
theorem Term.replace_sound (ctx : Ctx α) (old new : Term)
    (h : ∀ i, Term.eval ctx new i = Term.eval ctx old i) :
    ∀ (t : Term) (i : Index), Term.eval ctx (Term.replace old new t) i = Term.eval ctx t i := by
  intro t
  induction t <;> intro i <;> simp only [Term.replace] <;> split
  all_goals first
    | (rename_i heq; rw [h i, heq])
    | simp only [Term.eval, *]

theorem Step.run_sound (ctx : Ctx α) (hlog : ScalarOps.ofDecimal log2eDecimal = (ScalarField.log2e : α))
    (s : Step) (outs : List Term) (sub new : Term) (h : s.run outs = some (sub, new)) :
    ∀ i, Term.eval ctx new i = Term.eval ctx sub i := by
  unfold Step.run at h
  split at h
  · cases h
  · split at h
    · cases h
    · split at h
      · cases h
      · rename_i new' hnew
        cases h
        exact Rule.apply_sound ctx hlog s.rule _ _ hnew

/-- The replayed outputs have the graph's values at every index (`exp_to_exp2` over an exact
log2 e, `hlog`). -/
theorem replay_sound (ctx : Ctx α) (hlog : ScalarOps.ofDecimal log2eDecimal = (ScalarField.log2e : α)) :
    ∀ (steps : List Step) (outs outs' : List Term), replay outs steps = some outs' → Pointwise ctx outs' outs
  | [], outs, outs', h => by
    have h' : some outs = some outs' := h
    cases h'
    exact Pointwise.refl ctx _
  | s :: rest, outs, outs', h => by
    simp only [replay] at h
    split at h
    · rename_i sub new hrun
      have hnew := Step.run_sound ctx hlog s outs sub new hrun
      exact Pointwise.trans ctx _ _ _ (replay_sound ctx hlog rest _ _ h)
        (Pointwise.map ctx _ (Term.replace_sound ctx sub new hnew) outs)
    · cases h

end ReplaySound

end Superopt

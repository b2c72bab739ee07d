import Superopt.Graph
import Superopt.Rules

/-!
# Term-level semantics

`Term.eval` gives every graph term its tensor over an abstract scalar type: a tensor is a
function of an `Index` (a position along every named axis), so operands of a binary op are
aligned by axis name for free; a reduction or contraction along an axis is a finite sum (or
maximum, or mean) over the positions `0, ..., n-1` of that axis, by the recursion of
`Superopt/Semantics.lean`.

The algebraic rewrite rules are restated here on terms, with the side conditions Python checks
(`pyrunner/rules/registry.py`): for the matmul rules, the contracted axis is not among the scale's
or divisor's axes (`a ∉ s.resultAxes`). Each is proved from its scalar theorem in
`Superopt/Rules.lean` plus `Term.eval_set`: a term's value does not move along an axis it does not
have.

The elementwise functions Python has beyond the scalar laws (`log`, `silu`, ...) come from
`ScalarOps`; no rule needs a law about them.
-/

namespace Superopt

/-- A position along every named axis. -/
abbrev Index := Axis → Nat

/-- The index `i` moved to position `k` along the axis `a`. -/
def Index.set (i : Index) (a : Axis) (k : Nat) : Index := fun y => if y = a then k else i y

theorem Index.set_set (i : Index) (a : Axis) (k j : Nat) :
    Index.set (Index.set i a k) a j = Index.set i a j := by
  funext y
  simp only [Index.set]
  by_cases h : y = a
  · simp only [if_pos h]
  · simp only [if_neg h]

theorem Index.set_comm {a b : Axis} (h : a ≠ b) (i : Index) (k j : Nat) :
    Index.set (Index.set i a k) b j = Index.set (Index.set i b j) a k := by
  funext y
  simp only [Index.set]
  by_cases ha : y = a
  · have hb : ¬ y = b := fun hb => h (ha.symm.trans hb)
    simp only [if_pos ha, if_neg hb]
  · simp only [if_neg ha]

/--
The constants and elementwise functions beyond the scalar laws of `ScalarField`: `log`, `sqrt`,
`rsqrt`, `silu`, `sigmoid`, `tanh`, `gelu`, `relu`, `abs`, `softplus`, `min`, the mask comparisons
`lt`, `le` (and any op added later) have no law a rule needs, so each is just some function.
-/
class ScalarOps (α : Type) where
  /-- The scalar a decimal constant denotes. -/
  ofDecimal : Decimal → α
  /-- The unary functions without laws. -/
  unary : UnaryOp → α → α
  /-- The binary functions without laws. -/
  binary : BinaryOp → α → α → α
  /-- `-∞`, what a mask gives hidden scores (Python's constant `-inf`). -/
  negInf : α
  /-- `select c x y`: `x` where `c ≠ 0`, else `y` (Python `where`). -/
  select : α → α → α → α

/-- Where a graph's values come from: the axis extents and a value for every input element. -/
structure Ctx (α : Type) where
  size : Axis → Nat
  /-- The element of input `name` at the given positions (one per input axis, in order). -/
  input : String → List Nat → α

section Eval

variable {α : Type} [ScalarField α] [ScalarOps α]

/-- The scalar function of a unary op. -/
def UnaryOp.eval : UnaryOp → α → α
  | .exp => ScalarField.exp
  | .exp2 => ScalarField.exp2
  | .neg => fun a => -a
  | .recip => ScalarField.inv
  | .square => fun a => a * a
  | f => ScalarOps.unary f

/-- The scalar function of a binary op. -/
def BinaryOp.eval : BinaryOp → α → α → α
  | .add => fun a b => a + b
  | .sub => fun a b => a - b
  | .mul => fun a b => a * b
  | .div => fun a b => a / b
  | .max => ScalarField.fmax
  | f => ScalarOps.binary f

/-- The scalar function of a ternary op. -/
def TernaryOp.eval : TernaryOp → α → α → α → α
  | .select => ScalarOps.select

/-- A reduction of the values along one axis (`max` of no values is `zero`; axes are non-empty). -/
def ReduceOp.eval : ReduceOp → List α → α
  | .sum => listSum
  | .mean => listMean
  | .max => fun l =>
    match l with
    | [] => ScalarField.zero
    | b :: rest => listMax b rest

theorem ReduceOp.eval_sum (l : List α) : ReduceOp.eval .sum l = listSum l := rfl

/-- The value of a term at an index. -/
def Term.eval (ctx : Ctx α) : Term → Index → α
  | .input n axes, i => ctx.input n (axes.map i)
  | .const d, _ => ScalarOps.ofDecimal d
  | .negInf, _ => ScalarOps.negInf
  | .axisSize a, _ => natToScalar (ctx.size a)
  | .iota a, i => natToScalar (i a)
  | .unary f x, i => UnaryOp.eval f (Term.eval ctx x i)
  | .binary f a b, i => BinaryOp.eval f (Term.eval ctx a i) (Term.eval ctx b i)
  | .ternary f c a b, i =>
    TernaryOp.eval f (Term.eval ctx c i) (Term.eval ctx a i) (Term.eval ctx b i)
  | .reduce f x ax, i =>
    ReduceOp.eval f ((List.range (ctx.size ax)).map fun k => Term.eval ctx x (Index.set i ax k))
  | .matmul a b ax, i =>
    listSum ((List.range (ctx.size ax)).map fun k =>
      Term.eval ctx a (Index.set i ax k) * Term.eval ctx b (Index.set i ax k))

theorem map_set_of_not_mem (i : Index) (a : Axis) (k : Nat) :
    ∀ axes : List Axis, a ∉ axes → axes.map (Index.set i a k) = axes.map i := by
  intro axes
  induction axes with
  | nil => intro _; rfl
  | cons y ys ih =>
    intro h
    have hy : ¬ y = a := fun hy => h (List.mem_cons.2 (Or.inl hy.symm))
    have hys : a ∉ ys := fun hm => h (List.mem_cons.2 (Or.inr hm))
    rw [List.map_cons, List.map_cons, ih hys]
    simp only [Index.set, if_neg hy]

/-- A term's value does not change along an axis it does not have. -/
theorem Term.eval_set (ctx : Ctx α) (a : Axis) (k : Nat) (t : Term) :
    ∀ i : Index, a ∉ t.resultAxes → Term.eval ctx t (Index.set i a k) = Term.eval ctx t i := by
  induction t with
  | input n axes =>
    intro i h
    simp only [Term.resultAxes] at h
    simp only [Term.eval, map_set_of_not_mem i a k axes h]
  | const d => intro i _; simp only [Term.eval]
  | negInf => intro i _; simp only [Term.eval]
  | axisSize ax => intro i _; simp only [Term.eval]
  | iota ax =>
    intro i h
    simp only [Term.resultAxes] at h
    have hne : ¬ ax = a := fun he => h (List.mem_singleton.2 he.symm)
    simp only [Term.eval, Index.set, if_neg hne]
  | unary f x ih =>
    intro i h
    simp only [Term.resultAxes] at h
    simp only [Term.eval, ih i h]
  | binary f p q ihp ihq =>
    intro i h
    simp only [Term.resultAxes] at h
    have hp : a ∉ p.resultAxes := fun hm => h (List.mem_append.2 (Or.inl hm))
    have hq : a ∉ q.resultAxes := by
      intro hm
      by_cases hpm : a ∈ p.resultAxes
      · exact hp hpm
      · exact h (List.mem_append.2 (Or.inr (List.mem_filter.2 ⟨hm, decide_eq_true hpm⟩)))
    simp only [Term.eval, ihp i hp, ihq i hq]
  | ternary f c p q ihc ihp ihq =>
    intro i h
    simp only [Term.resultAxes] at h
    have hp : a ∉ p.resultAxes := fun hm =>
      h (List.mem_append.2 (Or.inl (List.mem_append.2 (Or.inl hm))))
    have hq : a ∉ q.resultAxes := by
      intro hm
      by_cases hpm : a ∈ p.resultAxes
      · exact hp hpm
      · exact h (List.mem_append.2 (Or.inl (List.mem_append.2
          (Or.inr (List.mem_filter.2 ⟨hm, decide_eq_true hpm⟩)))))
    have hc : a ∉ c.resultAxes := by
      intro hm
      by_cases hmid : a ∈ p.resultAxes ++ q.resultAxes.filter (fun y => decide (y ∉ p.resultAxes))
      · exact h (List.mem_append.2 (Or.inl hmid))
      · exact h (List.mem_append.2 (Or.inr (List.mem_filter.2 ⟨hm, decide_eq_true hmid⟩)))
    simp only [Term.eval, ihc i hc, ihp i hp, ihq i hq]
  | reduce f x ax ih =>
    intro i h
    simp only [Term.resultAxes] at h
    by_cases hax : a = ax
    · subst hax
      simp only [Term.eval, Index.set_set]
    · have hx : a ∉ x.resultAxes := fun hm => h (List.mem_filter.2 ⟨hm, decide_eq_true hax⟩)
      have ih' : ∀ j : Index, Term.eval ctx x (Index.set j a k) = Term.eval ctx x j :=
        fun j => ih j hx
      simp only [Term.eval, Index.set_comm hax, ih']
  | matmul p q ax ihp ihq =>
    intro i h
    simp only [Term.resultAxes] at h
    by_cases hax : a = ax
    · subst hax
      simp only [Term.eval, Index.set_set]
    · have hp : a ∉ p.resultAxes := fun hm =>
        h (List.mem_append.2 (Or.inl (List.mem_filter.2 ⟨hm, decide_eq_true hax⟩)))
      have hq : a ∉ q.resultAxes := by
        intro hm
        by_cases hl : a ∈ (p.resultAxes).filter (fun y => decide (y ≠ ax))
        · exact h (List.mem_append.2 (Or.inl hl))
        · exact h (List.mem_append.2 (Or.inr (List.mem_filter.2 ⟨hm, decide_eq_true ⟨hax, hl⟩⟩)))
      have ihp' : ∀ j : Index, Term.eval ctx p (Index.set j a k) = Term.eval ctx p j :=
        fun j => ihp j hp
      have ihq' : ∀ j : Index, Term.eval ctx q (Index.set j a k) = Term.eval ctx q j :=
        fun j => ihq j hq
      simp only [Term.eval, Index.set_comm hax, ihp', ihq']

/-! ## The algebraic rules on terms (same side conditions as Python) -/

/--
`softmax_max_shift` on terms: `exp (x - max_a x) / sum_a exp (x - max_a x)` equals
`exp x / sum_a exp x` at every index.
-/
theorem term_softmax_max_shift (ctx : Ctx α) (x : Term) (a : Axis) (i : Index) :
    Term.eval ctx (.binary .div (.unary .exp (.binary .sub x (.reduce .max x a)))
        (.reduce .sum (.unary .exp (.binary .sub x (.reduce .max x a))) a)) i =
      Term.eval ctx (.binary .div (.unary .exp x) (.reduce .sum (.unary .exp x) a)) i := by
  simp only [Term.eval, UnaryOp.eval, BinaryOp.eval, ReduceOp.eval_sum, Index.set_set]
  rw [listSum_exp_sub, exp_sub]
  exact mul_div_mul_right _ _ _ (ScalarField.exp_ne_zero _)

/-- `softmax_max_shift` on terms with `E = exp2`, as Python also applies it. -/
theorem term_softmax_max_shift_exp2 (ctx : Ctx α) (x : Term) (a : Axis) (i : Index) :
    Term.eval ctx (.binary .div (.unary .exp2 (.binary .sub x (.reduce .max x a)))
        (.reduce .sum (.unary .exp2 (.binary .sub x (.reduce .max x a))) a)) i =
      Term.eval ctx (.binary .div (.unary .exp2 x) (.reduce .sum (.unary .exp2 x) a)) i := by
  simp only [Term.eval, UnaryOp.eval, BinaryOp.eval, ReduceOp.eval_sum, Index.set_set]
  exact softmax_shift_exp2 _ _ _ _

/-- `matmul_div_commute` on terms: `(P / l) @_a V = (P @_a V) / l` when `a` is not an axis of `l`. -/
theorem term_matmul_div_commute (ctx : Ctx α) (p l v : Term) (a : Axis)
    (h : a ∉ l.resultAxes) (i : Index) :
    Term.eval ctx (.matmul (.binary .div p l) v a) i =
      Term.eval ctx (.binary .div (.matmul p v a) l) i := by
  have hl : ∀ k, Term.eval ctx l (Index.set i a k) = Term.eval ctx l i :=
    fun k => Term.eval_set ctx a k l i h
  simp only [Term.eval, BinaryOp.eval, hl]
  exact matmul_div_commute _ _ _ _

/-- The operand-swapped form Python also applies: `V @_a (P / l) = (V @_a P) / l`. -/
theorem term_matmul_div_commute_right (ctx : Ctx α) (v p l : Term) (a : Axis)
    (h : a ∉ l.resultAxes) (i : Index) :
    Term.eval ctx (.matmul v (.binary .div p l) a) i =
      Term.eval ctx (.binary .div (.matmul v p a) l) i := by
  have hl : ∀ k, Term.eval ctx l (Index.set i a k) = Term.eval ctx l i :=
    fun k => Term.eval_set ctx a k l i h
  simp only [Term.eval, BinaryOp.eval, hl]
  exact matmul_div_commute_right _ _ _ _

/-- `matmul_row_scale_commute` on terms: `(X * s) @_a W = (X @_a W) * s`, `a` not an axis of `s`. -/
theorem term_matmul_row_scale_commute (ctx : Ctx α) (x s w : Term) (a : Axis)
    (h : a ∉ s.resultAxes) (i : Index) :
    Term.eval ctx (.matmul (.binary .mul x s) w a) i =
      Term.eval ctx (.binary .mul (.matmul x w a) s) i := by
  have hs : ∀ k, Term.eval ctx s (Index.set i a k) = Term.eval ctx s i :=
    fun k => Term.eval_set ctx a k s i h
  simp only [Term.eval, BinaryOp.eval, hs]
  exact matmul_row_scale_commute _ _ _ _

/-- Scale on the left of the product: `(s * X) @_a W = (X @_a W) * s`. -/
theorem term_matmul_row_scale_commute_scale_left (ctx : Ctx α) (s x w : Term) (a : Axis)
    (h : a ∉ s.resultAxes) (i : Index) :
    Term.eval ctx (.matmul (.binary .mul s x) w a) i =
      Term.eval ctx (.binary .mul (.matmul x w a) s) i := by
  have hs : ∀ k, Term.eval ctx s (Index.set i a k) = Term.eval ctx s i :=
    fun k => Term.eval_set ctx a k s i h
  simp only [Term.eval, BinaryOp.eval, hs]
  exact matmul_row_scale_commute_scale_left _ _ _ _

/-- Scaled operand on the right of the matmul: `W @_a (X * s) = (W @_a X) * s`. -/
theorem term_matmul_row_scale_commute_right (ctx : Ctx α) (w x s : Term) (a : Axis)
    (h : a ∉ s.resultAxes) (i : Index) :
    Term.eval ctx (.matmul w (.binary .mul x s) a) i =
      Term.eval ctx (.binary .mul (.matmul w x a) s) i := by
  have hs : ∀ k, Term.eval ctx s (Index.set i a k) = Term.eval ctx s i :=
    fun k => Term.eval_set ctx a k s i h
  simp only [Term.eval, BinaryOp.eval, hs]
  exact matmul_row_scale_commute_right _ _ _ _

/-- Scaled operand on the right, scale on the left: `W @_a (s * X) = (W @_a X) * s`. -/
theorem term_matmul_row_scale_commute_right_scale_left (ctx : Ctx α) (w s x : Term) (a : Axis)
    (h : a ∉ s.resultAxes) (i : Index) :
    Term.eval ctx (.matmul w (.binary .mul s x) a) i =
      Term.eval ctx (.binary .mul (.matmul w x a) s) i := by
  have hs : ∀ k, Term.eval ctx s (Index.set i a k) = Term.eval ctx s i :=
    fun k => Term.eval_set ctx a k s i h
  simp only [Term.eval, BinaryOp.eval, hs]
  exact matmul_row_scale_commute_right_scale_left _ _ _ _

/--
`exp_to_exp2` on terms: `exp x = exp2 (x * c)` where the constant `c` denotes `log2 e` (Python's
`LOG2E` is log2 e rounded to float64; over exact scalars the hypothesis says `c` is log2 e).
-/
theorem term_exp_to_exp2 (ctx : Ctx α) (x : Term) (c : Decimal)
    (hc : ScalarOps.ofDecimal c = (ScalarField.log2e : α)) (i : Index) :
    Term.eval ctx (.unary .exp x) i = Term.eval ctx (.unary .exp2 (.binary .mul x (.const c))) i := by
  simp only [Term.eval, UnaryOp.eval, BinaryOp.eval, hc]
  exact exp_to_exp2 _

/-- `mean_to_sum_div` on terms: `mean_a x = sum_a x / |a|`. -/
theorem term_mean_to_sum_div (ctx : Ctx α) (x : Term) (a : Axis) (i : Index) :
    Term.eval ctx (.reduce .mean x a) i =
      Term.eval ctx (.binary .div (.reduce .sum x a) (.axisSize a)) i := by
  simp only [Term.eval, ReduceOp.eval, BinaryOp.eval, listMean, List.length_map, List.length_range]

/-- `elementwise_mul_comm` on terms: `a * b = b * a`, operands aligned by axis name. -/
theorem term_elementwise_mul_comm (ctx : Ctx α) (p q : Term) (i : Index) :
    Term.eval ctx (.binary .mul p q) i = Term.eval ctx (.binary .mul q p) i := by
  simp only [Term.eval, BinaryOp.eval]
  exact elementwise_mul_comm _ _

/-- `elementwise_mul_assoc` on terms: `(a * b) * c = a * (b * c)`. -/
theorem term_elementwise_mul_assoc (ctx : Ctx α) (p q r : Term) (i : Index) :
    Term.eval ctx (.binary .mul (.binary .mul p q) r) i =
      Term.eval ctx (.binary .mul p (.binary .mul q r)) i := by
  simp only [Term.eval, BinaryOp.eval]
  exact elementwise_mul_assoc _ _ _

/-- `matmul_as_sum` on terms: `x @_a w = sum_a (x * w)`, operands aligned by axis name. -/
theorem term_matmul_as_sum (ctx : Ctx α) (x w : Term) (a : Axis) (i : Index) :
    Term.eval ctx (.matmul x w a) i = Term.eval ctx (.reduce .sum (.binary .mul x w) a) i := by
  simp only [Term.eval, BinaryOp.eval, ReduceOp.eval_sum]

/--
`exp_shift_to_max` on terms: `exp ((x - n) * c) = exp ((x - m) * c) * exp ((m - n) * c)` for any term
`m`; Python takes `m = max_a x` where `n` is built from it and `a` is not an axis of `n`.
-/
theorem term_exp_shift_to_max (ctx : Ctx α) (x n m c : Term) (i : Index) :
    Term.eval ctx (.unary .exp (.binary .mul (.binary .sub x n) c)) i =
      Term.eval ctx (.binary .mul (.unary .exp (.binary .mul (.binary .sub x m) c))
        (.unary .exp (.binary .mul (.binary .sub m n) c))) i := by
  simp only [Term.eval, UnaryOp.eval, BinaryOp.eval]
  exact exp_shift_to_max _ _ _ _

/-- `sum_scale_commute` on terms: `sum_a (x * s) = sum_a x * s` when `a` is not an axis of `s`. -/
theorem term_sum_scale_commute (ctx : Ctx α) (x s : Term) (a : Axis)
    (h : a ∉ s.resultAxes) (i : Index) :
    Term.eval ctx (.reduce .sum (.binary .mul x s) a) i =
      Term.eval ctx (.binary .mul (.reduce .sum x a) s) i := by
  have hs : ∀ k, Term.eval ctx s (Index.set i a k) = Term.eval ctx s i :=
    fun k => Term.eval_set ctx a k s i h
  simp only [Term.eval, BinaryOp.eval, ReduceOp.eval_sum, hs]
  exact sum_scale_commute _ _ _

/-- The divisor form: `sum_a (x / s) = sum_a x / s` when `a` is not an axis of `s`. -/
theorem term_sum_scale_commute_div (ctx : Ctx α) (x s : Term) (a : Axis)
    (h : a ∉ s.resultAxes) (i : Index) :
    Term.eval ctx (.reduce .sum (.binary .div x s) a) i =
      Term.eval ctx (.binary .div (.reduce .sum x a) s) i := by
  have hs : ∀ k, Term.eval ctx s (Index.set i a k) = Term.eval ctx s i :=
    fun k => Term.eval_set ctx a k s i h
  simp only [Term.eval, BinaryOp.eval, ReduceOp.eval_sum, hs]
  exact sum_scale_commute_div _ _ _

/-! ## The three rules restated on terms last: scaled shift, variance, matmul association -/

/-- The scaled shift as scalars over any list of keys: `softmax_scaled_max_shift` with the numerator's
value given separately (the row element `i` of a term is not one of the reduced keys' values). -/
theorem scaled_shift_scalar (l : List Nat) (f : Nat → α) (yi m cc : α) :
    ScalarField.exp ((yi - m) * cc) / listSum (l.map fun k => ScalarField.exp ((f k - m) * cc)) =
      ScalarField.exp (yi * cc) / listSum (l.map fun k => ScalarField.exp (f k * cc)) := by
  have h1 : listSum (l.map fun k => ScalarField.exp ((f k - m) * cc)) =
      listSum (l.map fun k => ScalarField.exp (f k * cc)) * ScalarField.exp (-(m * cc)) := by
    rw [listSum_map_ext l (fun k => ScalarField.exp ((f k - m) * cc))
      (fun k => ScalarField.exp (f k * cc - m * cc)) (fun k => congrArg ScalarField.exp (sub_mul_distrib (f k) m cc))]
    exact listSum_exp_sub l (fun k => f k * cc) (m * cc)
  rw [h1, sub_mul_distrib yi m cc, exp_sub (yi * cc) (m * cc)]
  exact mul_div_mul_right _ _ _ (ScalarField.exp_ne_zero _)

/--
`softmax_scaled_max_shift` on terms: `exp ((y - max_a y) * c) / sum_a exp ((y - max_a y) * c)` equals
`exp (y * c) / sum_a exp (y * c)` when `a` is not an axis of `c` (Python also requires `c` positive,
which keeps every shifted exponent at most 0; the equality does not need it).
-/
theorem term_softmax_scaled_max_shift (ctx : Ctx α) (y c : Term) (a : Axis) (h : a ∉ c.resultAxes)
    (i : Index) :
    Term.eval ctx (.binary .div (.unary .exp (.binary .mul (.binary .sub y (.reduce .max y a)) c))
        (.reduce .sum (.unary .exp (.binary .mul (.binary .sub y (.reduce .max y a)) c)) a)) i =
      Term.eval ctx (.binary .div (.unary .exp (.binary .mul y c))
        (.reduce .sum (.unary .exp (.binary .mul y c)) a)) i := by
  have hc : ∀ k, Term.eval ctx c (Index.set i a k) = Term.eval ctx c i :=
    fun k => Term.eval_set ctx a k c i h
  simp only [Term.eval, UnaryOp.eval, BinaryOp.eval, ReduceOp.eval_sum, Index.set_set, hc]
  exact scaled_shift_scalar _ _ _ _ _

/--
`variance_sum_of_squares` on terms: `mean_a ((x - mean_a x)²) = mean_a (x²) - (mean_a x)²`, where the
extent of `a` is not zero as a scalar (`hn`; in the reals, any axis of at least one element).
-/
theorem term_variance_sum_of_squares (ctx : Ctx α) (x : Term) (a : Axis)
    (hn : (natToScalar (ctx.size a) : α) ≠ ScalarField.zero) (i : Index) :
    Term.eval ctx (.reduce .mean (.unary .square (.binary .sub x (.reduce .mean x a))) a) i =
      Term.eval ctx (.binary .sub (.reduce .mean (.unary .square x) a)
        (.unary .square (.reduce .mean x a))) i := by
  have hn' : (natToScalar (List.range (ctx.size a)).length : α) ≠ ScalarField.zero := by
    rw [List.length_range]
    exact hn
  simp only [Term.eval, ReduceOp.eval, UnaryOp.eval, BinaryOp.eval, listMean, List.length_map,
    Index.set_set]
  exact variance_sum_of_squares (List.range (ctx.size a)) (fun k => Term.eval ctx x (Index.set i a k)) hn'

/-- The order of two finite sums does not matter. -/
theorem listSum_comm (l₁ l₂ : List Nat) (F : Nat → Nat → α) :
    listSum (l₁.map fun x => listSum (l₂.map fun y => F x y)) =
      listSum (l₂.map fun y => listSum (l₁.map fun x => F x y)) := by
  induction l₁ with
  | nil =>
    simp only [List.map_nil, listSum]
    exact (listSum_map_zero l₂).symm
  | cons x₀ l ih =>
    simp only [List.map_cons, listSum, ih]
    exact (listSum_map_add l₂ (fun y => F x₀ y) (fun y => listSum (l.map fun x => F x y))).symm

/-- `Σ_k (Σ_j a_j b_kj) c_k = Σ_j a_j (Σ_k b_kj c_k)`: matrix products associate. -/
theorem double_sum_assoc (lk lj : List Nat) (a : Nat → α) (b : Nat → Nat → α) (c : Nat → α) :
    listSum (lk.map fun k => listSum (lj.map fun j => a j * b k j) * c k) =
      listSum (lj.map fun j => a j * listSum (lk.map fun k => b k j * c k)) := by
  have hl : ∀ k, listSum (lj.map fun j => a j * b k j) * c k = listSum (lj.map fun j => a j * b k j * c k) :=
    fun k => (listSum_map_mul_right lj (fun j => a j * b k j) (c k)).symm
  have hr : ∀ j, a j * listSum (lk.map fun k => b k j * c k) = listSum (lk.map fun k => a j * b k j * c k) := by
    intro j
    rw [← listSum_map_mul_left lk (fun k => b k j * c k) (a j)]
    exact listSum_map_ext lk (fun k => a j * (b k j * c k)) (fun k => a j * b k j * c k)
      (fun k => (ScalarField.mul_assoc (a j) (b k j) (c k)).symm)
  rw [listSum_map_ext lk (fun k => listSum (lj.map fun j => a j * b k j) * c k)
      (fun k => listSum (lj.map fun j => a j * b k j * c k)) hl,
    listSum_map_ext lj (fun j => a j * listSum (lk.map fun k => b k j * c k))
      (fun j => listSum (lk.map fun k => a j * b k j * c k)) hr]
  exact listSum_comm lk lj (fun k j => a j * b k j * c k)

/--
`matmul_assoc` on terms: `(A @_j B) @_k C = A @_j (B @_k C)` when the two contracted axes differ,
`k` is not an axis of `A` and `j` is not an axis of `C` (Python's side conditions).
-/
theorem term_matmul_assoc (ctx : Ctx α) (A B C : Term) (j k : Axis) (hjk : j ≠ k)
    (hA : k ∉ A.resultAxes) (hC : j ∉ C.resultAxes) (i : Index) :
    Term.eval ctx (.matmul (.matmul A B j) C k) i = Term.eval ctx (.matmul A (.matmul B C k) j) i := by
  have hkj : k ≠ j := fun h => hjk h.symm
  have hA' : ∀ k' j', Term.eval ctx A (Index.set (Index.set i k k') j j') =
      Term.eval ctx A (Index.set i j j') := by
    intro k' j'
    rw [Index.set_comm hkj i k' j']
    exact Term.eval_set ctx k k' A (Index.set i j j') hA
  have hB' : ∀ k' j', Term.eval ctx B (Index.set (Index.set i k k') j j') =
      Term.eval ctx B (Index.set (Index.set i j j') k k') := by
    intro k' j'
    rw [Index.set_comm hkj i k' j']
  have hC' : ∀ j' k', Term.eval ctx C (Index.set (Index.set i j j') k k') =
      Term.eval ctx C (Index.set i k k') := by
    intro j' k'
    rw [← Index.set_comm hkj i k' j']
    exact Term.eval_set ctx j j' C (Index.set i k k') hC
  simp only [Term.eval, hA', hB', hC']
  exact double_sum_assoc (List.range (ctx.size k)) (List.range (ctx.size j))
    (fun j' => Term.eval ctx A (Index.set i j j'))
    (fun k' j' => Term.eval ctx B (Index.set (Index.set i j j') k k'))
    (fun k' => Term.eval ctx C (Index.set i k k'))

end Eval

end Superopt

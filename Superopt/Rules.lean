import Superopt.Semantics

/-!
# Rewrite rules and their proofs

One theorem per rewrite rule the planners apply. Each theorem's name is the rule's name in the
kernel plans (`derivation[].rule`) and in `pyrunner.rules.RULE_NAMES`; `Superopt/Plan.lean`
refers to them by resolved name, so a renamed theorem breaks the build.

Each theorem is the scalar statement of its rule at one output element: an axis becomes a list
of indices `ks` (or `js`), a reduction along it becomes `listSum`/`listMax` over that list, and a
tensor becomes a function from indices to scalars. Side conditions of a rule appear as the
shape of the statement; for example in `matmul_div_commute` the divisor `d` does not depend on
the contracted index, which is the rule's condition that `l` is constant along that axis.
-/

namespace Superopt

open ScalarField (exp exp2 inv fmax ln2 log2e)

variable {α : Type} [ScalarField α] {ι : Type}

/-- Shifting every exponent by `m` scales a sum of exponentials by `exp (-m)`. -/
theorem listSum_exp_sub (l : List ι) (x : ι → α) (m : α) :
    listSum (l.map fun j => exp (x j - m)) = listSum (l.map fun j => exp (x j)) * exp (-m) := by
  induction l with
  | nil => simp only [List.map_nil, listSum, ScalarField.zero_mul]
  | cons a l ih =>
    simp only [List.map_cons, listSum, ih]
    rw [exp_sub (x a) m, ScalarField.right_distrib]

/--
Max-subtraction in softmax: shifting every score by the same `m` does not change the softmax.
`exp (x i - m) / Σ_j exp (x j - m) = exp (x i) / Σ_j exp (x j)`.
-/
theorem softmax_max_shift (js : List ι) (x : ι → α) (m : α) (i : ι) :
    exp (x i - m) / listSum (js.map fun j => exp (x j - m)) =
      exp (x i) / listSum (js.map fun j => exp (x j)) := by
  rw [listSum_exp_sub js x m, exp_sub (x i) m]
  exact mul_div_mul_right (exp (x i)) (listSum (js.map fun j => exp (x j))) (exp (-m))
    (ScalarField.exp_ne_zero (-m))

/--
Delayed normalisation: `(P / d) @ V = (P @ V) / d` when `d` is constant along the contracted
axis (here: `d` does not depend on the index `k`).
-/
theorem matmul_div_commute (ks : List ι) (p v : ι → α) (d : α) :
    listSum (ks.map fun k => p k / d * v k) = listSum (ks.map fun k => p k * v k) / d := by
  rw [listSum_map_ext ks (fun k => p k / d * v k) (fun k => p k * v k * inv d)
      (fun k => div_mul_swap (p k) (v k) d),
    listSum_map_mul_right ks (fun k => p k * v k) (inv d),
    ScalarField.div_eq_mul_inv]

/-- Row-scale commutation: `(X * s) @ W = (X @ W) * s` for `s` constant along the contraction. -/
theorem matmul_row_scale_commute (ks : List ι) (x w : ι → α) (s : α) :
    listSum (ks.map fun k => x k * s * w k) = listSum (ks.map fun k => x k * w k) * s := by
  rw [listSum_map_ext ks (fun k => x k * s * w k) (fun k => x k * w k * s)
      (fun k => scalar_mul_right_comm (x k) s (w k))]
  exact listSum_map_mul_right ks (fun k => x k * w k) s

/-- `exp x = exp2 (x * log2 e)`, from `exp2 y = exp (y * ln 2)` and `log2 e * ln 2 = 1`. -/
theorem exp_to_exp2 (x : α) : exp x = exp2 (x * log2e) := by
  rw [ScalarField.exp2_eq (x * log2e), ScalarField.mul_assoc x log2e ln2,
    ScalarField.log2e_mul_ln2 (α := α), ScalarField.mul_one x]

/-- `mean = sum / n`, where `n` is the extent of the reduced axis (definitional). -/
theorem mean_to_sum_div (l : List α) : listMean l = listSum l / (natToScalar l.length : α) := rfl

/--
Splitting a reduction into tiles combined by an associative update: a sum over `l₁ ++ l₂` is
the sum of the tiles' sums, and a max over a list split into two non-empty tiles is the max of
the tiles' maxima.
-/
theorem reduction_tiling (l₁ l₂ : List α) (a b : α) :
    listSum (l₁ ++ l₂) = listSum l₁ + listSum l₂ ∧
      listMax a (l₁ ++ b :: l₂) = fmax (listMax a l₁) (listMax b l₂) :=
  ⟨listSum_append l₁ l₂, listMax_append a b l₁ l₂⟩

/-! ## Online softmax -/

/-- `Σ_{j ∈ t} exp (s j - m)`: the softmax denominator of a tile under the shift `m`. -/
def sumExp (s : ι → α) (m : α) (t : List ι) : α := listSum (t.map fun j => exp (s j - m))

/-- `Σ_{j ∈ t} exp (s j - m) * v j`: the unnormalised output of a tile under the shift `m`. -/
def sumExpV (s v : ι → α) (m : α) (t : List ι) : α :=
  listSum (t.map fun j => exp (s j - m) * v j)

/-- The online-softmax state for one output element: running shift `m`, denominator `l`, and
unnormalised output `o`. -/
structure OnlineState (β : Type) where
  m : β
  l : β
  o : β

/-- The state after the keys `t`, all computed under the shift `m`. -/
def OnlineState.ofTile (s v : ι → α) (m : α) (t : List ι) : OnlineState α :=
  ⟨m, sumExp s m t, sumExpV s v m t⟩

/-- One step of the streamed loop: rescale the state to the new shift `m'`, add the tile `t`. -/
def OnlineState.step (st : OnlineState α) (s v : ι → α) (m' : α) (t : List ι) : OnlineState α :=
  ⟨m', st.l * exp (st.m - m') + sumExp s m' t, st.o * exp (st.m - m') + sumExpV s v m' t⟩

theorem sumExp_append (s : ι → α) (m : α) (l₁ l₂ : List ι) :
    sumExp s m (l₁ ++ l₂) = sumExp s m l₁ + sumExp s m l₂ := by
  simp only [sumExp, List.map_append, listSum_append]

theorem sumExpV_append (s v : ι → α) (m : α) (l₁ l₂ : List ι) :
    sumExpV s v m (l₁ ++ l₂) = sumExpV s v m l₁ + sumExpV s v m l₂ := by
  simp only [sumExpV, List.map_append, listSum_append]

theorem sumExp_rescale (s : ι → α) (m m' : α) (l : List ι) :
    sumExp s m l * exp (m - m') = sumExp s m' l := by
  induction l with
  | nil => simp only [sumExp, List.map_nil, listSum, ScalarField.zero_mul]
  | cons a l ih =>
    simp only [sumExp, List.map_cons, listSum] at ih ⊢
    rw [ScalarField.right_distrib, ih, exp_shift (s a) m m']

theorem sumExpV_rescale (s v : ι → α) (m m' : α) (l : List ι) :
    sumExpV s v m l * exp (m - m') = sumExpV s v m' l := by
  induction l with
  | nil => simp only [sumExpV, List.map_nil, listSum, ScalarField.zero_mul]
  | cons a l ih =>
    simp only [sumExpV, List.map_cons, listSum] at ih ⊢
    rw [ScalarField.right_distrib, ih, scalar_mul_right_comm (exp (s a - m)) (v a) (exp (m - m')),
      exp_shift (s a) m m']

/--
The online-softmax rescaling: the state for the keys `prev` under the shift `m`, stepped with
the tile `tile` under any new shift `m'`, is exactly the state computed directly for
`prev ++ tile` under `m'`. With `softmax_max_shift` (the final `o / l` does not depend on the
shift) this makes FlashAttention's streamed loop equal to the plain softmax.
-/
theorem online_softmax_rescale (s v : ι → α) (m m' : α) (prev tile : List ι) :
    (OnlineState.ofTile s v m prev).step s v m' tile = OnlineState.ofTile s v m' (prev ++ tile) := by
  simp only [OnlineState.step, OnlineState.ofTile, sumExp_rescale, sumExpV_rescale, sumExp_append,
    sumExpV_append]

/-! ## Loop fusion -/

/--
Two matmuls sharing the operand `x` computed in one loop over the contracted axis (one
`fold2`, two accumulators) give the two separate contractions.
-/
theorem shared_operand_fusion (ks : List ι) (x a b : ι → α) :
    fold2 (fun k => x k * a k) (fun k => x k * b k) ks =
      (listSum (ks.map fun k => x k * a k), listSum (ks.map fun k => x k * b k)) :=
  fold2_eq (fun k => x k * a k) (fun k => x k * b k) ks

/--
A reduction over the same axis as a contraction, computed inside the contraction's loop: one
`fold2` accumulates `Σ x²` and `Σ x * w` together, and scaling the contraction afterwards by any
function `g` of the reduction equals contracting the row-scaled operand (RMSNorm + matmul in one
kernel).
-/
theorem reduction_in_contraction_loop (ks : List ι) (x w : ι → α) (g : α → α) :
    (fold2 (fun k => x k * x k) (fun k => x k * w k) ks).2 *
        g (fold2 (fun k => x k * x k) (fun k => x k * w k) ks).1 =
      listSum (ks.map fun k => x k * g (listSum (ks.map fun j => x j * x j)) * w k) := by
  rw [fold2_eq (fun k => x k * x k) (fun k => x k * w k) ks]
  exact (matmul_row_scale_commute ks x w (g (listSum (ks.map fun j => x j * x j)))).symm

end Superopt

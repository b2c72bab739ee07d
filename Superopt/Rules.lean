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

/-- `exp2 (y - m) = exp (y * ln 2 - m * ln 2)`. -/
theorem exp2_sub_eq (y m : α) : exp2 (y - m) = exp (y * ln2 - m * ln2) := by
  rw [ScalarField.exp2_eq, sub_mul_distrib]

/--
The shift in exp2 form (Python applies `softmax_max_shift` with `E = exp2` too):
`exp2 (y - m) / Σ_j exp2 (x j - m) = exp2 y / Σ_j exp2 (x j)`, for any numerator `y`.
-/
theorem softmax_shift_exp2 (js : List ι) (x : ι → α) (y m : α) :
    exp2 (y - m) / listSum (js.map fun j => exp2 (x j - m)) =
      exp2 y / listSum (js.map fun j => exp2 (x j)) := by
  rw [exp2_sub_eq y m,
    listSum_map_ext js (fun j => exp2 (x j - m)) (fun j => exp (x j * ln2 - m * ln2))
      (fun j => exp2_sub_eq (x j) m),
    ScalarField.exp2_eq y,
    listSum_map_ext js (fun j => exp2 (x j)) (fun j => exp (x j * ln2))
      (fun j => ScalarField.exp2_eq (x j)),
    listSum_exp_sub, exp_sub]
  exact mul_div_mul_right _ _ _ (ScalarField.exp_ne_zero _)

/-- `softmax_max_shift` with `E = exp2`. -/
theorem softmax_max_shift_exp2 (js : List ι) (x : ι → α) (m : α) (i : ι) :
    exp2 (x i - m) / listSum (js.map fun j => exp2 (x j - m)) =
      exp2 (x i) / listSum (js.map fun j => exp2 (x j)) :=
  softmax_shift_exp2 js x (x i) m

/--
The shift under a scale: `exp ((y i - m) * c) / Σ_j exp ((y j - m) * c) = exp (y i * c) / Σ_j exp (y j * c)`
for any `m` and `c`: `softmax_max_shift` with the shift `m * c`. With `m = max_a y` and `c > 0`
(attention's `1 / sqrt d`) every exponent is still at most 0, and the scale stays on the
exponent's argument, where it folds into `exp2`'s constant, instead of scaling the scores first.
-/
theorem softmax_scaled_max_shift (js : List ι) (y : ι → α) (c m : α) (i : ι) :
    exp ((y i - m) * c) / listSum (js.map fun j => exp ((y j - m) * c)) =
      exp (y i * c) / listSum (js.map fun j => exp (y j * c)) := by
  rw [sub_mul_distrib (y i) m c,
    listSum_map_ext js (fun j => exp ((y j - m) * c)) (fun j => exp (y j * c - m * c))
      (fun j => congrArg exp (sub_mul_distrib (y j) m c))]
  exact softmax_max_shift js (fun j => y j * c) (m * c) i

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

theorem mul_div_eq_mul_inv (v p d : α) : v * (p / d) = v * p * inv d := by
  rw [ScalarField.div_eq_mul_inv, ScalarField.mul_assoc]

theorem mul_swap_left (s x w : α) : s * x * w = x * s * w := by
  rw [ScalarField.mul_comm s x]

theorem mul_swap_right (w s x : α) : w * (s * x) = w * (x * s) := by
  rw [ScalarField.mul_comm s x]

theorem exp_sub_mul (a m b : α) : exp (a - m) * b = exp a * b * exp (-m) := by
  rw [exp_sub a m, scalar_mul_right_comm (exp a) (exp (-m)) b]

/-- Row-scale commutation: `(X * s) @ W = (X @ W) * s` for `s` constant along the contraction. -/
theorem matmul_row_scale_commute (ks : List ι) (x w : ι → α) (s : α) :
    listSum (ks.map fun k => x k * s * w k) = listSum (ks.map fun k => x k * w k) * s := by
  rw [listSum_map_ext ks (fun k => x k * s * w k) (fun k => x k * w k * s)
      (fun k => scalar_mul_right_comm (x k) s (w k))]
  exact listSum_map_mul_right ks (fun k => x k * w k) s

/-- `matmul_div_commute` with the divided operand on the right: `V @ (P / l) = (V @ P) / l`. -/
theorem matmul_div_commute_right (ks : List ι) (v p : ι → α) (d : α) :
    listSum (ks.map fun k => v k * (p k / d)) = listSum (ks.map fun k => v k * p k) / d := by
  rw [listSum_map_ext ks (fun k => v k * (p k / d)) (fun k => v k * p k * inv d)
      (fun k => mul_div_eq_mul_inv (v k) (p k) d),
    listSum_map_mul_right ks (fun k => v k * p k) (inv d),
    ScalarField.div_eq_mul_inv]

/-- Row-scale commutation with the scale on the left of the product: `(s * X) @ W = (X @ W) * s`. -/
theorem matmul_row_scale_commute_scale_left (ks : List ι) (x w : ι → α) (s : α) :
    listSum (ks.map fun k => s * x k * w k) = listSum (ks.map fun k => x k * w k) * s := by
  rw [listSum_map_ext ks (fun k => s * x k * w k) (fun k => x k * s * w k)
      (fun k => mul_swap_left s (x k) (w k))]
  exact matmul_row_scale_commute ks x w s

/-- Row-scale commutation in the right matmul operand: `W @ (X * s) = (W @ X) * s`. -/
theorem matmul_row_scale_commute_right (ks : List ι) (w x : ι → α) (s : α) :
    listSum (ks.map fun k => w k * (x k * s)) = listSum (ks.map fun k => w k * x k) * s := by
  rw [listSum_map_ext ks (fun k => w k * (x k * s)) (fun k => w k * x k * s)
      (fun k => (ScalarField.mul_assoc (w k) (x k) s).symm)]
  exact listSum_map_mul_right ks (fun k => w k * x k) s

/-- Row-scale commutation in the right operand, scale on the left: `W @ (s * X) = (W @ X) * s`. -/
theorem matmul_row_scale_commute_right_scale_left (ks : List ι) (w x : ι → α) (s : α) :
    listSum (ks.map fun k => w k * (s * x k)) = listSum (ks.map fun k => w k * x k) * s := by
  rw [listSum_map_ext ks (fun k => w k * (s * x k)) (fun k => w k * (x k * s))
      (fun k => mul_swap_right (w k) s (x k))]
  exact matmul_row_scale_commute_right ks w x s

/-- `exp x = exp2 (x * log2 e)`, from `exp2 y = exp (y * ln 2)` and `log2 e * ln 2 = 1`. -/
theorem exp_to_exp2 (x : α) : exp x = exp2 (x * log2e) := by
  rw [ScalarField.exp2_eq (x * log2e), ScalarField.mul_assoc x log2e ln2,
    ScalarField.log2e_mul_ln2 (α := α), ScalarField.mul_one x]

/-- `exp (x - m) = exp2 (x * log2 e - m * log2 e)`: `exp_to_exp2` after the max shift. -/
theorem exp_to_exp2_shifted (x m : α) : exp (x - m) = exp2 (x * log2e - m * log2e) := by
  rw [exp_to_exp2 (x - m), sub_mul_distrib]

/--
The exp2 form of the shifted softmax (what `softmax_max_shift` then `exp_to_exp2` produce):
`exp2 (x i * log2 e - m * log2 e) / Σ_j exp2 (x j * log2 e - m * log2 e) = softmax (x) i`, for
any shift `m` (the planner uses `m = max_j x j`, see `exp_to_exp2_max_shift`).
-/
theorem softmax_exp2_shift (js : List ι) (x : ι → α) (m : α) (i : ι) :
    exp2 (x i * log2e - m * log2e) / listSum (js.map fun j => exp2 (x j * log2e - m * log2e)) =
      exp (x i) / listSum (js.map fun j => exp (x j)) := by
  rw [← exp_to_exp2_shifted (x i) m,
    listSum_map_ext js (fun j => exp2 (x j * log2e - m * log2e)) (fun j => exp (x j - m))
      (fun j => (exp_to_exp2_shifted (x j) m).symm)]
  exact softmax_max_shift js x m i

/-- `softmax_exp2_shift` with the shift the planner inserts: the max over the row. -/
theorem exp_to_exp2_max_shift (j₀ : ι) (js : List ι) (x : ι → α) (i : ι) :
    exp2 (x i * log2e - listMax (x j₀) (js.map x) * log2e) /
        listSum ((j₀ :: js).map fun j => exp2 (x j * log2e - listMax (x j₀) (js.map x) * log2e)) =
      exp (x i) / listSum ((j₀ :: js).map fun j => exp (x j)) :=
  softmax_exp2_shift (j₀ :: js) x (listMax (x j₀) (js.map x)) i

/-- `mean = sum / n`, where `n` is the extent of the reduced axis (definitional). -/
theorem mean_to_sum_div (l : List α) : listMean l = listSum l / (natToScalar l.length : α) := rfl

/-! ## The variance from the sum and the sum of squares -/

/-- `a * 0 = 0`. -/
theorem scalar_mul_zero (a : α) : a * ScalarField.zero = ScalarField.zero := by
  rw [ScalarField.mul_comm, ScalarField.zero_mul]

/-- `a * (b + c) = a * b + a * c`. -/
theorem scalar_left_distrib (a b c : α) : a * (b + c) = a * b + a * c := by
  rw [ScalarField.mul_comm a (b + c), ScalarField.right_distrib, ScalarField.mul_comm b a,
    ScalarField.mul_comm c a]

/-- `(a + b) + (c + d) = (a + c) + (b + d)`. -/
theorem scalar_add_add_add_comm (a b c d : α) : a + b + (c + d) = a + c + (b + d) := by
  rw [ScalarField.add_assoc a b (c + d), ← ScalarField.add_assoc b c d, ScalarField.add_comm b c,
    ScalarField.add_assoc c b d, ← ScalarField.add_assoc a c (b + d)]

/-- `a + -a = 0`. -/
theorem scalar_add_neg_cancel (a : α) : a + -a = ScalarField.zero := by
  rw [ScalarField.add_comm, ScalarField.neg_add_cancel]

/-- `(q - c) + c = q`. -/
theorem scalar_sub_add_cancel (q c : α) : q - c + c = q := by
  rw [ScalarField.sub_eq_add_neg q c, ScalarField.add_assoc q (-c) c, ScalarField.neg_add_cancel c,
    scalar_add_zero q]

/-- From `a + b = c`: `a = c - b`. -/
theorem scalar_eq_sub_of_add_eq (a b c : α) (h : a + b = c) : a = c - b := by
  rw [← h, ScalarField.sub_eq_add_neg (a + b) b, ScalarField.add_assoc a b (-b), scalar_add_neg_cancel b,
    scalar_add_zero a]

/-- From `a + b = c + b`: `a = c`. -/
theorem scalar_add_right_cancel (a b c : α) (h : a + b = c + b) : a = c := by
  have h2 := scalar_eq_sub_of_add_eq a b (c + b) h
  rw [ScalarField.sub_eq_add_neg (c + b) b, ScalarField.add_assoc c b (-b), scalar_add_neg_cancel b,
    scalar_add_zero c] at h2
  exact h2

/-- `n * (s / n) = s` for `n ≠ 0`. -/
theorem scalar_mul_div_cancel (n s : α) (hn : n ≠ ScalarField.zero) : n * (s / n) = s := by
  rw [ScalarField.div_eq_mul_inv s n, ← ScalarField.mul_assoc n s (inv n), ScalarField.mul_comm n s,
    ScalarField.mul_assoc s n (inv n), ScalarField.mul_inv_cancel n hn, ScalarField.mul_one s]

/-- `p² + 2c (p + c) = (p + c)² + c²`, with squares written as products. -/
theorem scalar_sq_shift (p c : α) : p * p + (c + c) * (p + c) = (p + c) * (p + c) + c * c := by
  rw [scalar_left_distrib (c + c) p c, ScalarField.right_distrib c c p, ScalarField.right_distrib c c c,
    ScalarField.right_distrib p c (p + c), scalar_left_distrib p p c, scalar_left_distrib c p c,
    ScalarField.mul_comm p c]
  simp only [ScalarField.add_assoc]

/-- `(q - c)² + 2c q = q² + c²`: `scalar_sq_shift` at `p = q - c`. -/
theorem scalar_sq_sub_add (q c : α) : (q - c) * (q - c) + (c + c) * q = q * q + c * c := by
  have h := scalar_sq_shift (q - c) c
  rw [scalar_sub_add_cancel q c] at h
  exact h

/-- One element more in `listSum_sq_sub`: the induction step as scalar algebra. -/
theorem scalar_sq_sum_step (q c f x g n : α) (ih : f + (c + c) * x = g + n * (c * c)) :
    (q - c) * (q - c) + f + (c + c) * (q + x) = q * q + g + (n + ScalarField.one) * (c * c) := by
  rw [scalar_left_distrib (c + c) q x,
    scalar_add_add_add_comm ((q - c) * (q - c)) f ((c + c) * q) ((c + c) * x), ih, scalar_sq_sub_add q c,
    ScalarField.right_distrib n ScalarField.one (c * c), ScalarField.one_mul (c * c),
    ScalarField.add_comm (n * (c * c)) (c * c), scalar_add_add_add_comm (q * q) g (c * c) (n * (c * c))]

/--
The squares about any `c`, kept free of subtraction: `Σ (x - c)² + 2c Σ x = Σ x² + n c²`, where
`n` is the number of terms.
-/
theorem listSum_sq_sub (ks : List ι) (x : ι → α) (c : α) :
    listSum (ks.map fun k => (x k - c) * (x k - c)) + (c + c) * listSum (ks.map x) =
      listSum (ks.map fun k => x k * x k) + natToScalar ks.length * (c * c) := by
  induction ks with
  | nil =>
    simp only [List.map_nil, listSum, List.length_nil, natToScalar, ScalarField.zero_mul, scalar_mul_zero]
  | cons a l ih =>
    simp only [List.map_cons, listSum, List.length_cons, natToScalar]
    exact scalar_sq_sum_step (x a) c _ _ _ _ ih

/-- `d + 2 (s/n) s = q + n (s/n)²` gives `d / n = q / n - (s/n)²`, for `n ≠ 0`. -/
theorem variance_of_sums (d s q n : α) (hn : n ≠ ScalarField.zero)
    (h : d + (s / n + s / n) * s = q + n * (s / n * (s / n))) :
    d / n = q / n - s / n * (s / n) := by
  rw [← ScalarField.mul_assoc n (s / n) (s / n), scalar_mul_div_cancel n s hn,
    ScalarField.right_distrib (s / n) (s / n) s, ScalarField.mul_comm s (s / n),
    ← ScalarField.add_assoc d (s / n * s) (s / n * s)] at h
  have h2 := scalar_add_right_cancel (d + s / n * s) (s / n * s) q h
  refine scalar_eq_sub_of_add_eq (d / n) (s / n * (s / n)) (q / n) ?_
  rw [← h2, ScalarField.div_eq_mul_inv (d + s / n * s) n, ScalarField.right_distrib d (s / n * s) (inv n),
    ← ScalarField.div_eq_mul_inv d n, ScalarField.mul_assoc (s / n) s (inv n), ← ScalarField.div_eq_mul_inv s n]

/--
The variance as the mean of squares minus the squared mean:
`mean_a ((x - mean_a x)²) = mean_a (x²) - (mean_a x)²`, over a non-empty axis (its extent `n`
is not zero in the scalars). Both means on the right are sums over the same axis, so one streaming
pass computes them. In floating point the difference cancels when the mean is large against the
spread of `x`; this theorem is about exact scalars.
-/
theorem variance_sum_of_squares (ks : List ι) (x : ι → α)
    (hn : (natToScalar ks.length : α) ≠ ScalarField.zero) :
    listSum (ks.map fun k => (x k - listSum (ks.map x) / natToScalar ks.length) *
        (x k - listSum (ks.map x) / natToScalar ks.length)) / natToScalar ks.length =
      listSum (ks.map fun k => x k * x k) / natToScalar ks.length -
        listSum (ks.map x) / natToScalar ks.length * (listSum (ks.map x) / natToScalar ks.length) :=
  variance_of_sums _ (listSum (ks.map x)) _ (natToScalar ks.length) hn
    (listSum_sq_sub ks x (listSum (ks.map x) / natToScalar ks.length))

/--
Two tiles: a sum over `l₁ ++ l₂` is the sum of the tiles' sums, and a max over a list split into
two non-empty tiles is the max of the tiles' maxima.
-/
theorem reduction_tiling_two (l₁ l₂ : List α) (a b : α) :
    listSum (l₁ ++ l₂) = listSum l₁ + listSum l₂ ∧
      listMax a (l₁ ++ b :: l₂) = fmax (listMax a l₁) (listMax b l₂) :=
  ⟨listSum_append l₁ l₂, listMax_append a b l₁ l₂⟩

/-- The keys of consecutive tiles, in order. -/
def flattenTiles : List (List α) → List α
  | [] => []
  | t :: rest => t ++ flattenTiles rest

/-- The keys of consecutive non-empty tiles (each a first key and the rest), in order. -/
def flattenNonEmpty : List (α × List α) → List α
  | [] => []
  | t :: rest => t.1 :: (t.2 ++ flattenNonEmpty rest)

/-- The tiled sum loop: the running value `r` updated by `r' = r + sum(tile)` tile after tile. -/
def runSum (r : α) : List (List α) → α
  | [] => r
  | t :: rest => runSum (r + listSum t) rest

/-- The tiled max loop: `r' = max(r, max(tile))` tile after tile, over non-empty tiles. -/
def runMax (r : α) : List (α × List α) → α
  | [] => r
  | t :: rest => runMax (fmax r (listMax t.1 t.2)) rest

theorem runSum_eq (r : α) (tiles : List (List α)) :
    runSum r tiles = r + listSum (flattenTiles tiles) := by
  induction tiles generalizing r with
  | nil => simp only [runSum, flattenTiles, listSum, scalar_add_zero]
  | cons t rest ih => simp only [runSum, flattenTiles, ih, listSum_append, ScalarField.add_assoc]

theorem runMax_eq (a : α) (l : List α) (tiles : List (α × List α)) :
    runMax (listMax a l) tiles = listMax a (l ++ flattenNonEmpty tiles) := by
  induction tiles generalizing l with
  | nil => simp only [runMax, flattenNonEmpty, List.append_nil]
  | cons t rest ih =>
    simp only [runMax, flattenNonEmpty]
    rw [← listMax_append a t.1 l t.2, ih]
    simp only [List.append_assoc, List.cons_append]

/--
Splitting a reduction into any number of tiles, combined by the associative update the kernels
run: the sum loop `r' = r + sum(tile)` from `r = 0` over the tiles gives the sum over all their
keys, and the max loop `r' = max(r, max(tile))` started from the first tile's max gives the max
over all keys. (Python starts the max loop from `-inf`; the scalar laws have no `-inf`, so the
loop starts from the first tile, which is the same value.) `reduction_tiling_two` is the two-tile
case.
-/
theorem reduction_tiling (tiles : List (List α)) (a : α) (l : List α)
    (rest : List (α × List α)) :
    runSum ScalarField.zero tiles = listSum (flattenTiles tiles) ∧
      runMax (listMax a l) rest = listMax a (l ++ flattenNonEmpty rest) :=
  ⟨by rw [runSum_eq, ScalarField.zero_add], runMax_eq a l rest⟩

/-- `f 0 + f 1 + ... + f (n - 1)`: a sum over an axis of extent `n`. -/
def sumUpTo (f : Nat → α) : Nat → α
  | 0 => ScalarField.zero
  | n + 1 => sumUpTo f n + f n

theorem sumUpTo_add (f : Nat → α) (m n : Nat) :
    sumUpTo f (m + n) = sumUpTo f m + sumUpTo (fun j => f (m + j)) n := by
  induction n with
  | zero => exact (scalar_add_zero (sumUpTo f m)).symm
  | succ n ih =>
    show sumUpTo f (m + n + 1) = sumUpTo f m + (sumUpTo (fun j => f (m + j)) n + f (m + n))
    rw [← ScalarField.add_assoc, ← ih]
    rfl

/--
Python's statement of `reduction_tiling` for sums, on positions: a sum over an axis of extent
`T * k` is the sum over `T` tiles of the sums over their `k` positions `t * k + j`.
-/
theorem reduction_tiling_range (f : Nat → α) (T k : Nat) :
    sumUpTo f (T * k) = sumUpTo (fun t => sumUpTo (fun j => f (t * k + j)) k) T := by
  induction T with
  | zero =>
    show sumUpTo f (0 * k) = ScalarField.zero
    simp only [Nat.zero_mul, sumUpTo]
  | succ T ih =>
    show sumUpTo f ((T + 1) * k) =
      sumUpTo (fun t => sumUpTo (fun j => f (t * k + j)) k) T + sumUpTo (fun j => f (T * k + j)) k
    rw [Nat.add_mul, Nat.one_mul, sumUpTo_add, ih]

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

/-- `Σ_{j ∈ t} exp (s j - m) * v j = (Σ_{j ∈ t} exp (s j) * v j) * exp (-m)`. -/
theorem sumExpV_shift (s v : ι → α) (m : α) (t : List ι) :
    sumExpV s v m t = listSum (t.map fun j => exp (s j) * v j) * exp (-m) := by
  unfold sumExpV
  rw [listSum_map_ext t (fun j => exp (s j - m) * v j) (fun j => exp (s j) * v j * exp (-m))
      (fun j => exp_sub_mul (s j) m (v j))]
  exact listSum_map_mul_right t (fun j => exp (s j) * v j) (exp (-m))

/-- The tiles' keys, in order. -/
def allKeys : List (α × List ι) → List ι
  | [] => []
  | t :: rest => t.2 ++ allKeys rest

/-- The shift of the last tile (`m` when there is none). -/
def lastShift (m : α) : List (α × List ι) → α
  | [] => m
  | t :: rest => lastShift t.1 rest

/-- The streamed loop: each tile comes with the running shift the kernel uses for it. -/
def OnlineState.run (s v : ι → α) (st : OnlineState α) : List (α × List ι) → OnlineState α
  | [] => st
  | t :: rest => OnlineState.run s v (st.step s v t.1 t.2) rest

/-- After any tiles, the streamed state is the direct state over all their keys. -/
theorem online_run_ofTile (s v : ι → α) (tiles : List (α × List ι)) (m : α) (prev : List ι) :
    OnlineState.run s v (OnlineState.ofTile s v m prev) tiles =
      OnlineState.ofTile s v (lastShift m tiles) (prev ++ allKeys tiles) := by
  induction tiles generalizing m prev with
  | nil => simp only [OnlineState.run, lastShift, allKeys, List.append_nil]
  | cons t rest ih =>
    simp only [OnlineState.run, lastShift, allKeys, online_softmax_rescale, ih, List.append_assoc]

/--
The end-to-end online-softmax claim: start from `l = 0`, `o = 0` (any initial shift `m₀`; the
kernel's `-inf` is one), stream the tiles with any running shifts (the kernel's running maxima
are one choice), and after the last tile `o / l` is softmax · V over all the keys:
`Σ_j (exp (s j) / Σ_k exp (s k)) * v j`.
-/
theorem online_softmax_final (s v : ι → α) (m₀ : α) (tiles : List (α × List ι)) :
    (OnlineState.run s v ⟨m₀, ScalarField.zero, ScalarField.zero⟩ tiles).o /
        (OnlineState.run s v ⟨m₀, ScalarField.zero, ScalarField.zero⟩ tiles).l =
      listSum ((allKeys tiles).map fun j =>
        exp (s j) / listSum ((allKeys tiles).map fun k => exp (s k)) * v j) := by
  have h₀ : (⟨m₀, ScalarField.zero, ScalarField.zero⟩ : OnlineState α) =
      OnlineState.ofTile s v m₀ [] := rfl
  rw [h₀, online_run_ofTile, List.nil_append]
  simp only [OnlineState.ofTile]
  rw [sumExpV_shift, sumExp, listSum_exp_sub,
    mul_div_mul_right _ _ (exp (-lastShift m₀ tiles)) (ScalarField.exp_ne_zero _),
    matmul_div_commute]

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
A reduction over the axis a contraction contracts, computed inside the contraction's loop: one
`fold2` accumulates `Σ f` (any summand `f` of the loaded tile: `x²` for RMSNorm, `x` for a mean)
and `Σ x * w` together, and scaling the contraction afterwards by any function `g` of the
reduction equals contracting the row-scaled operand (RMSNorm + matmul in one kernel).
-/
theorem reduction_in_contraction_loop (ks : List ι) (f x w : ι → α) (g : α → α) :
    (fold2 f (fun k => x k * w k) ks).2 * g (fold2 f (fun k => x k * w k) ks).1 =
      listSum (ks.map fun k => x k * g (listSum (ks.map f)) * w k) := by
  rw [fold2_eq f (fun k => x k * w k) ks]
  exact (matmul_row_scale_commute ks x w (g (listSum (ks.map f)))).symm

/-! ## Elementwise products -/

/-- `a * b = b * a` for elementwise products (operands aligned by axis name). -/
theorem elementwise_mul_comm (a b : α) : a * b = b * a := ScalarField.mul_comm a b

/-- `(a * b) * c = a * (b * c)` for elementwise products. -/
theorem elementwise_mul_assoc (a b c : α) : a * b * c = a * (b * c) := ScalarField.mul_assoc a b c

/-! ## Skipping masked tiles -/

/--
A streamed loop folds a combine `f` over its tiles. A tile that leaves every state unchanged
(`f b t = b`: its contribution to each accumulator is that accumulator's identity, `-inf` for a
running max, `0` for a sum or a contraction, as a tile whose every score is masked to `-inf`
gives) can be left out: folding over the other tiles gives the same state. The planner proves
per tile, by interval reasoning over the mask's index predicate, which tiles are of this kind.
-/
theorem masked_tile_skip {β τ : Type} (f : β → τ → β) (masked : τ → Bool)
    (h : ∀ b t, masked t = true → f b t = b) (init : β) (ts : List τ) :
    (ts.filter fun t => !masked t).foldl f init = ts.foldl f init := by
  induction ts generalizing init with
  | nil => rfl
  | cons t ts ih =>
    cases hm : masked t with
    | true =>
      have hn : ¬ (!masked t) = true := by simp [hm]
      rw [List.filter_cons_of_neg (p := fun t => !masked t) (l := ts) hn, List.foldl_cons, h init t hm]
      exact ih init
    | false =>
      have hp : (!masked t) = true := by simp [hm]
      rw [List.filter_cons_of_pos (p := fun t => !masked t) (l := ts) hp, List.foldl_cons, List.foldl_cons]
      exact ih (f init t)

/-! ## Merging adjacent axes -/

/--
Merging an outer axis and an inner axis of extent `nb` into one puts element `(j, l)` at
`j * nb + l`. That index map is a bijection: the merged index gives both parts back. So a graph
whose two axes are only carried together (never reduced, contracted, indexed or sized), stored
row-major, computes the same values with them read as one axis; `pyrunner.ir.merge_axes` checks
those side conditions.
-/
theorem merge_axes (nb j l : Nat) (hl : l < nb) :
    (j * nb + l) / nb = j ∧ (j * nb + l) % nb = l := by
  have hpos : 0 < nb := Nat.lt_of_le_of_lt (Nat.zero_le l) hl
  constructor
  · rw [Nat.add_comm, Nat.add_mul_div_right l j hpos, Nat.div_eq_of_lt hl, Nat.zero_add]
  · rw [Nat.add_comm, Nat.add_mul_mod_self_right, Nat.mod_eq_of_lt hl]

/-- Two sums over `n` terms agree where their summands agree below `n`. -/
theorem sumUpTo_congr (f g : Nat → α) (n : Nat) :
    (∀ j, j < n → f j = g j) → sumUpTo f n = sumUpTo g n := by
  induction n with
  | zero => intro _; rfl
  | succ n ih =>
    intro h
    show sumUpTo f n + f n = sumUpTo g n + g n
    rw [ih (fun j hj => h j (Nat.lt.step hj)), h n (Nat.lt_succ_self n)]

/--
A pair contraction merged: summing an outer axis of extent `T` and an inner one of extent `k` (a
contraction over the inner axis, then a sum over the outer one) is one sum over the merged axis of
extent `T * k`, each merged index `m` read as the pair `(m / k, m % k)` of `merge_axes`. So
`sum_a(c)`, with `c` contracting `b` over operands that carry `a` and `b` adjacent and in order,
is one contraction over the merged axis; `pyrunner.ir.merge_axes.pair_contractions` finds them.
-/
theorem merge_contraction (g : Nat → Nat → α) (T k : Nat) :
    sumUpTo (fun m => g (m / k) (m % k)) (T * k) = sumUpTo (fun t => sumUpTo (fun j => g t j) k) T := by
  rw [reduction_tiling_range]
  apply sumUpTo_congr
  intro t _
  apply sumUpTo_congr
  intro j hj
  show g ((t * k + j) / k) ((t * k + j) % k) = g t j
  rw [(merge_axes k t j hj).1, (merge_axes k t j hj).2]

/-! ## An axis of extent one -/

/--
Inserting an axis of extent 1 between an outer index `j` and an inner index `l` (inner extent
`nl`) moves no element: the only index `u` of the new axis is 0, so the row-major offset
`(j * 1 + u) * nl + l` is the source's `j * nl + l`. So an input read with the axis, every value
computed from it, and an output stored with it are the same bytes as without it;
`pyrunner.ir.unit_axes` inserts it where it gives a contraction a row axis.
-/
theorem unit_axis (nl j u l : Nat) (hu : u < 1) : (j * 1 + u) * nl + l = j * nl + l := by
  rw [Nat.eq_zero_of_le_zero (Nat.le_of_lt_succ hu), Nat.mul_one, Nat.add_zero]

/-! ## Splitting a reduction into chunks -/

/-- The chunks' denominators, each under its own shift `c.1`, rescaled to the shift `M` and summed. -/
def chunkSum (s : ι → α) (M : α) : List (α × List ι) → α
  | [] => ScalarField.zero
  | c :: rest => sumExp s c.1 c.2 * exp (c.1 - M) + chunkSum s M rest

/-- The chunks' unnormalised outputs, each under its own shift `c.1`, rescaled to `M` and summed. -/
def chunkSumV (s v : ι → α) (M : α) : List (α × List ι) → α
  | [] => ScalarField.zero
  | c :: rest => sumExpV s v c.1 c.2 * exp (c.1 - M) + chunkSumV s v M rest

/--
Splitting a reduced axis into chunks computed by separate blocks (split-K, flash-decoding): each
chunk `c` sums its keys `c.2` under its own shift `c.1` (the chunk's max in the kernels), and the
combine step rescales each chunk's sums by `exp (c.1 - M)` and adds them. For any shifts, that equals
the sums over all the keys under the shift `M` (the max over the chunks' maxima in the kernels).
The plain sums and maxima of a split axis are `reduction_tiling_range` and `reduction_tiling`.
-/
theorem split_reduction (s v : ι → α) (M : α) (chunks : List (α × List ι)) :
    chunkSum s M chunks = sumExp s M (allKeys chunks) ∧
      chunkSumV s v M chunks = sumExpV s v M (allKeys chunks) := by
  induction chunks with
  | nil =>
    exact ⟨by simp only [chunkSum, allKeys, sumExp, List.map_nil, listSum],
      by simp only [chunkSumV, allKeys, sumExpV, List.map_nil, listSum]⟩
  | cons c rest ih =>
    constructor
    · simp only [chunkSum, allKeys, sumExp_append, sumExp_rescale, ih.1]
    · simp only [chunkSumV, allKeys, sumExpV_append, sumExpV_rescale, ih.2]

/-- `exp2 (p + q) = exp2 p * exp2 q`, from `exp2 y = exp (y * ln 2)`. -/
theorem exp2_add (p q : α) : exp2 (p + q) = exp2 p * exp2 q := by
  rw [ScalarField.exp2_eq, ScalarField.exp2_eq, ScalarField.exp2_eq, ScalarField.right_distrib,
    ScalarField.exp_add]

/-- The chunks' partial results `Σ_{k ∈ c} E ((s k - c.1) * sc) * v k`, each under its own shift `c.1`,
rescaled by `E ((c.1 - M) * sc)` and summed (Python's combine step). -/
def chunkSumE (E : α → α) (sc : α) (s v : ι → α) (M : α) : List (α × List ι) → α
  | [] => ScalarField.zero
  | c :: rest =>
    listSum (c.2.map fun k => E ((s k - c.1) * sc) * v k) * E ((c.1 - M) * sc) + chunkSumE E sc s v M rest

/--
`split_reduction` in the generality Python applies it (`pyrunner/ir/split_axes.py`): for any
exponential `E` turning sums into products (`exp`, and `exp2` by `exp2_add`), any scale `sc` of the
exponent (attention's `1 / sqrt d`), any weights `v` (a contraction's other operand; `v = 1` for the
denominator) and any shifts, the chunks' rescaled partial results sum to the result over all keys
under the shift `M`. Plain sums, contractions and means of a split axis split as sums do
(`reduction_tiling_range`), maxima as `reduction_tiling` says.
-/
theorem split_reduction_scaled (E : α → α) (hE : ∀ a b, E (a + b) = E a * E b) (sc : α) (s v : ι → α)
    (M : α) : ∀ chunks : List (α × List ι),
      chunkSumE E sc s v M chunks = listSum ((allKeys chunks).map fun k => E ((s k - M) * sc) * v k)
  | [] => rfl
  | c :: rest => by
    have hc : ∀ k, E ((s k - c.1) * sc) * v k * E ((c.1 - M) * sc) = E ((s k - M) * sc) * v k := by
      intro k
      rw [scalar_mul_right_comm (E ((s k - c.1) * sc)) (v k) (E ((c.1 - M) * sc)), ← hE,
        ← ScalarField.right_distrib, sub_add_sub_cancel]
    show listSum (c.2.map fun k => E ((s k - c.1) * sc) * v k) * E ((c.1 - M) * sc) +
        chunkSumE E sc s v M rest =
      listSum ((c.2 ++ allKeys rest).map fun k => E ((s k - M) * sc) * v k)
    rw [← listSum_map_mul_right c.2 (fun k => E ((s k - c.1) * sc) * v k) (E ((c.1 - M) * sc)),
      listSum_map_ext c.2 (fun k => E ((s k - c.1) * sc) * v k * E ((c.1 - M) * sc))
        (fun k => E ((s k - M) * sc) * v k) hc,
      split_reduction_scaled E hE sc s v M rest, List.map_append, listSum_append]

/-- `split_reduction_scaled` for `exp`. -/
theorem split_reduction_exp (sc : α) (s v : ι → α) (M : α) (chunks : List (α × List ι)) :
    chunkSumE exp sc s v M chunks = listSum ((allKeys chunks).map fun k => exp ((s k - M) * sc) * v k) :=
  split_reduction_scaled exp ScalarField.exp_add sc s v M chunks

/-- `split_reduction_scaled` for `exp2` (after `exp_to_exp2`). -/
theorem split_reduction_exp2 (sc : α) (s v : ι → α) (M : α) (chunks : List (α × List ι)) :
    chunkSumE exp2 sc s v M chunks = listSum ((allKeys chunks).map fun k => exp2 ((s k - M) * sc) * v k) :=
  split_reduction_scaled exp2 exp2_add sc s v M chunks

/-! ## Re-associating a chain of contractions -/

/-- `Σ s * f = s * Σ f`. -/
theorem listSum_map_mul_left (l : List ι) (f : ι → α) (s : α) :
    listSum (l.map fun k => s * f k) = s * listSum (l.map f) := by
  induction l with
  | nil => simp only [List.map_nil, listSum, scalar_mul_zero]
  | cons a l ih => simp only [List.map_cons, listSum, ih, scalar_left_distrib]

/-- `Σ (f + g) = Σ f + Σ g`. -/
theorem listSum_map_add (l : List ι) (f g : ι → α) :
    listSum (l.map fun k => f k + g k) = listSum (l.map f) + listSum (l.map g) := by
  induction l with
  | nil => simp only [List.map_nil, listSum, ScalarField.zero_add]
  | cons a l ih =>
    simp only [List.map_cons, listSum, ih]
    exact scalar_add_add_add_comm (f a) (g a) (listSum (l.map f)) (listSum (l.map g))

/--
Two contractions over the same axis, summed, accumulated into one register tile in one loop (each
step adds both tiles' products to it): the running sum of `x k * a k + y k * b k` is the sum of the
two contractions, so the kernel needs one accumulator and no add after the loop.
-/
theorem shared_accumulator (ks : List ι) (x a y b : ι → α) :
    listSum (ks.map fun k => x k * a k + y k * b k) =
      listSum (ks.map fun k => x k * a k) + listSum (ks.map fun k => y k * b k) :=
  listSum_map_add ks (fun k => x k * a k) (fun k => y k * b k)

/-- A sum of zeros is zero. -/
theorem listSum_map_zero (l : List ι) :
    listSum (l.map fun (_ : ι) => (ScalarField.zero : α)) = ScalarField.zero := by
  induction l with
  | nil => rfl
  | cons a l ih => simp only [List.map_cons, listSum, ih, ScalarField.zero_add]

/-- Two finite sums swap: `Σ_k Σ_j f j k = Σ_j Σ_k f j k`. -/
theorem listSum_swap (js ks : List ι) (f : ι → ι → α) :
    listSum (ks.map fun k => listSum (js.map fun j => f j k)) =
      listSum (js.map fun j => listSum (ks.map fun k => f j k)) := by
  induction ks with
  | nil => exact (listSum_map_zero (α := α) js).symm
  | cons k₀ ks ih =>
    show listSum (js.map fun j => f j k₀) + listSum (ks.map fun k => listSum (js.map fun j => f j k)) =
      listSum (js.map fun j => f j k₀ + listSum (ks.map fun k => f j k))
    rw [ih]
    exact (listSum_map_add js (fun j => f j k₀) (fun j => listSum (ks.map fun k => f j k))).symm

/--
Re-associating two contractions: `(A @_j B) @_k C = A @_j (B @_k C)` at one output element, where
`A` does not depend on `k` and `C` not on `j` (the rule's side conditions: `k` is not an axis of `A`,
`j` not one of `C`). Both sides are `Σ_j Σ_k A j * B j k * C k`. The cost model then picks the
cheaper order of a chain: a low-rank weight `X @ (A @ B)` as `(X @ A) @ B`, linear attention
`(Q @ K) @ V` as `Q @ (K @ V)`.
-/
theorem matmul_assoc (js ks : List ι) (a : ι → α) (b : ι → ι → α) (c : ι → α) :
    listSum (ks.map fun k => listSum (js.map fun j => a j * b j k) * c k) =
      listSum (js.map fun j => a j * listSum (ks.map fun k => b j k * c k)) :=
  (listSum_map_ext ks (fun k => listSum (js.map fun j => a j * b j k) * c k)
      (fun k => listSum (js.map fun j => a j * (b j k * c k)))
      (fun k => (listSum_map_mul_right js (fun j => a j * b j k) (c k)).symm.trans
        (listSum_map_ext js (fun j => a j * b j k * c k) (fun j => a j * (b j k * c k))
          (fun j => ScalarField.mul_assoc (a j) (b j k) (c k))))).trans
    ((listSum_swap js ks (fun j k => a j * (b j k * c k))).trans
      (listSum_map_ext js (fun j => listSum (ks.map fun k => a j * (b j k * c k)))
        (fun j => a j * listSum (ks.map fun k => b j k * c k))
        (fun j => listSum_map_mul_left ks (fun k => b j k * c k) (a j))))

/--
A contraction as a reduction: the contraction of `x` and `w` over the indices `ks` is the sum over
`ks` of any `p` that is their pointwise product. The planner uses it for a product with no tile
row or column (a matrix-vector product), which then streams as a sum; `term_matmul_as_sum` states
it on graph terms.
-/
theorem matmul_as_sum (ks : List ι) (x w p : ι → α) (hp : ∀ k, p k = x k * w k) :
    listSum (ks.map fun k => x k * w k) = listSum (ks.map p) :=
  (listSum_map_ext ks p (fun k => x k * w k) hp).symm

/-! ## A shift that is not the bare maximum -/

/--
Exchanging an exponential's shift: `exp ((x - n) * c) = exp ((x - m) * c) * exp ((m - n) * c)` for any
`m`. The planner takes `m = max_a x` where `n` is built from it (attention sinks shift by
`max (max_a x) sink`): the first factor is then the online softmax's, and the second, constant along
`a`, leaves the loop's sums (`sum_scale_commute`, `matmul_row_scale_commute`).
-/
theorem exp_shift_to_max (x n m c : α) :
    exp ((x - n) * c) = exp ((x - m) * c) * exp ((m - n) * c) := by
  rw [← ScalarField.exp_add, ← ScalarField.right_distrib, sub_add_sub_cancel x m n]

/-- `exp_shift_to_max` without a scale: `exp (x - n) = exp (x - m) * exp (m - n)`. -/
theorem exp_shift_to_max_unscaled (x n m : α) : exp (x - n) = exp (x - m) * exp (m - n) :=
  (exp_shift x m n).symm

/-- `exp_shift_to_max` with `E = exp2`, as Python also applies it after `exp_to_exp2`. -/
theorem exp_shift_to_max_exp2 (x n m c : α) :
    exp2 ((x - n) * c) = exp2 ((x - m) * c) * exp2 ((m - n) * c) := by
  rw [ScalarField.exp2_eq ((x - n) * c), ScalarField.exp2_eq ((x - m) * c), ScalarField.exp2_eq ((m - n) * c),
    ← ScalarField.exp_add, ← ScalarField.right_distrib, ← ScalarField.right_distrib, sub_add_sub_cancel x m n]

/-- `exp_shift_to_max` with `E = exp2` and no scale. -/
theorem exp_shift_to_max_exp2_unscaled (x n m : α) : exp2 (x - n) = exp2 (x - m) * exp2 (m - n) := by
  rw [ScalarField.exp2_eq (x - n), ScalarField.exp2_eq (x - m), ScalarField.exp2_eq (m - n),
    ← ScalarField.exp_add, ← ScalarField.right_distrib, sub_add_sub_cancel x m n]

/-! ## A factor constant along a sum -/

/-- A factor constant along the summed indices leaves the sum: `Σ_k x k * s = (Σ_k x k) * s`. -/
theorem sum_scale_commute (ks : List ι) (x : ι → α) (s : α) :
    listSum (ks.map fun k => x k * s) = listSum (ks.map x) * s :=
  listSum_map_mul_right ks x s

/-- The factor on the left: `Σ_k s * x k = s * Σ_k x k`. -/
theorem sum_scale_commute_scale_left (ks : List ι) (x : ι → α) (s : α) :
    listSum (ks.map fun k => s * x k) = s * listSum (ks.map x) :=
  listSum_map_mul_left ks x s

/-- The factor on the left, the product kept in the sum's order: `Σ_k s * x k = (Σ_k x k) * s`. -/
theorem sum_scale_commute_scale_left_swapped (ks : List ι) (x : ι → α) (s : α) :
    listSum (ks.map fun k => s * x k) = listSum (ks.map x) * s := by
  rw [listSum_map_mul_left ks x s, ScalarField.mul_comm s (listSum (ks.map x))]

/-- A divisor constant along the summed indices: `Σ_k x k / s = (Σ_k x k) / s`. -/
theorem sum_scale_commute_div (ks : List ι) (x : ι → α) (s : α) :
    listSum (ks.map fun k => x k / s) = listSum (ks.map x) / s := by
  rw [listSum_map_ext ks (fun k => x k / s) (fun k => x k * inv s)
      (fun k => ScalarField.div_eq_mul_inv (x k) s),
    listSum_map_mul_right ks x (inv s), ScalarField.div_eq_mul_inv]

end Superopt

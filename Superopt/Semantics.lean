/-!
# Scalar semantics

What the rewrite rules are proved about. The scalar laws the proofs use are the fields of the
class `ScalarField`, so every theorem taking `[ScalarField α]` holds in any model of those laws:
the real numbers (with `inv 0 = 0`, `ln2 = log 2`, `log2e = 1 / log 2`) are one. Nothing here
assumes a law that is not a field of the class.

Reductions over an axis are finite sums (or maxima) over lists: `listSum`, `listMax`,
`listMean`. Sums over an index set are written `listSum (ks.map f)` for a list of indices `ks`
(for a tensor axis of extent `n`, the indices `0, ..., n-1`), so one lemma covers every axis.
All of these are defined here by plain recursion, so their lemmas are under our control.
-/

namespace Superopt

/--
The scalar laws the rewrite rules need: a commutative field (with `inv` total, as in the reals
with `inv 0 = 0`), `exp` turning sums into products and never zero, `exp2` related to `exp`
through `ln2`, and an associative `fmax`.
-/
class ScalarField (α : Type) extends Add α, Mul α, Sub α, Neg α, Div α where
  zero : α
  one : α
  inv : α → α
  exp : α → α
  exp2 : α → α
  fmax : α → α → α
  /-- The natural logarithm of 2. -/
  ln2 : α
  /-- `log2 e`, the factor that turns `exp` into `exp2`. -/
  log2e : α
  add_assoc : ∀ a b c : α, a + b + c = a + (b + c)
  add_comm : ∀ a b : α, a + b = b + a
  zero_add : ∀ a : α, zero + a = a
  neg_add_cancel : ∀ a : α, -a + a = zero
  sub_eq_add_neg : ∀ a b : α, a - b = a + -b
  neg_mul : ∀ a b : α, -a * b = -(a * b)
  mul_assoc : ∀ a b c : α, a * b * c = a * (b * c)
  mul_comm : ∀ a b : α, a * b = b * a
  one_mul : ∀ a : α, one * a = a
  mul_one : ∀ a : α, a * one = a
  zero_mul : ∀ a : α, zero * a = zero
  right_distrib : ∀ a b c : α, (a + b) * c = a * c + b * c
  inv_mul : ∀ a b : α, inv (a * b) = inv a * inv b
  mul_inv_cancel : ∀ a : α, a ≠ zero → a * inv a = one
  div_eq_mul_inv : ∀ a b : α, a / b = a * inv b
  exp_add : ∀ a b : α, exp (a + b) = exp a * exp b
  exp_ne_zero : ∀ a : α, exp a ≠ zero
  exp2_eq : ∀ a : α, exp2 a = exp (a * ln2)
  log2e_mul_ln2 : log2e * ln2 = one
  fmax_assoc : ∀ a b c : α, fmax (fmax a b) c = fmax a (fmax b c)

open ScalarField (exp inv fmax)

section Lists

variable {α : Type} [ScalarField α] {ι : Type}

/-- The sum of a list (a `sum` reduction). -/
def listSum : List α → α
  | [] => ScalarField.zero
  | a :: l => a + listSum l

/-- The maximum of the non-empty list `a :: l` (a `max` reduction). -/
def listMax : α → List α → α
  | a, [] => a
  | a, b :: l => fmax a (listMax b l)

/-- A natural number as a scalar: `1 + 1 + ... + 1`. -/
def natToScalar : Nat → α
  | 0 => ScalarField.zero
  | n + 1 => natToScalar n + ScalarField.one

/-- The mean of a list (a `mean` reduction). -/
def listMean (l : List α) : α := listSum l / (natToScalar l.length : α)

/-- Two sums over the same indices computed in one pass (one loop, two accumulators). -/
def fold2 (f g : ι → α) : List ι → α × α
  | [] => (ScalarField.zero, ScalarField.zero)
  | k :: l => (f k + (fold2 f g l).1, g k + (fold2 f g l).2)

theorem listSum_append (l₁ l₂ : List α) : listSum (l₁ ++ l₂) = listSum l₁ + listSum l₂ := by
  induction l₁ with
  | nil => simp only [List.nil_append, listSum, ScalarField.zero_add]
  | cons a l ih => simp only [List.cons_append, listSum, ih, ScalarField.add_assoc]

theorem listMax_append (a b : α) (l₁ l₂ : List α) :
    listMax a (l₁ ++ b :: l₂) = fmax (listMax a l₁) (listMax b l₂) := by
  induction l₁ generalizing a with
  | nil => simp only [List.nil_append, listMax]
  | cons c l ih => simp only [List.cons_append, listMax, ih, ScalarField.fmax_assoc]

theorem listSum_map_mul_right (l : List ι) (f : ι → α) (s : α) :
    listSum (l.map fun k => f k * s) = listSum (l.map f) * s := by
  induction l with
  | nil => simp only [List.map_nil, listSum, ScalarField.zero_mul]
  | cons a l ih => simp only [List.map_cons, listSum, ih, ScalarField.right_distrib]

theorem listSum_map_ext (l : List ι) (f g : ι → α) (h : ∀ k, f k = g k) :
    listSum (l.map f) = listSum (l.map g) := by
  induction l with
  | nil => rfl
  | cons a l ih => simp only [List.map_cons, listSum, h a, ih]

theorem fold2_eq (f g : ι → α) (l : List ι) :
    fold2 f g l = (listSum (l.map f), listSum (l.map g)) := by
  induction l with
  | nil => rfl
  | cons k l ih => simp only [fold2, List.map_cons, listSum, ih]

end Lists

section Scalars

variable {α : Type} [ScalarField α]

theorem scalar_mul_right_comm (a b c : α) : a * b * c = a * c * b := by
  rw [ScalarField.mul_assoc a b c, ScalarField.mul_comm b c, ← ScalarField.mul_assoc a c b]

theorem sub_add_sub_cancel (a m m' : α) : a - m + (m - m') = a - m' := by
  rw [ScalarField.sub_eq_add_neg a m, ScalarField.sub_eq_add_neg m m',
    ScalarField.sub_eq_add_neg a m', ScalarField.add_assoc a (-m) (m + -m'),
    ← ScalarField.add_assoc (-m) m (-m'), ScalarField.neg_add_cancel m,
    ScalarField.zero_add (-m')]

theorem scalar_add_zero (a : α) : a + ScalarField.zero = a := by
  rw [ScalarField.add_comm]
  exact ScalarField.zero_add a

/-- `(a - b) * c = a * c - b * c`. -/
theorem sub_mul_distrib (a b c : α) : (a - b) * c = a * c - b * c := by
  rw [ScalarField.sub_eq_add_neg a b, ScalarField.right_distrib, ScalarField.neg_mul,
    ← ScalarField.sub_eq_add_neg]

theorem exp_sub (a m : α) : exp (a - m) = exp a * exp (-m) := by
  rw [ScalarField.sub_eq_add_neg a m, ScalarField.exp_add a (-m)]

theorem exp_shift (a m m' : α) : exp (a - m) * exp (m - m') = exp (a - m') := by
  rw [← ScalarField.exp_add (a - m) (m - m'), sub_add_sub_cancel a m m']

theorem mul_div_mul_right (a b c : α) (hc : c ≠ ScalarField.zero) : a * c / (b * c) = a / b := by
  rw [ScalarField.div_eq_mul_inv (a * c) (b * c), ScalarField.div_eq_mul_inv a b,
    ScalarField.inv_mul b c, ScalarField.mul_assoc a c (inv b * inv c),
    ScalarField.mul_comm (inv b) (inv c), ← ScalarField.mul_assoc c (inv c) (inv b),
    ScalarField.mul_inv_cancel c hc, ScalarField.one_mul (inv b)]

theorem div_mul_swap (a b d : α) : a / d * b = a * b * inv d := by
  rw [ScalarField.div_eq_mul_inv a d, scalar_mul_right_comm a (inv d) b]

end Scalars

end Superopt

import Superopt.Eval

/-!
# A model of the scalar laws

The rewrite rules are proved for every type with a `ScalarField` instance, so they say something
only if such a type exists. This module gives one, checked by the kernel: the two-element field
`Two` (`0`, `1`; addition is exclusive or, multiplication is and), with `exp` and `exp2` constant
`1`, `ln2 = log2e = 1` and `fmax` the logical or. It is a poor model of the reals, but every law of
`ScalarField` holds in it, and `one ≠ zero` in it, so the laws are consistent and not trivial.
The real numbers (with `inv 0 = 0`, `ln2 = log 2`, `log2e = 1 / log 2`) are the intended model;
core Lean has no real numbers to state that in.
-/

namespace Superopt

/-- The two-element field. -/
inductive Two where
  | zero
  | one
  deriving DecidableEq, Repr

/-- Addition in `Two`: exclusive or. -/
def Two.add : Two → Two → Two
  | .zero, b => b
  | .one, .zero => .one
  | .one, .one => .zero

/-- Multiplication in `Two`: and. -/
def Two.mul : Two → Two → Two
  | .zero, _ => .zero
  | .one, b => b

/-- `fmax` in `Two`: or. -/
def Two.max : Two → Two → Two
  | .zero, b => b
  | .one, _ => .one

instance : ScalarField Two where
  add := Two.add
  mul := Two.mul
  sub := Two.add
  neg := fun a => a
  div := Two.mul
  zero := .zero
  one := .one
  inv := fun a => a
  exp := fun _ => .one
  exp2 := fun _ => .one
  fmax := Two.max
  ln2 := .one
  log2e := .one
  add_assoc := by intro a b c; cases a <;> cases b <;> cases c <;> rfl
  add_comm := by intro a b; cases a <;> cases b <;> rfl
  zero_add := by intro a; cases a <;> rfl
  neg_add_cancel := by intro a; cases a <;> rfl
  sub_eq_add_neg := by intro a b; cases a <;> cases b <;> rfl
  neg_mul := by intro a b; cases a <;> cases b <;> rfl
  mul_assoc := by intro a b c; cases a <;> cases b <;> cases c <;> rfl
  mul_comm := by intro a b; cases a <;> cases b <;> rfl
  one_mul := by intro a; cases a <;> rfl
  mul_one := by intro a; cases a <;> rfl
  zero_mul := by intro a; cases a <;> rfl
  right_distrib := by intro a b c; cases a <;> cases b <;> cases c <;> rfl
  inv_mul := by intro a b; cases a <;> cases b <;> rfl
  mul_inv_cancel := by
    intro a h
    cases a
    · exact absurd rfl h
    · rfl
  div_eq_mul_inv := by intro a b; cases a <;> cases b <;> rfl
  exp_add := by intro a b; rfl
  exp_ne_zero := by intro a h; exact Two.noConfusion h
  exp2_eq := by intro a; rfl
  log2e_mul_ln2 := rfl
  fmax_assoc := by intro a b c; cases a <;> cases b <;> cases c <;> rfl

/-- The functions beyond the laws, in `Two`: unary ones are the identity, binary ones `and`;
constants are `1`. -/
instance : ScalarOps Two where
  ofDecimal := fun _ => .one
  unary := fun _ a => a
  binary := fun _ => Two.mul
  negInf := .zero
  select := fun _ x _ => x

/-- The model is not trivial: its `one` and `zero` differ. -/
theorem two_one_ne_zero : (ScalarField.one : Two) ≠ ScalarField.zero := by
  intro h
  exact Two.noConfusion h

/-- The rules apply to the model, for example the softmax shift over three keys. -/
theorem two_softmax_max_shift (x : Nat → Two) (m : Two) :
    ScalarField.exp (x 0 - m) / listSum ([0, 1, 2].map fun j => ScalarField.exp (x j - m)) =
      ScalarField.exp (x 0) / listSum ([0, 1, 2].map fun j => ScalarField.exp (x j)) :=
  softmax_max_shift [0, 1, 2] x m 0

/-- The model's `ofDecimal` sends Python's LOG2E to `log2e`, so `term_exp_to_exp2` applies. -/
theorem two_term_exp_to_exp2 (ctx : Ctx Two) (x : Term) (i : Index) :
    Term.eval ctx (.unary .exp x) i =
      Term.eval ctx (.unary .exp2 (.binary .mul x (.const 1.4426950408889634))) i :=
  term_exp_to_exp2 ctx x 1.4426950408889634 rfl i

end Superopt

import Superopt.Graph

/-!
# Masked tiles: the interval reasoning of `masked_tile_skip`, proved

A streamed loop may leave out a tile where its mask is false at every element
(`masked_tile_skip` in `Superopt/Rules.lean` says a step that changes nothing may be dropped; that
every element of the tile is masked is its hypothesis). This module proves that hypothesis from
the mask's form, as `pyrunner/plan/masks.py` reasons about it: a mask is built from comparisons
`f ≤ 0` of integer affine forms `f = Σ c_a * index_a + offset` (`Atom`), combined by `and` and `or`
(`Pred`). Over a tile every index lies in an interval (`InBox`), so a form's least value there is
`Σ c_a * (c_a ≥ 0 ? lo_a : hi_a) + offset` (`formMin`); where it is positive the comparison is false at
every element.

* `Pred.allFalse` is the computable check; `allFalse_sound` proves that where it answers `true`, the
  predicate is false at every index of the box.
* `skippedOk` checks, for a loop over axis `s` tiled by `block` with `steps` steps, that every step
  outside the run range `[lo, hi)` has an all-false tile; `skipped_steps_masked` proves that then
  every element of every skipped step is masked.

`Superopt/Schedule.lean` runs `skippedOk` on every plan loop that skips tiles, with the loop's
`visible` predicate read from the plan's JSON, and checks that predicate's conjuncts are conjuncts of
the masks of the terms the kernel computes (`maskedSkip_sound`). What is not proved: that an all-false
tile leaves every loop state unchanged (the abstract evaluation of the loop body in
`pyrunner/rules/masking.py`, re-checked by Python's `validate`), and that the kernel's ops evaluate
those masks (Python's `kernel_match`).
-/

namespace Superopt

/-- `Σ coef_a * index_a + offset ≤ 0` over integer indices. -/
structure Atom where
  coef : List (Axis × Int)
  offset : Int
  deriving Repr, DecidableEq

/-- An index predicate: comparisons combined by `and` and `or`. -/
inductive Pred where
  | atom (a : Atom)
  | and (p q : Pred)
  | or (p q : Pred)
  deriving Repr, DecidableEq

/-- The value of an affine form at an index. -/
def formValue (idx : Axis → Int) : List (Axis × Int) → Int
  | [] => 0
  | (ax, c) :: rest => c * idx ax + formValue idx rest

/-- Whether the predicate holds at an index (the element is visible). -/
def Pred.holds (idx : Axis → Int) : Pred → Bool
  | .atom a => decide (formValue idx a.coef + a.offset ≤ 0)
  | .and p q => Pred.holds idx p && Pred.holds idx q
  | .or p q => Pred.holds idx p || Pred.holds idx q

/-- A tile: for every axis the least and the greatest index (inclusive). -/
abbrev Box := Axis → Int × Int

/-- The index lies in the box. -/
def InBox (box : Box) (idx : Axis → Int) : Prop := ∀ a, (box a).1 ≤ idx a ∧ idx a ≤ (box a).2

/-- The least value of an affine form over a box (interval arithmetic, exact for one form). -/
def formMin (box : Box) : List (Axis × Int) → Int
  | [] => 0
  | (ax, c) :: rest => (if c ≥ 0 then c * (box ax).1 else c * (box ax).2) + formMin box rest

/-- Whether the predicate is provably false at every index of the box. -/
def Pred.allFalse (box : Box) : Pred → Bool
  | .atom a => decide (formMin box a.coef + a.offset > 0)
  | .and p q => Pred.allFalse box p || Pred.allFalse box q
  | .or p q => Pred.allFalse box p && Pred.allFalse box q

theorem formMin_le (box : Box) (idx : Axis → Int) (h : InBox box idx) :
    ∀ l : List (Axis × Int), formMin box l ≤ formValue idx l
  | [] => by
    show (0 : Int) ≤ 0
    omega
  | (ax, c) :: rest => by
    have ih := formMin_le box idx h rest
    have hb := h ax
    show (if c ≥ 0 then c * (box ax).1 else c * (box ax).2) + formMin box rest ≤
      c * idx ax + formValue idx rest
    by_cases hc : c ≥ 0
    · rw [if_pos hc]
      have hm : c * (box ax).1 ≤ c * idx ax := Int.mul_le_mul_of_nonneg_left hb.1 hc
      omega
    · rw [if_neg hc]
      have hm : c * (box ax).2 ≤ c * idx ax := Int.mul_le_mul_of_nonpos_left (by omega) hb.2
      omega

theorem band_false_left (b : Bool) : (false && b) = false := rfl

theorem band_false_right (b : Bool) : (b && false) = false := by
  cases b <;> rfl

theorem bor_false_false : (false || false) = false := rfl

/-- Where `allFalse` answers `true`, the predicate is false at every index of the box. -/
theorem allFalse_sound (box : Box) (idx : Axis → Int) (h : InBox box idx) :
    ∀ p : Pred, p.allFalse box = true → p.holds idx = false
  | .atom a, hf => by
    have h1 : formMin box a.coef + a.offset > 0 := of_decide_eq_true hf
    have h2 : formMin box a.coef ≤ formValue idx a.coef := formMin_le box idx h a.coef
    show decide (formValue idx a.coef + a.offset ≤ 0) = false
    exact decide_eq_false (by omega)
  | .and p q, hf => by
    have hf' : (p.allFalse box || q.allFalse box) = true := hf
    show (p.holds idx && q.holds idx) = false
    cases hp : p.allFalse box with
    | true =>
      rw [allFalse_sound box idx h p hp, band_false_left]
    | false =>
      rw [hp] at hf'
      have hq : q.allFalse box = true := hf'
      rw [allFalse_sound box idx h q hq, band_false_right]
  | .or p q, hf => by
    have hf' : (p.allFalse box && q.allFalse box) = true := hf
    show (p.holds idx || q.holds idx) = false
    cases hp : p.allFalse box with
    | false =>
      rw [hp] at hf'
      have h0 : false = true := hf'
      cases h0
    | true =>
      rw [hp] at hf'
      have hq : q.allFalse box = true := hf'
      rw [allFalse_sound box idx h p hp, allFalse_sound box idx h q hq, bor_false_false]

/-- The box of loop step `j` along axis `s` (tiles of `block` indices), the other axes as in `box`. -/
def stepBox (box : Box) (s : Axis) (block : Int) (j : Nat) : Box :=
  fun a => if a = s then ((j : Int) * block, (j : Int) * block + block - 1) else box a

/-- `f 0 && f 1 && ... && f (n - 1)`. -/
def allBelow (f : Nat → Bool) : Nat → Bool
  | 0 => true
  | n + 1 => allBelow f n && f n

theorem allBelow_spec (f : Nat → Bool) : ∀ n, allBelow f n = true → ∀ j, j < n → f j = true
  | 0, _, j, hj => absurd hj (by omega)
  | n + 1, h, j, hj => by
    have h' : (allBelow f n && f n) = true := h
    cases ha : allBelow f n with
    | false =>
      rw [ha] at h'
      have h0 : false = true := h'
      cases h0
    | true =>
      rw [ha] at h'
      have hfn : f n = true := h'
      by_cases hjn : j = n
      · rw [hjn]
        exact hfn
      · exact allBelow_spec f n ha j (by omega)

/-- Every loop step outside the run range `[lo, hi)` has an all-false tile (the check a kernel's
loop bounds must pass, for the block of the other axes given by `box`). -/
def skippedOk (p : Pred) (box : Box) (s : Axis) (block : Int) (steps lo hi : Nat) : Bool :=
  allBelow (fun j => decide (lo ≤ j ∧ j < hi) || p.allFalse (stepBox box s block j)) steps

/-- Where `skippedOk` holds, every element of every step the loop leaves out is masked. -/
theorem skipped_steps_masked (p : Pred) (box : Box) (s : Axis) (block : Int) (steps lo hi : Nat)
    (hok : skippedOk p box s block steps lo hi = true) (j : Nat) (hj : j < steps)
    (hout : ¬ (lo ≤ j ∧ j < hi)) (idx : Axis → Int) (hin : InBox (stepBox box s block j) idx) :
    p.holds idx = false := by
  have hstep := allBelow_spec _ steps hok j hj
  have hd : decide (lo ≤ j ∧ j < hi) = false := decide_eq_false hout
  have hstep' : (decide (lo ≤ j ∧ j < hi) || p.allFalse (stepBox box s block j)) = true := hstep
  rw [hd] at hstep'
  have hf : p.allFalse (stepBox box s block j) = true := hstep'
  exact allFalse_sound (stepBox box s block j) idx hin p hf

end Superopt

import Superopt.Eval

/-!
# Replaying a derivation: each rule as a computable rewrite, proven sound

A plan's certificate (Python `pyrunner/rules/replay_plan.py`) records, for every algebraic step, the
rule, its instantiation and a position: an output of the graph and a path of operand indices. Here a
rule instance (`Rule`) carries everything the rule binds: the sub-terms, the axes and the operand
choices. It names the term it rewrites (`Rule.lhs`), the term it gives (`Rule.rhs`) and its side
condition (`Rule.side`, computed: an axis not among a term's axes, a positive scale, two different
contracted axes). `Rule.apply r t` is `some r.rhs` exactly when `t` is `r.lhs` and the side condition
holds. `Rule.sound` proves, for every instance whose side condition holds, that `rhs` and `lhs` have
the same value at every index, and `Rule.apply_sound` follows. `replay` runs the steps from the
graph's outputs, each rewriting every occurrence of the sub-term at its position (as Python does:
equal sub-terms are one value), and `replay_sound` says, by induction over the steps, that the
replayed outputs have the graph's values.

Which instance a certificate step means is read off the sub-term at its position by
`Superopt/Certificate.lean`; that reading is not trusted, since `Rule.apply` re-checks the instance
against the sub-term.

What the claim covers and what it does not:

* `exp_to_exp2` multiplies by the decimal constant `log2eDecimal` (Python's `LOG2E`, log2 e rounded
  to float64). Its soundness, and so `replay_sound`, assumes that constant denotes log2 e exactly
  (`hlog`); the float's rounding (relative error below 2^-53) is outside the claim.
* `variance_sum_of_squares` divides by an axis extent: `hsize` says no extent is zero as a scalar
  (true in the reals, where every axis has at least one element).
* The product rebuilds `elementwise_mul_assoc` / `elementwise_mul_comm` (`Rule.mulAssoc`, `Rule.mulComm`)
  read the factors off the product tree at the recorded paths (`Term.factorsAt`) and rebuild them
  left-nested in the recorded order; their side condition checks, by removing factors one by one
  (`sameFactors`), that the rebuilt product has the tree's factors, which is what the proof uses.
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

/-- `p @_a q` or, with `swap`, `q @_a p` (the operand order a step records). -/
def orientMatmul (swap : Bool) (p q : Term) (a : Axis) : Term :=
  match swap with
  | true => .matmul q p a
  | false => .matmul p q a

/-- `x * c`, or `x` itself without a scale (Python's optional scale of `exp_shift_to_max`). -/
def scaleBy : Option Term → Term → Term
  | none, x => x
  | some c, x => .binary .mul x c

/-- The softmax `E(x) / sum_a E(x)`. -/
def softmaxOf (fn : UnaryOp) (x : Term) (a : Axis) : Term :=
  .binary .div (.unary fn x) (.reduce .sum (.unary fn x) a)

/-- Whether `sub` occurs in `t` (Python's `m in subterms([n])`). -/
def Term.contains (sub : Term) : Term → Bool
  | .unary f x => decide (Term.unary f x = sub) || Term.contains sub x
  | .binary f a b => decide (Term.binary f a b = sub) || Term.contains sub a || Term.contains sub b
  | .ternary f c a b =>
    decide (Term.ternary f c a b = sub) || Term.contains sub c || Term.contains sub a ||
      Term.contains sub b
  | .reduce f x ax => decide (Term.reduce f x ax = sub) || Term.contains sub x
  | .matmul a b ax => decide (Term.matmul a b ax = sub) || Term.contains sub a || Term.contains sub b
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

/-- An optional scale Python accepts: none, or a positive term without axes. -/
def scaleOk : Option Term → Bool
  | none => true
  | some c => c.resultAxes.isEmpty && c.positive

/-! ## Product trees: the factors at given paths, and the tree rebuilt left-nested -/

/-- Paths below a product node split by their first step: the tails of the ones into the left operand
(which must come first) and of the ones into the right operand; `none` for an empty path or a step
other than 0 or 1, or a left path after a right one. -/
def splitPaths : List (List Nat) → Option (List (List Nat) × List (List Nat))
  | [] => some ([], [])
  | (0 :: p) :: rest => (splitPaths rest).map fun lr => (p :: lr.1, lr.2)
  | (1 :: p) :: rest => (splitPaths rest).bind fun lr => if lr.1.isEmpty then some ([], p :: lr.2) else none
  | _ => none

/-- The product case of `Term.factorsAt`: the operands' factors along the split paths, concatenated. -/
def splitJoin (sp : Option (List (List Nat) × List (List Nat))) (fa fb : List (List Nat) → Option (List Term)) :
    Option (List Term) :=
  sp.bind fun lr => (fa lr.1).bind fun x => (fb lr.2).map fun y => x ++ y

/-- The factors of the product tree of `t` whose leaves are at `paths`, left to right (Python's
`product_factors`): the path `[]` alone is the term itself; otherwise the term is a `mul` and the
paths split between its operands. `none` where the paths are not exactly the leaves of such a tree.
One equation per constructor, so each unfolds without side conditions. -/
def Term.factorsAt : Term → List (List Nat) → Option (List Term)
  | .input n axes, paths => if paths = [[]] then some [.input n axes] else none
  | .const d, paths => if paths = [[]] then some [.const d] else none
  | .negInf, paths => if paths = [[]] then some [.negInf] else none
  | .axisSize a, paths => if paths = [[]] then some [.axisSize a] else none
  | .iota a, paths => if paths = [[]] then some [.iota a] else none
  | .unary f x, paths => if paths = [[]] then some [.unary f x] else none
  | .binary f a b, paths =>
    if paths = [[]] then some [.binary f a b]
    else if f = .mul then splitJoin (splitPaths paths) (fun l => Term.factorsAt a l) (fun r => Term.factorsAt b r)
    else none
  | .ternary f c a b, paths => if paths = [[]] then some [.ternary f c a b] else none
  | .reduce f x ax, paths => if paths = [[]] then some [.reduce f x ax] else none
  | .matmul a b ax, paths => if paths = [[]] then some [.matmul a b ax] else none

/-- `((acc * f₁) * f₂) * ...`: a product built left-nested. -/
def leftProd : Term → List Term → Term
  | acc, [] => acc
  | acc, f :: fs => leftProd (.binary .mul acc f) fs

/-- The factors multiplied left-nested (Python's `left_product`; no factor gives `-∞`, which a rule's
side condition never lets through). -/
def rebuild : List Term → Term
  | [] => .negInf
  | f :: fs => leftProd f fs

/-- The factors in the order `perm` (indices into `fs`; one out of range is dropped). -/
def pickAll (fs : List Term) (perm : List Nat) : List Term := perm.filterMap fun k => fs[k]?

/-- `l` without the first occurrence of `x`, `none` where `x` does not occur. -/
def removeOne (x : Term) : List Term → Option (List Term)
  | [] => none
  | y :: l => if y = x then some l else (removeOne x l).map (y :: ·)

/-- The two lists hold the same factors, each as often (computed by removing them one by one). -/
def sameFactors : List Term → List Term → Bool
  | [], l => l.isEmpty
  | x :: l₁, l₂ => ((removeOne x l₂).map (sameFactors l₁)).getD false

/-- `perm` is a permutation of `0, ..., n-1` (Python: `sorted(choice) == range(n)`). -/
def isPerm (perm : List Nat) (n : Nat) : Bool :=
  decide (perm.length = n) && (List.range n).all fun k => perm.contains k

/-- The side condition of the reordering: two or more factors, `perm` a permutation of them, and the
picked factors the same as the tree's (the fact the proof uses). -/
def commOk (fs : List Term) (perm : List Nat) : Bool :=
  decide (2 ≤ fs.length) && isPerm perm fs.length && sameFactors (pickAll fs perm) fs

/--
The algebraic rules, each with its whole instantiation: the sub-terms, axes and operand choices it
binds (one constructor per proven form; the flags are Python's operand choices).
-/
inductive Rule where
  /-- `softmax_max_shift`: `E(x) / sum_a E(x)` to `E(x - max_a x) / sum_a E(x - max_a x)`. -/
  | softmaxMaxShift (fn : UnaryOp) (x : Term) (a : Axis)
  /-- `softmax_scaled_max_shift`: the softmax of `y * c` (`c * y` with `cLeft`) to the softmax of
  `(y - max_a y) * c` (`c * (y - max_a y)`). -/
  | softmaxScaledMaxShift (y c : Term) (a : Axis) (cLeft : Bool)
  /-- `matmul_div_commute`: `(p / l) @_a v` to `(p @_a v) / l`. -/
  | matmulDivLeft (p l v : Term) (a : Axis)
  /-- `matmul_div_commute`: `v @_a (p / l)` to `(v @_a p) / l`. -/
  | matmulDivRight (v p l : Term) (a : Axis)
  /-- `matmul_row_scale_commute`: `(x * s) @_a w` to `(x @_a w) * s` (`s * (x @_a w)` with `first`). -/
  | rowScaleXS (x s w : Term) (a : Axis) (first : Bool)
  /-- `matmul_row_scale_commute`: `(s * x) @_a w`. -/
  | rowScaleSX (s x w : Term) (a : Axis) (first : Bool)
  /-- `matmul_row_scale_commute`: `w @_a (x * s)`. -/
  | rowScaleWXS (w x s : Term) (a : Axis) (first : Bool)
  /-- `matmul_row_scale_commute`: `w @_a (s * x)`. -/
  | rowScaleWSX (w s x : Term) (a : Axis) (first : Bool)
  /-- `exp_to_exp2`: `exp x` to `exp2 (x * LOG2E)`. -/
  | expToExp2 (x : Term)
  /-- `mean_to_sum_div`: `mean_a x` to `sum_a x / |a|`. -/
  | meanToSumDiv (x : Term) (a : Axis)
  /-- `variance_sum_of_squares`: `mean_a ((x - mean_a x)²)` to `mean_a (x²) - (mean_a x)²`. -/
  | varianceSumOfSquares (x : Term) (a : Axis)
  /-- `matmul_as_sum`: `x @_a w` to `sum_a (x * w)` (`w * x` with `swap`). -/
  | matmulAsSum (x w : Term) (a : Axis) (swap : Bool)
  /-- `matmul_assoc`: `(A @_j B) @_k C` to `A @_j (B @_k C)`, every product in the operand order its
  flag says (Python's operand choices). -/
  | matmulAssoc (A B C : Term) (j k : Axis) (outerSwap innerSwap bcSwap outSwap : Bool)
  /-- `exp_shift_to_max`: `E((x - n) [* c])` to `E((x - m) [* c]) * E((m - n) [* c])`, `m = max_a x`. -/
  | expShiftToMax (fn : UnaryOp) (x n : Term) (c : Option Term) (a : Axis)
  /-- `sum_scale_commute`: `sum_a (x * s)` to `sum_a x * s` (`s * sum_a x` with `first`). -/
  | sumScaleRight (x s : Term) (a : Axis) (first : Bool)
  /-- `sum_scale_commute`: `sum_a (s * x)` to `sum_a x * s` (`s * sum_a x` with `first`). -/
  | sumScaleLeft (s x : Term) (a : Axis) (first : Bool)
  /-- `sum_scale_commute`: `sum_a (x / s)` to `sum_a x / s`. -/
  | sumScaleDiv (x s : Term) (a : Axis)
  /-- `elementwise_mul_assoc`: the product tree of `t` whose factors are at `paths`, regrouped
  left-nested, its factors in order. -/
  | mulAssoc (t : Term) (paths : List (List Nat))
  /-- `elementwise_mul_comm`: the product tree of `t` whose factors are at `paths`, rebuilt left-nested
  in the order `perm`. -/
  | mulComm (t : Term) (paths : List (List Nat)) (perm : List Nat)

/-- The rule's name as plans spell it. -/
def Rule.name : Rule → String
  | .softmaxMaxShift .. => "softmax_max_shift"
  | .softmaxScaledMaxShift .. => "softmax_scaled_max_shift"
  | .matmulDivLeft .. => "matmul_div_commute"
  | .matmulDivRight .. => "matmul_div_commute"
  | .rowScaleXS .. => "matmul_row_scale_commute"
  | .rowScaleSX .. => "matmul_row_scale_commute"
  | .rowScaleWXS .. => "matmul_row_scale_commute"
  | .rowScaleWSX .. => "matmul_row_scale_commute"
  | .expToExp2 .. => "exp_to_exp2"
  | .meanToSumDiv .. => "mean_to_sum_div"
  | .varianceSumOfSquares .. => "variance_sum_of_squares"
  | .matmulAsSum .. => "matmul_as_sum"
  | .matmulAssoc .. => "matmul_assoc"
  | .expShiftToMax .. => "exp_shift_to_max"
  | .sumScaleRight .. => "sum_scale_commute"
  | .sumScaleLeft .. => "sum_scale_commute"
  | .sumScaleDiv .. => "sum_scale_commute"
  | .mulAssoc .. => "elementwise_mul_assoc"
  | .mulComm .. => "elementwise_mul_comm"

/-- The term a rule instance rewrites. -/
def Rule.lhs : Rule → Term
  | .softmaxMaxShift fn x a => softmaxOf fn x a
  | .softmaxScaledMaxShift y c a cLeft => softmaxOf .exp (orientMul cLeft y c) a
  | .matmulDivLeft p l v a => .matmul (.binary .div p l) v a
  | .matmulDivRight v p l a => .matmul v (.binary .div p l) a
  | .rowScaleXS x s w a _ => .matmul (.binary .mul x s) w a
  | .rowScaleSX s x w a _ => .matmul (.binary .mul s x) w a
  | .rowScaleWXS w x s a _ => .matmul w (.binary .mul x s) a
  | .rowScaleWSX w s x a _ => .matmul w (.binary .mul s x) a
  | .expToExp2 x => .unary .exp x
  | .meanToSumDiv x a => .reduce .mean x a
  | .varianceSumOfSquares x a => .reduce .mean (.unary .square (.binary .sub x (.reduce .mean x a))) a
  | .matmulAsSum x w a _ => .matmul x w a
  | .matmulAssoc A B C j k outerSwap innerSwap _ _ =>
    orientMatmul outerSwap (orientMatmul innerSwap A B j) C k
  | .expShiftToMax fn x n c _ => .unary fn (scaleBy c (.binary .sub x n))
  | .sumScaleRight x s a _ => .reduce .sum (.binary .mul x s) a
  | .sumScaleLeft s x a _ => .reduce .sum (.binary .mul s x) a
  | .sumScaleDiv x s a => .reduce .sum (.binary .div x s) a
  | .mulAssoc t _ => t
  | .mulComm t _ _ => t

/-- The term a rule instance gives. -/
def Rule.rhs : Rule → Term
  | .softmaxMaxShift fn x a => softmaxOf fn (.binary .sub x (.reduce .max x a)) a
  | .softmaxScaledMaxShift y c a cLeft =>
    softmaxOf .exp (orientMul cLeft (.binary .sub y (.reduce .max y a)) c) a
  | .matmulDivLeft p l v a => .binary .div (.matmul p v a) l
  | .matmulDivRight v p l a => .binary .div (.matmul v p a) l
  | .rowScaleXS x s w a first => orientMul first (.matmul x w a) s
  | .rowScaleSX s x w a first => orientMul first (.matmul x w a) s
  | .rowScaleWXS w x s a first => orientMul first (.matmul w x a) s
  | .rowScaleWSX w s x a first => orientMul first (.matmul w x a) s
  | .expToExp2 x => .unary .exp2 (.binary .mul x (.const log2eDecimal))
  | .meanToSumDiv x a => .binary .div (.reduce .sum x a) (.axisSize a)
  | .varianceSumOfSquares x a =>
    .binary .sub (.reduce .mean (.unary .square x) a) (.unary .square (.reduce .mean x a))
  | .matmulAsSum x w a swap => .reduce .sum (orientMul swap x w) a
  | .matmulAssoc A B C j k _ _ bcSwap outSwap => orientMatmul outSwap A (orientMatmul bcSwap B C k) j
  | .expShiftToMax fn x n c a =>
    .binary .mul (.unary fn (scaleBy c (.binary .sub x (.reduce .max x a))))
      (.unary fn (scaleBy c (.binary .sub (.reduce .max x a) n)))
  | .sumScaleRight x s a first => orientMul first (.reduce .sum x a) s
  | .sumScaleLeft s x a first => orientMul first (.reduce .sum x a) s
  | .sumScaleDiv x s a => .binary .div (.reduce .sum x a) s
  | .mulAssoc t paths => rebuild ((t.factorsAt paths).getD [])
  | .mulComm t paths perm => rebuild (pickAll ((t.factorsAt paths).getD []) perm)

/-- The rule's side condition, as Python checks it (`pyrunner/rules/replay.py`). -/
def Rule.side : Rule → Bool
  | .softmaxMaxShift fn x a => decide ((fn = .exp ∨ fn = .exp2) ∧ a ∈ x.resultAxes)
  | .softmaxScaledMaxShift y c a _ =>
    decide (c.resultAxes = [] ∧ a ∉ c.resultAxes ∧ c.positive = true ∧ a ∈ y.resultAxes)
  | .matmulDivLeft _ l _ a => decide (a ∉ l.resultAxes)
  | .matmulDivRight _ _ l a => decide (a ∉ l.resultAxes)
  | .rowScaleXS _ s _ a _ => decide (a ∉ s.resultAxes)
  | .rowScaleSX s _ _ a _ => decide (a ∉ s.resultAxes)
  | .rowScaleWXS _ _ s a _ => decide (a ∉ s.resultAxes)
  | .rowScaleWSX _ s _ a _ => decide (a ∉ s.resultAxes)
  | .expToExp2 _ => true
  | .meanToSumDiv _ _ => true
  | .varianceSumOfSquares _ _ => true
  | .matmulAsSum x w a _ =>
    decide (x.resultAxes.filter (fun y => decide (y ≠ a ∧ y ∉ w.resultAxes)) = [] ∨
      w.resultAxes.filter (fun y => decide (y ≠ a ∧ y ∉ x.resultAxes)) = [])
  | .matmulAssoc A B C j k _ _ _ _ =>
    decide (j ≠ k ∧ k ∉ A.resultAxes ∧ j ∉ C.resultAxes ∧ k ∈ B.resultAxes)
  | .expShiftToMax fn x n c a =>
    decide ((fn = .exp ∨ fn = .exp2) ∧ scaleOk c = true ∧ a ∈ x.resultAxes ∧ a ∉ n.resultAxes ∧
      n ≠ .reduce .max x a ∧ Term.contains (.reduce .max x a) n = true)
  | .sumScaleRight x s a _ => decide (a ∉ s.resultAxes ∧ a ∈ x.resultAxes)
  | .sumScaleLeft s x a _ => decide (a ∉ s.resultAxes ∧ a ∈ x.resultAxes)
  | .sumScaleDiv x s a => decide (a ∉ s.resultAxes ∧ a ∈ x.resultAxes)
  | .mulAssoc t paths => (t.factorsAt paths).isSome && decide (2 ≤ ((t.factorsAt paths).getD []).length)
  | .mulComm t paths perm => (t.factorsAt paths).isSome && commOk ((t.factorsAt paths).getD []) perm

/-- The rule applied to a term: its result where the term is the instance's `lhs` and the side
condition holds, `none` otherwise. -/
def Rule.apply (r : Rule) (t : Term) : Option Term :=
  if t = r.lhs ∧ r.side = true then some r.rhs else none

/-- From `o.bind f = some c`: `o` is some `b` with `f b = some c`. -/
theorem bind_eq_some_elim {β γ : Type} {o : Option β} {f : β → Option γ} {c : γ}
    (h : o.bind f = some c) : ∃ b, o = some b ∧ f b = some c := by
  cases o with
  | none =>
    have h' : (none : Option γ) = some c := h
    cases h'
  | some b => exact ⟨b, rfl, h⟩

/-- From `o.map f = some c`: `o` is some `b` with `f b = c`. -/
theorem map_eq_some_elim {β γ : Type} {o : Option β} {f : β → γ} {c : γ}
    (h : o.map f = some c) : ∃ b, o = some b ∧ f b = c := by
  cases o with
  | none =>
    have h' : (none : Option γ) = some c := h
    cases h'
  | some b =>
    have h' : some (f b) = some c := h
    cases h'
    exact ⟨b, rfl, rfl⟩

/-! ## Soundness of each rewrite -/

section Sound

variable {α : Type} [ScalarField α] [ScalarOps α]

theorem orientMul_eval (ctx : Ctx α) (swap : Bool) (a b : Term) (i : Index) :
    Term.eval ctx (orientMul swap a b) i = Term.eval ctx (.binary .mul a b) i := by
  cases swap with
  | false => rfl
  | true => exact term_elementwise_mul_comm ctx b a i

theorem orientMatmul_eval (ctx : Ctx α) (swap : Bool) (p q : Term) (a : Axis) (i : Index) :
    Term.eval ctx (orientMatmul swap p q a) i = Term.eval ctx (.matmul p q a) i := by
  cases swap with
  | false => rfl
  | true =>
    simp only [orientMatmul, Term.eval]
    exact listSum_map_ext (List.range (ctx.size a))
      (fun k => Term.eval ctx q (Index.set i a k) * Term.eval ctx p (Index.set i a k))
      (fun k => Term.eval ctx p (Index.set i a k) * Term.eval ctx q (Index.set i a k))
      (fun k => ScalarField.mul_comm _ _)

/-- A reduction of terms with equal values has equal values. -/
theorem reduce_congr (ctx : Ctx α) (f : ReduceOp) (x y : Term) (a : Axis)
    (h : ∀ j, Term.eval ctx x j = Term.eval ctx y j) (i : Index) :
    Term.eval ctx (.reduce f x a) i = Term.eval ctx (.reduce f y a) i := by
  simp only [Term.eval, h]

/-- A product of terms with equal values has equal values. -/
theorem matmul_congr (ctx : Ctx α) (p p' q q' : Term) (a : Axis)
    (hp : ∀ j, Term.eval ctx p j = Term.eval ctx p' j) (hq : ∀ j, Term.eval ctx q j = Term.eval ctx q' j)
    (i : Index) : Term.eval ctx (.matmul p q a) i = Term.eval ctx (.matmul p' q' a) i := by
  simp only [Term.eval, hp, hq]

/-- A softmax of terms with equal values has equal values. -/
theorem softmaxOf_congr (ctx : Ctx α) (fn : UnaryOp) (x y : Term) (a : Axis)
    (h : ∀ j, Term.eval ctx x j = Term.eval ctx y j) (i : Index) :
    Term.eval ctx (softmaxOf fn x a) i = Term.eval ctx (softmaxOf fn y a) i := by
  simp only [softmaxOf, Term.eval, h]

/-- `exp_shift_to_max` on terms, for `E = exp` or `exp2`, with or without a scale, for any `m`. -/
theorem term_exp_shift (ctx : Ctx α) (fn : UnaryOp) (hfn : fn = .exp ∨ fn = .exp2) (x n m : Term)
    (c : Option Term) (i : Index) :
    Term.eval ctx (.binary .mul (.unary fn (scaleBy c (.binary .sub x m)))
        (.unary fn (scaleBy c (.binary .sub m n)))) i =
      Term.eval ctx (.unary fn (scaleBy c (.binary .sub x n))) i := by
  have hadd : ∀ p q : α, UnaryOp.eval fn p * UnaryOp.eval fn q = UnaryOp.eval fn (p + q) := by
    intro p q
    cases hfn with
    | inl h =>
      cases h
      exact (ScalarField.exp_add p q).symm
    | inr h =>
      cases h
      exact (exp2_add p q).symm
  have hsc : Term.eval ctx (scaleBy c (.binary .sub x m)) i + Term.eval ctx (scaleBy c (.binary .sub m n)) i =
      Term.eval ctx (scaleBy c (.binary .sub x n)) i := by
    cases c with
    | none =>
      simp only [scaleBy, Term.eval, BinaryOp.eval]
      exact sub_add_sub_cancel _ _ _
    | some cc =>
      simp only [scaleBy, Term.eval, BinaryOp.eval]
      rw [← ScalarField.right_distrib, sub_add_sub_cancel]
  show UnaryOp.eval fn (Term.eval ctx (scaleBy c (.binary .sub x m)) i) *
      UnaryOp.eval fn (Term.eval ctx (scaleBy c (.binary .sub m n)) i) =
    UnaryOp.eval fn (Term.eval ctx (scaleBy c (.binary .sub x n)) i)
  rw [hadd, hsc]

/-- From `a && b`: `a`. -/
theorem band_left {a b : Bool} (h : (a && b) = true) : a = true := by
  cases a <;> cases b <;> first | rfl | exact h

/-- From `a && b`: `b`. -/
theorem band_right {a b : Bool} (h : (a && b) = true) : b = true := by
  cases a <;> cases b <;> first | rfl | exact h

/-- The product of the factors' values at an index (`one` for no factor). -/
def prodEval (ctx : Ctx α) : List Term → Index → α
  | [], _ => ScalarField.one
  | f :: fs, i => Term.eval ctx f i * prodEval ctx fs i

theorem prodEval_append (ctx : Ctx α) (i : Index) :
    ∀ l₁ l₂ : List Term, prodEval ctx (l₁ ++ l₂) i = prodEval ctx l₁ i * prodEval ctx l₂ i
  | [], l₂ => (ScalarField.one_mul (prodEval ctx l₂ i)).symm
  | f :: l₁, l₂ => by
    show Term.eval ctx f i * prodEval ctx (l₁ ++ l₂) i =
      Term.eval ctx f i * prodEval ctx l₁ i * prodEval ctx l₂ i
    rw [prodEval_append ctx i l₁ l₂]
    exact (ScalarField.mul_assoc _ _ _).symm

/-- A left-nested product has the product of its factors' values. -/
theorem leftProd_eval (ctx : Ctx α) (i : Index) :
    ∀ (fs : List Term) (acc : Term), Term.eval ctx (leftProd acc fs) i = Term.eval ctx acc i * prodEval ctx fs i
  | [], acc => (ScalarField.mul_one (Term.eval ctx acc i)).symm
  | f :: fs, acc => by
    show Term.eval ctx (leftProd (.binary .mul acc f) fs) i =
      Term.eval ctx acc i * (Term.eval ctx f i * prodEval ctx fs i)
    rw [leftProd_eval ctx i fs (.binary .mul acc f)]
    exact ScalarField.mul_assoc (Term.eval ctx acc i) (Term.eval ctx f i) (prodEval ctx fs i)

/-- A rebuilt product of at least one factor has the product of its factors' values. -/
theorem rebuild_eval (ctx : Ctx α) (i : Index) :
    ∀ fs : List Term, fs.isEmpty = false → Term.eval ctx (rebuild fs) i = prodEval ctx fs i
  | [], h => by
    have h0 : true = false := h
    cases h0
  | f :: fs, _ => leftProd_eval ctx i fs f

/-- A leaf of `Term.factorsAt`: the term is its one factor. -/
theorem factorsAt_leaf (ctx : Ctx α) (t : Term) (paths : List (List Nat)) (fs : List Term)
    (h : (if paths = [[]] then some [t] else none) = some fs) : ∀ i, Term.eval ctx t i = prodEval ctx fs i := by
  intro i
  by_cases hp : paths = [[]]
  · rw [if_pos hp] at h
    cases h
    exact (ScalarField.mul_one (Term.eval ctx t i)).symm
  · rw [if_neg hp] at h
    cases h

/-- The factors `Term.factorsAt` finds multiply to the term's value. -/
theorem Term.factorsAt_sound (ctx : Ctx α) :
    ∀ (t : Term) (paths : List (List Nat)) (fs : List Term), t.factorsAt paths = some fs →
      ∀ i, Term.eval ctx t i = prodEval ctx fs i := by
  intro t
  induction t with
  | input n axes => exact fun paths fs h => factorsAt_leaf ctx (.input n axes) paths fs h
  | const d => exact fun paths fs h => factorsAt_leaf ctx (.const d) paths fs h
  | negInf => exact fun paths fs h => factorsAt_leaf ctx .negInf paths fs h
  | axisSize a => exact fun paths fs h => factorsAt_leaf ctx (.axisSize a) paths fs h
  | iota a => exact fun paths fs h => factorsAt_leaf ctx (.iota a) paths fs h
  | unary f x _ => exact fun paths fs h => factorsAt_leaf ctx (.unary f x) paths fs h
  | ternary f c a b _ _ _ => exact fun paths fs h => factorsAt_leaf ctx (.ternary f c a b) paths fs h
  | reduce f x ax _ => exact fun paths fs h => factorsAt_leaf ctx (.reduce f x ax) paths fs h
  | matmul a b ax _ _ => exact fun paths fs h => factorsAt_leaf ctx (.matmul a b ax) paths fs h
  | binary f a b iha ihb =>
    intro paths fs h
    have h1 : (if paths = [[]] then some [Term.binary f a b]
        else if f = .mul then splitJoin (splitPaths paths) (fun l => Term.factorsAt a l) (fun r => Term.factorsAt b r)
        else none) = some fs := h
    by_cases hp : paths = [[]]
    · rw [if_pos hp] at h1
      cases h1
      intro i
      exact (ScalarField.mul_one (Term.eval ctx (.binary f a b) i)).symm
    · rw [if_neg hp] at h1
      by_cases hf : f = .mul
      · rw [if_pos hf] at h1
        have h1' : (splitPaths paths).bind (fun lr => (Term.factorsAt a lr.1).bind fun x =>
            (Term.factorsAt b lr.2).map fun y => x ++ y) = some fs := h1
        obtain ⟨lr, _, h2⟩ := bind_eq_some_elim h1'
        have h2' : (Term.factorsAt a lr.1).bind (fun x => (Term.factorsAt b lr.2).map fun y => x ++ y) = some fs := h2
        obtain ⟨x, hx, h3⟩ := bind_eq_some_elim h2'
        have h3' : (Term.factorsAt b lr.2).map (fun y => x ++ y) = some fs := h3
        obtain ⟨y, hy, h4⟩ := map_eq_some_elim h3'
        have h4' : x ++ y = fs := h4
        subst hf
        intro i
        show Term.eval ctx a i * Term.eval ctx b i = prodEval ctx fs i
        rw [← h4', prodEval_append ctx i x y, iha lr.1 x hx i, ihb lr.2 y hy i]
      · rw [if_neg hf] at h1
        cases h1

/-- `a * (b * c) = b * (a * c)`. -/
theorem scalar_mul_left_comm (a b c : α) : a * (b * c) = b * (a * c) := by
  rw [← ScalarField.mul_assoc a b c, ScalarField.mul_comm a b, ScalarField.mul_assoc b a c]

/-- Taking one factor out of a list: the product is that factor times the rest's. -/
theorem removeOne_prod (ctx : Ctx α) (i : Index) (x : Term) :
    ∀ (l r : List Term), removeOne x l = some r → prodEval ctx l i = Term.eval ctx x i * prodEval ctx r i
  | [], r, h => by
    have h' : (none : Option (List Term)) = some r := h
    cases h'
  | y :: l, r, h => by
    have h' : (if y = x then some l else (removeOne x l).map (y :: ·)) = some r := h
    by_cases hy : y = x
    · rw [if_pos hy] at h'
      cases h'
      subst hy
      exact rfl
    · rw [if_neg hy] at h'
      obtain ⟨r', hr', h2⟩ := map_eq_some_elim h'
      have h2' : y :: r' = r := h2
      cases h2'
      show Term.eval ctx y i * prodEval ctx l i = Term.eval ctx x i * (Term.eval ctx y i * prodEval ctx r' i)
      rw [removeOne_prod ctx i x l r' hr']
      exact scalar_mul_left_comm _ _ _

/-- Lists with the same factors have the same product (commutativity and associativity). -/
theorem sameFactors_prod (ctx : Ctx α) (i : Index) :
    ∀ (l₁ l₂ : List Term), sameFactors l₁ l₂ = true → prodEval ctx l₁ i = prodEval ctx l₂ i
  | [], l₂, h => by
    have h' : l₂.isEmpty = true := h
    cases l₂ with
    | nil => rfl
    | cons _ _ =>
      have h0 : false = true := h'
      cases h0
  | x :: l₁, l₂, h => by
    have h' : ((removeOne x l₂).map (sameFactors l₁)).getD false = true := h
    cases hr : removeOne x l₂ with
    | none =>
      rw [hr] at h'
      have h0 : false = true := h'
      cases h0
    | some r =>
      rw [hr] at h'
      have h2 : sameFactors l₁ r = true := h'
      show Term.eval ctx x i * prodEval ctx l₁ i = prodEval ctx l₂ i
      rw [removeOne_prod ctx i x l₂ r hr, sameFactors_prod ctx i l₁ r h2]

/-- The same factors as a non-empty list are not none. -/
theorem sameFactors_nonempty :
    ∀ (l₁ l₂ : List Term), sameFactors l₁ l₂ = true → l₂.isEmpty = false → l₁.isEmpty = false
  | [], l₂, h, h2 => by
    have h' : l₂.isEmpty = true := h
    rw [h'] at h2
    cases h2
  | _ :: _, _, _, _ => rfl

/-- At least two factors make a non-empty list. -/
theorem nonempty_of_two (fs : List Term) (h : 2 ≤ fs.length) : fs.isEmpty = false := by
  cases fs with
  | nil => exact absurd h (by decide)
  | cons _ _ => rfl

/-- Every rule instance whose side condition holds keeps the value at every index (`exp_to_exp2`
over an exact log2 e, `hlog`; `variance_sum_of_squares` over extents that are not zero, `hsize`). -/
theorem Rule.sound (ctx : Ctx α) (hlog : ScalarOps.ofDecimal log2eDecimal = (ScalarField.log2e : α))
    (hsize : ∀ a : Axis, (natToScalar (ctx.size a) : α) ≠ ScalarField.zero) :
    ∀ r : Rule, r.side = true → ∀ i, Term.eval ctx r.rhs i = Term.eval ctx r.lhs i
  | .softmaxMaxShift fn x a, hs, i => by
    have hc : (fn = .exp ∨ fn = .exp2) ∧ a ∈ x.resultAxes := of_decide_eq_true hs
    cases hc.1 with
    | inl h =>
      cases h
      exact term_softmax_max_shift ctx x a i
    | inr h =>
      cases h
      exact term_softmax_max_shift_exp2 ctx x a i
  | .softmaxScaledMaxShift y c a cLeft, hs, i => by
    have hc : c.resultAxes = [] ∧ a ∉ c.resultAxes ∧ c.positive = true ∧ a ∈ y.resultAxes :=
      of_decide_eq_true hs
    show Term.eval ctx (softmaxOf .exp (orientMul cLeft (.binary .sub y (.reduce .max y a)) c) a) i =
      Term.eval ctx (softmaxOf .exp (orientMul cLeft y c) a) i
    rw [softmaxOf_congr ctx .exp (orientMul cLeft (.binary .sub y (.reduce .max y a)) c)
        (.binary .mul (.binary .sub y (.reduce .max y a)) c) a
        (orientMul_eval ctx cLeft (.binary .sub y (.reduce .max y a)) c) i,
      softmaxOf_congr ctx .exp (orientMul cLeft y c) (.binary .mul y c) a (orientMul_eval ctx cLeft y c) i]
    exact term_softmax_scaled_max_shift ctx y c a hc.2.1 i
  | .matmulDivLeft p l v a, hs, i => by
    have hc : a ∉ l.resultAxes := of_decide_eq_true hs
    exact (term_matmul_div_commute ctx p l v a hc i).symm
  | .matmulDivRight v p l a, hs, i => by
    have hc : a ∉ l.resultAxes := of_decide_eq_true hs
    exact (term_matmul_div_commute_right ctx v p l a hc i).symm
  | .rowScaleXS x s w a first, hs, i => by
    have hc : a ∉ s.resultAxes := of_decide_eq_true hs
    exact (orientMul_eval ctx first (.matmul x w a) s i).trans
      (term_matmul_row_scale_commute ctx x s w a hc i).symm
  | .rowScaleSX s x w a first, hs, i => by
    have hc : a ∉ s.resultAxes := of_decide_eq_true hs
    exact (orientMul_eval ctx first (.matmul x w a) s i).trans
      (term_matmul_row_scale_commute_scale_left ctx s x w a hc i).symm
  | .rowScaleWXS w x s a first, hs, i => by
    have hc : a ∉ s.resultAxes := of_decide_eq_true hs
    exact (orientMul_eval ctx first (.matmul w x a) s i).trans
      (term_matmul_row_scale_commute_right ctx w x s a hc i).symm
  | .rowScaleWSX w s x a first, hs, i => by
    have hc : a ∉ s.resultAxes := of_decide_eq_true hs
    exact (orientMul_eval ctx first (.matmul w x a) s i).trans
      (term_matmul_row_scale_commute_right_scale_left ctx w s x a hc i).symm
  | .expToExp2 x, _, i => (term_exp_to_exp2 ctx x log2eDecimal hlog i).symm
  | .meanToSumDiv x a, _, i => (term_mean_to_sum_div ctx x a i).symm
  | .varianceSumOfSquares x a, _, i => (term_variance_sum_of_squares ctx x a (hsize a) i).symm
  | .matmulAsSum x w a swap, _, i =>
    (reduce_congr ctx .sum (orientMul swap x w) (.binary .mul x w) a (orientMul_eval ctx swap x w) i).trans
      (term_matmul_as_sum ctx x w a i).symm
  | .matmulAssoc A B C j k outerSwap innerSwap bcSwap outSwap, hs, i => by
    have hc : j ≠ k ∧ k ∉ A.resultAxes ∧ j ∉ C.resultAxes ∧ k ∈ B.resultAxes := of_decide_eq_true hs
    show Term.eval ctx (orientMatmul outSwap A (orientMatmul bcSwap B C k) j) i =
      Term.eval ctx (orientMatmul outerSwap (orientMatmul innerSwap A B j) C k) i
    rw [orientMatmul_eval ctx outSwap A (orientMatmul bcSwap B C k) j i,
      orientMatmul_eval ctx outerSwap (orientMatmul innerSwap A B j) C k i,
      matmul_congr ctx A A (orientMatmul bcSwap B C k) (.matmul B C k) j (fun _ => rfl)
        (orientMatmul_eval ctx bcSwap B C k) i,
      matmul_congr ctx (orientMatmul innerSwap A B j) (.matmul A B j) C C k
        (orientMatmul_eval ctx innerSwap A B j) (fun _ => rfl) i]
    exact (term_matmul_assoc ctx A B C j k hc.1 hc.2.1 hc.2.2.1 i).symm
  | .expShiftToMax fn x n c a, hs, i => by
    have hc : (fn = .exp ∨ fn = .exp2) ∧ scaleOk c = true ∧ a ∈ x.resultAxes ∧ a ∉ n.resultAxes ∧
        n ≠ .reduce .max x a ∧ Term.contains (.reduce .max x a) n = true := of_decide_eq_true hs
    exact term_exp_shift ctx fn hc.1 x n (.reduce .max x a) c i
  | .sumScaleRight x s a first, hs, i => by
    have hc : a ∉ s.resultAxes ∧ a ∈ x.resultAxes := of_decide_eq_true hs
    exact (orientMul_eval ctx first (.reduce .sum x a) s i).trans
      (term_sum_scale_commute ctx x s a hc.1 i).symm
  | .sumScaleLeft s x a first, hs, i => by
    have hc : a ∉ s.resultAxes ∧ a ∈ x.resultAxes := of_decide_eq_true hs
    exact (orientMul_eval ctx first (.reduce .sum x a) s i).trans
      ((term_sum_scale_commute ctx x s a hc.1 i).symm.trans
        (reduce_congr ctx .sum (.binary .mul x s) (.binary .mul s x) a
          (fun j => term_elementwise_mul_comm ctx x s j) i))
  | .sumScaleDiv x s a, hs, i => by
    have hc : a ∉ s.resultAxes ∧ a ∈ x.resultAxes := of_decide_eq_true hs
    exact (term_sum_scale_commute_div ctx x s a hc.1 i).symm
  | .mulAssoc t paths, hs, i => by
    show Term.eval ctx (rebuild ((t.factorsAt paths).getD [])) i = Term.eval ctx t i
    cases hf : t.factorsAt paths with
    | none =>
      have hs' : ((t.factorsAt paths).isSome && decide (2 ≤ ((t.factorsAt paths).getD []).length)) = true := hs
      rw [hf] at hs'
      have h0 : false = true := band_left hs'
      cases h0
    | some fs =>
      have hs' : ((t.factorsAt paths).isSome && decide (2 ≤ ((t.factorsAt paths).getD []).length)) = true := hs
      rw [hf] at hs'
      have hlen : 2 ≤ fs.length := of_decide_eq_true (band_right hs')
      exact (rebuild_eval ctx i fs (nonempty_of_two fs hlen)).trans (Term.factorsAt_sound ctx t paths fs hf i).symm
  | .mulComm t paths perm, hs, i => by
    cases hf : t.factorsAt paths with
    | none =>
      have hs' : ((t.factorsAt paths).isSome && commOk ((t.factorsAt paths).getD []) perm) = true := hs
      rw [hf] at hs'
      have h0 : false = true := band_left hs'
      cases h0
    | some fs =>
      have hs' : ((t.factorsAt paths).isSome && commOk ((t.factorsAt paths).getD []) perm) = true := hs
      rw [hf] at hs'
      have hc : ((decide (2 ≤ fs.length) && isPerm perm fs.length) && sameFactors (pickAll fs perm) fs) = true :=
        band_right hs'
      have hsame : sameFactors (pickAll fs perm) fs = true := band_right hc
      have hlen : 2 ≤ fs.length := of_decide_eq_true (band_left (band_left hc))
      show Term.eval ctx (rebuild (pickAll ((t.factorsAt paths).getD []) perm)) i = Term.eval ctx t i
      rw [hf]
      exact (rebuild_eval ctx i (pickAll fs perm)
          (sameFactors_nonempty _ _ hsame (nonempty_of_two fs hlen))).trans
        ((sameFactors_prod ctx i _ _ hsame).trans (Term.factorsAt_sound ctx t paths fs hf i).symm)

/-- `Rule.apply_sound`: a rewrite keeps the term's value at every index (`exp_to_exp2` over an exact
log2 e, `hlog`; `variance_sum_of_squares` over extents that are not zero, `hsize`). -/
theorem Rule.apply_sound (ctx : Ctx α)
    (hlog : ScalarOps.ofDecimal log2eDecimal = (ScalarField.log2e : α))
    (hsize : ∀ a : Axis, (natToScalar (ctx.size a) : α) ≠ ScalarField.zero)
    (r : Rule) (t t' : Term) (h : r.apply t = some t') : ∀ i, Term.eval ctx t' i = Term.eval ctx t i := by
  have h' : (if t = r.lhs ∧ r.side = true then some r.rhs else none) = some t' := h
  by_cases hc : t = r.lhs ∧ r.side = true
  · rw [if_pos hc] at h'
    cases h'
    rw [hc.1]
    exact Rule.sound ctx hlog hsize r hc.2
  · rw [if_neg hc] at h'
    cases h'

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

/-- One step of a derivation: the rule instance and where it applies. -/
structure Step where
  rule : Rule
  output : Nat
  path : List Nat

/-- The sub-term at the step's position, or `none` where the position leaves the outputs. -/
def Step.sub? (outs : List Term) (s : Step) : Option Term :=
  (outs[s.output]?).bind fun root => Term.at? root s.path

/-- The sub-term at the step's position and its rewrite, or `none` where the rule does not apply. -/
def Step.run (outs : List Term) (s : Step) : Option (Term × Term) :=
  (s.sub? outs).bind fun sub => (s.rule.apply sub).map fun new => (sub, new)

/-- The outputs after the steps, each rewriting every occurrence of its sub-term in every output. -/
def replay (outs : List Term) : List Step → Option (List Term)
  | [] => some outs
  | s :: rest => (s.run outs).bind fun p => replay (outs.map (Term.replace p.1 p.2)) rest

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

/-- One node of `Term.replace`: the node becomes `new` where it is `old`, else `u`, of its value. -/
theorem replace_node (ctx : Ctx α) (old new : Term) (h : ∀ i, Term.eval ctx new i = Term.eval ctx old i)
    (t u : Term) (hu : ∀ i, Term.eval ctx u i = Term.eval ctx t i) :
    ∀ i, Term.eval ctx (if t = old then new else u) i = Term.eval ctx t i := by
  intro i
  by_cases hc : t = old
  · rw [if_pos hc, h i, hc]
  · rw [if_neg hc]
    exact hu i

/-- Replacing a sub-term by one of the same value keeps every term's value. -/
theorem Term.replace_sound (ctx : Ctx α) (old new : Term)
    (h : ∀ i, Term.eval ctx new i = Term.eval ctx old i) :
    ∀ (t : Term) (i : Index), Term.eval ctx (Term.replace old new t) i = Term.eval ctx t i := by
  intro t
  induction t with
  | input n axes => exact replace_node ctx old new h (.input n axes) (.input n axes) (fun _ => rfl)
  | const d => exact replace_node ctx old new h (.const d) (.const d) (fun _ => rfl)
  | negInf => exact replace_node ctx old new h .negInf .negInf (fun _ => rfl)
  | axisSize a => exact replace_node ctx old new h (.axisSize a) (.axisSize a) (fun _ => rfl)
  | iota a => exact replace_node ctx old new h (.iota a) (.iota a) (fun _ => rfl)
  | unary f x ih =>
    exact replace_node ctx old new h (.unary f x) (.unary f (Term.replace old new x))
      (fun i => by simp only [Term.eval, ih i])
  | binary f a b iha ihb =>
    exact replace_node ctx old new h (.binary f a b)
      (.binary f (Term.replace old new a) (Term.replace old new b))
      (fun i => by simp only [Term.eval, iha i, ihb i])
  | ternary f c a b ihc iha ihb =>
    exact replace_node ctx old new h (.ternary f c a b)
      (.ternary f (Term.replace old new c) (Term.replace old new a) (Term.replace old new b))
      (fun i => by simp only [Term.eval, ihc i, iha i, ihb i])
  | reduce f x ax ih =>
    exact replace_node ctx old new h (.reduce f x ax) (.reduce f (Term.replace old new x) ax)
      (fun i => by simp only [Term.eval, ih])
  | matmul a b ax iha ihb =>
    exact replace_node ctx old new h (.matmul a b ax)
      (.matmul (Term.replace old new a) (Term.replace old new b) ax)
      (fun i => by simp only [Term.eval, iha, ihb])

theorem Step.run_sound (ctx : Ctx α) (hlog : ScalarOps.ofDecimal log2eDecimal = (ScalarField.log2e : α))
    (hsize : ∀ a : Axis, (natToScalar (ctx.size a) : α) ≠ ScalarField.zero)
    (s : Step) (outs : List Term) (p : Term × Term) (h : s.run outs = some p) :
    ∀ i, Term.eval ctx p.2 i = Term.eval ctx p.1 i := by
  have h' : (s.sub? outs).bind (fun sub => (s.rule.apply sub).map fun new => (sub, new)) = some p := h
  obtain ⟨sub, _, h2⟩ := bind_eq_some_elim h'
  have h2' : (s.rule.apply sub).map (fun new => (sub, new)) = some p := h2
  obtain ⟨new, h3, h4⟩ := map_eq_some_elim h2'
  have h4' : (sub, new) = p := h4
  cases h4'
  exact Rule.apply_sound ctx hlog hsize s.rule sub new h3

/-- `replay_sound`: the replayed outputs have the graph's values at every index (`exp_to_exp2` over
an exact log2 e, `hlog`; extents that are not zero, `hsize`). -/
theorem replay_sound (ctx : Ctx α) (hlog : ScalarOps.ofDecimal log2eDecimal = (ScalarField.log2e : α))
    (hsize : ∀ a : Axis, (natToScalar (ctx.size a) : α) ≠ ScalarField.zero) :
    ∀ (steps : List Step) (outs outs' : List Term), replay outs steps = some outs' → Pointwise ctx outs' outs
  | [], outs, outs', h => by
    have h' : some outs = some outs' := h
    cases h'
    exact Pointwise.refl ctx _
  | s :: rest, outs, outs', h => by
    have h' : (s.run outs).bind (fun p => replay (outs.map (Term.replace p.1 p.2)) rest) = some outs' := h
    obtain ⟨p, hp, hrest⟩ := bind_eq_some_elim h'
    have hrest' : replay (outs.map (Term.replace p.1 p.2)) rest = some outs' := hrest
    exact Pointwise.trans ctx _ _ _ (replay_sound ctx hlog hsize rest _ _ hrest')
      (Pointwise.map ctx _ (Term.replace_sound ctx p.1 p.2 (Step.run_sound ctx hlog hsize s outs p hp)) outs)

end ReplaySound

end Superopt

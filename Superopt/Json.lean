import Superopt.Graph

/-!
# Graph JSON, written exactly as Python writes it

`Graph.jsonText` is the Lean twin of `pyrunner.ir.graph_json.graph_to_json` followed by Python's
`json.dumps` (separators `", "` and `": "`): the same nodes in the same order (operands before
users, shared sub-terms once), the same node names (output names, then the author's labels, then
`t1`, `t2`, ... for the rest), the same keys in the same order, and the same number text.

Numbers: Lean's `Float.toString` keeps six decimals, which would turn `1e-6` into `0.000001` at
best and damage `log2 e`. Graph constants are exact decimals (`Decimal`), printed here the way
Python prints the float they round to (`repr`): an integral value below `2^53` as an integer,
otherwise the shortest round-trip digits in fixed notation when the decimal point is between
`-4` and `16` places from the first digit, in exponent notation (`1e-06`) otherwise. For a decimal
of at most 15 significant digits, and for any decimal that is itself Python's `repr` of a float
(such as `1.4426950408889634`), those digits are exactly the decimal's own.
`tests/lean/SuperoptTest.lean` checks the printer on a table of values, and
`tests/test_lean_protocol.py` checks that table against Python's `repr`.
-/

namespace Superopt

/-- `s` as a JSON string literal (quotes, backslashes and control characters escaped). -/
def jsonString (s : String) : String :=
  let body := s.foldl (fun acc c =>
    if c = '"' then acc ++ "\\\""
    else if c = '\\' then acc ++ "\\\\"
    else if c = '\n' then acc ++ "\\n"
    else if c = '\r' then acc ++ "\\r"
    else if c = '\t' then acc ++ "\\t"
    else if c.toNat < 32 then
      acc ++ "\\u00" ++ String.singleton (Nat.digitChar (c.toNat / 16)) ++
        String.singleton (Nat.digitChar (c.toNat % 16))
    else acc.push c) ""
  "\"" ++ body ++ "\""

/-- A JSON list of already-rendered items, spaced as Python's `json.dumps`. -/
def jsonList (items : List String) : String := "[" ++ ", ".intercalate items ++ "]"

/-- A JSON object of already-rendered values, keys in the given order. -/
def jsonObj (fields : List (String × String)) : String :=
  "{" ++ ", ".intercalate (fields.map fun p => jsonString p.1 ++ ": " ++ p.2) ++ "}"

/-- `k` zeros. -/
def zeros (k : Nat) : String := "".pushn '0' k

/-- Drops trailing zeros of `m` (at most `fuel` of them), lowering the exponent `e` for each. -/
def stripZeros : Nat → Nat → Int → Nat × Int
  | 0, m, e => (m, e)
  | fuel + 1, m, e => if m ≠ 0 ∧ m % 10 = 0 then stripZeros fuel (m / 10) (e - 1) else (m, e)

/--
The significant digits of `|d|` (no trailing zeros) and the position of the decimal point:
`|d| = 0.DIGITS × 10^point`.
-/
def Decimal.digitsPoint (d : Decimal) : String × Int :=
  let m := d.mantissa.natAbs
  let p := stripZeros (toString m).length m (Int.ofNat d.exponent)
  let ds := toString p.1
  (ds, Int.ofNat ds.length - p.2)

/-- Python's `repr` of the float nearest to `d` (see the module note for when it is exact). -/
def Decimal.pyRepr (d : Decimal) : String :=
  let sign := if d.mantissa < 0 then "-" else ""
  let ds := d.digitsPoint.1
  let pt := d.digitsPoint.2
  let n : Int := Int.ofNat ds.length
  if d.mantissa = 0 then "0.0"
  else if pt < -3 ∨ pt > 16 then
    let x := pt - 1
    let mant := if ds.length = 1 then ds else ds.take 1 ++ "." ++ ds.drop 1
    let xs := toString x.natAbs
    let xs := if xs.length < 2 then "0" ++ xs else xs
    sign ++ mant ++ "e" ++ (if x < 0 then "-" else "+") ++ xs
  else if pt ≤ 0 then
    sign ++ "0." ++ zeros pt.natAbs ++ ds
  else if pt < n then
    sign ++ ds.take pt.toNat ++ "." ++ ds.drop pt.toNat
  else
    sign ++ ds ++ zeros (pt - n).toNat ++ ".0"

/--
The number as `graph_to_json` writes a constant: an integer when the value is integral and below
`2^53` in size (Python's `_num`), else Python's float `repr`.
-/
def Decimal.graphText (d : Decimal) : String :=
  let ds := d.digitsPoint.1
  let pt := d.digitsPoint.2
  let n : Int := Int.ofNat ds.length
  if d.mantissa = 0 then "0"
  else if pt ≥ n ∧ pt ≤ 17 then
    let v := ds.toNat?.getD 0 * 10 ^ (pt - n).toNat
    if v < 2 ^ 53 then (if d.mantissa < 0 then "-" else "") ++ toString v else d.pyRepr
  else d.pyRepr

/-! ## Graph to JSON (Python's `graph_to_json`) -/

/-- Appends `t` unless it is already there. -/
def pushNew (l : List Term) (t : Term) : List Term := if l.contains t then l else l ++ [t]

/-- `acc` followed by the sub-terms of `t` it lacks, operands before users (Python `subterms`). -/
def Term.collect : List Term → Term → List Term
  | acc, .unary f x => pushNew (Term.collect acc x) (.unary f x)
  | acc, .binary f a b => pushNew (Term.collect (Term.collect acc a) b) (.binary f a b)
  | acc, .ternary f c a b =>
    pushNew (Term.collect (Term.collect (Term.collect acc c) a) b) (.ternary f c a b)
  | acc, .reduce f x ax => pushNew (Term.collect acc x) (.reduce f x ax)
  | acc, .matmul a b ax => pushNew (Term.collect (Term.collect acc a) b) (.matmul a b ax)
  | acc, t => pushNew acc t

/-- Every distinct term of the graph, operands before users (Python `Graph.terms`). -/
def Graph.terms (g : Graph) : List Term := g.outputs.foldl (fun acc o => Term.collect acc o.2) []

/-- Whether a term is a constant (constants are written inline, never as nodes). -/
def Term.isConst : Term → Bool
  | .const _ => true
  | .negInf => true
  | _ => false

/-- An input's name. -/
def Term.inputName? : Term → Option String
  | .input n _ => some n
  | _ => none

/-- The label Python keeps for `t`: the last output naming it, else the author's first label. -/
def Graph.label (g : Graph) (t : Term) : Option String :=
  match g.outputs.reverse.find? (fun o => o.2 == t) with
  | some o => some o.1
  | none => (g.labels.find? (fun l => l.1 == t)).map (·.2)

/-- Node names handed out so far. -/
structure Naming where
  names : List (Term × String)
  used : List String
  counter : Nat

/-- The name given to `t`, if any. -/
def Naming.nameOf (s : Naming) (t : Term) : Option String :=
  (s.names.find? (fun p => p.1 == t)).map (·.2)

/-- Python's `claim`: name `t` `w` unless `t` is named or a constant, or `w` is empty or taken. -/
def Naming.claim (s : Naming) (t : Term) (want : Option String) : Naming :=
  match want with
  | none => s
  | some w =>
    if (s.nameOf t).isSome || t.isConst || w.isEmpty || s.used.contains w then s
    else { s with names := s.names ++ [(t, w)], used := s.used ++ [w] }

/-- The first `k ≥ c` whose `t<k>` is free (at most `fuel` tries; `used.length + 1` suffice). -/
def Naming.fresh (s : Naming) : Nat → Nat → Nat
  | 0, c => c
  | fuel + 1, c => if s.used.contains s!"t{c}" then Naming.fresh s fuel (c + 1) else c

/-- Gives `t` the next free `t<k>` name unless it is named or a constant (Python's counter loop). -/
def Naming.generated (s : Naming) (t : Term) : Naming :=
  if (s.nameOf t).isSome || t.isConst then s
  else
    let c := s.fresh (s.used.length + 1) (s.counter + 1)
    { s.claim t (some s!"t{c}") with counter := c }

/-- The names of every node: inputs, then outputs, then labels, then generated ones. -/
def Graph.naming (g : Graph) (terms : List Term) : Naming :=
  let s0 : Naming := {
    names := terms.filterMap (fun t => t.inputName?.map (fun n => (t, n))),
    used := terms.filterMap Term.inputName?,
    counter := 0 }
  let s1 := g.outputs.foldl (fun s o => s.claim o.2 (some o.1)) s0
  let s2 := terms.foldl (fun s t => s.claim t (g.label t)) s1
  terms.foldl Naming.generated s2

/-- How a node refers to an operand: a constant inline, anything else by name. -/
def Naming.ref (s : Naming) (t : Term) : String :=
  match t with
  | .const d => d.graphText
  | .negInf => jsonString "-inf"
  | _ => jsonString ((s.nameOf t).getD "?")

/-- The JSON node of a term (none for inputs and constants). -/
def Naming.node (s : Naming) (t : Term) : Option String :=
  let nm := ("name", jsonString ((s.nameOf t).getD "?"))
  match t with
  | .input _ _ => none
  | .const _ => none
  | .negInf => none
  | .axisSize a => some (jsonObj [nm, ("op", jsonString "size"), ("axis", jsonString a)])
  | .iota a => some (jsonObj [nm, ("op", jsonString "iota"), ("axis", jsonString a)])
  | .unary f x => some (jsonObj [nm, ("op", jsonString f.name), ("args", jsonList [s.ref x])])
  | .binary f a b =>
    some (jsonObj [nm, ("op", jsonString f.name), ("args", jsonList [s.ref a, s.ref b])])
  | .ternary f c a b =>
    some (jsonObj [nm, ("op", jsonString f.name), ("args", jsonList [s.ref c, s.ref a, s.ref b])])
  | .reduce f x ax =>
    some (jsonObj [nm, ("op", jsonString f.name), ("args", jsonList [s.ref x]),
      ("axis", jsonString ax)])
  | .matmul a b ax =>
    some (jsonObj [nm, ("op", jsonString "matmul"), ("args", jsonList [s.ref a, s.ref b]),
      ("contract", jsonString ax)])

/-- The graph as `json.dumps(graph_to_json(g))` prints it. -/
def Graph.jsonText (g : Graph) : String :=
  let terms := g.terms
  let s := g.naming terms
  let inputs := terms.filterMap fun t =>
    match t with
    | .input n axes => some (n, axes)
    | _ => none
  let outs := g.outputs.map fun o =>
    if s.nameOf o.2 == some o.1 then jsonString o.1
    else jsonObj [("name", jsonString o.1), ("node", s.ref o.2)]
  jsonObj [
    ("name", jsonString g.name),
    ("axes", jsonObj (g.sizes.map fun p => (p.1, toString p.2))),
    ("inputs", jsonObj (inputs.map fun p => (p.1, jsonList (p.2.map jsonString)))),
    ("nodes", jsonList (terms.filterMap s.node)),
    ("outputs", jsonList outs)]

end Superopt

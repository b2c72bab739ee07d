import Superopt.Graph
import Superopt.Semantics
import Superopt.Rules
import Superopt.Eval
import Superopt.Replay
import Superopt.Certificate
import Superopt.Masks
import Superopt.Schedule
import Superopt.Model
import Superopt.Json
import Superopt.Workloads
import Superopt.Plan

/-!
# Superopt

The library's root module: importing it brings in every part of the Lean package.

* `Superopt.Graph`: the graph IR over named axes (mirror of `pyrunner/ir/graph.py`), exact decimal
  constants.
* `Superopt.Semantics`: the scalar laws (`ScalarField`) and finite sums, maxima and means.
* `Superopt.Rules`: one theorem per rewrite rule, named as the plans name the rule.
* `Superopt.Eval`: `Term.eval` (each term's tensor over the scalar laws) and the algebraic rules
  restated on terms with Python's side conditions.
* `Superopt.Replay`: each algebraic rule instance as a computable `Rule.apply` with
  `Rule.apply_sound`, and `replay` of a derivation with `replay_sound`.
* `Superopt.Masks`: index predicates over tiles, the interval reasoning of `masked_tile_skip`
  (`allFalse_sound`, `skipped_steps_masked`).
* `Superopt.Certificate`: a plan's certificate read from its JSON and replayed from the Lean graph.
* `Superopt.Schedule`: each kernel's loop checked against the side conditions of the schedule rules
  it cites (`masked_tile_skip` against the kernel's masks, `maskedSkip_sound`), and the axis views.
* `Superopt.Model`: a two-element model of the scalar laws (the laws are consistent).
* `Superopt.Json`: the graph JSON format of `pyrunner/ir/graph_json.py`, numbers printed exactly.
* `Superopt.Workloads`: the workload catalog (mirror of `pyrunner/ir/catalog.py`).
* `Superopt.Plan`: the `superopt` command line (Lean front, Python search engine).

`Superopt.Main` (the executable's `main`) is kept out of this root on purpose.
-/

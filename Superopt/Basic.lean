import Superopt.Graph
import Superopt.Semantics
import Superopt.Rules
import Superopt.Workloads
import Superopt.Plan

/-!
# Superopt

The library's root module: importing it brings in every part of the Lean package.

* `Superopt.Graph`: the graph IR over named axes (mirror of `pyrunner/ir/graph.py`).
* `Superopt.Semantics`: the scalar laws (`ScalarField`) and finite sums, maxima and means.
* `Superopt.Rules`: one theorem per rewrite rule, named as the plans name the rule.
* `Superopt.Workloads`: the workload catalog (mirror of `pyrunner/ir/catalog.py`).
* `Superopt.Plan`: JSON output of graphs and rules, and the command line of `superopt`.

`Superopt.Main` (the executable's `main`) is kept out of this root on purpose.
-/

import Lake
open Lake DSL

/-!
Lake configuration for Superopt's Lean side: the graph IR, the scalar semantics, the rewrite
rules with their proofs, the workload catalog and the `superopt` executable.

The repository's top level is fixed, so there is no `Superopt.lean`: the library is every module
under `Superopt/` (a submodule glob), with `Superopt/Basic.lean` importing all of them. The Lean
tests live under `tests/lean/` and run through `lake test`.
-/

package superopt where
  testDriver := "superopt_test"

@[default_target]
lean_lib Superopt where
  globs := #[.submodules `Superopt]

@[default_target]
lean_exe superopt where
  root := `Superopt.Main

lean_exe superopt_test where
  srcDir := "tests/lean"
  root := `SuperoptTest

import Superopt.Plan

/-!
# `lake exe superopt`

The executable's entry point; everything it does lives in `Superopt/Plan.lean` (`runCli`).
-/

/-- Entry point of `lake exe superopt`. -/
def main (args : List String) : IO UInt32 :=
  Superopt.runCli args

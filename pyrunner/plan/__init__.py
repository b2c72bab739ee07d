"""Stage 4, the contract between planner and runner: the plan schema, its validation, its analysis."""

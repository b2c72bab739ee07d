"""Stage 1, the meaning of an operator: graph IR and DSL, graph JSON, float64 reference, catalog."""

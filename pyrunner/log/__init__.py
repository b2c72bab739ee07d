"""Stage 6, feedback: the results log that planners read back, and the report made from it."""

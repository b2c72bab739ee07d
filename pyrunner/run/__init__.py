"""Stage 5, running a plan: the runner, verification, the CPU executor, PyTorch baselines, timing."""

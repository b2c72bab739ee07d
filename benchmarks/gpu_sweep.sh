#!/usr/bin/env bash
# The GPU correctness sweep, one call. On the GPU machine, from the repository root, with .device carried:
#   bash benchmarks/gpu_sweep.sh [gpu_sweep.py options]
# Every catalog workload, every tests/data and benchmarks/graphs graph and 12 random graphs, at a small and a real shape,
# planned, compiled and verified against float64 on the GPU; sweep.log, cases.jsonl and summary.json
# go to $OUT and a short table is printed last. The environment (TileLang and the carried wheels)
# is set up by gpu_run.sh; TOTAL_S (default 480) bounds the whole command.
OUT=${OUT:-$PWD/results/gpu_sweep} TOTAL_S=${TOTAL_S:-480} SCRIPT=benchmarks/gpu_sweep.py \
  exec bash "$(dirname "$0")/gpu_run.sh" "$@"

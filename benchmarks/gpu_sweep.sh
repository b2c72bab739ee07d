#!/usr/bin/env bash
# The GPU correctness sweep, one call. On the GPU machine, from the repository root, with .device carried:
#   bash benchmarks/gpu_sweep.sh [gpu_sweep.py options]
# Unpacks TileLang (.device/tilelang-site.tar.xz) and the wheels the GPU image lacks (.device/whl/),
# then runs benchmarks/gpu_sweep.py: every catalog workload, every tests/data graph and 12 random graphs,
# at a small and a real shape, planned, compiled and verified against float64 on the GPU. Writes
# sweep.log, cases.jsonl and summary.json to $OUT and prints a short table last.
# TOTAL_S (default 480) bounds the whole command, unpacking included; the tool's limit is 600 s.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
OUT=${OUT:-$PWD/results/gpu_sweep}
mkdir -p "$OUT"
if [ ! -f .device/tilelang-site.tar.xz ]; then
  echo "error: .device/tilelang-site.tar.xz is missing: run benchmarks/build_device_bundle.sh and carry .device" >&2
  exit 3
fi
mkdir -p /tmp/site /tmp/site2
tar -C /tmp/site -xJf .device/tilelang-site.tar.xz || { echo "error: cannot unpack TileLang" >&2; exit 3; }
if compgen -G ".device/whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 \
    .device/whl/*.whl || { echo "error: cannot install the carried wheels" >&2; exit 3; }
fi
export PYTHONPATH=/tmp/site2:/tmp/site:$PWD
export PYTHONUNBUFFERED=1
spent=$(( $(date +%s) - start ))
budget=$(( ${TOTAL_S:-480} - spent - 20 ))
echo "unpacked TileLang and wheels in ${spent} s; sweep budget ${budget} s"
exec python3 benchmarks/gpu_sweep.py --out "$OUT" --budget-s "$budget" "$@"

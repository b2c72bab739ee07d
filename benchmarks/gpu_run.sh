#!/usr/bin/env bash
# The one GPU benchmark command. On the GPU machine, from the repository root, with .device carried:
#   bash benchmarks/gpu_run.sh [gpu_run.py options]
# Unpacks TileLang (.device/tilelang-site.tar.xz) and the wheels the GPU image lacks (.device/whl/),
# then runs benchmarks/gpu_run.py, which writes results.jsonl, report.md, speedups.png,
# gpu_run.log and sources.tar.gz to $OUT and prints a short table last.
# TOTAL_S (default 540) bounds the whole command, unpacking included; the tool's limit is 600 s.
# SCRIPT runs another script in the same environment (it must take --out and --budget-s), e.g.
#   SCRIPT=benchmarks/torch_demo.py TOTAL_S=230 bash benchmarks/gpu_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
OUT=${OUT:-$PWD/results/gpu_run}
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
budget=$(( ${TOTAL_S:-540} - spent - 25 ))
echo "unpacked TileLang and wheels in ${spent} s; gpu_run budget ${budget} s"
exec python3 "${SCRIPT:-benchmarks/gpu_run.py}" --out "$OUT" --budget-s "$budget" "$@"

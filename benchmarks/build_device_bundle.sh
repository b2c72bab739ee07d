#!/usr/bin/env bash
# Builds .device/ (git-ignored) on this machine for benchmarks/gpu_run.sh on the GPU machine:
#   .device/tilelang-site.tar.xz  TileLang and its needs (../shared/tools/device-site.sh; ~3 min, ~53 MB)
#   .device/whl/*.whl             pure wheels for packages the GPU image (python 3.12) lacks: pydantic 2
# The GPU call must carry .device; the travelling tree (with .device) must stay under 64 MiB.
# usage: bash benchmarks/build_device_bundle.sh      (FORCE=1 rebuilds the TileLang tarball)
set -euo pipefail
cd "$(dirname "$0")/.."
site_script=${DEVICE_SITE:-../shared/tools/device-site.sh}
mkdir -p .device
if [ "${FORCE:-0}" = 1 ] || [ ! -f .device/tilelang-site.tar.xz ]; then
  bash "$site_script" .device
else
  echo "kept .device/tilelang-site.tar.xz (FORCE=1 rebuilds it)"
fi
rm -rf .device/whl
# Versions match the development venv; the GPU image has typing-extensions, but pydantic-core
# needs a recent one, so a pinned copy travels too.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .device/whl \
  "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5" \
  "typing-extensions==4.16.0"
ls -l .device/whl
du -sh .device

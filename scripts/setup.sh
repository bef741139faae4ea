#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job —
# `dragon-gen build` of the built-in default BDH kernel set into
# ./dragon-kernels (manifest.json + one cubin per kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build="${BUILD_DIR:-build}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$cuda" >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
echo "dragon: built $build/dragon-gen; building the default kernel set" >&2
"$build/dragon-gen" build --out dragon-kernels --progress "$@"

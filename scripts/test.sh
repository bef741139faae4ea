#!/usr/bin/env bash
# Quick start, step 2: install what is missing, build, run the whole test
# suite. Environment: BUILD_DIR (default build-test), DG_WERROR=ON,
# DG_SANITIZE=address,undefined, DRAGON_TEST_QUICK=1 (sampled exhaustive
# loops). GPU tests print "skipped: no CUDA device" without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build="${BUILD_DIR:-build-test}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda" \
  -DDG_WERROR="${DG_WERROR:-OFF}" -DDG_SANITIZE="${DG_SANITIZE:-}" >/dev/null
cmake --build "$build" -j "$(nproc)"
# Tests get their own cache folder so they never touch the user's.
export DRAGON_CACHE_DIR="$PWD/$build/test-cache"
rm -rf "$DRAGON_CACHE_DIR"
cd "$build"
ctest --output-on-failure --timeout 1500 "$@"

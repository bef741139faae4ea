#!/usr/bin/env bash
# Quick start, step 2: install what is missing, build, run the whole test
# suite. What is installed, only where missing: the build's packages and
# python3-venv (scripts/deps.sh), the Python tests' torch, numpy,
# safetensors and pytest in .venv at the repository root
# (scripts/pydeps.sh; its python3 is the one every test runs), and the
# built-in corpus in data/ (scripts/corpus.sh). The tests then run with
# DRAGON_REQUIRE_DEPS=1: a test that finds one of these missing fails
# instead of skipping. Only GPU tests skip, printing "skipped: no CUDA
# device", without a GPU. At the end one line counts the tests that
# printed "skipped" and names the ones that skipped for a reason other
# than a missing GPU.
# Environment: BUILD_DIR (default build-test), DG_WERROR=ON,
# DG_SANITIZE=address,undefined, DRAGON_TEST_QUICK=1 (sampled exhaustive
# loops). Arguments go to ctest (e.g. -R NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
DG_WITH_PYTHON=1 scripts/deps.sh
py=$(scripts/pydeps.sh)
export VIRTUAL_ENV="${py%/bin/python}"
export PATH="$VIRTUAL_ENV/bin:$PATH"
scripts/corpus.sh
export DRAGON_REQUIRE_DEPS=1
build="${BUILD_DIR:-build-test}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda" \
  -DDG_WERROR="${DG_WERROR:-OFF}" -DDG_SANITIZE="${DG_SANITIZE:-}" >/dev/null
cmake --build "$build" -j "$(nproc)"
# Tests get their own cache folder so they never touch the user's.
export DRAGON_CACHE_DIR="$PWD/$build/test-cache"
rm -rf "$DRAGON_CACHE_DIR"
cd "$build"
rc=0
ctest --output-on-failure --timeout 1500 "$@" || rc=$?
# The skips, from every test's output (ctest keeps it in LastTest.log):
# how many tests printed "skipped: REASON", and each test and reason that
# is not a missing GPU (no CUDA device, fewer GPUs, an older SM).
awk '/^[0-9]+\/[0-9]+ Testing: / { t = $3 }
     /skipped: / { r = substr($0, index($0, "skipped: ") + 9); sub(/ \(.*/, "", r); any[t] = 1
                   if (r !~ /^(no CUDA device|needs [0-9]+ GPUs|the .* path needs sm_|.* opts in to only)/ &&
                       !((t, r) in seen)) { seen[t, r] = 1; other = other (other ? "; " : "") t " (" r ")" } }
     END { n = 0; for (k in any) n++
           printf "test.sh: %d tests printed \"skipped\"; for a reason other than a missing GPU: %s\n",
                  n, other ? other : "none" }' Testing/Temporary/LastTest.log
exit "$rc"

#!/usr/bin/env bash
# Fuzzes the spec parser, the manifest reader, the tuning record reader,
# the safetensors reader and the checkpoint reader.
#
#   scripts/fuzz.sh [seconds]      (default 30 per target)
#
# Configures a clang build in build-fuzz (-DDG_BUILD_FUZZ=ON), builds
# fuzz_spec, fuzz_manifest, fuzz_tune_record, fuzz_safetensors and
# fuzz_checkpoint (-fsanitize=fuzzer,address,undefined),
# replays every seed in tests/fuzz/corpus/<target>/ and every past crash in
# tests/fuzz/regress/<target>/, then runs each fuzzer for the given time.
# New corpus entries go to build-fuzz/corpus/ (the seeds stay as they are);
# a crash is copied into tests/fuzz/regress/<target>/ and the script fails.
# Environment: CC (default clang-14 if present, else clang), BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
case "$seconds" in
  ''|*[!0-9]*) echo "fuzz.sh: seconds must be a whole number, got '$seconds'" >&2; exit 2 ;;
esac
build="${BUILD_DIR:-build-fuzz}"
cc="${CC:-$(command -v clang-14 || command -v clang || true)}"
if [ -z "$cc" ]; then
  echo "fuzz.sh: clang not found; install it (DG_WITH_CLANG=1 scripts/deps.sh) or set CC" >&2
  exit 1
fi
cuda="${CUDA_HOME:-/usr/local/cuda}"

cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCUDAToolkit_ROOT="$cuda" -DDG_BUILD_FUZZ=ON -DDG_BUILD_TESTS=OFF -DDG_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_spec fuzz_manifest fuzz_tune_record \
  fuzz_safetensors fuzz_checkpoint

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for target in spec manifest tune_record safetensors checkpoint; do
  bin="$build/tests/fuzz/fuzz_$target"
  seeds="tests/fuzz/corpus/$target"
  regress="tests/fuzz/regress/$target"
  work="$build/corpus/$target"
  artifacts="$build/artifacts/$target"
  mkdir -p "$regress" "$work" "$artifacts"
  rm -f "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*

  echo "== fuzz_$target: replaying $seeds and $regress" >&2
  if ! "$bin" -runs=0 -artifact_prefix="$artifacts/" "$seeds" "$regress"; then
    echo "fuzz.sh: fuzz_$target fails on a seed or a past crash (see above)" >&2
    status=1
  fi

  echo "== fuzz_$target: fuzzing for ${seconds}s" >&2
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$work" "$seeds" "$regress" || status=1

  found=0
  for f in "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*; do
    [ -e "$f" ] || continue
    cp "$f" "$regress/"
    echo "fuzz.sh: fuzz_$target found $(basename "$f"); kept as $regress/$(basename "$f")" >&2
    found=1
  done
  [ "$found" = 0 ] || status=1
done
if [ "$status" != 0 ]; then
  echo "fuzz.sh: failed; reproduce with $build/tests/fuzz/fuzz_<target> <file>" >&2
fi
exit "$status"

#!/usr/bin/env bash
# The GPU suite, on a GPU machine without network (run from anywhere):
#
#   scripts/gpu_test.sh [--bench | --bench-only] [--reps N] [--target T]...
#                       [-- CTEST_ARGS...]
#
# 1. unpacks the .debs that scripts/gpu_deps.sh fetched (.gpu/debs) into
#    .gpu/prefix with dpkg -x, rewrites their .pc files to point there (and
#    drops Requires.private/Libs.private: the build links shared), and puts
#    only the libraries this machine lacks (by soname) on LD_LIBRARY_PATH;
# 2. configures and builds Release in build-gpu/ with -j$(nproc) (a build
#    folder made elsewhere, or against another prefix, is started afresh);
#    --target T (repeatable) builds only those targets (and what they
#    need), for a quick run of a few suites with `-- -R ...`;
# 3. runs ctest with DRAGON_REQUIRE_GPU=1, so a missing driver or device
#    fails the GPU tests instead of skipping them;
# 4. with --bench (or --bench-only, which skips step 3) runs bench/kernels,
#    also when tests failed.
#
# Results go to $OUT when it is set (the device tool brings that folder
# back), else to build-gpu/results: device.txt (nvidia-smi), build.log,
# ctest.log, ctest.xml (JUnit), kernels.json and kernels.txt, summary.txt.
# Exit status: 0 when everything that ran passed, 1 otherwise, 2 on usage.
# Environment: CUDA_HOME (default /usr/local/cuda), DG_WERROR (default OFF),
# DRAGON_TEST_QUICK=1 (sampled exhaustive loops), BUILD_DIR (build-gpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

bench=0 tests=1 reps="" ctest_args=() targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1 ;;
    --bench-only) bench=1 tests=0 ;;
    --reps) [ $# -ge 2 ] || { echo "gpu_test.sh: --reps needs a number" >&2; exit 2; }
            reps=$2; shift ;;
    --target) [ $# -ge 2 ] || { echo "gpu_test.sh: --target needs a target name" >&2; exit 2; }
              targets+=(--target "$2"); shift ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

build="${BUILD_DIR:-build-gpu}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
results="${OUT:-$build/results}"
mkdir -p "$results"
rm -f "$results"/{device.txt,build.log,ctest.log,ctest.xml,kernels.json,kernels.txt,summary.txt}
cuda="${CUDA_HOME:-/usr/local/cuda}"
debs="$root/.gpu/debs"
prefix="$root/.gpu/prefix"
summary="$results/summary.txt"
: >"$summary"
say() { echo "gpu_test: $*" | tee -a "$summary" >&2; }
status=0
t_start=$(date +%s)

# --- the device, for the record -------------------------------------------
{
  date -u '+%Y-%m-%dT%H:%M:%SZ'
  uname -srm
  nvidia-smi 2>&1 || echo "nvidia-smi failed or is missing"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv 2>&1 || true
  echo "nvcc: $("$cuda/bin/nvcc" --version 2>/dev/null | tail -1)"
  echo "gcc: $(gcc --version 2>/dev/null | head -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
} >"$results/device.txt" 2>&1

# --- 1. dependencies from .gpu/debs ----------------------------------------
if ! ls "$debs"/*.deb >/dev/null 2>&1; then
  say "no .debs in $debs: run scripts/gpu_deps.sh on a machine with network, and carry .gpu/debs"
  exit 1
fi
rm -rf "$prefix"
mkdir -p "$prefix"
for d in "$debs"/*.deb; do
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$d" "$prefix" || { say "cannot unpack $d"; exit 1; }
  else # no dpkg: a .deb is an ar archive holding data.tar.*
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$d" && tar -xf data.tar.* -C "$prefix") || { say "cannot unpack $d"; exit 1; }
    rm -rf "$tmp"
  fi
done
multiarch=usr/lib/x86_64-linux-gnu
pcdir="$prefix/pc"
mkdir -p "$pcdir"
# Debian's multiarch headers (lua5.4-deb-multiarch.h) sit in a folder the
# compiler searches by default under /usr, not under the prefix.
incarch="$prefix/usr/include/x86_64-linux-gnu"
for pc in "$prefix/$multiarch/pkgconfig"/*.pc "$prefix/usr/share/pkgconfig"/*.pc; do
  [ -e "$pc" ] || continue
  # prefix=/usr, libdir=/usr/lib/..., includedir=/usr/include → the prefix.
  sed -e "s#^\([A-Za-z_]*\)=/usr#\1=$prefix/usr#" -e '/^Requires\.private:/d' \
      -e '/^Libs\.private:/d' -e "/^Cflags:/s#\$# -I$incarch#" "$pc" >"$pcdir/$(basename "$pc")"
done
# Libraries the system lacks, by soname, linked into one folder: the build's
# linker and the tests find them there, and nothing of the system is shadowed.
runlib="$prefix/runlib"
mkdir -p "$runlib"
have=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null | awk '{print $1}' | sort -u)
added=()
for so in "$prefix/$multiarch"/*.so* "$prefix/lib/x86_64-linux-gnu"/*.so*; do
  if [ ! -f "$so" ] || [ -L "$so" ]; then continue; fi
  soname=$(readelf -d "$so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ -n "$soname" ] || continue
  if ! grep -qxF "$soname" <<<"$have"; then
    ln -sf "$so" "$runlib/$soname"
    added+=("$soname")
  fi
done
export LD_LIBRARY_PATH="$runlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pkgconfig_exe=$(command -v pkg-config || command -v pkgconf || true)
if [ -z "$pkgconfig_exe" ]; then
  pkgconfig_exe="$prefix/usr/bin/pkgconf"
fi
ndebs=$(find "$debs" -maxdepth 1 -name '*.deb' | wc -l)
say "deps: $ndebs .debs unpacked into $prefix; from there at run time: ${added[*]:-none}"
say "pkg-config: $pkgconfig_exe"

# --- 2. configure and build ------------------------------------------------
# Start afresh when the build folder was configured for another source tree or
# another prefix (a copied folder, a moved repo), or configuring fails.
stamp="$build/.gpu-test-stamp"
want_stamp="$root|$prefix|$cuda"
afresh() { # everything in the build folder but the results
  find "$build" -mindepth 1 -maxdepth 1 ! -name results -exec rm -rf {} +
}
if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$stamp" 2>/dev/null)" != "$want_stamp" ]; then
  say "build: $build was configured elsewhere; starting afresh"
  afresh
fi
configure() { # -U: pkg-config results are cached; ask again every time (.pc files are rewritten)
  cmake -S "$root" -B "$build" -U '__pkg_config_checked_*' -U 'pkgcfg_lib_*' \
    -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$cuda" \
    -DPKG_CONFIG_EXECUTABLE="$pkgconfig_exe" -DDG_WERROR="${DG_WERROR:-OFF}"
}
log="$results/build.log"
t0=$(date +%s)
if ! configure >"$log" 2>&1; then
  say "build: configure failed; retrying in an empty $build"
  afresh
  configure >>"$log" 2>&1 || { tail -40 "$log" >&2; say "build: configure failed (see build.log)"; exit 1; }
fi
echo "$want_stamp" >"$stamp"
if ! cmake --build "$build" -j "$(nproc)" "${targets[@]}" >>"$log" 2>&1; then
  grep -E 'error|Error' "$log" | head -40 >&2
  say "build: failed (see build.log)"
  exit 1
fi
say "build: Release in $build${targets[*]:+ (${targets[*]})}, $(( $(date +%s) - t0 )) s"

# --- 3. tests --------------------------------------------------------------
if [ "$tests" = 1 ]; then
  export DRAGON_REQUIRE_GPU=1
  export DRAGON_CACHE_DIR="$build/test-cache"
  rm -rf "$DRAGON_CACHE_DIR"
  t0=$(date +%s)
  (cd "$build" && ctest --output-on-failure --timeout 1500 -j "$(nproc)" \
     --output-junit "$results/ctest.xml" "${ctest_args[@]}") 2>&1 | tee "$results/ctest.log"
  rc=${PIPESTATUS[0]}
  line=$(grep -E 'tests passed(, [0-9]+ tests failed)? out of' "$results/ctest.log" | tail -1)
  skipped=$(grep -c 'skipped: no CUDA device' "$results/ctest.log" || true)
  say "tests: ${line:-no ctest summary} ($(( $(date +%s) - t0 )) s; exit $rc; 'skipped: no CUDA device' printed $skipped times)"
  if [ "$rc" != 0 ]; then
    status=1
    [ "$bench" = 1 ] && say "tests failed; running the bench anyway"
  fi
fi

# --- 4. bench --------------------------------------------------------------
if [ "$bench" = 1 ]; then
  if [ ! -x "$build/bench/kernels" ]; then
    say "bench: $build/bench/kernels was not built (cuBLASLt missing? see build.log)"
    status=1
  else
    export DRAGON_CACHE_DIR="$build/bench-cache"
    t0=$(date +%s)
    "$build/bench/kernels" --require-gpu --out "$results/kernels.json" ${reps:+--reps "$reps"} \
      2>&1 | tee "$results/kernels.txt"
    rc=${PIPESTATUS[0]}
    say "bench: exit $rc, $(( $(date +%s) - t0 )) s; results in $results/kernels.json"
    [ "$rc" = 0 ] || status=1
  fi
fi

say "done in $(( $(date +%s) - t_start )) s: $([ "$status" = 0 ] && echo ok || echo FAILED); results in $results"
exit "$status"

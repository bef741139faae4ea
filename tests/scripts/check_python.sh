#!/usr/bin/env bash
# The Python package as a user installs it: `pip install ./python` into a
# folder of its own under the build folder (pip --target, so python3 keeps
# seeing its torch wherever it is installed, and no environment of the
# machine is touched), pytest installed there if python3 lacks it, then
# the package's tests, run from the installed copy against this build's
# library (DRAGON_LIB): the CPU tests run, the GPU tests print "skipped:
# no CUDA device" without one (DRAGON_REQUIRE_GPU=1 makes that a failure).
# The install is held to what it promises: dragon_bdh installed and no
# `dragon` beside it, nothing written into python/ (no build/, no
# egg-info), no path of the tree in the installed package.
# A machine without network (the GPU one) installs from the wheels
# scripts/gpu_deps.sh fetched (.gpu/wheels).
# A library built with sanitizers is loaded with their runtimes (ASan,
# UBSan, TSan) preloaded into python3 (LD_PRELOAD, found through the
# compiler CC that built it), as an uninstrumented interpreter needs (ASan
# must come first; UBSan loaded later, with torch, kills the run without a
# word), and with leak detection off (the interpreter's own allocations
# live to its exit).
# Exits 77 (ctest's skip) where python3 cannot import torch or CC has no
# such runtime to preload (each a failure with DRAGON_REQUIRE_DEPS=1, as
# scripts/test.sh runs it).
#   tests/scripts/check_python.sh SOURCE_DIR BUILD_DIR [SANITIZE CC]
# $DRAGON: the dragon program the example is held to (default BUILD_DIR/dragon).
set -uo pipefail
src=${1:?source dir}
build=${2:?build dir}
missing() { # what is missing, the fix
  if [ "${DRAGON_REQUIRE_DEPS:-0}" = 1 ]; then
    echo "check_python: $1 (DRAGON_REQUIRE_DEPS=1: not a skip); $2" >&2
    exit 1
  fi
  echo "skipped: $1"
  exit 77
}
sanitize=${3:-}
preload=()
for s in ${sanitize//,/ }; do
  case "$s" in
    address) rt=libasan.so ;;
    undefined) rt=libubsan.so ;;
    thread) rt=libtsan.so ;;
    *) continue ;;
  esac
  lib=$("${4:-cc}" -print-file-name="$rt" 2>/dev/null)
  case "$lib" in /*) [ -e "$lib" ] || lib="" ;; *) lib="" ;; esac
  [ -n "$lib" ] || missing "no $rt from ${4:-cc} to preload into python3 (libdragon is built with -fsanitize=$sanitize)"     "install the compiler's sanitizer runtime"
  preload+=("$lib")
done
run_py() { # python3 that loads libdragon
  if [ ${#preload[@]} -gt 0 ]; then
    LD_PRELOAD="$(IFS=:; echo "${preload[*]}")${LD_PRELOAD:+:$LD_PRELOAD}" \
      ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$@"
  else
    "$@"
  fi
}
python3 -c 'import torch' 2>/dev/null ||
  missing "no torch ($(command -v python3) cannot import torch)" "scripts/test.sh installs it into .venv"
site="$build/python-site"
pipx=(--disable-pip-version-check)
if [ -d "$src/.gpu/wheels" ]; then
  pipx+=(--find-links "$src/.gpu/wheels")
  [ "${DRAGON_REQUIRE_GPU:-0}" = 1 ] && pipx+=(--no-index)
fi
export PYTHONPATH="$site"
if ! python3 -c 'import setuptools' 2>/dev/null; then
  python3 -m pip install -q "${pipx[@]}" --target "$site" setuptools ||
    { echo "check_python: pip install setuptools failed" >&2; exit 1; }
fi
rm -rf "$site/dragon" "$site/dragon_bdh" "$site"/dragon_bdh-*
before=$(cd "$src/python" && find . -path ./tests -prune -o -print | grep -v __pycache__ | sort)
DRAGON_LIB="$build" python3 -m pip install -q "${pipx[@]}" --no-build-isolation --no-deps --upgrade --target "$site" \
  "$src/python" ||
  { echo "check_python: pip install ./python failed" >&2; exit 1; }
after=$(cd "$src/python" && find . -path ./tests -prune -o -print | grep -v __pycache__ | sort)
if [ "$before" != "$after" ]; then
  echo "check_python: pip install ./python wrote into the source tree:" >&2
  diff <(echo "$before") <(echo "$after") >&2
  exit 1
fi
[ -d "$site/dragon_bdh" ] && [ -f "$site/dragon_bdh/_libs/libdragon.so" ] && [ ! -e "$site/dragon" ] ||
  { echo "check_python: the install holds $(ls "$site" | tr '\n' ' '): want dragon_bdh (its libdragon bundled) and no dragon" >&2
    exit 1; }
if grep -rl --include='*.py' -F "$src" "$site/dragon_bdh"; then
  echo "check_python: the installed package names the source tree ($src) in the files above" >&2
  exit 1
fi
if ! python3 -c 'import pytest' 2>/dev/null; then
  python3 -m pip install -q "${pipx[@]}" --target "$site" pytest ||
    { echo "check_python: pip install pytest failed" >&2; exit 1; }
fi
cd "$build" # the installed package, not the tree's
inst=$(run_py python3 -c 'import dragon_bdh, os; print(os.path.dirname(dragon_bdh.__file__))')
[ "$inst" = "$site/dragon_bdh" ] ||
  { echo "check_python: dragon_bdh imported from $inst, not the install in $site" >&2; exit 1; }
DRAGON="${DRAGON:-$build/dragon}" DRAGON_LIB="$build" run_py python3 -m pytest -q -rs -p no:cacheprovider "$src/python/tests"

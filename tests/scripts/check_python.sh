#!/usr/bin/env bash
# The Python package as a user installs it: `pip install ./python` into a
# virtual environment (its own, under the build folder, without a pip of
# its own: the system's pip, setuptools and torch are seen through its
# site-packages, so nothing older shadows them), pytest installed there
# if missing, then the package's tests against this build's library
# (DRAGON_LIB): the CPU tests run, the GPU tests print "skipped: no CUDA
# device" without one (DRAGON_REQUIRE_GPU=1 makes that a failure).
# Exits 77 (ctest's skip) where python3 cannot import torch, or the
# library is built with sanitizers (python3 would need their runtime
# preloaded).
#   tests/scripts/check_python.sh SOURCE_DIR BUILD_DIR [SANITIZE]
set -uo pipefail
src=${1:?source dir}
build=${2:?build dir}
if [ -n "${3:-}" ]; then
  echo "skipped: libdragon built with -fsanitize=$3 (the plain build runs the Python tests)"
  exit 77
fi
if ! python3 -c 'import torch' 2>/dev/null; then
  echo "skipped: no torch (python3 cannot import torch)"
  exit 77
fi
venv="$build/pyenv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages --without-pip "$venv" || { echo "check_python: python3 -m venv failed" >&2; exit 1; }
fi
py="$venv/bin/python"
"$py" -m pip install -q --no-build-isolation --no-deps --force-reinstall "$src/python" ||
  { echo "check_python: pip install ./python failed" >&2; exit 1; }
if ! "$py" -c 'import pytest' 2>/dev/null; then
  "$py" -m pip install -q pytest || { echo "check_python: pip install pytest failed" >&2; exit 1; }
fi
# the installed package, not the tree's: run from outside python/
cd "$build"
inst=$("$py" -c 'import dragon, os; print(os.path.dirname(dragon.__file__))')
case "$inst" in
  "$src/python/"*) echo "check_python: dragon imported from the tree ($inst), not the install" >&2; exit 1 ;;
esac
DRAGON_LIB="$build" "$py" -m pytest -q -rs -p no:cacheprovider "$src/python/tests"

#!/usr/bin/env bash
# Installs what dragon needs on Debian/Ubuntu, only what is missing:
# a C compiler (and C++: the tests run generated kernels on the CPU), CMake, pkg-config, Lua 5.4, cJSON, Criterion (tests),
# gnuplot (dragon plot), clang (fuzz targets: DG_WITH_CLANG=1) and
# python3 with venv (the Python tests' environment, scripts/pydeps.sh:
# DG_WITH_PYTHON=1). The CUDA toolkit (NVRTC)
# must already be installed; it is looked for in $CUDA_HOME, /usr/local/cuda
# and on PATH.
set -euo pipefail

pkgs=(gcc g++ make cmake pkg-config liblua5.4-dev libcjson-dev libcriterion-dev gnuplot-nox)
[ "${DG_WITH_CLANG:-0}" = 1 ] && pkgs+=(clang libclang-rt-dev)  # libFuzzer + sanitizer runtimes
[ "${DG_WITH_PYTHON:-0}" = 1 ] && pkgs+=(python3 python3-venv)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "dragon: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -e "$cuda/include/nvrtc.h" ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "dragon: the CUDA toolkit (with NVRTC) was not found in $cuda or on PATH; install it and set CUDA_HOME" >&2
  exit 1
fi

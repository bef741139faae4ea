#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job:
#   1. `dragon-gen build` of the built-in default BDH kernel set into
#      ./dragon-kernels (manifest.json + one cubin per kernel); arguments
#      go to it;
#   2. when dragon finds a GPU it can use (`dragon devices`): the built-in
#      corpus (scripts/corpus.sh, data/shakespeare.txt), a short training
#      run of the default preset into runs/quickstart (300 steps of 8 x 512
#      bytes, validation every 100, the kernels loaded from the bundle; a
#      run already there is started afresh), then 300 bytes sampled from
#      it. Without one, a line saying so and where the bundle is; exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build="${BUILD_DIR:-build}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$cuda" >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
echo "dragon: built $build/dragon-gen and $build/dragon; building the default kernel set" >&2
"$build/dragon-gen" build --out dragon-kernels --progress "$@"

if ! gpu=$("$build/dragon" devices 2>/dev/null); then
  echo "dragon: training needs an NVIDIA GPU, and there is none here (\`$build/dragon devices\` says why); the kernel bundle is in $PWD/dragon-kernels" >&2
  exit 0
fi
echo "dragon: GPU ${gpu%%$'\n'*}; the corpus, then a short training run" >&2
scripts/corpus.sh
export DRAGON_KERNELS="$PWD/dragon-kernels"
rm -rf runs/quickstart
"$build/dragon" train --steps 300 --eval-every 100 --out runs/quickstart
echo "dragon: 300 bytes sampled from runs/quickstart (\`$build/dragon sample runs/quickstart\`):" >&2
"$build/dragon" sample runs/quickstart --length 300
echo

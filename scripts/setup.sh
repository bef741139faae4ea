#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job:
#   1. the built-in corpus (scripts/corpus.sh, data/shakespeare.txt), which
#      `dragon train` reads by default from the repository's folder;
#   2. `dragon-gen build` of the built-in default BDH kernel set into
#      ./dragon-kernels (manifest.json + one cubin per kernel); arguments
#      go to it;
#   3. when dragon finds a GPU it can use (`dragon devices`): a short
#      training run of the default preset into runs/quickstart (300 steps
#      of 8 x 512 bytes, validation every 100, the kernels loaded from the
#      bundle; a run already there is started afresh), then 300 bytes
#      sampled from it. Without one: why not, then the tiny model of the
#      README trained on the CPU into runs/tiny (30 steps, a second; started
#      afresh) and 200 bytes sampled from it, and what to run next.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build="${BUILD_DIR:-build}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$cuda" >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
scripts/corpus.sh
echo "dragon: built $build/dragon-gen and $build/dragon; building the default kernel set" >&2
"$build/dragon-gen" build --out dragon-kernels --progress "$@"

if ! gpu=$("$build/dragon" devices 2>/dev/null); then
  "$build/dragon" devices >/dev/null || true # why not, on stderr
  echo "dragon: the kernel bundle is in $PWD/dragon-kernels; no GPU to train on, so the tiny model on the CPU, into runs/tiny:" >&2
  rm -rf runs/tiny
  "$build/dragon" train --cpu --preset f32 --layers 2 --embd 32 --heads 2 --neurons 64 \
    --batch 4 --time 32 --steps 30 --eval-every 10 --eval-batches 4 --out runs/tiny
  echo "dragon: 200 bytes sampled from it (\`$build/dragon sample runs/tiny\`; 30 steps learn little):" >&2
  "$build/dragon" sample runs/tiny
  echo
  cat >&2 <<EOF
dragon: next, from $PWD:
  scripts/test.sh                       # the whole test suite (it installs the Python tests' torch & co. into .venv)
  $build/dragon train --cpu --preset f32 --layers 2 --embd 32 --heads 2 --neurons 64 --batch 4 --time 32 --steps 1000 --out runs/tiny-1k
  $build/dragon sample runs/tiny-1k --prompt "ROMEO:"   # 1,000 steps (half a minute) begin to spell
  (elsewhere, set DRAGON_CORPUS=$PWD/data/shakespeare.txt, or \`cmake --install $build\` and the corpus goes with it)
  on a machine with an NVIDIA GPU, scripts/setup.sh trains the default model (bf16, 25M parameters) there
EOF
  exit 0
fi
echo "dragon: GPU ${gpu%%$'\n'*}; a short training run" >&2
export DRAGON_KERNELS="$PWD/dragon-kernels"
rm -rf runs/quickstart
"$build/dragon" train --steps 300 --eval-every 100 --out runs/quickstart
echo "dragon: 300 bytes sampled from runs/quickstart (\`$build/dragon sample runs/quickstart\`):" >&2
"$build/dragon" sample runs/quickstart --length 300
echo

#!/usr/bin/env bash
# The quality comparison on a GPU machine: BDH 25M trained by dragon (bf16,
# w8a8, bitnet presets) and by the PyTorch model (tools/bdh_torch.py train,
# bf16 autocast + torch.compile) with the same hyperparameters, corpus
# split, batches and initial weights, then the report (tools/quality.py).
#
#   bench/quality.sh dragon [--presets "bf16 w8a8 bitnet"]   dragon's runs
#   bench/quality.sh torch                                   PyTorch's runs
#   bench/quality.sh report                                  the report
#   bench/quality.sh all                                     the runs, then the report
#   common options: [--dir DIR] [--seeds "1 2"] [--steps 1500] [--budget S]
#                   [--jobs N] [--results DIR]
#
# Each run: B 8, T 512, AdamW lr 1e-3 (warm-up 100, cosine to 1e-4), wd 0.1,
# clip 1.0, dropout 0.1, validation every 100 steps over 32 fixed batches,
# into DIR/<impl>-<preset>-s<seed>/ (log.jsonl, run.json; dragon's newest
# checkpoint, every $QUALITY_CKPT_EVERY steps, 500 by default).
#
# An invocation stops what it runs after --budget seconds (540: the
# device's 10 minutes less room to spare) and exits 3; the same command
# again carries on: finished runs are skipped, dragon's unfinished ones
# resume from their newest checkpoint (logging what a straight run logs),
# PyTorch's start again. A run is not started with less than 120 s left
# ($QUALITY_MIN_S).
# --jobs N runs N at once, each on its own GPU (CUDA_VISIBLE_DEVICES=k for
# the k-th lane of runs, taken in the order dragon's seed by seed, then
# PyTorch's): on a machine of 4 GPUs `all --jobs 4` gives each GPU two of the
# eight runs in turn.
# So a session of 10-minute calls on one GPU runs, e.g.:
#   bench/quality.sh dragon --presets bf16   (until it exits 0)
#   bench/quality.sh dragon --presets "w8a8 bitnet"   (likewise)
#   bench/quality.sh torch
#   bench/quality.sh report
# DIR must outlive the calls: the default, runs/quality, is ignored by git,
# so a warm device machine keeps it between calls.
#
# dragon is $DRAGON (default build-gpu/dragon); when it is not there and
# .gpu/debs is, scripts/gpu_test.sh builds it (no tests). Its libraries:
# .gpu/prefix/runlib on LD_LIBRARY_PATH where that exists (scripts/gpu_test.sh
# makes it from the carried .gpu/debs). The corpus:
# $DRAGON_CORPUS (default .gpu/corpus/shakespeare.txt where it exists,
# else data/shakespeare.txt), held to its SHA-256 by both trainers.
# $PYTHON (python3) runs the PyTorch side and the report.
#
# When $OUT is set (the device tool's folder, brought back after each
# call), every run's log.jsonl and run.json go into one archive,
# $OUT/quality-logs.tar.gz (<run>/log.jsonl, <run>/run.json; unpack it and
# give the run folders to tools/quality.py), and the report goes to
# $OUT/results unless --results says where.
# Exit status: 0 done, 1 a run or the build failed, 2 usage, 3 stopped at
# the budget (call again).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

usage() { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
action=$1
shift
case "$action" in
  dragon | torch | report | all) ;;
  -h | --help) usage; exit 0 ;;
  *) echo "quality.sh: unknown action '$action' (dragon, torch, report, all; see --help)" >&2; exit 2 ;;
esac
dir=${QUALITY_DIR:-runs/quality} seeds="1 2" presets="bf16 w8a8 bitnet" steps=1500 budget=540 jobs=1
# dragon's checkpoints (each a resume point; a 25M one is 300 MB, hashed)
ckpt_every=${QUALITY_CKPT_EVERY:-500}
results=${OUT:+$OUT/results}
results=${results:-bench/results}
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "quality.sh: $1 needs a value (see --help)" >&2; exit 2; }
  case "$1" in
    --dir) dir=$2 ;;
    --seeds) seeds=$2 ;;
    --presets) presets=$2 ;;
    --steps) steps=$2 ;;
    --budget) budget=$2 ;;
    --jobs) jobs=$2 ;;
    --results) results=$2 ;;
    *) echo "quality.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done
for p in $presets; do
  case "$p" in bf16 | w8a8 | bitnet) ;; *) echo "quality.sh: --presets: '$p' is not bf16, w8a8 or bitnet" >&2; exit 2 ;; esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ && "$budget" =~ ^[0-9]+$ && "$jobs" =~ ^[1-9][0-9]*$ ]] ||
  { echo "quality.sh: --steps, --budget and --jobs take whole numbers (--jobs at least 1)" >&2; exit 2; }

DRAGON=${DRAGON:-build-gpu/dragon}
PYTHON=${PYTHON:-python3}
[ -d .gpu/prefix/runlib ] && export LD_LIBRARY_PATH="$root/.gpu/prefix/runlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -z "${DRAGON_CORPUS:-}" ] && [ -f .gpu/corpus/shakespeare.txt ]; then
  export DRAGON_CORPUS="$root/.gpu/corpus/shakespeare.txt"
fi
hp=(--steps "$steps" --batch 8 --time 512 --lr 1e-3 --wd 0.1 --clip 1.0 --dropout 0.1
    --eval-every 100 --eval-batches 32)
t_start=$(date +%s)
mkdir -p "$dir"
say() { echo "quality: $*" >&2; }
left() { echo $((budget - ($(date +%s) - t_start))); }
# a run is done when its log's last line is the last step, validated
done_run() { tail -n 1 "$1/log.jsonl" 2>/dev/null | grep -q "^{\"step\": $steps, .*\"val_loss\""; }
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1; }

# one archive, not a file a run: the device tool brings back only so many
# files from $OUT (the per-run copies of eight runs did not come back)
copy_out() {
  [ -n "${OUT:-}" ] || return 0
  local files=() d
  for d in "$dir"/*/; do
    [ -f "$d/log.jsonl" ] || continue
    d=$(basename "$d")
    files+=("$d/log.jsonl")
    [ -f "$dir/$d/run.json" ] && files+=("$d/run.json")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  mkdir -p "$OUT"
  tar -czf "$OUT/quality-logs.tar.gz" -C "$dir" "${files[@]}"
}

# run NAME CMD...: CMD under what is left of the budget; 0 done, 3 stopped, 1 failed
run() {
  local name=$1 rem rc
  shift
  rem=$(left)
  if [ "$rem" -lt "${QUALITY_MIN_S:-120}" ]; then
    say "$name: ${rem} s left of the budget: not started (call again)"
    return 3
  fi
  say "$name: $* (${rem} s left)"
  timeout --signal=TERM --kill-after=20 "$rem" "$@" >"$dir/$name.out" 2>&1
  rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "$name: stopped at the budget after $(tail -n 1 "$dir/$name/log.jsonl" 2>/dev/null | cut -d, -f1 | cut -d' ' -f2) steps (call again)"
    return 3
  elif [ "$rc" != 0 ]; then
    say "$name: failed (exit $rc): $(tail -n 3 "$dir/$name.out")"
    return 1
  fi
  say "$name: $(tail -n 1 "$dir/$name.out")"
  return 0
}

status=0
note() { [ "$1" = 1 ] && status=1; [ "$1" = 3 ] && [ "$status" = 0 ] && status=3; return 0; }

need_dragon() {
  [ -x "$DRAGON" ] && return 0
  if [ "$DRAGON" = build-gpu/dragon ] && ls .gpu/debs/*.deb >/dev/null 2>&1; then
    say "building $DRAGON (scripts/gpu_test.sh, no tests)"
    OUT="" scripts/gpu_test.sh --target dragon-cli -- -R '^$' >"$dir/build.out" 2>&1 ||
      { say "the build failed: $(tail -n 5 "$dir/build.out")"; return 1; }
    [ -d .gpu/prefix/runlib ] && export LD_LIBRARY_PATH="$root/.gpu/prefix/runlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    return 0
  fi
  say "no dragon at $DRAGON: build it (scripts/gpu_test.sh) or set DRAGON"
  return 1
}

# one_run IMPL PRESET SEED: the run, unless it is done (0, 1 or 3 as `run`)
one_run() {
  local impl=$1 p=$2 s=$3 name=$1-$2-s$3 d="$dir/$1-$2-s$3" resume=()
  if done_run "$d"; then
    say "$name: done"
    return 0
  fi
  if [ "$impl" = torch ]; then
    rm -rf "$d"
    run "$name" "$PYTHON" tools/bdh_torch.py train --impl compile --device cuda --size 25m "${hp[@]}" \
      --seed "$s" --out "$d"
    return
  fi
  if ls "$d"/ckpt-*.safetensors >/dev/null 2>&1; then
    resume=(--resume)
  else
    rm -rf "$d"
    mkdir -p "$d"
  fi
  printf '{"impl": "dragon", "preset": "%s", "seed": %s, "steps": %s, "batch": 8, "time": 512, "lr": 0.001, "wd": 0.1, "clip": 1.0, "dropout": 0.1, "eval_every": 100, "eval_batches": 32, "device_name": "%s"}\n' \
    "$p" "$s" "$steps" "$(gpu_name)" >"$d/run.json"
  run "$name" "$DRAGON" train --preset "$p" "${hp[@]}" --seed "$s" --ckpt-every "$ckpt_every" --keep 1 \
    --out "$d" "${resume[@]}"
}

# lane K: the jobs K, K+jobs, K+2·jobs, ... in turn (on GPU K when jobs > 1),
# until one fails or stops at the budget; its status as `note` keeps it
lane() {
  local k=$1 i rc
  status=0
  for ((i = k; i < ${#todo[@]}; i += jobs)); do
    one_run ${todo[$i]}
    rc=$?
    note $rc
    [ $rc = 0 ] || break
  done
  return "$status"
}

# the runs of `todo` (each "impl preset seed"), in --jobs lanes
do_runs() {
  [ ${#todo[@]} -gt 0 ] || return 0
  if [ "$jobs" = 1 ]; then
    lane 0
    return
  fi
  local pids=() k rc
  for ((k = 0; k < jobs && k < ${#todo[@]}; k++)); do
    CUDA_VISIBLE_DEVICES=$k lane "$k" &
    pids+=($!)
  done
  for k in "${pids[@]}"; do
    wait "$k"
    rc=$?
    note $rc
  done
}

do_report() {
  local runs=()
  for s in $seeds; do
    for p in $presets; do runs+=("$dir/dragon-$p-s$s"); done
    runs+=("$dir/torch-bf16-s$s")
  done
  mkdir -p "$results"
  "$PYTHON" tools/quality.py "${runs[@]}" --results "$results" --dragon "$DRAGON" || status=1
}

todo=()
for s in $seeds; do
  if [ "$action" = dragon ] || [ "$action" = all ]; then
    for p in $presets; do todo+=("dragon $p $s"); done
  fi
done
for s in $seeds; do
  if [ "$action" = torch ] || [ "$action" = all ]; then todo+=("torch bf16 $s"); fi
done
case "$action" in
  dragon | all)
    need_dragon || status=1
    [ "$status" = 0 ] && do_runs
    [ "$status" = 0 ] && [ "$action" = all ] && do_report
    ;;
  torch) do_runs ;;
  report) do_report ;;
esac
copy_out
say "$action: $(case $status in 0) echo done ;; 3) echo 'stopped at the budget: run the same command again' ;; *) echo FAILED ;; esac) in $(( $(date +%s) - t_start )) s; runs in $dir"
exit "$status"

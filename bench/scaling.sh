#!/usr/bin/env bash
# Data-parallel scaling of `dragon train` on one machine: tokens/s of the
# same per-GPU batch on 1 GPU and on N (--gpus N), the scaling efficiency
# tokens_N / (N x tokens_1), as JSON.
#
#   bench/scaling.sh [--gpus N] [--preset w8a8] [--batch 8] [--time 512] [--steps 60]
#       [--dragon build-gpu/dragon] [--out FILE]
#
# Each run trains --steps steps (no validation, one checkpoint at the end)
# of the built-in corpus; a run's tokens/s is the median of its steps'
# after the first 10 (the JIT, the graph's capture). FILE defaults to
# $OUT/scaling-<device>-<date>.json when $OUT is set, else
# bench/results/scaling-<device>-<date>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
n=2 preset=w8a8 batch=8 time=512 steps=60 dragon=build-gpu/dragon out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) n=$2; shift ;;
    --preset) preset=$2; shift ;;
    --batch) batch=$2; shift ;;
    --time) time=$2; shift ;;
    --steps) steps=$2; shift ;;
    --dragon) dragon=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "scaling.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$dragon" ] || { echo "scaling.sh: no dragon at $dragon (build it: scripts/gpu_test.sh --target dragon-cli)" >&2; exit 1; }
have=$(nvidia-smi -L 2>/dev/null | wc -l || echo 0)
[ "$have" -ge "$n" ] || { echo "scaling.sh: --gpus $n, but this machine has $have GPUs" >&2; exit 1; }
device=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr ' ' '-' | tr 'A-Z' 'a-z' | sed 's/^nvidia-//')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() { # GPUS NAME: the run in $tmp/NAME (its own folder: --gpus 1 runs twice)
  "$dragon" train --preset "$preset" --batch $((batch * $1)) --time "$time" --steps "$steps" --eval-every 0 \
    --ckpt-every 0 --keep 1 --gpus "$1" --out "$tmp/$2" >"$tmp/$2.out" 2>&1 ||
    { echo "scaling.sh: the $1-GPU run failed:" >&2; tail -5 "$tmp/$2.out" >&2; exit 1; }
}
run 1 one
run "$n" many
[ -n "$out" ] || out="${OUT:-bench/results}/scaling-$device-$(date -u +%F).json"
python3 - "$tmp/one/log.jsonl" "$tmp/many/log.jsonl" "$n" "$preset" "$batch" "$time" "$steps" "$device" "$out" <<'PY'
import json, statistics, sys
one, many, n, preset, batch, time_, steps, device, out = sys.argv[1:]
n = int(n)
def tps(path):
    rows = [json.loads(l) for l in open(path)]
    return statistics.median(r["tokens_per_s"] for r in rows[10:-1]), rows[-1]["train_loss"]
t1, l1 = tps(one)
tn, ln = tps(many)
res = {"device": device, "preset": preset, "per_gpu_batch": int(batch), "time": int(time_), "steps": int(steps),
       "rows": [{"gpus": 1, "tokens_per_s": t1, "final_train_loss": l1},
                {"gpus": n, "tokens_per_s": tn, "final_train_loss": ln}],
       "efficiency": tn / (n * t1)}
res["at_least_90pct"] = res["efficiency"] >= 0.90
open(out, "w").write(json.dumps(res, indent=1) + "\n")
print(json.dumps(res, indent=1))
PY

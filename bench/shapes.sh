#!/usr/bin/env bash
# dragon's training step across model shapes, beside the PyTorch anchor
# (bench/torch_bdh_step.py: bf16 autocast, torch.compile, fused AdamW) at
# the same shape in the same run, as JSON rows.
#
#   bench/shapes.sh [--only "25m d512 ..."] [--presets "w8a8 bf16"] [--no-anchor]
#       [--steps N] [--budget S] [--out FILE] [--merge]
#
# The shapes (name: layers, embd D, heads H, neurons N, vocab V, batch B,
# time T):
#   25m        6  256  4   8192    256  8   512   the 25M model
#   d512       6  512  8   4096    256  8   512
#   d768       6  768 12   8192    256  4   512
#   1b         6 1280 16  16384    256  2   512   1.0B parameters: w8a8 runs
#                                                 200 steps
#   25m-t4k    6  256  4   8192    256  1  4096   long context (the attention's
#                                                 chunked form from T 4096)
#   25m-t16k   6  256  4   8192    256  1 16384   long context
#   25m-t64k   6  256  4   8192    256  1 65536   longer: its peak memory
#   25m-v50k   6  256  4   8192  50304  8   512   GPT-2's vocabulary (uint16 tokens)
#   hn1m       6  256 16  65536    256  1   256   H·N = 1M neurons
#   l12       12  384  6   4096    256  8   512
# params = 3·H·D·N + 2·V·D (one encoder, encoder_v and decoder for every
# layer, so the layers do not multiply it).
#
# Each shape, each preset: `dragon train` for --steps steps (30; the 1b
# shape's w8a8 run 200 unless --steps is given) on the built-in corpus
# (vocab 256) or on random uint16 tokens written as nanoGPT's
# train.bin/val.bin (any other vocab), with an empty kernel cache of its
# own (first_step_s is an empty cache's), no validation but the one at the
# end (over one batch), no checkpoint (--ckpt-every never), --json. Its row:
# first_step_s, ready_s, startup (its parts), peak_bytes and kernels from
# the JSON; step_ms, the median
# over the steps after the first 5 (but the last, which validates) of
# B·T / tokens_per_s from the log; first_loss and last_loss. Then the
# anchor, `torch_bdh_step.py` at the shape (impl torch.compile, preset
# bf16; its first_two_steps_s is its compile and two steps). A run that
# fails gives a row with `error` (its stderr's last lines) instead of
# figures, and the bench goes on.
#
# FILE (default $OUT/shapes-<device>-<date>.json when $OUT is set, else
# bench/results/shapes-<device>-<date>.json) gets {"device", "date",
# "commit", "checks", "rows": [...]} (each row with the commit it ran;
# checks: over dragon's rows, the shapes with figures, first_step_s
# within 3 s for 25m and 5 s for all, the ≥1B w8a8 run's 200 steps with
# its loss falling and its peak memory; null where no row says), and
# stdout a table of its rows and the checks; with $OUT set a copy goes to runs/shapes/
# (ignored by git, so a warm device machine keeps it between calls, while
# $OUT starts empty). --merge: the rows already in FILE (or, when there
# is none, in that copy) are kept, but those of a (shape, impl, preset)
# run again, which are replaced.
#
# --budget S (540: a device call's 10 minutes less room to spare): what
# would start after S seconds is not started, and a run still going at
# S + 45 s is stopped; both give no row and are listed on stderr with the
# --only that runs them. On one H200, one call each (with --merge):
#   bench/shapes.sh --only "25m d512 d768 l12"
#   bench/shapes.sh --only "1b 25m-v50k" --merge
#   bench/shapes.sh --only "25m-t16k hn1m" --merge
#   bench/shapes.sh --only "25m-t4k 25m-t64k" --merge
# (torch.compile takes most of a shape's time; the 1b w8a8 run's 200
# steps a minute or so).
#
# dragon is $DRAGON (default build-gpu/dragon; when it is not there and
# .gpu/debs is, scripts/gpu_test.sh builds it, no tests); .gpu/prefix/runlib
# goes on LD_LIBRARY_PATH where it exists. The corpus: $DRAGON_CORPUS
# (default .gpu/corpus/shakespeare.txt where it exists). $PYTHON (python3)
# runs the anchor and writes the JSON. DRAGON_SHAPES_CPU=1 (the tree's own
# check, tests/scripts/check_shapes_sh.sh): tiny shapes on the CPU model
# (dragon train --cpu) on random tokens, presets "w8a8 f32" unless
# --presets says; the anchor sees no GPU (CUDA_VISIBLE_DEVICES empty), so
# its rows are errors.
# Exit status: 0 every run gave its figures, 1 one failed (its row says
# why) or the build did, 2 usage, 3 some not run for the budget (call again
# with the --only it names, and --merge).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

usage() { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
cpu=${DRAGON_SHAPES_CPU:-0}
if [ "$cpu" = 1 ]; then
  all_shapes="tiny 2 32 2 64 256 2 32
tiny-v1k 2 32 2 64 1024 2 32"
  presets="w8a8 f32"
else
  all_shapes="25m 6 256 4 8192 256 8 512
d512 6 512 8 4096 256 8 512
d768 6 768 12 8192 256 4 512
1b 6 1280 16 16384 256 2 512
25m-t4k 6 256 4 8192 256 1 4096
25m-t16k 6 256 4 8192 256 1 16384
25m-t64k 6 256 4 8192 256 1 65536
25m-v50k 6 256 4 8192 50304 8 512
hn1m 6 256 16 65536 256 1 256
l12 12 384 6 4096 256 8 512"
  presets="w8a8 bf16"
fi
only="" anchor=1 steps="" budget=540 out="" merge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-anchor) anchor=0; shift; continue ;;
    --merge) merge=1; shift; continue ;;
    -h | --help) usage; exit 0 ;;
  esac
  [ $# -ge 2 ] || { echo "shapes.sh: $1 needs a value (see --help)" >&2; exit 2; }
  case "$1" in
    --only) only=$2 ;;
    --presets) presets=$2 ;;
    --steps) steps=$2 ;;
    --budget) budget=$2 ;;
    --out) out=$2 ;;
    *) echo "shapes.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done
names=$(cut -d' ' -f1 <<<"$all_shapes")
for s in $only; do
  grep -qxF -- "$s" <<<"$names" ||
    { echo "shapes.sh: --only: no shape '$s' (the shapes: $(echo $names))" >&2; exit 2; }
done
for p in $presets; do
  case "$p" in f32 | bf16 | w8a8 | bitnet) ;; *) echo "shapes.sh: --presets: '$p' is not f32, bf16, w8a8 or bitnet" >&2; exit 2 ;; esac
done
[[ -z "$steps" || "$steps" =~ ^[1-9][0-9]*$ ]] && [[ "$budget" =~ ^[0-9]+$ ]] ||
  { echo "shapes.sh: --steps and --budget take whole numbers (--steps at least 1)" >&2; exit 2; }

DRAGON=${DRAGON:-build-gpu/dragon}
PYTHON=${PYTHON:-python3}
[ -d .gpu/prefix/runlib ] && export LD_LIBRARY_PATH="$root/.gpu/prefix/runlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -z "${DRAGON_CORPUS:-}" ] && [ -f .gpu/corpus/shakespeare.txt ]; then
  export DRAGON_CORPUS="$root/.gpu/corpus/shakespeare.txt"
fi
t_start=$(date +%s)
say() { echo "shapes: $*" >&2; }
elapsed() { echo $(($(date +%s) - t_start)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -x "$DRAGON" ]; then
  if [ "$DRAGON" = build-gpu/dragon ] && ls .gpu/debs/*.deb >/dev/null 2>&1; then
    say "building $DRAGON (scripts/gpu_test.sh, no tests)"
    OUT="" scripts/gpu_test.sh --target dragon-cli -- -R '^$' >"$tmp/build.out" 2>&1 ||
      { say "the build failed: $(tail -n 5 "$tmp/build.out")"; exit 1; }
    [ -d .gpu/prefix/runlib ] && export LD_LIBRARY_PATH="$root/.gpu/prefix/runlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    say "no dragon at $DRAGON: build it (scripts/gpu_test.sh --target dragon-cli) or set DRAGON"
    exit 1
  fi
fi
if [ "$cpu" = 1 ]; then
  device=cpu
else
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | tr ' ' '-' | tr 'A-Z' 'a-z' | sed 's/^nvidia-//')
  [ -n "$device" ] || device=cpu
fi
[ -n "$out" ] || out="${OUT:-bench/results}/shapes-$device-$(date -u +%F).json"
keep_copy="" # $OUT starts empty on each device call: the rows also kept where the next call finds them
[ -z "${OUT:-}" ] || keep_copy="runs/shapes/$(basename "$out")"

rows="$tmp/rows.jsonl" # one row a line, as the runs end
: >"$rows"
status=0
skipped=()

# row KIND ARGS...: a row onto $rows (python3 reads the run's files)
row() {
  "$PYTHON" - "$@" >>"$rows" <<'PY'
import json, statistics, sys
kind, name, L, D, H, N, V, B, T, preset = sys.argv[1:11]
L, D, H, N, V, B, T = (int(x) for x in (L, D, H, N, V, B, T))
r = {"shape": name, "layers": L, "embd": D, "heads": H, "neurons": N, "vocab": V, "batch": B, "time": T,
     "params": 3 * H * D * N + 2 * V * D, "impl": "dragon" if kind == "dragon" else "torch.compile",
     "preset": preset}
def tail(path, n=5):
    try:
        lines = [l for l in open(path, errors="replace").read().splitlines() if l.strip()]
    except OSError:
        lines = []
    return "\n".join(lines[-n:]) or "no output"
def last_json(path): # the whole output (dragon's --json), else its last JSON line
    text = open(path, errors="replace").read()
    try:
        return json.loads(text)
    except ValueError:
        pass
    for l in reversed(text.splitlines()):
        l = l.strip()
        if l.startswith("{"):
            return json.loads(l)
    raise ValueError("no JSON line")
rc = int(sys.argv[11])
if kind == "dragon":
    outp, errp, logp = sys.argv[12:15]
    try:
        if rc:
            raise RuntimeError("exit %d" % rc)
        j = last_json(outp)
        log = [json.loads(l) for l in open(logp)]
        ms = [B * T / x["tokens_per_s"] * 1e3 for x in (log[5:-1] or log[1:] or log) if x.get("tokens_per_s")]
        r.update(step_ms=statistics.median(ms), tokens_per_s=B * T / statistics.median(ms) * 1e3,
                 peak_bytes=j.get("peak_bytes"), first_step_s=j.get("first_step_s"),
                 first_loss=log[0]["train_loss"], last_loss=log[-1]["train_loss"], steps=j["steps"],
                 kernels=j.get("kernels"), device_name=j.get("device_name"),
                 ready_s=j.get("ready_s"), startup=j.get("startup"))
    except Exception as e:
        r["error"] = tail(errp) if rc else "%s: %s" % (type(e).__name__, e)
else:
    outp, errp = sys.argv[12:14]
    try:
        if rc:
            raise RuntimeError("exit %d" % rc)
        j = last_json(outp)
        r.update(step_ms=j["step_ms"], tokens_per_s=B * T / j["step_ms"] * 1e3, peak_bytes=j["peak_bytes"],
                 first_step_s=None, first_two_steps_s=j["first_two_steps_s"], torch=j.get("torch"),
                 mode=j.get("mode"))
    except Exception as e:
        r["error"] = tail(errp) if rc else "%s: %s" % (type(e).__name__, e)
print(json.dumps(r))
PY
}

# timed LABEL STDOUT STDERR CMD...: CMD (its output into those files)
# under what is left of the budget (+45 s); 0 when it ran to its end
# (whatever its exit), 3 when it did not start or was stopped, which
# lists LABEL's shape as skipped. $rc: CMD's exit.
timed() {
  local label=$1 o=$2 e=$3 rem
  shift 3
  rem=$((budget - $(elapsed)))
  if [ "$rem" -le 0 ]; then
    say "$label: not started (past the --budget of $budget s)"
    return 3
  fi
  say "$label ($(elapsed) s in)"
  timeout --signal=TERM --kill-after=15 $((rem + 45)) "$@" >"$o" 2>"$e"
  rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "$label: stopped at the budget"
    return 3
  fi
  return 0
}

# the random uint16 token corpus of vocab V (train.bin, val.bin) in $tmp/tokens-V
tokens() {
  local d="$tmp/tokens-$1"
  [ -f "$d/val.bin" ] && return 0
  mkdir -p "$d"
  "$PYTHON" - "$1" "$d" <<'PY'
import os, random, sys
from array import array
v, d = int(sys.argv[1]), sys.argv[2]
rnd = random.Random(1)
for name, n in (("train.bin", 1 << 20), ("val.bin", 1 << 17)):
    a = array("H", (rnd.randrange(v) for _ in range(n)))
    if sys.byteorder != "little":
        a.byteswap()
    with open(os.path.join(d, name), "wb") as f:
        a.tofile(f)
PY
}

while read -r name L D H N V B T; do
  [ -z "$only" ] || grep -qxF -- "$name" <<<"$(tr ' ' '\n' <<<"$only")" || continue
  shape=("$name" "$L" "$D" "$H" "$N" "$V" "$B" "$T")
  missed=0
  data=()
  if [ "$V" != 256 ] || [ "$cpu" = 1 ]; then # (the CPU check: no built-in corpus needed)
    tokens "$V" || { say "$name: the token files could not be written"; status=1; continue; }
    data=(--data "$tmp/tokens-$V" --vocab "$V")
  fi
  for p in $presets; do
    n=${steps:-30}
    # the ≥1B shape trains long enough to show its loss falling
    [ -z "$steps" ] && [ "$p" = w8a8 ] && [ $((3 * H * D * N + 2 * V * D)) -ge 1000000000 ] && n=200
    d="$tmp/run-$name-$p"
    rm -rf "$d" "$tmp/cache"
    mkdir -p "$tmp/cache" # an empty kernel cache: the first step's JIT counted
    cpu_flag=()
    [ "$cpu" = 1 ] && cpu_flag=(--cpu)
    timed "$name $p ($n steps)" "$d.out" "$d.err" env DRAGON_CACHE_DIR="$tmp/cache" "$DRAGON" train "${cpu_flag[@]}" --preset "$p" \
      --layers "$L" --embd "$D" --heads "$H" --neurons "$N" --batch "$B" --time "$T" --steps "$n" \
      --eval-every 0 --eval-batches 1 --ckpt-every never "${data[@]}" --out "$d" --json ||
      { missed=1; continue; }
    row dragon "${shape[@]}" "$p" "$rc" "$d.out" "$d.err" "$d/log.jsonl"
    [ "$rc" = 0 ] || status=1
    say "$name $p: $(tail -n 1 "$rows" | cut -c1-300)"
    rm -rf "$d" "$tmp/cache"
  done
  if [ "$anchor" = 1 ]; then
    a="$tmp/anchor-$name"
    # the CPU check hides the GPUs from the anchor too: its rows are errors on any machine
    hide=()
    [ "$cpu" = 1 ] && hide=(env CUDA_VISIBLE_DEVICES=)
    if timed "$name torch.compile" "$a.out" "$a.err" "${hide[@]}" "$PYTHON" bench/torch_bdh_step.py --layers "$L" --embd "$D" \
      --heads "$H" --neurons "$N" --vocab "$V" --batch "$B" --time "$T"; then
      row anchor "${shape[@]}" bf16 "$rc" "$a.out" "$a.err"
      [ "$rc" = 0 ] || status=1
      say "$name torch.compile: $(tail -n 1 "$rows" | cut -c1-300)"
    else
      missed=1
    fi
  fi
  [ "$missed" = 0 ] || skipped+=("$name")
done <<<"$all_shapes"

# the rows into FILE (merged with the earlier ones when asked)
mkdir -p "$(dirname "$out")"
old=""
if [ "$merge" = 1 ]; then
  if [ -f "$out" ]; then old=$out; elif [ -n "$keep_copy" ] && [ -f "$keep_copy" ]; then old=$keep_copy; fi
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -s "$rows" ] || [ -n "$old" ] || { say "no rows: $out not written"; out=/dev/null; }
[ "$out" = /dev/null ] || "$PYTHON" - "$rows" "$out" "$old" "$device" "$(date -u +%F)" "$commit" <<'PY' || status=1
import json, sys
rows_p, out, old, device, date, commit = sys.argv[1:]
new = [dict(json.loads(l), commit=commit) for l in open(rows_p) if l.strip()]
key = lambda r: (r["shape"], r["impl"], r["preset"])
rows = []
if old:
    done = {key(r) for r in new}
    rows = [r for r in json.load(open(old))["rows"] if key(r) not in done]
rows += new
# the issue's acceptance, over dragon's rows (None: no row to say)
ok = [r for r in rows if r["impl"] == "dragon" and "error" not in r]
first = [r for r in ok if r.get("first_step_s") is not None]
def every(rs, f):
    return all(f(r) for r in rs) if rs else None
checks = {
    "shapes": len({r["shape"] for r in ok}),
    "first_step_25m_le_3s": every([r for r in first if r["shape"] == "25m"], lambda r: r["first_step_s"] <= 3),
    "first_step_le_5s": every(first, lambda r: r["first_step_s"] <= 5),
    "billion_200_steps_loss_falls": every([r for r in ok if r["params"] >= 10**9 and r["preset"] == "w8a8"],
                                          lambda r: r["steps"] >= 200 and r["last_loss"] < r["first_loss"]
                                          and bool(r.get("peak_bytes"))),
}
res = {"device": device, "date": date, "commit": commit, "checks": checks, "rows": rows}
open(out, "w").write(json.dumps(res, indent=1) + "\n")
# the table a person reads
print("%-9s %-13s %-6s %9s %11s %8s %7s %s" % ("shape", "impl", "preset", "step ms", "tokens/s", "peak GB",
                                                  "first s", "loss first -> last"))
for r in rows:
    if "error" in r:
        print("%-9s %-13s %-6s error: %s" % (r["shape"], r["impl"], r["preset"], r["error"].splitlines()[-1][:80]))
        continue
    f = lambda k, fmt, scale=1: fmt % (r[k] / scale) if r.get(k) is not None else "-"
    loss = "%.3f -> %.3f (%d steps)" % (r["first_loss"], r["last_loss"], r["steps"]) if "first_loss" in r else ""
    print("%-9s %-13s %-6s %9s %11s %8s %7s %s" % (r["shape"], r["impl"], r["preset"], f("step_ms", "%.2f"),
          f("tokens_per_s", "%.0f"), f("peak_bytes", "%.1f", 1e9), f("first_step_s", "%.2f"), loss))
print("checks: " + json.dumps(checks))
PY
if [ "$out" != /dev/null ] && [ -n "$keep_copy" ] && ! [ "$out" -ef "$keep_copy" ]; then
  mkdir -p runs/shapes && cp "$out" "$keep_copy"
fi
if [ ${#skipped[@]} -gt 0 ]; then
  say "not run for the budget: ${skipped[*]}; again with --only \"${skipped[*]}\" --merge"
  [ "$status" = 0 ] && status=3
fi
say "$(wc -l <"$rows") rows in $(elapsed) s into $out"
exit "$status"

#!/usr/bin/env bash
# bench/quality.sh's sequence on the CPU, with stand-ins for the GPU's
# programs ($DRAGON: dragon train at the tiny shape, f32 for bf16; $PYTHON:
# bdh_torch.py train likewise, eager) on a generated text:
#   - `dragon` (in 3 lanes at once) trains every preset and seed into
#     DIR/dragon-P-sS with a run.json, `torch` into DIR/torch-bf16-sS,
#     `report` writes the JSON; a second call skips the finished runs;
#   - a run stopped at --budget exits 3, and the same call again resumes
#     it from its checkpoint to the log a straight run writes;
#   - with $OUT set the logs (one archive) and the report are written there;
#   - a bad action, preset or a missing dragon are refused.
# Exits 77 (ctest's skip) where python3 cannot import torch (a failure
# with DRAGON_REQUIRE_DEPS=1, as scripts/test.sh runs it).
#   tests/scripts/check_quality_sh.sh SOURCE_DIR DRAGON
set -uo pipefail
src=${1:?source dir}
real_dragon=${2:?the dragon program}
if ! python3 -c 'import torch, numpy' 2>/dev/null; then
  if [ "${DRAGON_REQUIRE_DEPS:-0}" = 1 ]; then
    echo "check_quality_sh: $(command -v python3) cannot import torch, numpy (DRAGON_REQUIRE_DEPS=1: not a skip); scripts/test.sh installs them into .venv" >&2
    exit 1
  fi
  echo "skipped: no torch (python3 cannot import torch, numpy)"
  exit 77
fi
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fails=0
fail() { echo "check_quality_sh: $*" >&2; fails=$((fails + 1)); }

python3 -c "
import random, sys
random.seed(1)
w = open(sys.argv[1]).read().split()
open(sys.argv[2], 'w').write(' '.join(random.choice(w) for _ in range(20000)))" "$src/README.md" "$t/text.txt"
tiny="--batch 2 --time 16 --eval-batches 2 --data $t/text.txt"
cat >"$t/dragon" <<EOF
#!/usr/bin/env bash
args=()
for a in "\$@"; do [ "\$a" = bf16 ] && a=f32; args+=("\$a"); done
exec "$real_dragon" "\${args[@]}" --cpu --layers 2 --embd 32 --heads 2 --neurons 64 $tiny
EOF
cat >"$t/python" <<EOF
#!/usr/bin/env bash
case "\$1" in
  tools/bdh_torch.py) OMP_NUM_THREADS=1 exec python3 "\$@" --device cpu --impl eager --size tiny $tiny ;;
  *) exec python3 "\$@" ;;
esac
EOF
# no GPU for the runs' device names, on a GPU machine too (the report's
# file is then quality-cpu-*)
printf '#!/bin/sh\nexit 1\n' >"$t/nvidia-smi"
chmod +x "$t/dragon" "$t/python" "$t/nvidia-smi"
export DRAGON="$t/dragon" PYTHON="$t/python" PATH="$t:$PATH"
q=("$src/bench/quality.sh")
common=(--dir "$t/runs" --steps 30 --seeds "1 2" --results "$t/res")

"${q[@]}" dragon "${common[@]}" --jobs 3 2>"$t/err" || fail "dragon in 3 lanes: $(cat "$t/err")"
"${q[@]}" torch "${common[@]}" 2>"$t/err" || fail "torch: $(cat "$t/err")"
for r in dragon-bf16-s1 dragon-w8a8-s1 dragon-bitnet-s1 dragon-bf16-s2 dragon-w8a8-s2 dragon-bitnet-s2 \
  torch-bf16-s1 torch-bf16-s2; do
  [ "$(tail -n 1 "$t/runs/$r/log.jsonl" 2>/dev/null | cut -d, -f1)" = '{"step": 30' ] || fail "$r: no 30 steps"
  python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$t/runs/$r/run.json" 2>/dev/null ||
    fail "$r: no run.json"
done
grep -q '"preset": "bitnet", "seed": 2' "$t/runs/dragon-bitnet-s2/run.json" || fail "run.json: $(cat "$t/runs/dragon-bitnet-s2/run.json")"
"${q[@]}" dragon "${common[@]}" 2>"$t/err" || fail "dragon again: $(cat "$t/err")"
[ "$(grep -c ': done$' "$t/err")" = 6 ] || fail "finished runs not skipped: $(cat "$t/err")"
"${q[@]}" report "${common[@]}" >"$t/out" 2>"$t/err" || fail "report: $(cat "$t/err")"
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r["runs"]) == 8 and all(x["steps"] == 30 for x in r["runs"]), r["runs"]' \
  "$t/res/quality-cpu-$(date -u +%F).json" || fail "the report: $(cat "$t/out" "$t/err")"

# stopped at the budget, then resumed to a straight run's log (timing aside)
QUALITY_MIN_S=0 "${q[@]}" dragon --dir "$t/cut" --steps 3000 --seeds 1 --presets bf16 --budget 4 2>"$t/err"
[ $? -eq 3 ] && grep -q "stopped at the budget" "$t/err" || fail "no stop at the budget: $(cat "$t/err")"
ls "$t/cut/dragon-bf16-s1"/ckpt-*.safetensors >/dev/null 2>&1 || fail "no checkpoint to resume: $(cat "$t/err")"
OUT="$t/out-dir" "${q[@]}" dragon --dir "$t/cut" --steps 3000 --seeds 1 --presets bf16 2>"$t/err" ||
  fail "the resumed call: $(cat "$t/err")"
grep -q -- "--resume" "$t/err" || fail "not resumed: $(cat "$t/err")"
"${q[@]}" dragon --dir "$t/straight" --steps 3000 --seeds 1 --presets bf16 2>/dev/null
strip() { sed 's/, "tokens_per_s.*//' "$1"; }
cmp -s <(strip "$t/cut/dragon-bf16-s1/log.jsonl") <(strip "$t/straight/dragon-bf16-s1/log.jsonl") ||
  fail "the resumed log differs from a straight run's"
listed=$(tar -tzf "$t/out-dir/quality-logs.tar.gz" 2>/dev/null)
grep -qx "dragon-bf16-s1/log.jsonl" <<<"$listed" && grep -qx "dragon-bf16-s1/run.json" <<<"$listed" ||
  fail "the logs are not in \$OUT/quality-logs.tar.gz: $(ls -R "$t/out-dir" 2>&1)"

# refusals
"${q[@]}" frobnicate 2>/dev/null
[ $? -eq 2 ] || fail "an unknown action did not exit 2"
"${q[@]}" dragon --jobs 0 2>"$t/err"
[ $? -eq 2 ] && grep -q "jobs" "$t/err" || fail "--jobs 0: $(cat "$t/err")"
"${q[@]}" dragon --presets fp8 2>"$t/err"
[ $? -eq 2 ] && grep -q "'fp8' is not bf16, w8a8 or bitnet" "$t/err" || fail "a bad preset: $(cat "$t/err")"
DRAGON=/nonexistent "${q[@]}" dragon --dir "$t/none" 2>"$t/err"
[ $? -eq 1 ] && grep -q "no dragon at /nonexistent" "$t/err" || fail "a missing dragon: $(cat "$t/err")"

[ "$fails" -eq 0 ] && echo "check_quality_sh: ok"
exit $((fails > 0))

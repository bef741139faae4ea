#!/usr/bin/env bash
# bench/shapes.sh on the CPU (DRAGON_SHAPES_CPU=1: its tiny shapes, dragon
# train --cpu, random tokens), without a GPU:
#   - every (shape, preset) gives a dragon row with the shape, params =
#     3·H·D·N + 2·V·D, step_ms, tokens_per_s, first/last loss, steps, and
#     a line of the table on stdout; the checks count the shapes;
#     the anchor, which needs CUDA, gives a row with `error` (not a crash),
#     and the exit status says a run failed (1);
#   - --merge replaces the rows run again and keeps the others; without it
#     the file holds only this call's rows;
#   - --budget 0 starts nothing, lists what it skipped and exits 3,
#     leaving the file as it was;
#   - a bad --only or --presets is refused (2), and so is a missing dragon (1).
#   tests/scripts/check_shapes_sh.sh SOURCE_DIR DRAGON
set -uo pipefail
src=${1:?source dir}
dragon=${2:?the dragon program}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fails=0
fail() { echo "check_shapes_sh: $*" >&2; fails=$((fails + 1)); }
export DRAGON="$dragon" DRAGON_SHAPES_CPU=1
unset OUT
sh=("$src/bench/shapes.sh")
f="$t/shapes.json"

# rows FILE EXPECT...: each "shape impl preset ok|error" is a row of FILE, and nothing else is
rows() {
  python3 - "$@" <<'PY'
import json, sys
path, want = sys.argv[1], sys.argv[2:]
rows = json.load(open(path))["rows"]
got = sorted(" ".join((r["shape"], r["impl"], r["preset"], "error" if "error" in r else "ok")) for r in rows)
assert got == sorted(want), "rows %s, want %s" % (got, sorted(want))
for r in rows:
    assert r["params"] == 3 * r["heads"] * r["embd"] * r["neurons"] + 2 * r["vocab"] * r["embd"], r
    if r["impl"] == "dragon" and "error" not in r:
        assert r["step_ms"] > 0 and abs(r["tokens_per_s"] * r["step_ms"] / 1e3 - r["batch"] * r["time"]) < 1e-6, r
        assert r["steps"] == 8 and r["first_loss"] > 0 and r["last_loss"] > 0, r
    if "error" in r:
        assert r["error"].strip() and "step_ms" not in r, r
PY
}

"${sh[@]}" --steps 8 --out "$f" >"$t/table" 2>"$t/err"
rc=$?
[ $rc -eq 1 ] || fail "the anchor without CUDA: exit $rc, not 1: $(cat "$t/err")"
rows "$f" "tiny dragon w8a8 ok" "tiny dragon f32 ok" "tiny torch.compile bf16 error" \
  "tiny-v1k dragon w8a8 ok" "tiny-v1k dragon f32 ok" "tiny-v1k torch.compile bf16 error" ||
  fail "the first call: $(cat "$t/err")"
python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["checks"]
assert c["shapes"] == 2 and c["first_step_le_5s"] is True and c["billion_200_steps_loss_falls"] is None, c' "$f" ||
  fail "the checks"
[ "$(grep -c '^tiny' "$t/table")" = 6 ] && grep -q '^tiny-v1k  *dragon  *f32  *[0-9.]' "$t/table" ||
  fail "the table on stdout: $(cat "$t/table")"

# one shape again, one preset, merged: the others kept
"${sh[@]}" --steps 8 --out "$f" --only tiny-v1k --presets f32 --no-anchor --merge >/dev/null 2>"$t/err" ||
  fail "--merge: exit $?: $(cat "$t/err")"
rows "$f" "tiny dragon w8a8 ok" "tiny dragon f32 ok" "tiny torch.compile bf16 error" \
  "tiny-v1k dragon w8a8 ok" "tiny-v1k dragon f32 ok" "tiny-v1k torch.compile bf16 error" || fail "--merge"
grep -q "tiny-v1k f32" "$t/err" && ! grep -q "tiny w8a8" "$t/err" || fail "--only, --presets: $(cat "$t/err")"
"${sh[@]}" --steps 8 --out "$t/two.json" --only tiny --presets f32 --no-anchor >/dev/null 2>"$t/err" ||
  fail "one run: exit $?: $(cat "$t/err")"
rows "$t/two.json" "tiny dragon f32 ok" || fail "without --merge"

# nothing starts at --budget 0; the file stays
cp "$f" "$t/before.json"
"${sh[@]}" --steps 8 --out "$f" --budget 0 2>"$t/err"
rc=$?
[ $rc -eq 3 ] && grep -q -- '--only "tiny tiny-v1k" --merge' "$t/err" || fail "--budget 0: exit $rc: $(cat "$t/err")"
cmp -s "$f" "$t/before.json" || fail "--budget 0 changed the file"

# refusals
"${sh[@]}" --only nosuch 2>"$t/err"
[ $? -eq 2 ] && grep -q "no shape 'nosuch'" "$t/err" || fail "a bad --only: $(cat "$t/err")"
"${sh[@]}" --presets fp8 2>"$t/err"
[ $? -eq 2 ] && grep -q "'fp8' is not" "$t/err" || fail "a bad --presets: $(cat "$t/err")"
DRAGON=/nonexistent "${sh[@]}" --out "$t/none.json" 2>"$t/err"
[ $? -eq 1 ] && grep -q "no dragon at /nonexistent" "$t/err" || fail "a missing dragon: $(cat "$t/err")"

[ "$fails" -eq 0 ] && echo "check_shapes_sh: ok"
exit $((fails > 0))

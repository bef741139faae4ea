#!/usr/bin/env bash
# tools/quality.py on made-up run folders whose numbers are chosen by hand:
#   - the val_loss of each run is its last step's; step_ms leaves out the
#     evaluated steps and the first 10 of the run and of a resumption
#     (those steps are made slow: counted, they would move it);
#   - the acceptance checks: dragon bf16 against torch.compile 2%, w8a8
#     against bf16 0.5%, bitnet against bf16 3%, per seed and for the
#     means, each pass and fail below worked out in the comments;
#   - a folder without run.json is read by its name; the logs are copied
#     beside the JSON; a PNG is drawn (matplotlib, else dragon plot with
#     gnuplot: each where it can run), and without either the report is
#     still written, saying there is no PNG;
#   - a check without its runs says "missing"; an unfinished run, a
#     duplicate and a folder without a log are refused (exit 1) by name.
#   tests/scripts/check_quality.sh SOURCE_DIR [DRAGON]
set -uo pipefail
src=${1:?source dir}
dragon=${2:-}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
q=(python3 "$src/tools/quality.py")
fails=0
fail() { echo "check_quality: $*" >&2; fails=$((fails + 1)); }

# run DIR IMPL PRESET SEED FINAL_VAL [resume] [no-meta]: 40 steps of 8x512,
# validation every 10; a normal step 4096 tokens in 20 ms (204800 tok/s),
# the first 10 (and 10 after a resumption) 100x slower, an evaluated one
# 10x slower; val_loss falls linearly to FINAL_VAL.
run() {
  python3 - "$t/runs/$1" "$2" "$3" "$4" "$5" "${6:-}" "${7:-}" <<'EOF'
import json, os, sys
d, impl, preset, seed, final, resume, nometa = sys.argv[1:]
os.makedirs(d)
if nometa != "no-meta":
    json.dump(dict(impl=impl, preset=preset, seed=int(seed), steps=40, batch=8, time=512,
                   device_name="NVIDIA H200"), open(f"{d}/run.json", "w"))
wall, since = 0.0, 0
with open(f"{d}/log.jsonl", "w") as f:
    for s in range(1, 41):
        if resume and s == 21:
            wall, since = 0.0, 0
        since += 1
        ev = s % 10 == 0
        tps = 2048.0 if since <= 10 else 20480.0 if ev else 204800.0
        wall += 4096 / tps
        r = dict(step=s, train_loss=2.0, lr=1e-3, grad_norm=1.0)
        if ev:
            r["val_loss"] = float(final) + (40 - s) * 0.01
        r.update(tokens_per_s=tps, wall_s=round(wall, 3))
        f.write(json.dumps(r) + "\n")
EOF
}
# final val losses; torch 1.50, 1.52 (mean 1.51)
run torch-bf16-s1 torch.compile bf16 1 1.50
run torch-bf16-s2 torch.compile bf16 2 1.52
# bf16 1.52 (+1.33%), 1.53 (+0.66%), mean 1.525 (+0.99%): pass
run dragon-bf16-s1 dragon bf16 1 1.52
run dragon-bf16-s2 dragon bf16 2 1.53 resume
# w8a8 1.528 (+0.526% of 1.52: fail), 1.531 (+0.065%: ok), mean 1.5295 (+0.295% of 1.525: pass)
run dragon-w8a8-s1 dragon w8a8 1 1.528
run dragon-w8a8-s2 dragon w8a8 2 1.531 "" no-meta
# bitnet 1.60 (+5.26%: fail), 1.55 (+1.31%: ok), mean 1.575 (+3.28%: fail)
run dragon-bitnet-s1 dragon bitnet 1 1.60
run dragon-bitnet-s2 dragon bitnet 2 1.55

"${q[@]}" "$t"/runs/* --results "$t/res" --date 2026-12-02 --dragon "${dragon:-/nonexistent}" \
  >"$t/out" 2>"$t/err" || fail "a full set failed: $(cat "$t/err")"
python3 - "$t" <<'EOF' || fails=$((fails + 1))
import json, os, sys
t, bad = sys.argv[1], []
r = json.load(open(f"{t}/res/quality-h200-2026-12-02.json"))
runs = {(x["impl"], x["preset"], x["seed"]): x for x in r["runs"]}
if len(runs) != 8 or ("dragon", "w8a8", 2) not in runs:
    bad.append(f"runs: {sorted(runs)}")
for k, want in ((("torch.compile", "bf16", 1), 1.50), (("dragon", "bitnet", 2), 1.55)):
    if abs(runs[k]["val_loss"] - want) > 1e-12:
        bad.append(f"{k}: val_loss {runs[k]['val_loss']}, not {want}")
for k, x in runs.items():
    if abs(x["step_ms"] - 20.0) > 1e-9 or abs(x["tokens_per_s"] - 204800) > 1e-6 or x["steps"] != 40:
        bad.append(f"{k}: step_ms {x['step_ms']}, tokens_per_s {x['tokens_per_s']}, steps {x['steps']}")
    if x["log"] != f"quality-h200-2026-12-02/{k[0]}-{k[1]}-s{k[2]}.jsonl" or open(f"{t}/res/{x['log']}").read() != open(f"{t}/runs/" + (
            "torch" if k[0] != "dragon" else "dragon") + f"-{k[1]}-s{k[2]}/log.jsonl").read():
        bad.append(f"{k}: log not copied to {x['log']}")
acc = {c["name"]: c for c in r["acceptance"]}
want = {"dragon bf16 vs torch.compile bf16": (True, [True, True], 1.525 / 1.51 - 1),
        "dragon w8a8 vs dragon bf16": (True, [False, True], 1.5295 / 1.525 - 1),
        "dragon bitnet vs dragon bf16": (False, [False, True], 1.575 / 1.525 - 1)}
if sorted(acc) != sorted(want):
    bad.append(f"checks: {sorted(acc)}")
for name, (ok, per, rel) in want.items():
    c = acc.get(name)
    if not c:
        continue
    got = (c["pass"], [p["pass"] for p in c["per_seed"]], c["mean"]["rel"])
    if got[:2] != (ok, per) or abs(got[2] - rel) > 1e-12 or c["mean"]["seeds"] != [1, 2]:
        bad.append(f"{name}: pass {got[0]}, per seed {got[1]}, rel {got[2]}; want {ok}, {per}, {rel}")
png = r["png"]
if r["png_by"] is None:
    print("check_quality: no PNG drawer here (neither matplotlib nor dragon plot with gnuplot)")
elif png != "quality-h200-2026-12-02.png" or open(f"{t}/res/{png}", "rb").read(8) != b"\x89PNG\r\n\x1a\n":
    bad.append(f"no PNG at {png} (drawn by {r['png_by']})")
else:
    print(f"check_quality: PNG by {r['png_by']}")
for b in bad:
    print("check_quality:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
grep -q "dragon bitnet vs dragon bf16: mean +3.28% (within 3%: FAIL)" "$t/out" ||
  fail "the summary: $(cat "$t/out")"

# the other drawer: dragon plot where matplotlib does not import, and no
# PNG at all (still a report) where dragon cannot be found either
mkdir -p "$t/nompl/matplotlib" && echo 'raise ImportError("not here")' >"$t/nompl/matplotlib/__init__.py"
if [ -n "$dragon" ] && command -v gnuplot >/dev/null; then
  PYTHONPATH="$t/nompl" "${q[@]}" "$t"/runs/* --results "$t/res2" --date 2026-12-02 --dragon "$dragon" \
    >/dev/null 2>"$t/err" || fail "with dragon plot: $(cat "$t/err")"
  grep -q '"png_by": "dragon plot"' "$t/res2/quality-h200-2026-12-02.json" 2>/dev/null ||
    fail "not drawn by dragon plot: $(cat "$t/err")"
fi
PYTHONPATH="$t/nompl" "${q[@]}" "$t"/runs/* --results "$t/res3" --device x --date 2026-12-02 \
  --dragon /nonexistent >/dev/null 2>"$t/err" || fail "without a drawer: $(cat "$t/err")"
grep -q "no PNG" "$t/err" && grep -q '"png": null' "$t/res3/quality-x-2026-12-02.json" ||
  fail "without a drawer: $(cat "$t/err")"

# a check without its runs; refusals
"${q[@]}" "$t"/runs/dragon-* --results "$t/res4" --date 2026-12-02 --dragon /nonexistent >"$t/out" 2>&1 ||
  fail "dragon's runs alone failed: $(cat "$t/out")"
grep -q "dragon bf16 vs torch.compile bf16: missing" "$t/out" || fail "no 'missing': $(cat "$t/out")"
head -30 "$t/runs/dragon-bf16-s1/log.jsonl" >"$t/short" && mkdir -p "$t/bad/cut" &&
  cp "$t/short" "$t/bad/cut/log.jsonl" && cp "$t/runs/dragon-bf16-s1/run.json" "$t/bad/cut/"
"${q[@]}" "$t/bad/cut" --results "$t/res5" 2>"$t/err"
[ $? -eq 1 ] && grep -q "cut/log.jsonl: ends at step 30 of 40" "$t/err" || fail "an unfinished run: $(cat "$t/err")"
"${q[@]}" "$t/runs/dragon-bf16-s1" "$t/runs/dragon-bf16-s1/" --results "$t/res5" 2>"$t/err"
[ $? -eq 1 ] && grep -q "both are dragon bf16 seed 1" "$t/err" || fail "a duplicate: $(cat "$t/err")"
"${q[@]}" "$t/nowhere" --results "$t/res5" 2>"$t/err"
[ $? -eq 1 ] && grep -q "nowhere: no log.jsonl" "$t/err" || fail "no log: $(cat "$t/err")"
"${q[@]}" "$t/runs/dragon-bf16-s1" --date tomorrow 2>"$t/err"
[ $? -eq 2 ] || fail "a bad --date did not exit 2"

[ "$fails" -eq 0 ] && echo "check_quality: ok"
exit $((fails > 0))

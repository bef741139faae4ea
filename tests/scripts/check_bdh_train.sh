#!/usr/bin/env bash
# `bdh_torch.py train` trains as `dragon train` does, held to dragon itself
# at the tiny shape on the CPU (f32, dropout 0 in both, on a generated text):
#   - its initial weights of a seed are dragon's, bit for bit (dragon's
#     checkpoint after one step of lr 1e-30, a step too small to move an
#     f32 weight of that size), and another seed's are not;
#   - 20 steps from the same seed log the same lr (as printed), and train
#     losses, gradient norms and validation losses within 1e-5 of dragon's
#     (1e-6 at step 1), so the same weights met the same train and
#     validation batches; another seed's step-1 loss is not within that;
#   - the schedule of a 1,500-step run (warm-up 100, then the cosine)
#     prints dragon's lr at each of its first 130 steps.
# Exits 77 (ctest's skip) where python3 cannot import torch (a failure
# with DRAGON_REQUIRE_DEPS=1, as scripts/test.sh runs it).
#   tests/scripts/check_bdh_train.sh SOURCE_DIR DRAGON
set -uo pipefail
src=${1:?source dir}
dragon=${2:?the dragon program}
if ! python3 -c 'import torch, numpy, safetensors' 2>/dev/null; then
  if [ "${DRAGON_REQUIRE_DEPS:-0}" = 1 ]; then
    echo "check_bdh_train: $(command -v python3) cannot import torch, numpy, safetensors (DRAGON_REQUIRE_DEPS=1: not a skip); scripts/test.sh installs them into .venv" >&2
    exit 1
  fi
  echo "skipped: no torch (python3 cannot import torch, numpy, safetensors)"
  exit 77
fi
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fails=0
fail() { echo "check_bdh_train: $*" >&2; fails=$((fails + 1)); }

python3 - "$t/text.txt" <<'EOF'
import random, sys
words = ("Now is the winter of our discontent made glorious summer by this sun of York; "
         "and all the clouds that lour'd upon our house in the deep bosom of the ocean buried.").split()
random.seed(0)
out, n = [], 0
while n < 20000:
    out.append(random.choice(words))
    n += len(out[-1]) + 1
open(sys.argv[1], "w").write(" ".join(out))
EOF
shape=(--layers 2 --embd 32 --heads 2 --neurons 64)
run=(--batch 2 --time 16 --eval-every 5 --eval-batches 2 --dropout 0 --data "$t/text.txt")
torch=(python3 "$src/tools/bdh_torch.py" train --device cpu --impl eager --size tiny)

"$dragon" train --cpu --preset f32 "${shape[@]}" "${run[@]}" --seed 3 --steps 1 --lr 1e-30 \
  --out "$t/init" >"$t/log" 2>&1 || fail "dragon's init run: $(cat "$t/log")"
"$dragon" train --cpu --preset f32 "${shape[@]}" "${run[@]}" --seed 3 --steps 20 \
  --out "$t/d" >"$t/log" 2>&1 || fail "dragon's run: $(cat "$t/log")"
"$dragon" train --cpu --preset f32 "${shape[@]}" --batch 1 --time 4 --eval-batches 1 --data "$t/text.txt" \
  --seed 3 --steps 1500 --stop-at 130 --ckpt-every 0 --out "$t/sched" >"$t/log" 2>&1 ||
  fail "dragon's schedule run: $(cat "$t/log")"
"${torch[@]}" "${run[@]}" --seed 3 --steps 20 --out "$t/p" >"$t/log" 2>&1 || fail "the torch run: $(cat "$t/log")"
"${torch[@]}" "${run[@]}" --seed 4 --steps 1 --out "$t/p4" >"$t/log" 2>&1 ||
  fail "the torch run of seed 4: $(cat "$t/log")"

PYTHONPATH="$src/tools" python3 - "$t" <<'EOF' || fails=$((fails + 1))
import json, sys
import numpy as np
from safetensors.numpy import load_file
import bdh_train
from bdh_torch import SIZES

t, bad = sys.argv[1], []
def log(d):
    with open(f"{t}/{d}/log.jsonl") as f:
        return [json.loads(line) for line in f]
def raw_lr(d):  # the lr as printed (%.9g in both)
    with open(f"{t}/{d}/log.jsonl") as f:
        return [line.split('"lr": ')[1].split(",")[0] for line in f]

# the init, bit for bit
ck = load_file(f"{t}/init/ckpt-00000001.safetensors")
for seed, same in ((3, True), (4, False)):
    w = bdh_train.dragon_init(SIZES["tiny"], seed)
    for n in bdh_train.PARAM_ORDER:
        eq = ck[n].shape == w[n].shape and np.array_equal(ck[n].view(np.uint32), w[n].view(np.uint32))
        if eq != same:
            bad.append(f"init seed {seed}: {n} {'differs from' if same else 'equals'} dragon's seed 3")

# the run
d, p = log("d"), log("p")
rel = lambda a, b: abs(a - b) / abs(b)
if [r["step"] for r in d] != list(range(1, 21)) or [r["step"] for r in p] != list(range(1, 21)):
    bad.append(f"steps: dragon {[r['step'] for r in d]}, torch {[r['step'] for r in p]}")
vd = [r["step"] for r in d if "val_loss" in r]
vp = [r["step"] for r in p if "val_loss" in r]
if vd != [5, 10, 15, 20] or vp != vd:
    bad.append(f"validated at: dragon {vd}, torch {vp}")
if raw_lr("d") != raw_lr("p"):
    bad.append(f"lr: dragon {raw_lr('d')}, torch {raw_lr('p')}")
worst = {}
for a, b in zip(p, d):
    for k in ("train_loss", "grad_norm", "val_loss"):
        if k in b and k in a:
            worst[k] = max(worst.get(k, 0), rel(a[k], b[k]))
            if rel(a[k], b[k]) > (1e-6 if a["step"] == 1 else 1e-5):
                bad.append(f"step {a['step']}: {k} {a[k]!r}, dragon's {b[k]!r}")
if not p[-1]["val_loss"] < p[4]["val_loss"] - 0.1:
    bad.append(f"the validation loss did not fall: {p[4]['val_loss']} at 5, {p[-1]['val_loss']} at 20")
p4 = log("p4")[0]["train_loss"]
if rel(p4, d[0]["train_loss"]) <= 1e-6:
    bad.append(f"seed 4's step-1 loss {p4} is within 1e-6 of seed 3's {d[0]['train_loss']}")
print("check_bdh_train: step 1 loss dragon %.9g, torch %.9g; the largest relative differences over "
      "20 steps: %s" % (d[0]["train_loss"], p[0]["train_loss"],
                        ", ".join(f"{k} {v:.1e}" for k, v in worst.items())))

# the schedule of 1,500 steps
s = log("sched")
want = [bdh_train.lr_at(i, 1e-3, 1500, bdh_train.default_warmup(1500)) for i in range(130)]
got = [r["lr"] for r in s]
if len(got) != 130 or any(float("%.9g" % w) != g for w, g in zip(want, got)):
    bad.append(f"the schedule: {len(got)} steps; first differing: "
               f"{next(((i, w, g) for i, (w, g) in enumerate(zip(want, got)) if float('%.9g' % w) != g), None)}")
# dragon's checkpoint read by PyTorch (safetensors.torch.load_file) into the
# project's model: its validation loss over the same fixed batches is the
# one dragon logged at that step
import torch
from safetensors.torch import load_file as torch_load
from bdh_torch import BDH
w = torch_load(f"{t}/d/ckpt-00000020.safetensors")
m = BDH(**SIZES["tiny"], dropout=0.0)
with torch.no_grad():
    for n in bdh_train.PARAM_ORDER:
        m.get_parameter(n).copy_(w[n])
m.eval()
_, va = bdh_train.corpus_open(f"{t}/text.txt", builtin=False)
vr = bdh_train.SplitMix64(bdh_train.VAL_SEED)
total = 0.0
with torch.no_grad():
    for _ in range(2):
        i, g = bdh_train.rows(va, bdh_train.batch_offsets(vr, va.size, 2, 16), 16)
        total += float(m(torch.from_numpy(i), torch.from_numpy(g)))
got, want = total / 2, d[-1]["val_loss"]
print("check_bdh_train: dragon's step-20 checkpoint in PyTorch: val loss %.9g, dragon logged %.9g" % (got, want))
if rel(got, want) > 1e-5:
    bad.append(f"dragon's checkpoint in PyTorch: val loss {got!r}, dragon's {want!r}")

for b in bad:
    print("check_bdh_train:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF

[ "$fails" -eq 0 ] && echo "check_bdh_train: ok"
exit $((fails > 0))

#!/usr/bin/env python3
"""python/examples/train_bdh.py (dragon_bdh.torch.BDH with torch's AdamW)
beside `dragon train` on the same run: the same preset, size, seed,
batches, schedule and dropout, in the same machine's one run. Writes the
two train-loss curves (every --every steps), their worst and mean
relative difference, each run's validation loss over the same 8 fixed
batches and each one's wall time, as JSON.

    python3 bench/example_vs_train.py [--preset w8a8] [--steps 300]
        [--dragon build-gpu/dragon] [--every 10] [--out FILE]

The corpus is $DRAGON_CORPUS (or data/shakespeare.txt), as both read it.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="w8a8")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--dragon", default=os.path.join(ROOT, "build-gpu", "dragon"))
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiny", action="store_true", help="the tiny model on the CPU (a smoke test of this script)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dg-example-")
    common = ["--preset", a.preset, "--steps", str(a.steps), "--seed", str(a.seed)]

    env = dict(os.environ)  # the tree's package, as a user's checkout runs the example
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    t0 = time.time()
    ex = subprocess.run([sys.executable, os.path.join(ROOT, "python", "examples", "train_bdh.py"), *common,
                         "--log", os.path.join(tmp, "ex.jsonl")] + (["--size", "tiny"] if a.tiny else []), capture_output=True, text=True, env=env)
    ex_s = time.time() - t0
    if ex.returncode:
        sys.exit("example_vs_train: the example failed:\n" + ex.stderr[-3000:])
    m = re.search(r"val ([0-9.]+) after", ex.stdout)
    ex_val = float(m.group(1)) if m else None

    t0 = time.time()
    dr = subprocess.run([a.dragon, "train", *common, "--eval-every", str(a.steps), "--eval-batches", "8",
                         "--ckpt-every", "0", "--out", os.path.join(tmp, "run")] +
                        (["--cpu", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64"] if a.tiny else []), capture_output=True, text=True)
    dr_s = time.time() - t0
    if dr.returncode:
        sys.exit("example_vs_train: dragon train failed:\n" + dr.stderr[-3000:])

    got = [json.loads(l) for l in open(os.path.join(tmp, "ex.jsonl"))]
    want = [json.loads(l) for l in open(os.path.join(tmp, "run", "log.jsonl"))]
    want_train = {r["step"]: r["train_loss"] for r in want if "train_loss" in r}
    dr_val = [r["val_loss"] for r in want if "val_loss" in r]
    diffs = [abs(g["train_loss"] - want_train[g["step"]]) / want_train[g["step"]] for g in got
             if g["step"] in want_train]
    if len(diffs) != a.steps:
        sys.exit("example_vs_train: %d steps compared, %d expected" % (len(diffs), a.steps))
    curve = [{"step": g["step"], "example": g["train_loss"], "dragon_train": want_train[g["step"]]}
             for g in got if g["step"] == 1 or g["step"] % a.every == 0]
    import torch

    res = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "preset": a.preset, "steps": a.steps, "seed": a.seed,
           "size": ("tiny (2 layers, embd 32, 2 heads, 64 neurons)" if a.tiny else
                    "25m (6 layers, embd 256, 4 heads, 8192 neurons)") + ", B 8, T 512",
           "worst_rel_train_loss_diff": max(diffs), "mean_rel_train_loss_diff": sum(diffs) / len(diffs),
           "example_val_loss": ex_val, "dragon_train_val_loss": dr_val[-1] if dr_val else None,
           "example_wall_s": ex_s, "dragon_train_wall_s": dr_s,
           "example_loss_fell": got[-1]["train_loss"] < got[0]["train_loss"] - 1.0,
           "curve": curve}
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

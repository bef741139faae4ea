#!/usr/bin/env python3
"""A training step of dragon_bdh.torch.BDH with torch's AdamW, beside
`dragon train`'s own step and the project's PyTorch model under
torch.compile bf16 with the same AdamW, in the same run on one GPU.

    python3 bench/torch_step.py [--preset w8a8] [--batch 8] [--time 512]
        [--reps 20] [--warmup 5] [--step build-gpu/bench/step] [--out FILE]

Rows (JSON, to --out and stdout): impl dragon.torch (dragon_bdh.torch:
forward, backward through autograd, clip_grad_norm_, AdamW(fused),
zero_grad), dragon-train (bench/step --train's graph row: the step
dg_model_train_step replays), torch.compile (tools/bdh_torch.py's BDH,
bf16 autocast, the same clip and AdamW), each its mean step_ms over
--reps steps queued back to back, timed by CUDA events; then the ratios
and the issue's two checks: dragon.torch within 10% of dragon-train, and
faster than torch.compile.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "python"))


def timed(step, reps, warmup):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        step()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="w8a8")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--time", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--step", default=os.path.join(ROOT, "build-gpu", "bench", "step"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import bdh_torch
    import dragon_bdh.torch as dt

    dev = torch.device("cuda", 0)
    B, T = a.batch, a.time
    g = torch.Generator(device=dev).manual_seed(1)
    idx = torch.randint(0, 256, (B, T), device=dev, generator=g)
    tgt = torch.randint(0, 256, (B, T), device=dev, generator=g)
    rows = []

    m = dt.BDH(dt.BDHConfig(preset=a.preset, batch_size=B, block_size=T)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1, fused=True)

    def dragon_step():
        _, loss = m(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    rows.append({"impl": "dragon.torch", "preset": a.preset, "B": B, "T": T,
                 "step_ms": timed(dragon_step, a.reps, a.warmup)})
    del m, opt
    torch.cuda.empty_cache()

    ref = bdh_torch.BDH(**bdh_torch.SIZES["25m"]).to(dev)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
    cref = torch.compile(ref)

    def torch_step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = cref(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ropt.step()
        ropt.zero_grad(set_to_none=True)

    t0 = time.time()
    torch_step()
    rows.append({"impl": "torch.compile", "preset": "bf16", "B": B, "T": T, "compile_s": time.time() - t0,
                 "step_ms": timed(torch_step, a.reps, a.warmup)})
    del ref, ropt, cref
    torch.cuda.empty_cache()

    out = subprocess.run([a.step, "--presets", a.preset, "--batch", str(B), "--time", str(T), "--train",
                          "--no-torch", "--no-floor", "--no-anchor", "--reps", str(a.reps), "--warmup", "3"], capture_output=True, text=True)
    if out.returncode:
        sys.exit("torch_step: %s failed: %s" % (a.step, out.stderr[-2000:]))
    for r in json.loads(out.stdout)["rows"]:
        if r.get("mode") == "train_graph":
            rows.append({"impl": "dragon-train", "preset": a.preset, "B": B, "T": T, "step_ms": r["step_ms"]})
    by = {r["impl"]: r["step_ms"] for r in rows}
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows,
           "dragon_torch_over_dragon_train": by["dragon.torch"] / by["dragon-train"],
           "dragon_torch_over_torch_compile": by["dragon.torch"] / by["torch.compile"]}
    res["within_10pct_of_dragon_train"] = res["dragon_torch_over_dragon_train"] <= 1.10
    res["faster_than_torch_compile"] = res["dragon_torch_over_torch_compile"] < 1.0
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

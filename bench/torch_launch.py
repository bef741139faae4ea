#!/usr/bin/env python3
"""The host time of one dragon_bdh.torch op call, its op kept prepared
(what the ops do: dg_ffi_prepared_run of the op prepared at the shape's
first call) beside the op prepared again at every call (the kept ops
bounded to none: dg_ffi_op_prepare, then the launch), on one GPU.

    python3 bench/torch_launch.py [--rows 1] [--cols 256] [--batch 200] [--reps 30] [--out FILE]

The op: quantize_act int8 a token (rows x cols f32), a kernel of a few
µs. Each way makes --batch calls back to back, timed on the host (the
GPU's queue holds them: the host never waits), then synchronizes; the
figure is the median over --reps batches of the batch's time / --batch,
in µs. JSON to --out and stdout: host_us_per_call {kept, prepared_each_call}
and their ratio, and the prepares each way made.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--cols", type=int, default=256)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import dragon_bdh.torch as dt
    from dragon_bdh.torch import _call

    if not torch.cuda.is_available():
        print("skipped: no CUDA device (torch sees none)")
        return 0
    x = torch.randn(a.rows, a.cols, device="cuda")
    per, prepares = {}, {}
    for way, bound in (("kept", _call.PREPARED_MAX), ("prepared_each_call", 0)):
        old, _call.PREPARED_MAX = _call.PREPARED_MAX, bound
        try:
            dt.clear_prepared()
            times = []
            p0 = dt.prepared_stats()["prepares"]
            for r in range(-2, a.reps):  # two batches of warm-up
                t0 = time.perf_counter()
                for _ in range(a.batch):
                    dt.quantize_act(x, "int8", "token")
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                if r >= 0:
                    times.append((t1 - t0) * 1e6 / a.batch)
            per[way] = statistics.median(times)
            prepares[way] = dt.prepared_stats()["prepares"] - p0
        finally:
            _call.PREPARED_MAX = old
            dt.clear_prepared()
    doc = {"device": torch.cuda.get_device_name(0), "op": "quantize_act int8 token",
           "shape": [a.rows, a.cols], "batch": a.batch, "reps": a.reps, "host_us_per_call": per,
           "prepared_each_call_over_kept": per["prepared_each_call"] / per["kept"], "prepares": prepares}
    text = json.dumps(doc, indent=2)
    print("torch_launch: host µs a call: kept %.2f, prepared each call %.2f\n%s"
          % (per["kept"], per["prepared_each_call"], text))
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

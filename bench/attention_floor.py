#!/usr/bin/env python3
"""The cuBLAS floor of BDH attention's GEMMs (bf16 bmm through torch, the same GPU, the same run).

  python3 bench/attention_floor.py [--batch 8 --time 512 --heads 4 --neurons 8192 --embd 256] [--reps 50]

Per (b, h), with QR (T, N) = RoPE(xs), V = x (T, D), dO (T, D):
  scores     S  = QR·QRᵀ           T×T×N  (the full square: a causal kernel needs half)
  out        O  = S·V              T×D×T
  grad_scores dS = dO·Vᵀ           T×T×D
  grad_v     dV = Sᵀ·dO            T×D×T  (summed over heads: one bmm over B·H here)
  grad_xs    dQR = C·QR            T×N×T  (C = dS + dSᵀ, dense)
Also the copy bandwidth (a device-to-device copy of 1 GiB, bytes read + written) and the time of one
pass over xs (B,H,T,N) bf16 at that bandwidth. Prints one JSON object.
"""
import argparse, json
import torch


def bench(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); fn(); e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(batch=8, time=512, heads=4, neurons=8192, embd=256, reps=50).items():
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    B, T, H, N, D = a.batch, a.time, a.heads, a.neurons, a.embd
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g, dtype=torch.bfloat16)
    qr, v, do, s = r(B * H, T, N), r(B * H, T, D), r(B * H, T, D), r(B * H, T, T)
    rows = {}
    f = lambda m, n, k: 2.0 * B * H * m * n * k
    for name, fn, fl in [
        ("scores", lambda: torch.bmm(qr, qr.mT), f(T, T, N)),
        ("out", lambda: torch.bmm(s, v), f(T, D, T)),
        ("grad_scores", lambda: torch.bmm(do, v.mT), f(T, T, D)),
        ("grad_v", lambda: torch.bmm(s.mT, do), f(T, D, T)),
        ("grad_xs", lambda: torch.bmm(s, qr), f(T, N, T)),
    ]:
        ms = bench(fn, a.reps)
        rows[name] = {"ms": ms, "tflops": fl / ms / 1e9}
    big = torch.empty(1 << 29, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(big)
    ms = bench(lambda: dst.copy_(big), a.reps)
    bw = 2 * big.numel() * 2 / ms / 1e6  # GB/s
    xs_bytes = B * H * T * N * 2
    print(json.dumps({"device": torch.cuda.get_device_name(), "B": B, "T": T, "H": H, "N": N, "D": D,
                      "gemms": rows, "copy_GBps": bw, "xs_pass_ms": xs_bytes / bw / 1e6,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()

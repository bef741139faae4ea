#!/usr/bin/env python3
"""Trains BDH with dragon's kernels from PyTorch: dragon_bdh.torch.BDH for
the model, torch's AdamW for the optimizer, and `dragon train`'s recipe
(its batches of the built-in corpus, its initial weights, its schedule:
linear warm-up then a cosine to lr/10, betas 0.9/0.95, weight decay 0.1,
gradient clip 1.0), so that its loss follows `dragon train --seed S`'s.

The corpus is $DRAGON_CORPUS or data/shakespeare.txt (scripts/corpus.sh
fetches it) unless --data names a text file. Without a GPU it trains the
tiny model on the CPU (f32, w8a8 or bitnet) and, when the run would take
more than a minute, says how long before it goes on. It prints the loss
every 50 steps and the validation loss at the end; --log writes a JSONL
line a step (step, train_loss, lr), as `dragon train`'s log.jsonl, and
--sample N prints N bytes the trained model writes.
"""
import argparse
import json
import math
import sys
import time

try:
    import torch
except ImportError:
    sys.exit("train_bdh.py needs PyTorch: pip install torch")
try:
    import dragon_bdh
    import dragon_bdh.torch as dt
except ImportError as e:
    sys.exit("train_bdh.py needs the dragon_bdh package (%s): pip install ./python from the repository (the "
             "package was imported as `dragon` before 0.2; it is `dragon_bdh` now)" % e)

SIZES = {"25m": {}, "tiny": dict(n_layer=2, n_embd=32, n_head=2, mlp_internal_dim_multiplier=4)}
WARN_S = 60  # a CPU run estimated longer than this is announced before it goes on


def lr_at(t, lr, steps, warmup):
    """dragon's schedule (dg_adamw_lr) for step t, 0-based."""
    if t < warmup:
        return lr * (t + 1) / warmup
    p = min((t - warmup) / max(steps - warmup, 1), 1.0)
    return lr / 10 + (lr - lr / 10) * (1 + math.cos(math.pi * p)) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="w8a8", help="f32, bf16 (a GPU only), w8a8, bitnet (default w8a8)")
    ap.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    ap.add_argument("--batch", type=int, default=8, help="batch rows B (default 8)")
    ap.add_argument("--time", type=int, default=512, help="tokens a row T (default 512)")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    ap.add_argument("--seed", type=int, default=1337, help="weights, batches and dropout (default 1337)")
    ap.add_argument("--size", choices=SIZES, default=None, help="default: 25m on a GPU, tiny on the CPU")
    ap.add_argument("--data", default=None, help="a text file instead of the built-in corpus")
    ap.add_argument("--log", default=None, help="a JSONL line a step to this file")
    ap.add_argument("--sample", type=int, default=0, help="bytes to sample from the trained model (default 0)")
    a = ap.parse_args()

    cuda = dragon_bdh.device_count() > 0 and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    cfg = dt.BDHConfig(preset=a.preset, batch_size=a.batch, block_size=a.time, seed=a.seed,
                       **SIZES[a.size or ("25m" if cuda else "tiny")])
    corpus = dragon_bdh.Corpus(a.data, seed=a.seed)
    model = dt.BDH(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=cuda)
    warmup = min(100, a.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_at(t, a.lr, a.steps, warmup) / a.lr)
    log = open(a.log, "w") if a.log else None

    def tensors(pair):
        idx, tgt = (torch.frombuffer(bytearray(x), dtype=torch.int32).view(a.batch, a.time) for x in pair)
        return idx.to(device), tgt.to(device)

    t0 = time.time()
    for step in range(1, a.steps + 1):
        lr = opt.param_groups[0]["lr"]
        _, loss = model(*tensors(corpus.batch(a.batch, a.time)))  # dragon's forward
        loss.backward()  # dragon's backward, through autograd
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if log:
            log.write(json.dumps({"step": step, "train_loss": loss.item(), "lr": lr}) + "\n")
        if step == 1 and not cuda:
            est = (time.time() - t0) * a.steps
            if est > WARN_S:
                print("train_bdh: %d steps of B %d x T %d on the CPU will take about %.0f minutes (%.2f s a step); "
                      "--steps, --batch or --time make it shorter, a GPU much shorter"
                      % (a.steps, a.batch, a.time, est / 60, est / a.steps), file=sys.stderr, flush=True)
        if step % 50 == 0 or step == 1:
            print("step %d  loss %.4f  %.1f s" % (step, loss.item(), time.time() - t0), flush=True)
    model.eval()
    with torch.no_grad():
        val = sum(model(*tensors(b))[1].item() for b in corpus.val_batches(8, a.batch, a.time)) / 8
    print("val %.4f after %d steps (%s, %s, %.1f s)" % (val, a.steps, a.preset, device, time.time() - t0))
    if a.sample > 0:
        prompt = torch.tensor([list(b"\n")], device=device)
        out = model.generate(prompt, a.sample, temperature=0.8, top_k=40)[0, 1:].tolist()
        print(bytes(out).decode("utf-8", errors="replace"))


if __name__ == "__main__":
    main()

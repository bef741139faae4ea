#!/usr/bin/env python3
"""Trains BDH with dragon's fused step from PyTorch: dragon.torch.BDH for
the model, torch's AdamW for the optimizer, `dragon train`'s recipe (its
batches of the built-in corpus, its init, its schedule: linear warm-up
then a cosine to lr/10, betas 0.9/0.95, weight decay 0.1, clip 1.0), so
its loss follows `dragon train --seed S`'s.

    python3 python/examples/train_bdh.py [--preset w8a8] [--steps 300]
        [--batch 8] [--time 512] [--size 25m|tiny] [--data FILE] [--log FILE]

The corpus is $DRAGON_CORPUS or data/shakespeare.txt (scripts/corpus.sh)
unless --data names a file. On a machine without a GPU it trains the
tiny model on the CPU (f32, w8a8 or bitnet). It prints the loss every 50
steps and the validation loss at the end; --log writes a JSONL line a
step (step, train_loss, lr), as `dragon train`'s log.jsonl.
"""
import argparse
import json
import math
import time

import torch

import dragon
import dragon.torch

SIZES = {"25m": {}, "tiny": dict(layers=2, embd=32, heads=2, neurons=64)}


def lr_at(t, lr, steps, warmup):
    """dragon's schedule (dg_adamw_lr) for step t, 0-based."""
    if t < warmup:
        return lr * (t + 1) / warmup
    p = min((t - warmup) / max(steps - warmup, 1), 1.0)
    return lr / 10 + (lr - lr / 10) * (1 + math.cos(math.pi * p)) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="w8a8")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--time", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--size", choices=SIZES, default=None, help="default: 25m on a GPU, tiny on the CPU")
    ap.add_argument("--data", default=None, help="a text file instead of the built-in corpus")
    ap.add_argument("--log", default=None, help="a JSONL line a step")
    a = ap.parse_args()

    cuda = dragon.device_count() > 0 and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    size = SIZES[a.size or ("25m" if cuda else "tiny")]
    corpus = dragon.Corpus(a.data, seed=a.seed)
    model = dragon.torch.BDH(a.preset, batch=a.batch, time=a.time, seed=a.seed, device=device, **size)
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
        loss = model(*tensors(corpus.batch(a.batch, a.time)))  # dragon's forward + backward
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if log:
            log.write(json.dumps({"step": step, "train_loss": loss.item(), "lr": lr}) + "\n")
        if step % 50 == 0 or step == 1:
            print("step %d  loss %.4f  %.1f s" % (step, loss.item(), time.time() - t0), flush=True)
    model.eval()
    with torch.no_grad():
        val = sum(model(*tensors(b)).item() for b in corpus.val_batches(8, a.batch, a.time)) / 8
    print("val %.4f after %d steps (%s, %s, %.1f s)" % (val, a.steps, a.preset, device, time.time() - t0))


if __name__ == "__main__":
    main()

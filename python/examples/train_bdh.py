#!/usr/bin/env python3
"""Trains BDH with dragon's fused step from PyTorch: dragon.torch.BDH for
the model, torch's AdamW for the optimizer, `dragon train`'s batches of
the built-in corpus ($DRAGON_CORPUS or data/shakespeare.txt).

    python3 python/examples/train_bdh.py [--preset w8a8] [--steps 300] [--batch 8] [--time 512]

On a machine without a GPU it trains a tiny model on the CPU (f32, w8a8
or bitnet). It prints the loss every 50 steps and the validation loss at
the end, as `dragon train` logs them.
"""
import argparse
import time

import torch

import dragon
import dragon.torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="w8a8")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--time", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=None, help="a text file instead of the built-in corpus")
    a = ap.parse_args()

    cuda = dragon.device_count() > 0 and torch.cuda.is_available()
    size = {} if cuda else dict(layers=2, embd=64, heads=2, neurons=256)  # the CPU: a tiny model
    device = "cuda" if cuda else "cpu"
    corpus = dragon.Corpus(a.data, seed=a.seed)
    model = dragon.torch.BDH(a.preset, batch=a.batch, time=a.time, seed=a.seed, device=device, **size)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, fused=cuda)

    def tensors(pair):
        idx, tgt = (torch.frombuffer(bytearray(x), dtype=torch.int32).view(a.batch, a.time) for x in pair)
        return idx.to(device, non_blocking=True), tgt.to(device, non_blocking=True)

    t0 = time.time()
    for step in range(1, a.steps + 1):
        loss = model(*tensors(corpus.batch(a.batch, a.time)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == 1:
            print("step %d  loss %.4f  %.1f s" % (step, loss.item(), time.time() - t0), flush=True)
    model.eval()
    with torch.no_grad():
        val = sum(model(*tensors(b)).item() for b in corpus.val_batches(8, a.batch, a.time)) / 8
    print("val %.4f after %d steps (%s, %s)" % (val, a.steps, a.preset, device))


if __name__ == "__main__":
    main()

"""`bdh_torch.py train`: the PyTorch model (bdh_torch.BDH) trained as
`dragon train` trains dragon's, so that their loss curves compare.

What is dragon's, reproduced here from its sources:

  corpus    (runtime/train/data.c) the file's bytes are the tokens; the
            first len − len//10 train, the rest validate. A batch of B rows
            draws, row by row, o = splitmix64() % (split − T); the row is
            split[o : o+T], its targets split[o+1 : o+T+1].
  RNG       (base/rng.c) splitmix64; the train batches' stream is seeded
            with the run's seed (checkpoint.c dg_train_state_create), the
            validation's with VAL_SEED afresh at every evaluation
            (trainer.c), so every run of every trainer sees the same
            validation batches.
  init      (model.c dg_model_weights_create) one stream seeded with the
            seed, through the weights in the order embed.weight, encoder,
            encoder_v, decoder, lm_head: normal(0, 0.02) by Box-Muller, a
            pair of draws for a pair of values (cos, sin), rounded to f32.
            Seed S starts this model from dragon's weights of seed S.
  schedule  (optim.c dg_adamw_lr) lr·(t+1)/warmup for t < warmup (warmup
            min(100, steps//10) unless given), then a cosine from lr down
            to lr/10 at the last step; in double, rounded to f32.
  AdamW     betas 0.9, 0.95, eps 1e-8, decoupled weight decay on every
            weight (each is a matrix), the global gradient-norm clip of
            clip_grad_norm_ (grad_norm logged before it); the
            hyperparameters as dragon holds them, rounded to f32.
  eval      every --eval-every steps and at the last: the mean loss of
            --eval-batches validation batches, dropout off.
  log       DIR/log.jsonl, a line a step in dragon's fields and format:
            step, train_loss, lr, grad_norm, [val_loss], tokens_per_s,
            wall_s; and DIR/run.json, what ran (impl, preset, seed, ...).

What is not: dropout's masks (torch's generator, not dragon's Philox),
and on the GPU the precision (bf16 autocast, not dragon's kernels).

Timing: the losses and norms stay on the device and are read every
--sync-every steps and at each evaluation; a step's tokens_per_s is its
window's tokens over the window's time (plus the evaluation's, on an
evaluated step, as dragon counts it), so reading them does not stall the
queue every step.
"""
import hashlib
import json
import math
import os
import re
import sys
import time

import numpy as np

VAL_SEED = 0x76616C  # trainer.c
GOLDEN = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1
PARAM_ORDER = ("embed.weight", "encoder", "encoder_v", "decoder", "lm_head")  # model.h dg_model_param
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- splitmix64, as base/rng.c -----------------------------------------------

class SplitMix64:
    def __init__(self, seed):
        self.state = seed & M64

    def u64(self):
        self.state = (self.state + GOLDEN) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)


def splitmix64_block(seed, first, n):
    """Draws first+1 .. first+n of the stream seeded with `seed` (uint64;
    the k-th draw mixes seed + k·golden)."""
    with np.errstate(over="ignore"):
        k = np.arange(first + 1, first + n + 1, dtype=np.uint64)
        z = np.uint64(seed & M64) + k * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


# ---- the weights' init, as model.c dg_model_weights_create ---------------------

def param_shapes(cfg):
    V, D, H, N = cfg["vocab"], cfg["embd"], cfg["heads"], cfg["neurons"]
    return {"embed.weight": (V, D), "encoder": (H, D, N), "encoder_v": (H, D, N),
            "decoder": (H * N, D), "lm_head": (D, V)}


def libm(f, x):
    """f (math.log, math.cos, math.sin: the C library's, as dragon calls
    them) of every double of x. numpy's own vectorized log differs from
    the C library's in the last bit of some doubles (and by version and
    CPU), which can move an f32 rounding; the C library's cannot."""
    return np.fromiter(map(f, x.tolist()), np.float64, x.size)


def dragon_init(cfg, seed):
    """{name: float32 array} of dragon's initial weights of `seed` (at the
    25M shape some seconds: the transcendentals are the C library's)."""
    out, drawn = {}, 0
    for name in PARAM_ORDER:
        shape = param_shapes(cfg)[name]
        n = int(np.prod(shape))
        pairs = (n + 1) // 2
        z = splitmix64_block(seed, drawn, 2 * pairs)
        drawn += 2 * pairs
        u1 = ((z[0::2] >> np.uint64(11)).astype(np.float64) + 1.0) / 9007199254740993.0
        u2 = (z[1::2] >> np.uint64(11)).astype(np.float64) / 9007199254740992.0
        r, a = np.sqrt(-2.0 * libm(math.log, u1)), 2.0 * math.pi * u2  # sqrt: exact in IEEE
        v = np.empty(2 * pairs, dtype=np.float32)
        v[0::2] = (0.02 * r * libm(math.cos, a)).astype(np.float32)
        v[1::2] = (0.02 * r * libm(math.sin, a)).astype(np.float32)
        out[name] = v[:n].reshape(shape)
    return out


# ---- the corpus and its batches, as data.c --------------------------------------

def builtin_digest():
    """DG_CORPUS_SHA256 of include/dragon/data.h (the one place it is written)."""
    with open(os.path.join(ROOT, "include", "dragon", "data.h")) as f:
        return re.search(r'#define DG_CORPUS_SHA256 "([0-9a-f]{64})"', f.read()).group(1)


def corpus_open(path, builtin):
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    if builtin:
        got, want = hashlib.sha256(data.tobytes()).hexdigest(), builtin_digest()
        if got != want:
            raise SystemExit(f"bdh_torch train: {path}: {data.size} bytes of SHA-256 {got}, not the "
                             f"built-in corpus ({want}): run scripts/corpus.sh again")
    train_len = data.size - data.size // 10
    return data[:train_len], data[train_len:]


def batch_offsets(rng, split_len, b, t):
    return [rng.u64() % (split_len - t) for _ in range(b)]


def rows(split, offsets, t):
    """(idx, tgt) int64 arrays [len(offsets), t] of a split at offsets."""
    o = np.asarray(offsets, dtype=np.int64)[:, None] + np.arange(t, dtype=np.int64)[None, :]
    return split[o].astype(np.int64), split[o + 1].astype(np.int64)


# ---- the schedule, as optim.c ----------------------------------------------------

def f32(x):
    return float(np.float32(x))


def default_warmup(steps):
    return min(100, steps // 10)


def lr_at(t, lr, steps, warmup):
    """dg_adamw_lr: lr and the floor are f32 (lr/10 in f32), the formula in
    double, the result rounded to f32."""
    lr = f32(lr)
    floor = float(np.float32(lr) / np.float32(10))
    if t < warmup:
        return f32(lr * (t + 1) / warmup)
    span = steps - warmup
    p = min((t - warmup) / span if span > 0 else 1.0, 1.0)
    return f32(floor + (lr - floor) * (1.0 + math.cos(math.pi * p)) / 2.0)


# ---- the run ----------------------------------------------------------------------

def default_data():
    env = os.environ.get("DRAGON_CORPUS")
    return env if env else "data/shakespeare.txt"


def add_parser(sub, sizes):
    t = sub.add_parser("train", help="train as `dragon train` does (its corpus split, batches, "
                       "init, schedule and log)")
    t.add_argument("--data", default=None,
                   help="the corpus (default $DRAGON_CORPUS or data/shakespeare.txt, held to "
                   "its SHA-256)")
    t.add_argument("--out", default="runs/torch", help="DIR: DIR/log.jsonl and DIR/run.json")
    t.add_argument("--size", choices=sorted(sizes), default="25m")
    t.add_argument("--steps", type=int, default=1500)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--time", type=int, default=512)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=None, help="default min(100, steps/10)")
    t.add_argument("--wd", type=float, default=0.1)
    t.add_argument("--clip", type=float, default=1.0, help="0: no clipping")
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--seed", type=int, default=1337)
    t.add_argument("--eval-every", type=int, default=100, help="0: only at the last step")
    t.add_argument("--eval-batches", type=int, default=32)
    t.add_argument("--sync-every", type=int, default=10,
                   help="steps between reads of the losses from the device")
    t.add_argument("--impl", choices=("eager", "compile"), default="compile")
    t.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: bf16 autocast; cpu: f32")
    return t


def check_args(a):
    bad = None
    if a.steps < 1 or a.batch < 1 or a.time < 1 or a.eval_batches < 1 or a.sync_every < 1:
        bad = "--steps, --batch, --time, --eval-batches and --sync-every must be at least 1"
    elif not (a.lr > 0 and math.isfinite(a.lr)):
        bad = f"--lr {a.lr}: must be finite and > 0"
    elif a.wd < 0 or a.clip < 0 or a.eval_every < 0:
        bad = "--wd, --clip and --eval-every must be >= 0"
    elif not 0 <= a.dropout < 1:
        bad = f"--dropout {a.dropout}: must be in [0, 1)"
    elif a.warmup is not None and not 0 <= a.warmup <= a.steps:
        bad = f"--warmup {a.warmup}: must be in [0, steps]"
    if bad:
        print(f"bdh_torch train: {bad}", file=sys.stderr)
        sys.exit(2)


def train(args, BDH, sizes):
    import torch

    check_args(args)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bdh_torch train: --device cuda: no CUDA device (use --device cpu)")
    path = args.data or default_data()
    try:
        tr, va = corpus_open(path, builtin=args.data is None)
    except FileNotFoundError:
        hint = "run scripts/corpus.sh (or give a file with --data)" if args.data is None else "no such file"
        raise SystemExit(f"bdh_torch train: {path}: {hint}")
    B, T = args.batch, args.time
    for name, split in (("train split (the first 90%)", tr), ("validation split (the last 10%)", va)):
        if split.size < T + 1:
            raise SystemExit(f"bdh_torch train: {path}: its {name} is {split.size} bytes; rows of "
                             f"{T} tokens need {T + 1}")
    warmup = default_warmup(args.steps) if args.warmup is None else args.warmup
    cfg = sizes[args.size]

    torch.manual_seed(args.seed)  # dropout's masks
    m = BDH(**cfg, dropout=args.dropout)
    with torch.no_grad():
        for name, w in dragon_init(cfg, args.seed).items():
            m.get_parameter(name).copy_(torch.from_numpy(w))
    m.to(dev)
    fn = torch.compile(m) if args.impl == "compile" else m
    params = [m.get_parameter(n) for n in PARAM_ORDER]
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW(params, lr=f32(args.lr), betas=(f32(0.9), f32(0.95)), eps=f32(1e-8),
                            weight_decay=f32(args.wd), **({"fused": True} if fused else {}))

    # every batch's rows up front, on the device: no copy from the host a step
    rng = SplitMix64(args.seed)
    offs = [batch_offsets(rng, tr.size, B, T) for _ in range(args.steps)]
    tr_dev = torch.from_numpy(tr.astype(np.int64)).to(dev)
    offs_dev = torch.tensor(offs, dtype=torch.int64, device=dev)  # [steps, B]
    ar = torch.arange(T, dtype=torch.int64, device=dev)
    vr = SplitMix64(VAL_SEED)
    val = [rows(va, batch_offsets(vr, va.size, B, T), T) for _ in range(args.eval_batches)]
    val = [(torch.from_numpy(i).to(dev), torch.from_numpy(g).to(dev)) for i, g in val]

    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev.type == "cuda" else \
        (lambda: torch.autocast("cpu", enabled=False))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def evaluate():
        m.eval()
        total = torch.zeros((), dtype=torch.float64, device=dev)
        with torch.no_grad(), autocast():
            for i, g in val:
                total += fn(i, g).double()
        m.train()
        return total.item() / len(val)

    os.makedirs(args.out, exist_ok=True)
    dev_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    run = dict(impl="torch.compile" if args.impl == "compile" else "pytorch",
               preset="bf16" if dev.type == "cuda" else "f32", seed=args.seed, steps=args.steps,
               batch=B, time=T, lr=args.lr, warmup=warmup, wd=args.wd, clip=args.clip,
               dropout=args.dropout, size=args.size, eval_every=args.eval_every,
               eval_batches=args.eval_batches, data=path, device=dev.type, device_name=dev_name,
               torch=torch.__version__)
    with open(os.path.join(args.out, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
        f.write("\n")
    log = open(os.path.join(args.out, "log.jsonl"), "w")

    m.train()
    pending = []  # (step, lr, loss, norm) not yet read from the device
    sync()
    t0 = tw = time.perf_counter()
    for t in range(args.steps):
        lr = lr_at(t, args.lr, args.steps, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        o = offs_dev[t][:, None] + ar[None, :]
        idx, tgt = tr_dev[o], tr_dev[o + 1]
        with autocast():
            loss = fn(idx, tgt)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, args.clip if args.clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        pending.append((t + 1, lr, loss.detach(), norm.detach()))
        step = t + 1
        evaluated = (args.eval_every > 0 and step % args.eval_every == 0) or step == args.steps
        if not (evaluated or len(pending) == args.sync_every):
            continue
        sync()
        te = time.perf_counter()
        vals = torch.stack([torch.stack((l.double(), n.double())) for _, _, l, n in pending]).tolist()
        dt = (te - tw) / len(pending)
        vl, tv = (evaluate(), time.perf_counter()) if evaluated else (None, te)
        for k, ((s, lr_s, _, _), (l, n)) in enumerate(zip(pending, vals)):
            if not (math.isfinite(l) and math.isfinite(n)):
                log.close()
                raise SystemExit(f"bdh_torch train: step {s}: the loss is {l:g} and the gradient "
                                 f"norm {n:g}; stopped")
            last = k == len(pending) - 1
            step_s = dt + (tv - te if last else 0.0)
            wall = (tv if last else tw + (k + 1) * dt) - t0
            line = f'{{"step": {s}, "train_loss": {l:.9g}, "lr": {lr_s:.9g}, "grad_norm": {n:.9g}'
            if last and vl is not None:
                line += f', "val_loss": {vl:.9g}'
            line += f', "tokens_per_s": {B * T / step_s:.1f}, "wall_s": {wall:.3f}}}\n'
            log.write(line)
        log.flush()
        if sys.stderr.isatty():
            s, l = pending[-1][0], vals[-1][0]
            end = f"  val {vl:.4f}\n" if vl is not None else "   \r"
            print(f"\rstep {s}/{args.steps}  loss {l:.4f}  {B * T / dt:.0f} tok/s{end}", end="",
                  file=sys.stderr)
        pending = []
        tw = time.perf_counter()
    log.close()
    print(f"trained: {run['impl']} {run['preset']} on {dev_name}, {args.steps} steps of {B}x{T}, "
          f"in {time.perf_counter() - t0:.1f} s; log in {args.out}")

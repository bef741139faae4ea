#!/usr/bin/env python3
"""The quality comparison's report: dragon's presets against the PyTorch model
trained alike (bench/quality.sh runs them), from their run folders.

    python3 tools/quality.py RUN_DIR... [--results bench/results]
        [--device NAME] [--date YYYY-MM-DD] [--skip 10] [--dragon PATH]

A run folder holds log.jsonl (dragon train's, or bdh_torch.py train's, in
the same fields) and run.json: {"impl", "preset", "seed"} at least (impl
"dragon", "torch.compile" or "pytorch"), and "batch", "time" (else
--batch/--time), "steps" (checked against the log), "device_name".

Writes, under --results:
  quality-<device>-<date>.json
      {"runs": [{"impl", "preset", "seed", "steps", "val_loss",
                 "tokens_per_s", "step_ms", "log"}],
       "acceptance": [{"name", "impl", "preset", "ref_impl", "ref_preset",
                       "tolerance", "mean": {...}, "per_seed": [{...}],
                       "pass"}], "device", "date", "config"}
      val_loss: the log's at its last step (the mean over the same fixed
      validation batches in every run); log: the copy of its log (a path
      relative to the JSON's folder, as "png" is); step_ms: the mean time of a step
      over the steps without an evaluation and not right after one (a
      checkpoint's step), less the first --skip steps of
      the run and of each resumption (the JIT's and torch.compile's
      warm-up), from each step's tokens_per_s; tokens_per_s: batch·time
      over that mean. An acceptance check compares the val_loss of
      (impl, preset) with its reference's: rel = val/ref − 1, passing when
      |rel| <= tolerance; per seed, and for the means over the seeds both
      have ("pass" is the means' verdict):
        dragon bf16   vs the PyTorch model (torch.compile, bf16)   2%
        dragon w8a8   vs dragon bf16                               0.5%
        dragon bitnet vs dragon bf16                               3%
  quality-<device>-<date>.png
      the validation curves (matplotlib where it imports, else `dragon
      plot`, which draws the training losses too; none, with a warning,
      where neither can)
  quality-<device>-<date>/<impl>-<preset>-s<seed>.jsonl
      each run's log, as committed beside the JSON.

Exit status: 0 written (whatever the checks say), 1 a run folder that is
missing, incomplete or duplicated, 2 usage.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

CHECKS = (  # (impl, preset) against (ref impl, ref preset), tolerance
    (("dragon", "bf16"), ("torch", "bf16"), 0.02),
    (("dragon", "w8a8"), ("dragon", "bf16"), 0.005),
    (("dragon", "bitnet"), ("dragon", "bf16"), 0.03),
)
TORCH_IMPLS = ("torch.compile", "pytorch")  # "torch" in CHECKS: the first present


def die(msg, code=1):
    print(f"quality: {msg}", file=sys.stderr)
    sys.exit(code)


def read_run(d):
    log_path, meta_path = os.path.join(d, "log.jsonl"), os.path.join(d, "run.json")
    if not os.path.isfile(log_path):
        die(f"{d}: no log.jsonl (a run folder of dragon train or bdh_torch.py train)")
    meta = {}
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    else:  # the folder's name, as bench/quality.sh names them: <impl>-<preset>-s<seed>
        m = re.fullmatch(r"(dragon|torch)-(\w+)-s(\d+)", os.path.basename(os.path.normpath(d)))
        if not m:
            die(f"{d}: no run.json, and its name is not <impl>-<preset>-s<seed>")
        meta = dict(impl="dragon" if m[1] == "dragon" else "torch.compile", preset=m[2], seed=int(m[3]))
    for k in ("impl", "preset", "seed"):
        if k not in meta:
            die(f"{meta_path}: no \"{k}\"")
    with open(log_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        die(f"{log_path}: no step lines")
    last = rows[-1]
    want = meta.get("steps")
    if want is not None and last["step"] != want:
        die(f"{log_path}: ends at step {last['step']} of {want}: finish the run (bench/quality.sh resumes it)")
    if "val_loss" not in last:
        die(f"{log_path}: no val_loss at its last step {last['step']}")
    return meta, rows, log_path


def step_ms(rows, bt, skip):
    """The mean ms of a step without an evaluation and not right after one
    (where a run writes its checkpoints: dragon's logs before the fix that
    times a step from the end of the previous one's checkpoint counted the
    save in the next step), less the first `skip` of the run and of each
    resumption (wall_s falls where one began)."""
    ms, since, prev, after_eval = [], 0, None, False
    for r in rows:
        if prev is not None and r["wall_s"] < prev:
            since = 0
        prev = r["wall_s"]
        since += 1
        if since > skip and "val_loss" not in r and not after_eval and r["tokens_per_s"] > 0:
            ms.append(1e3 * bt / r["tokens_per_s"])
        after_eval = "val_loss" in r
    return sum(ms) / len(ms) if ms else None


def device_of(runs, given):
    if given:
        return given
    for r in runs:
        name = r["meta"].get("device_name", "")
        if name and name != "cpu":
            words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w != "nvidia"]
            if words:
                return words[0]
    return "cpu"


def check(runs, a, b, tol):
    def find(key):
        impl, preset = key
        impls = [i for i in TORCH_IMPLS if (i, preset) in {(r["impl"], r["preset"]) for r in runs}][:1] \
            if impl == "torch" else [impl]
        return {r["seed"]: r for r in runs if r["impl"] in impls and r["preset"] == preset}

    ra, rb = find(a), find(b)
    impl_b = next(iter(rb.values()))["impl"] if rb else (TORCH_IMPLS[0] if b[0] == "torch" else b[0])
    out = dict(name=f"{a[0]} {a[1]} vs {impl_b} {b[1]}", impl=a[0], preset=a[1], ref_impl=impl_b,
               ref_preset=b[1], tolerance=tol)
    seeds = sorted(set(ra) & set(rb))
    if not seeds:
        out.update(mean=None, per_seed=[], **{"pass": None},
                   missing=f"no seed with both runs (seeds: {sorted(ra)} and {sorted(rb)})")
        return out

    def verdict(v, ref):
        rel = v / ref - 1
        return dict(val_loss=v, ref_val_loss=ref, rel=rel, **{"pass": abs(rel) <= tol})

    out["per_seed"] = [dict(seed=s, **verdict(ra[s]["val_loss"], rb[s]["val_loss"])) for s in seeds]
    mean = lambda rs: sum(rs[s]["val_loss"] for s in seeds) / len(seeds)
    out["mean"] = dict(seeds=seeds, **verdict(mean(ra), mean(rb)))
    out["pass"] = out["mean"]["pass"]
    return out


def plot_matplotlib(runs, png, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw=dict(width_ratios=[3, 2]))
    keys = sorted({(r["impl"], r["preset"]) for r in runs})
    colors = {k: f"C{i}" for i, k in enumerate(keys)}
    styles = ["-", "--", ":", "-."]
    seeds = sorted({r["seed"] for r in runs})
    for r in runs:
        pts = [(x["step"], x["val_loss"]) for x in r["rows"] if "val_loss" in x]
        steps, vals = zip(*pts)
        label = f"{r['impl']} {r['preset']} s{r['seed']} ({r['val_loss']:.4f})"
        for ax in axes:
            ax.plot(steps, vals, styles[seeds.index(r["seed"]) % 4], color=colors[(r["impl"], r["preset"])],
                    marker="o", ms=3, lw=1.5, label=label)
    last = max(r["rows"][-1]["step"] for r in runs)
    tail = [x["val_loss"] for r in runs for x in r["rows"] if "val_loss" in x and x["step"] >= last * 2 // 3]
    axes[1].set_xlim(last * 2 // 3 - last // 50, last + last // 50)
    axes[1].set_ylim(min(tail) - 0.01, max(tail) + 0.01)
    axes[0].set_title(title)
    axes[1].set_title("the last third")
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats a byte)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_dragon(runs, png, title, dragon):
    cmd = [dragon, "plot", *[r["log_path"] for r in runs], "--out", png, "--title", title]
    for r in runs:
        cmd += ["--label", f"{r['impl']} {r['preset']} s{r['seed']}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(p.stderr.strip() or f"dragon plot exited {p.returncode}")


def plot(runs, png, title, dragon):
    """Which drew it, or None with a warning."""
    try:
        plot_matplotlib(runs, png, title)
        return "matplotlib"
    except ImportError:
        pass
    if dragon and (shutil.which(dragon) or os.access(dragon, os.X_OK)):
        try:
            plot_dragon(runs, png, title, dragon)
            return "dragon plot"
        except RuntimeError as e:
            print(f"quality: no PNG: {e}", file=sys.stderr)
            return None
    print(f"quality: no PNG: matplotlib does not import and there is no dragon at {dragon!r} "
          "(--dragon PATH)", file=sys.stderr)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[1:]))
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--results", default="bench/results", help="where the report goes (bench/results)")
    ap.add_argument("--device", default=None, help="its name in the file names (default from the "
                    "runs' device_name, e.g. h200)")
    ap.add_argument("--date", default=None, help="YYYY-MM-DD (default today, UTC)")
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of step_ms (10)")
    ap.add_argument("--batch", type=int, default=8, help="B where run.json lacks it (8)")
    ap.add_argument("--time", type=int, default=512, help="T where run.json lacks it (512)")
    ap.add_argument("--dragon", default=os.environ.get("DRAGON", "build/dragon"),
                    help="the dragon program, for `dragon plot` ($DRAGON, build/dragon)")
    args = ap.parse_args()
    if args.skip < 0:
        die("--skip: must be >= 0", 2)
    if args.date and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", args.date):
        die(f"--date {args.date}: not YYYY-MM-DD", 2)

    runs, seen = [], {}
    for d in args.runs:
        meta, rows, log_path = read_run(d)
        key = (meta["impl"], meta["preset"], int(meta["seed"]))
        if key in seen:
            die(f"{d} and {seen[key]}: both are {key[0]} {key[1]} seed {key[2]}")
        seen[key] = d
        bt = int(meta.get("batch", args.batch)) * int(meta.get("time", args.time))
        ms = step_ms(rows, bt, args.skip)
        runs.append(dict(impl=key[0], preset=key[1], seed=key[2], steps=rows[-1]["step"],
                         val_loss=rows[-1]["val_loss"], tokens_per_s=bt * 1e3 / ms if ms else None,
                         step_ms=ms, meta=meta, rows=rows, log_path=log_path, bt=bt))
    runs.sort(key=lambda r: (r["impl"] != "dragon", r["impl"], r["preset"], r["seed"]))

    device = device_of(runs, args.device)
    date = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    stem = os.path.join(args.results, f"quality-{device}-{date}")
    os.makedirs(stem, exist_ok=True)
    for r in runs:  # "log" and "png": beside the JSON, named relative to it
        r["log"] = os.path.join(os.path.basename(stem), f"{r['impl']}-{r['preset']}-s{r['seed']}.jsonl")
        shutil.copyfile(r["log_path"], os.path.join(args.results, r["log"]))

    cfg_keys = ("batch", "time", "lr", "wd", "clip", "dropout", "warmup", "eval_every", "eval_batches")
    config = {k: v for k, v in runs[0]["meta"].items() if k in cfg_keys}
    acceptance = [check(runs, a, b, tol) for a, b, tol in CHECKS]
    steps = sorted({r["steps"] for r in runs})
    bts = sorted({r["bt"] for r in runs})
    title = (f"BDH validation loss, {device}: {'/'.join(map(str, steps))} steps of "
             f"{'/'.join(map(str, bts))} tokens")
    drawn = plot(runs, stem + ".png", title, args.dragon)
    report = dict(
        runs=[{k: r[k] for k in ("impl", "preset", "seed", "steps", "val_loss", "tokens_per_s", "step_ms",
                                 "log")} for r in runs],
        acceptance=acceptance, device=device, date=date, config=config,
        step_ms_rule=f"mean over steps without an evaluation and not right after one, less the first "
                     f"{args.skip} of the run and of each resumption",
        png=os.path.basename(stem) + ".png" if drawn else None, png_by=drawn)
    if len(steps) > 1 or len(bts) > 1:
        report["warning"] = f"the runs differ in steps {steps} or tokens a step {bts}"
        print(f"quality: warning: {report['warning']}", file=sys.stderr)
    with tempfile.NamedTemporaryFile("w", dir=args.results, delete=False, suffix=".tmp") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(f.name, stem + ".json")

    for r in runs:
        ms = f"{r['step_ms']:.1f} ms/step" if r["step_ms"] else "no timed step"
        print(f"{r['impl']:>14} {r['preset']:<7} s{r['seed']}: val {r['val_loss']:.4f} at {r['steps']}, {ms}")
    for c in acceptance:
        if c["pass"] is None:
            print(f"  {c['name']}: missing ({c['missing']})")
            continue
        seeds = ", ".join(f"s{p['seed']} {100 * p['rel']:+.2f}% {'ok' if p['pass'] else 'FAIL'}"
                          for p in c["per_seed"])
        print(f"  {c['name']}: mean {100 * c['mean']['rel']:+.2f}% (within {100 * c['tolerance']:g}%: "
              f"{'pass' if c['pass'] else 'FAIL'}); {seeds}")
    print(f"quality: wrote {stem}.json{', ' + stem + '.png' if drawn else ''} and the logs in {stem}/")


if __name__ == "__main__":
    main()

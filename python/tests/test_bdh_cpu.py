"""dragon_bdh.torch.BDH on the CPU, as a PyTorch user of pathwaycom/bdh's
BDH uses it, against the project's PyTorch model (tools/bdh_torch.py):
the config, forward's (logits, loss), the backward in loss.backward()
(none inside the forward), any batch and length, generate(), state_dict()
both ways, .to(), train()/eval() and dropout, copies; and the example
(its --help, its warning, its loss against `dragon train`'s)."""
import copy
import json
import os
import pickle
import random
import subprocess
import sys
import time

import pytest
import torch

import dragon_bdh
import dragon_bdh.torch as dt

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(PKG, "examples", "train_bdh.py")
# the tiny model: N = 4 * 32 / 2 = 64 neurons a head
TINY = dict(n_layer=2, n_embd=32, n_head=2, mlp_internal_dim_multiplier=4, vocab_size=256)
REF = dict(layers=2, embd=32, heads=2, neurons=64, vocab=256)


def tokens(seed, b=2, t=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, t), generator=g), torch.randint(0, 256, (b, t), generator=g)


def model(preset="f32", scale=25.0, **kw):
    """A tiny BDH, its init scaled up so that the ReLUs are not all at
    their kinks, and the project's PyTorch model holding its weights."""
    import bdh_torch

    m = dt.BDH(dt.BDHConfig(preset=preset, **{**TINY, "dropout": 0.0, "seed": 3, "batch_size": 2, "block_size": 8,
                                              **kw}))
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale)
    ref = bdh_torch.BDH(dropout=0.0, quant=None if preset == "f32" else preset, **REF)
    ref.load_state_dict(m.state_dict(), strict=True)
    return m, ref


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_config_is_the_references_and_dragons():
    """BDHConfig's first fields are pathwaycom/bdh's BDHConfig's (the 25M
    model at the defaults: 8192 neurons a head); any object with them
    configures the model (fields it lacks take the defaults), keyword
    fields override; the old positional preset and unknown fields are
    refused saying what to write."""
    c = dt.BDHConfig()
    assert (c.n_layer, c.n_embd, c.dropout, c.n_head, c.vocab_size, c.n_neurons) == (6, 256, 0.1, 4, 256, 8192)

    class TheirConfig:  # pathwaycom/bdh's fields only
        n_layer, n_embd, dropout, n_head, mlp_internal_dim_multiplier, vocab_size = 2, 32, 0.0, 2, 4, 256

    m = dt.BDH(TheirConfig(), preset="f32")
    assert m.config.n_neurons == 64 and m.config.preset == "f32" and m.config.block_size == 512
    assert m.encoder.shape == (2, 32, 64)
    with pytest.raises(TypeError, match=r"BDH\(BDHConfig\(preset='w8a8'"):
        dt.BDH("w8a8")
    with pytest.raises(TypeError, match="no config field batch"):
        dt.BDH(batch=8)
    with pytest.raises(dragon_bdh.InvalidArgument, match="preset 'seed'"):
        dt.BDH(preset="seed", **TINY)
    with pytest.raises(dragon_bdh.InvalidArgument, match="not a multiple of n_head=3"):
        dt.BDH(n_head=3, **{k: v for k, v in TINY.items() if k != "n_head"})
    # dragon's init of the seed: the same weights as `dragon train --seed 3` starts from
    w = dragon_bdh.Model("f32", batch=1, time=1, seed=3, **REF)
    assert torch.equal(dt.BDH(preset="f32", seed=3, **TINY).encoder.detach(), torch.from_dlpack(w.buffer(1)))


@pytest.mark.parametrize("preset", ["f32", "w8a8", "bitnet"])
def test_forward_returns_logits_and_loss_as_the_reference(preset):
    """(None, loss) with targets; (logits, None) without; both when
    asked. The loss and every gradient match the PyTorch model's (f32 to
    rounding; the low-bit recipes to their fake-quant forms); the logits
    its logits (the f32 recipe: the activations' precision on the CPU)."""
    m, ref = model(preset)
    idx, tgt = tokens(1)
    logits, loss = m(idx, tgt)
    assert logits is None and loss.shape == () and loss.dtype == torch.float32 and loss.requires_grad
    loss.backward()
    want = ref(idx, tgt)
    want.backward()
    tol = 1e-5 if preset == "f32" else 2e-3
    assert abs(loss.item() - want.item()) <= tol * abs(want.item()), (loss.item(), want.item())
    for (n, p), (n2, q) in zip(sorted(m.named_parameters()), sorted(ref.named_parameters())):
        assert n == n2
        assert rel(p.grad, q.grad) < (1e-4 if preset == "f32" else 5e-2), n
    with torch.no_grad():
        want_logits = ref(idx)
    logits, none = m(idx)
    assert none is None and logits.shape == (2, 8, 256) and logits.dtype == torch.float32
    assert not logits.requires_grad  # the loss is what backward() differentiates
    assert rel(logits, want_logits) < (1e-5 if preset == "f32" else 5e-2)
    logits2, loss2 = m(idx, tgt, return_logits=True)
    assert torch.allclose(logits2, logits, rtol=0, atol=0) and abs(loss2.item() - loss.item()) < 1e-6


def test_the_backward_runs_in_loss_backward_through_autograd(monkeypatch):
    """The forward runs dragon's forward only; loss.backward() runs its
    backward (once) and autograd puts the gradients in .grad, scaled by
    the incoming gradient and accumulating. Under no_grad or eval there
    is no graph; a forward in between makes the backward recompute its
    own forward first (the same gradients); a parameter changed in place
    between the forward and the backward is autograd's usual error."""
    m, ref = model("f32")
    idx, tgt = tokens(2)
    m(idx, tgt)  # makes the plan
    plan = next(iter(m._plans.values()))
    calls = []
    real = plan.model.backward
    monkeypatch.setattr(plan.model, "backward", lambda: (calls.append(1), real())[1])
    _, loss = m(idx, tgt)
    assert calls == [] and all(p.grad is None for p in m.parameters())
    (2.0 * loss).backward()
    assert calls == [1]
    g1 = [p.grad.clone() for p in m.parameters()]
    ref(idx, tgt).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert rel(p.grad, 2 * q.grad) < 1e-4
    _, loss = m(idx, tgt)
    loss.backward()  # accumulates
    for p, g in zip(m.parameters(), g1):
        assert torch.allclose(p.grad, 1.5 * g, rtol=1e-6)
    assert len(calls) == 2
    m.zero_grad()
    with torch.no_grad():
        _, loss = m(idx, tgt)
    assert not loss.requires_grad and len(calls) == 2
    # the first pass's backward after a second forward: recomputed, equal
    other, otgt = tokens(3)
    _, first = m(idx, tgt)
    m(other, otgt)
    first.backward()
    assert len(calls) == 3
    for p, g in zip(m.parameters(), g1):
        assert torch.allclose(p.grad, 0.5 * g, rtol=1e-6, atol=1e-9)
    m.zero_grad()
    _, loss = m(idx, tgt)
    with torch.no_grad():
        m.encoder.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_any_batch_and_length_on_the_cpu():
    """Batches of any (B, T), larger than the config's too, each the
    reference's loss and gradients; the CPU runs them all on one plan."""
    m, ref = model("f32")
    for b, t in ((1, 1), (2, 8), (3, 5), (5, 17), (1, 40)):
        idx, tgt = tokens(b * 100 + t, b, t)
        m.zero_grad()
        ref.zero_grad()
        _, loss = m(idx, tgt)
        loss.backward()
        want = ref(idx, tgt)
        want.backward()
        assert abs(loss.item() - want.item()) <= 1e-5 * want.item(), (b, t)
        for p, q in zip(m.parameters(), ref.parameters()):  # T 1: no attention, the decoder's all zeros
            assert (p.grad - q.grad).norm() <= 1e-4 * q.grad.norm() + 1e-9, (b, t)
    assert m.plans() == [("cpu", 2, 8)]
    with pytest.raises(dragon_bdh.InvalidArgument, match=r"targets: expected integer tokens of idx's shape"):
        m(idx, tgt[:, :-1])
    with pytest.raises(dragon_bdh.InvalidArgument, match=r"idx: expected a \(B, T\) tensor"):
        m(idx[0])
    with pytest.raises(dragon_bdh.InvalidArgument, match=r"idx\[3\] = 300"):
        bad = torch.zeros(2, 8, dtype=torch.long)
        bad[0, 3] = 300
        m(bad, torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(dragon_bdh.InvalidArgument, match=r"targets\[9\] = -1"):
        bad = torch.zeros(2, 8, dtype=torch.long)
        bad[1, 1] = -1
        m(torch.zeros(2, 8, dtype=torch.long), bad)


def test_generate_samples_from_the_last_positions_logits():
    """generate() appends max_new_tokens tokens, the prompt kept; with
    temperature 0 (or top_k 1) each is the argmax of the reference's
    logits at the last position of every token so far (the CPU decodes
    from a state: no window, the context passes block_size 8); sampling
    draws from torch's generator (seeded: repeatable)."""
    m, ref = model("f32")
    m.train()  # generate turns dropout off whatever the mode
    idx, _ = tokens(5, 2, 6)
    out = m.generate(idx, 12, temperature=0)
    assert out.shape == (2, 18) and torch.equal(out[:, :6], idx) and out.dtype == idx.dtype
    with torch.no_grad():
        for k in range(6, 18):
            ctx = out[:, :k]  # past block_size 8
            want = ref(ctx)[:, -1].argmax(-1)
            assert torch.equal(out[:, k], want), k
    assert torch.equal(m.generate(idx, 12, top_k=1), out)
    torch.manual_seed(7)
    a = m.generate(idx, 12, temperature=1.0, top_k=20)
    torch.manual_seed(7)
    assert torch.equal(m.generate(idx, 12, temperature=1.0, top_k=20), a)
    assert m.training


def test_state_dict_is_the_references_names_and_shapes(tmp_path):
    """state_dict() holds pathwaycom/bdh's parameters by name and shape
    (embed.weight [V, D], encoder [H, D, N], encoder_v [H, D, N], decoder
    [H*N, D], lm_head [D, V]) and nothing else; it loads into the
    project's PyTorch model strictly and back; load_checkpoint reads a
    safetensors file of them."""
    import bdh_torch
    from safetensors.torch import save_file

    m = dt.BDH(preset="f32", seed=5, **TINY)
    sd = m.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == {
        "embed.weight": (256, 32), "encoder": (2, 32, 64), "encoder_v": (2, 32, 64), "decoder": (128, 32),
        "lm_head": (32, 256)}
    ref = bdh_torch.BDH(**REF)
    ref.load_state_dict(sd, strict=True)
    m2 = dt.BDH(preset="w8a8", seed=6, **TINY)
    m2.load_state_dict(ref.state_dict())
    for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    idx, tgt = tokens(8)
    want = dt.BDH(preset="w8a8", seed=5, **TINY).eval()(idx, tgt)[1].item()  # the same weights
    assert m2.eval()(idx, tgt)[1].item() == want
    path = str(tmp_path / "w.safetensors")
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    m3 = dt.BDH(preset="f32", seed=9, **TINY)
    m3.load_checkpoint(path)
    assert torch.equal(m3.encoder, m.encoder)


def test_to_moves_or_says_why():
    """.to(cpu) keeps working; a dtype or device dragon does not run is
    refused before anything moves, naming why; the parameters stay the
    optimizer's (the same objects) across a move."""
    m = dt.BDH(preset="f32", **TINY)
    params = list(m.parameters())
    assert m.to("cpu") is m and m.cpu() is m and list(m.parameters()) == params
    with pytest.raises(dragon_bdh.Unsupported, match="float32 weights .*preset='bf16'"):
        m.to(torch.float64)
    with pytest.raises(dragon_bdh.Unsupported, match="float32"):
        m.half()
    with pytest.raises(dragon_bdh.Unsupported, match="cuda or cpu, not meta"):
        m.to("meta")
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in m.parameters())
    idx, tgt = tokens(1)
    m(idx, tgt)[1].backward()
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError, dragon_bdh.DragonError)):
            m.cuda()
        assert all(p.device.type == "cpu" for p in m.parameters())


def test_train_and_eval_turn_dropout_on_and_off():
    """With dropout, training forwards of one batch differ (each draws its
    masks), evaluation ones do not and equal a dropout-0 model's."""
    m = dt.BDH(preset="f32", dropout=0.5, **TINY)
    m0 = dt.BDH(preset="f32", dropout=0.0, **TINY)
    idx, tgt = tokens(3)
    with torch.no_grad():
        a, b = m(idx, tgt)[1].item(), m(idx, tgt)[1].item()
        assert a != b and m.dropout_step == 2
        m.eval()
        c, d = m(idx, tgt)[1].item(), m(idx, tgt)[1].item()
        assert c == d == m0(idx, tgt)[1].item() and m.dropout_step == 2


def test_copies_and_pickles_without_dragons_plans():
    """deepcopy and pickle copy the parameters; dragon's plans stay with
    the original (each copy makes its own at its first forward)."""
    m, _ = model("f32")
    idx, tgt = tokens(4)
    want = m(idx, tgt)[1].item()
    for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert c._plans == {} and c.state_dict().keys() == m.state_dict().keys()
        assert c(idx, tgt)[1].item() == want


def test_trains_with_torch_adamw():
    m = dt.BDH(preset="w8a8", seed=2, **TINY)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1)
    idx, tgt = tokens(4)
    losses = []
    for _ in range(30):
        _, loss = m(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses


def test_load_checkpoint_checks_the_file_as_dragon_does(tmp_path):
    """load_checkpoint reads a `dragon train` checkpoint's weights, and
    refuses what dragon's own readers refuse: a flipped bit of its
    metadata (the step: the seal covers the header too), a NaN weight
    (named, though a file PyTorch wrote has no seal), and gradients."""
    prog = os.environ.get("DRAGON") or os.path.join(os.path.dirname(dragon_bdh.library_path()), "dragon")
    if not os.path.isfile(prog):
        pytest.skip("no dragon program beside the library (%s)" % prog)
    from safetensors.torch import load_file, save_file

    text = tmp_path / "text.txt"
    text.write_text("Now is the winter of our discontent made glorious summer by this sun of York. " * 80)
    tiny = ["--cpu", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64"]
    r = subprocess.run([prog, "train", *tiny, "--preset", "f32", "--steps", "3", "--batch", "2", "--time", "8",
                        "--eval-batches", "1", "--data", str(text), "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ck = tmp_path / "run" / "ckpt-00000003.safetensors"
    m = dt.BDH(preset="f32", seed=9, **TINY)
    m.load_checkpoint(str(ck))
    assert torch.equal(m.encoder.detach(), load_file(str(ck))["encoder"])

    data = ck.read_bytes()
    at = data.index(b'"step":"3"') + 8
    flipped = tmp_path / "flipped.safetensors"
    flipped.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])  # "3" -> "2"
    with pytest.raises(dragon_bdh.DragonError, match=r"flipped.safetensors: damaged: "):
        m.load_checkpoint(str(flipped))
    assert torch.equal(m.encoder.detach(), load_file(str(ck))["encoder"])  # untouched

    sd = load_file(str(ck))
    sd["lm_head"][0, 5] = float("nan")
    nan = tmp_path / "nan.safetensors"
    save_file({k: sd[k] for k in dragon_bdh.PARAMS}, str(nan))
    with pytest.raises(dragon_bdh.DragonError, match=r"lm_head\[5\] is nan"):
        m.load_checkpoint(str(nan))

    grads = tmp_path / "grads.safetensors"
    r = subprocess.run([prog, "eval", "--model", str(ck), "--cpu", "--batch", "1", "--time", "8", "--batches", "1",
                        "--grads", str(grads)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with pytest.raises(dragon_bdh.DragonError, match="a gradients file"):
        m.load_checkpoint(str(grads))


def test_the_examples_help_is_whole():
    """--help prints the whole description (its last sentence too) and
    every option's help."""
    r = subprocess.run([sys.executable, EXAMPLE, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--sample N prints N bytes the trained model writes." in " ".join(r.stdout.split())
    assert "gradient clip 1.0), so that its loss follows `dragon train --seed S`'s." in " ".join(r.stdout.split())
    for opt in ("--preset", "--steps", "--batch", "--time", "--lr", "--seed", "--size", "--data", "--log"):
        assert opt in r.stdout


def test_the_example_warns_before_a_long_cpu_run(tmp_path):
    """On the CPU, a run that would take more than a minute (the first
    step's time times the steps) is announced on stderr with the
    estimate and what shortens it, before it goes on."""
    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question. " * 400)
    p = subprocess.Popen([sys.executable, EXAMPLE, "--preset", "f32", "--size", "tiny", "--steps", "1000000",
                          "--batch", "2", "--time", "16", "--data", str(text)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    try:
        for _ in range(50):  # past anything else on stderr (a library's warning)
            line = p.stderr.readline()
            if "will take" in line or not line:
                break
    finally:
        p.kill()
        p.communicate()
    assert "1000000 steps of B 2 x T 16 on the CPU will take about" in line, line
    assert "minutes" in line and "--steps" in line


@pytest.mark.parametrize("preset,tol", [("f32", 1e-6), ("w8a8", 3e-3)])
def test_the_example_follows_dragon_train(tmp_path, preset, tol):
    """examples/train_bdh.py (tiny, on the CPU) against `dragon train
    --cpu` of the same recipe, seed and text: the same batches, init,
    schedule and dropout, torch's AdamW and clip for dragon's, so the two
    losses agree step by step within the optimizers' rounding (f32: 5e-8
    over the 40 steps) and fall. A low-bit recipe amplifies that rounding
    where a code flips (w8a8: about 1e-4 by step 40). A short run says
    nothing of its time; --sample writes bytes."""
    prog = os.environ.get("DRAGON") or os.path.join(os.path.dirname(dragon_bdh.library_path()), "dragon")
    if not os.path.isfile(prog):
        pytest.skip("no dragon program beside the library (%s)" % prog)
    random.seed(1)
    words = open(os.path.join(os.path.dirname(PKG), "README.md")).read().split()
    text = tmp_path / "text.txt"
    text.write_text(" ".join(random.choice(words) for _ in range(20000)))
    common = ["--preset", preset, "--steps", "40", "--batch", "2", "--time", "16", "--seed", "5", "--data", str(text)]
    t0 = time.time()
    ex = subprocess.run([sys.executable, EXAMPLE, *common, "--size", "tiny", "--lr", "3e-3", "--sample", "20",
                         "--log", str(tmp_path / "ex.jsonl")], capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert ex.returncode == 0, ex.stderr
    assert "val " in ex.stdout and "will take" not in ex.stderr, (ex.stdout, ex.stderr, time.time() - t0)
    dr = subprocess.run([prog, "train", *common, "--cpu", "--layers", "2", "--embd", "32", "--heads", "2",
                         "--neurons", "64", "--lr", "3e-3", "--eval-batches", "2", "--out", str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=300)
    assert dr.returncode == 0, dr.stderr
    got = [json.loads(l) for l in open(tmp_path / "ex.jsonl")]
    want = [json.loads(l) for l in open(tmp_path / "run" / "log.jsonl")]
    assert len(got) == len(want) == 40
    for g, w in zip(got, want):
        assert abs(g["lr"] - w["lr"]) <= 1e-6 * w["lr"], (g, w)
        assert abs(g["train_loss"] - w["train_loss"]) <= tol * w["train_loss"], (g, w)
    assert got[-1]["train_loss"] < got[0]["train_loss"] - 0.5

"""Token corpora and token ids from Python, without torch and without a
GPU: dragon_bdh.Corpus over llm.c's shards (the default vocabulary 50304, the
val shard beside the train ones, the same digest however they are named,
a bad file refused with dragon's line naming it and the byte offset) and
over raw uint16 tokens (vocab=); dragon_bdh.Model.generate at a vocabulary of
512 returns ids, the same ones `dragon sample --prompt-ids` prints from
the same weights and seed."""
import json
import os
import struct
import subprocess

import pytest

import dragon_bdh as dragon


def cycle(i, v):
    k = i % 64
    return v - 1 if k == 0 else (k * 7919 + 13) % (v - 1)


def shard(path, toks, magic=20240520, version=1, count=None):
    head = struct.pack("<256i", magic, version, len(toks) if count is None else count, *([0] * 253))
    path.write_bytes(head + struct.pack("<%dH" % len(toks), *toks))


def test_shards_split_vocab_and_digest(tmp_path):
    shard(tmp_path / "t_train_000001.bin", [cycle(i, 50304) for i in range(600)])
    shard(tmp_path / "t_train_000002.bin", [cycle(i, 50304) for i in range(600, 1200)])
    shard(tmp_path / "t_val_000000.bin", [cycle(i, 50304) for i in range(100)])
    c = dragon.Corpus(str(tmp_path / "t_train_*.bin"))
    assert (c.size, c.train_size, c.vocab) == (1300, 1200, 50304)
    assert "beside" in c.split
    idx, tgt = c.batch(2, 16)
    assert all(0 <= t < 50304 for t in idx) and list(idx)[1:16] == list(tgt)[:15]
    listed = dragon.Corpus(",".join(str(tmp_path / n) for n in ("t_train_000001.bin", "t_train_000002.bin",
                                                                  "t_val_000000.bin")))
    assert listed.digest() == c.digest() == dragon.Corpus(str(tmp_path)).digest()
    shard(tmp_path / "t_val_000000.bin", [cycle(i, 50304) for i in range(100)], count=101)
    with pytest.raises(dragon.DragonError) as e:
        dragon.Corpus(str(tmp_path))
    assert "t_val_000000.bin: byte offset 1224: truncated" in str(e.value)


def test_raw_tokens_need_their_vocabulary(tmp_path):
    (tmp_path / "train.bin").write_bytes(struct.pack("<1000H", *[cycle(i, 512) for i in range(1000)]))
    (tmp_path / "val.bin").write_bytes(struct.pack("<200H", *[cycle(i, 512) for i in range(200)]))
    c = dragon.Corpus(str(tmp_path), vocab=512)
    assert (c.size, c.train_size, c.vocab, c.split) == (1200, 1000, 512, "val.bin")
    with pytest.raises(dragon.InvalidArgument) as e:
        dragon.Corpus(str(tmp_path))
    assert "--vocab" in str(e.value)
    with pytest.raises(dragon.DragonError) as e:
        dragon.Corpus(str(tmp_path), vocab=300)
    assert "train.bin: byte offset" in str(e.value) and "outside the vocabulary 0..299" in str(e.value)


def load_masters(model, path):
    """A checkpoint's weights copied into a CPU dragon.Model's masters (the
    safetensors layout read by hand: no torch here)."""
    import ctypes

    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + n])
    for p in model.params:
        t = head[p["name"]]
        a, b = t["data_offsets"]
        blob = data[8 + n + a:8 + n + b]
        assert t["dtype"] == "F32" and tuple(t["shape"]) == p["shape"]
        ctypes.memmove(p["master"], blob, len(blob))


@pytest.mark.skipif(not os.environ.get("DRAGON"), reason="needs the dragon program ($DRAGON)")
def test_generate_returns_the_ids_dragon_sample_prints(tmp_path):
    data = tmp_path / "tokens.u16"
    data.write_bytes(struct.pack("<6000H", *[cycle(i, 512) for i in range(6000)]))
    run = tmp_path / "run"
    tiny = ["--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64",
            "--batch", "2", "--time", "16", "--eval-batches", "1", "--lr", "0.01"]
    r = subprocess.run([os.environ["DRAGON"], "train", *tiny, "--steps", "6", "--data", str(data), "--vocab", "512",
                        "--out", str(run)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = dragon.Model("f32", batch=1, time=16, layers=2, embd=32, heads=2, neurons=64, vocab=512)
    load_masters(m, run / "ckpt-00000006.safetensors")
    for seed, temp in ((5, 0.8), (5, 0.0), (6, 1.0)):
        ids = m.generate([511, 3, 40], length=12, temperature=temp, seed=seed)
        assert len(ids) == 12 and all(isinstance(t, int) and 0 <= t < 512 for t in ids)
        r = subprocess.run([os.environ["DRAGON"], "sample", str(run), "--cpu", "--prompt-ids", "511,3,40",
                            "--length", "12", "--temperature", str(temp), "--seed", str(seed)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [str(t) for t in [511, 3, 40] + ids]
    with pytest.raises(dragon.InvalidArgument):
        m.generate("text", length=1)
    with pytest.raises(dragon.InvalidArgument):
        m.generate([512], length=1)

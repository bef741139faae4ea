"""Kernel bundles from Python, no GPU and no torch needed: build_bundle
compiles a few specs with NVRTC into a folder that dragon's reader
accepts (check_bundle: the manifest, every file's size, SHA-256 and
SM), specs that resolve alike are one kernel, a second build is all
cache hits; a spec dragon refuses, an empty list and a folder that
cannot be made raise dragon's line and write nothing; default_specs is
the default build set."""
import json
import os

import pytest

import dragon_bdh

SPECS = ["op=pack_i8x4;latent=256", "op=unpack_i8x4;latent=256"]


def test_a_small_bundle_builds_and_reads_back(tmp_path):
    out, cache = tmp_path / "kernels", tmp_path / "cache"
    specs = SPECS + [dragon_bdh.Spec("op=pack_i8x4;latent=256")]  # the same kernel again, as a Spec
    r = dragon_bdh.build_bundle(out, specs=specs, device="", jobs=2, cache_dir=cache)
    assert r["specs"] == 3 and r["kernels"] == 2, r
    assert r["compiled"] + r["cache_hits"] == 2 and r["device"] == "" and r["sm"] == 0, r
    kernels = dragon_bdh.check_bundle(out)
    assert len(kernels) == 2
    assert any(";op=pack_i8x4;" in ";" + k for k in kernels) and any(";op=unpack_i8x4;" in ";" + k for k in kernels)
    assert all("tile=auto" not in k for k in kernels), kernels
    names = sorted(os.listdir(out))
    assert "manifest.json" in names and not any(n.startswith(".") for n in names), names
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == 2 and sorted(k["spec"] for k in manifest["kernels"]) == sorted(kernels)
    for k in manifest["kernels"]:
        assert k["file"].endswith(".cubin") and (out / k["file"]).stat().st_size == k["size"]

    again = dragon_bdh.build_bundle(out, specs=specs, device="", cache_dir=cache)
    assert again["cache_hits"] == 2 and again["compiled"] == 0, again


def test_a_damaged_bundle_is_named(tmp_path):
    out = tmp_path / "kernels"
    dragon_bdh.build_bundle(out, specs=SPECS[:1], device="", cache_dir=tmp_path / "cache")
    cubin = [n for n in os.listdir(out) if n.endswith(".cubin")][0]
    data = (out / cubin).read_bytes()
    (out / cubin).write_bytes(data[: len(data) // 2])
    with pytest.raises(dragon_bdh.DragonError) as e:
        dragon_bdh.check_bundle(out)
    assert cubin in str(e.value), e.value
    with pytest.raises(dragon_bdh.DragonError) as e:
        dragon_bdh.check_bundle(tmp_path / "nothing-here")
    assert e.value.status == "not found" and "manifest.json" in str(e.value)


def test_bad_input_raises_and_writes_nothing(tmp_path):
    out = tmp_path / "made" / "kernels"
    cache = tmp_path / "cache"
    with pytest.raises(dragon_bdh.InvalidSpec) as e:
        dragon_bdh.build_bundle(out, specs=SPECS + ["op=lowrank_fwd;latent=8190"], device="", cache_dir=cache)
    assert "specs[2]: " in str(e.value) and "latent=8190" in str(e.value), e.value
    assert e.value.step == "args"
    with pytest.raises(dragon_bdh.InvalidArgument) as e:
        dragon_bdh.build_bundle(out, specs=[], cache_dir=cache)
    assert "empty" in str(e.value)
    with pytest.raises(dragon_bdh.InvalidArgument) as e:
        dragon_bdh.build_bundle(out, specs=SPECS, device="NVIDIA H200", cache_dir=cache)
    assert "sm" in str(e.value)
    assert not (tmp_path / "made").exists()
    (tmp_path / "file").write_text("a file, not a folder")
    with pytest.raises(dragon_bdh.DragonError) as e:
        dragon_bdh.build_bundle(tmp_path / "file" / "kernels", specs=SPECS, device="", cache_dir=cache)
    assert e.value.step == "folder" and str(tmp_path / "file") in str(e.value), e.value


def test_default_specs_are_the_default_build_set():
    specs = dragon_bdh.default_specs()
    assert len(specs) == len(set(specs)) > 0
    ops = {dict(kv.split("=", 1) for kv in s.strip(";").split(";"))["op"] for s in specs}
    assert {"lowrank_fwd", "pack_i8x4", "embed_fwd", "adamw_update"} <= ops, ops
    assert dragon_bdh.Spec(specs[0]).text == specs[0]

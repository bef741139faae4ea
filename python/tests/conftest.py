"""Shared fixtures: the repository's tools/ on the path (the project's
PyTorch model, bdh_torch.BDH), and the GPU tests' gate, which prints
"skipped: no CUDA device (why)" where there is none, and fails instead
with DRAGON_REQUIRE_GPU=1 (the GPU machine's run), so a broken driver
cannot pass as a skip."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))


def gpu_reason():
    try:
        import torch
    except ImportError:
        return "no torch"
    import dragon_bdh

    if dragon_bdh.device_count() == 0:
        return dragon_bdh.no_device_reason()
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return ""


@pytest.fixture
def gpu():
    why = gpu_reason()
    if why:
        if os.environ.get("DRAGON_REQUIRE_GPU") == "1":
            pytest.fail("DRAGON_REQUIRE_GPU=1 and no CUDA device: %s" % why)
        print("skipped: no CUDA device (%s)" % why)
        pytest.skip("skipped: no CUDA device (%s)" % why)
    import torch

    return torch.device("cuda", 0)

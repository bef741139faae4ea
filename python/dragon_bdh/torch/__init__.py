"""dragon_bdh on torch tensors: the BDH model (dragon_bdh.torch.BDH, its
config BDHConfig: pathwaycom/bdh's BDH in interface, dragon's fused
kernels underneath) and the ops (dragon_bdh.torch.ops: projection,
decoder, attention, the quantizers and packers).

Needs PyTorch (`pip install torch`); `import dragon_bdh` alone does not.

    import torch
    from dragon_bdh.torch import BDH, BDHConfig
    model = BDH(BDHConfig(preset="w8a8")).cuda()
    logits, loss = model(idx, targets)      # logits None unless asked
    loss.backward()
"""
try:
    import torch  # noqa: F401
except ImportError as e:  # torch missing, or one that does not import
    raise ModuleNotFoundError("dragon_bdh.torch needs PyTorch, which did not import (%s): pip install torch "
                              "(import dragon_bdh alone needs nothing)" % e, name="torch") from e

from dragon_bdh.torch import _call  # noqa: E402,F401
from dragon_bdh.torch._call import check_only, clear_prepared, prepared_stats  # noqa: E402
from dragon_bdh.torch.bdh import BDH, BDHConfig  # noqa: E402
from dragon_bdh.torch.ops import (attention, decoder, dequantize, fake_quant_act, fake_quant_weight,  # noqa: E402
                                  pack, projection, quantize_act, quantize_weight, rope_table, unpack)

__all__ = ["BDH", "BDHConfig", "attention", "decoder", "dequantize", "fake_quant_act", "fake_quant_weight", "pack",
           "projection", "quantize_act", "quantize_weight", "rope_table", "unpack", "check_only",
           "clear_prepared", "prepared_stats"]

"""dragon on torch tensors: the ops (dragon.torch.ops: projection,
decoder, attention, the quantizers and packers) and the BDH model
(dragon.torch.BDH). Needs torch; `import dragon` alone does not."""
from dragon.torch import _call  # noqa: F401
from dragon.torch._call import check_only
from dragon.torch.bdh import BDH
from dragon.torch.ops import (attention, decoder, dequantize, fake_quant_act, fake_quant_weight, pack, projection,
                              quantize_act, quantize_weight, rope_table, unpack)

__all__ = ["BDH", "attention", "decoder", "dequantize", "fake_quant_act", "fake_quant_weight", "pack",
           "projection", "quantize_act", "quantize_weight", "rope_table", "unpack", "check_only"]

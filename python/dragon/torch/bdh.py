"""dragon.torch.BDH: the BDH model as an nn.Module whose forward and
backward are dragon's fused step for a preset (f32, bf16, w8a8, bitnet;
the CPU runs f32, w8a8 and bitnet).

Its parameters are the reference's (embed.weight, encoder, encoder_v,
decoder, lm_head; pathwaycom/bdh bdh.py's names and shapes) and they are
dragon's own f32 masters, aliased through DLPack: torch's optimizer
updates them in place and the next forward remakes the execution copies
(codes, scales, layouts) from them. state_dict() loads into the
project's PyTorch model (tools/bdh_torch.py) and back; load_checkpoint
reads a `dragon train` checkpoint.

    model = dragon.torch.BDH("w8a8", batch=8, time=512).cuda()   # or device="cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    loss = model(idx, targets)          # (B, T) int64|int32 tokens
    loss.backward(); opt.step(); opt.zero_grad()

The forward with gradients enabled runs the forward and the backward at
once (dragon's step) and keeps the gradients; loss.backward() hands them
to autograd (scaled by the incoming gradient), so they accumulate into
.grad as any module's do. Without gradients (torch.no_grad, eval) it runs
the forward alone. Dropout follows model.training; its seed is the
constructor's and its step counts the training forwards.
"""
import torch
from torch import nn

import dragon


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, idx, targets, *params):
        module._run(idx, targets, backward=True)
        ctx.module = module
        return module._loss.clone()

    @staticmethod
    def backward(ctx, grad):
        m = ctx.module
        return (None, None, None) + tuple(g * grad for g in m._grads)


class BDH(nn.Module):
    def __init__(self, preset="w8a8", batch=8, time=512, layers=6, embd=256, heads=4, neurons=8192, vocab=256,
                 dropout=0.1, seed=1, device=None):
        super().__init__()
        device = torch.device(device) if device is not None else torch.device("cpu")
        if device.type == "cuda":
            idx = device.index if device.index is not None else torch.cuda.current_device()
            device = torch.device("cuda", idx)
            dev = dragon.Device.get(idx)
        elif device.type == "cpu":
            dev = None
        else:
            raise dragon.InvalidArgument("device %s: dragon runs on cuda or cpu" % device, "invalid argument")
        self._m = dragon.Model(preset, batch=batch, time=time, seed=seed, device=dev, layers=layers, embd=embd,
                               heads=heads, neurons=neurons, vocab=vocab, dropout=dropout)
        self.preset, self.batch, self.time, self.seed = preset, batch, time, seed
        self.config = dict(layers=layers, embd=embd, heads=heads, neurons=neurons, vocab=vocab, dropout=dropout)
        self.step = 0
        self._dev = device
        masters = [torch.from_dlpack(self._m.buffer(p)) for p in range(5)]
        self._grads = [torch.from_dlpack(self._m.buffer(p, "grad")) for p in range(5)]
        self._loss = torch.from_dlpack(self._m.loss_buffer())
        self.embed = nn.Module()
        self.embed.weight = nn.Parameter(masters[0])
        self.encoder = nn.Parameter(masters[1])
        self.encoder_v = nn.Parameter(masters[2])
        self.decoder = nn.Parameter(masters[3])
        self.lm_head = nn.Parameter(masters[4])

    def _params(self):
        return (self.embed.weight, self.encoder, self.encoder_v, self.decoder, self.lm_head)

    def _apply(self, fn, recurse=True):
        # .cuda(), .to(), .half() would move the parameters off dragon's
        # memory; the model is made where it runs (device=).
        probe = fn(torch.empty(0, device=self._dev))
        if probe.device != self._dev or probe.dtype != torch.float32:
            raise dragon.Unsupported("dragon.torch.BDH lives where it was made (%s, float32 masters); make it "
                                     "with device=%s instead" % (self._dev, probe.device), "unsupported")
        return self

    def _tokens(self, t, what):
        if t.shape != (self.batch, self.time):
            raise dragon.InvalidArgument("%s: shape %s, the model was made for (%d, %d) (batch, time)"
                                         % (what, tuple(t.shape), self.batch, self.time), "invalid argument")
        t = t.to(torch.int32).contiguous()
        if self._dev.type == "cuda" and t.device.type == "cuda":
            if t.device != self._dev:
                raise dragon.InvalidArgument("%s on %s, the model on %s" % (what, t.device, self._dev),
                                             "invalid argument")
            return t, True
        return t.cpu(), False

    def _run_check(self):
        for p, where in zip(self._params(), range(5)):
            if p.data_ptr() != self._m.params[where]["master"]:
                raise dragon.InvalidArgument("%s is no longer dragon's memory (was it replaced, not copied "
                                             "into?); load weights with load_state_dict" % dragon.PARAMS[where],
                                             "invalid argument")

    def _run(self, idx, targets, backward):
        self._run_check()
        i, on_dev = self._tokens(idx, "idx")
        t, _ = self._tokens(targets, "targets")
        if on_dev != (t.device.type == "cuda"):
            i, t, on_dev = i.cpu(), t.cpu(), False
        if self._dev.type == "cuda":
            dragon.torch._call.device(self._dev)  # dragon's launches on torch's current stream
        train = self.training
        self._m.run(i.data_ptr(), t.data_ptr(), tokens_on_device=on_dev, seed=self.seed, step=self.step,
                    train=train, backward=backward)
        if train:
            self.step += 1
        self._keep = (i, t)  # host copies are read on the stream; keep them past it

    def forward(self, idx, targets):
        """The mean cross-entropy of the next tokens (a 0-dim float32)."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in self._params()):
            return _Step.apply(self, idx, targets, *self._params())
        self._run(idx, targets, backward=False)
        return self._loss.clone()

    def generate(self, prompt=None, length=200, temperature=0.8, top_k=40, seed=1337):
        """The token ids drawn after prompt (a list of `length` ints) as
        `dragon sample` draws them from the same weights and seed:
        dragon.Model.generate on this model's masters, its time the
        context. prompt: a list of ids, or bytes/str for a byte model
        (vocab 256)."""
        self._run_check()
        if self._dev.type == "cuda":
            dragon.torch._call.device(self._dev)
        return self._m.generate(prompt, length=length, temperature=temperature, top_k=top_k, seed=seed)

    def bad_tokens(self):
        """Whether the last run with tokens on the device met one outside
        the vocabulary (its row was made harmless); reads the flag (a sync)."""
        b = self._m.bad_buffer()
        return bool(torch.from_dlpack(b).item()) if b is not None else False

    def load_checkpoint(self, path):
        """The weights of a `dragon train` checkpoint (or any safetensors
        file with the reference's names), copied into the masters once the
        file is checked as dragon's own readers check it
        (dragon.check_weights: its seal, not gradients, finite values)."""
        from safetensors.torch import load

        with open(path, "rb") as f:
            data = f.read()  # read once: the bytes checked are the bytes loaded
        dragon.check_weights(data, path)
        sd = load(data)
        missing = [n for n in dragon.PARAMS if n not in sd]
        if missing:
            raise dragon.InvalidArgument("%s: no %s" % (path, ", ".join(missing)), "invalid argument")
        self.load_state_dict({n: sd[n] for n in dragon.PARAMS})

    def extra_repr(self):
        c = self.config
        return "preset=%s, batch=%d, time=%d, layers=%d, embd=%d, heads=%d, neurons=%d, on %s" % (
            self.preset, self.batch, self.time, c["layers"], c["embd"], c["heads"], c["neurons"], self._dev)

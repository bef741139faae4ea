"""dragon_bdh.torch.BDH: the BDH model as pathwaycom/bdh's BDH is used,
with dragon's fused forward and backward underneath.

    from dragon_bdh.torch import BDH, BDHConfig
    model = BDH(BDHConfig(preset="w8a8")).cuda()          # or .to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    logits, loss = model(idx, targets)   # (B, T) int64|int32 tokens; logits None
    loss.backward(); opt.step(); opt.zero_grad()
    logits, _ = model(idx)               # no targets: the logits (B, T, V)
    out = model.generate(idx, 100, temperature=0.8, top_k=20)

What is the reference's: the config's names (BDHConfig: n_layer,
n_embd, dropout, n_head, mlp_internal_dim_multiplier, vocab_size), the
parameters' names and shapes (embed.weight [V, D], encoder [H, D, N],
encoder_v [H, D, N], decoder [H*N, D], lm_head [D, V]: state_dict() loads
into tools/bdh_torch.py's BDH and pathwaycom/bdh's, and back),
forward(idx, targets=None) -> (logits, loss), generate().

What is dragon's: the math runs in dragon's kernels for a preset (the
recipe: f32, bf16, w8a8, bitnet; the CPU runs f32, w8a8 and bitnet), the
loss is its fused cross-entropy (the (B, T, V) logits are never made
unless asked for), the initial weights are dragon's (seed S: `dragon
train --seed S`'s), and dropout is dragon's (its masks drawn from the
config's seed and a count of training forwards).

The parameters are ordinary float32 tensors of the module's own (what
.to(), state_dict(), an optimizer see); each forward copies them into
the masters of dragon's model (a plan) and remakes its execution copies
(codes, scales, layouts) from them. The backward runs in loss.backward()
through autograd, from the activations the forward kept; the gradients
reach .grad as any module's do (scaled by the incoming gradient,
accumulating).
"""
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

import dragon_bdh
from dragon_bdh.torch import _call

#: the presets the module runs (the GPU: all four; the CPU: f32, w8a8, bitnet)
TORCH_PRESETS = ("f32", "bf16", "w8a8", "bitnet")


@dataclasses.dataclass
class BDHConfig:
    """The model's config: pathwaycom/bdh's BDHConfig fields, then dragon's.

    n_layer, n_embd, dropout, n_head, mlp_internal_dim_multiplier,
    vocab_size: the reference's (the neurons a head are
    mlp_internal_dim_multiplier * n_embd // n_head: 8192 at the defaults,
    the 25M model `dragon train` trains).
    preset: dragon's recipe, one of f32, bf16, w8a8, bitnet.
    batch_size, block_size: the (B, T) a GPU model is planned for at its
        first forward (any batch up to it runs on that plan, padded; a
        larger one is planned when it first comes, and kept); block_size
        is also the context generate() keeps.
    seed: the initial weights' (dragon's init) and dropout's seed.
    """

    n_layer: int = 6
    n_embd: int = 256
    dropout: float = 0.1
    n_head: int = 4
    mlp_internal_dim_multiplier: int = 128
    vocab_size: int = 256
    preset: str = "w8a8"
    batch_size: int = 8
    block_size: int = 512
    seed: int = 1

    @property
    def n_neurons(self):
        """N, the neurons a head: mlp_internal_dim_multiplier * n_embd // n_head."""
        return self.mlp_internal_dim_multiplier * self.n_embd // self.n_head

    def sizes(self):
        """The sizes as dragon's model takes them (layers, embd, heads,
        neurons, vocab, dropout)."""
        return dict(layers=self.n_layer, embd=self.n_embd, heads=self.n_head, neurons=self.n_neurons,
                    vocab=self.vocab_size, dropout=self.dropout)


def _config_of(config, overrides):
    """A BDHConfig from config (a BDHConfig, pathwaycom/bdh's, any object
    with some of its fields, or None) with overrides (field=value)."""
    if isinstance(config, str):
        raise TypeError("BDH(%r): BDH takes a config, BDH(BDHConfig(preset=%r, ...)) or BDH(preset=%r, ...)"
                        % (config, config, config))
    fields = {f.name for f in dataclasses.fields(BDHConfig)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise TypeError("BDH(): no config field %s; the fields are %s" % (", ".join(bad), ", ".join(
            f.name for f in dataclasses.fields(BDHConfig))))
    vals = {}
    if config is not None:
        vals = {k: getattr(config, k) for k in fields if hasattr(config, k)}
    vals.update(overrides)
    c = BDHConfig(**vals)
    if c.preset not in TORCH_PRESETS:
        raise dragon_bdh.InvalidArgument("preset '%s': one of %s" % (c.preset, ", ".join(TORCH_PRESETS)),
                                         "invalid argument")
    if c.n_head < 1 or c.n_neurons * c.n_head != c.mlp_internal_dim_multiplier * c.n_embd:
        raise dragon_bdh.InvalidArgument("mlp_internal_dim_multiplier=%d x n_embd=%d is not a multiple of n_head=%d"
                                         % (c.mlp_internal_dim_multiplier, c.n_embd, c.n_head), "invalid argument")
    if c.batch_size < 1 or c.block_size < 1:
        raise dragon_bdh.InvalidArgument("batch_size=%d, block_size=%d: each at least 1"
                                         % (c.batch_size, c.block_size), "invalid argument")
    return c


class _Plan:
    """dragon's model on one device for batches up to (b, t): its masters,
    gradients and loss as torch tensors (DLPack views of its memory). On
    the CPU one plan runs any (B, T); on a GPU a smaller batch is padded
    to (b, t) (tokens 0, targets outside the vocabulary: nothing added to
    the loss or a gradient; the loss and gradients then scaled from the
    b*t rows' mean to the batch's; dropout's masks drawn at the plan's
    element indices, so they differ from those of a run planned at the
    batch's own shape). runs counts its forwards: a pass is
    (plan, runs at its forward), and its backward runs from the kept
    activations while no other forward has run since, else it recomputes
    the forward first."""

    def __init__(self, config, device, b, t):
        dev = dragon_bdh.Device.get(device.index) if device.type == "cuda" else None
        c = config
        self.model = dragon_bdh.Model(c.preset, batch=b, time=t, seed=c.seed, device=dev, **c.sizes())
        self.device, self.b, self.t, self.vocab = device, b, t, c.vocab_size
        self.masters = [torch.from_dlpack(self.model.buffer(p)) for p in range(5)]
        self.grads = [torch.from_dlpack(self.model.buffer(p, "grad")) for p in range(5)]
        self.loss = torch.from_dlpack(self.model.loss_buffer())
        self.runs = 0
        self.pending = None  # the run whose backward may run from the arenas
        self.bad = None      # device tokens: a token outside the vocabulary (a tensor)

    def covers(self, b, t):
        """Whether a batch of (b, t) runs on this plan."""
        return self.device.type == "cpu" or (b <= self.b and t <= self.t)

    def tokens(self, idx, targets):
        """The batch as this plan runs it: (idx, targets, B, T, whether
        there are targets), int32 tensors of its own (a GPU plan's padded
        on its device; the CPU's targets None without any)."""
        B, T = idx.shape
        if self.device.type == "cpu":
            i = idx.to("cpu", torch.int32, copy=True).contiguous()
            t = targets.to("cpu", torch.int32, copy=True).contiguous() if targets is not None else None
            return i, t, B, T, targets is not None
        V = self.vocab
        for x, what in ((idx, "idx"), (targets, "targets")):
            if x is not None and x.device.type == "cpu":  # checked here, as dragon checks host tokens
                bad = ((x < 0) | (x >= V)).flatten().nonzero()
                if len(bad):
                    k = bad[0].item()
                    raise dragon_bdh.InvalidArgument("%s[%d] = %d: outside the vocabulary 0..%d"
                                                     % (what, k, x.flatten()[k].item(), V - 1), "invalid argument")
        i = torch.zeros((self.b, self.t), dtype=torch.int32, device=self.device)
        i[:B, :T] = idx
        t = torch.full((self.b, self.t), -1, dtype=torch.int32, device=self.device)
        if targets is not None:
            t[:B, :T] = targets
        bad = (idx < 0) | (idx >= V)
        if targets is not None:
            bad = bad | (targets < 0) | (targets >= V)
        self.bad = bad.any()  # on the device: no sync
        return i, t, B, T, targets is not None

    def scale(self, B, T):
        """What the b*t rows' mean is multiplied by to be the batch's."""
        return 1.0 if self.device.type == "cpu" else (self.b * self.t) / (B * T)

    def forward(self, params, call):
        """Runs the forward of call (tokens(), then seed, step, train) with
        params' values; the loss (a new 0-dim float32 tensor, the batch's
        mean) or None without targets."""
        (i, t, B, T, has_targets), seed, step, train = call
        with torch.no_grad():
            if self.device.type == "cuda":
                _call.device(self.device)  # dragon's launches on torch's current stream, after these copies
            for m, p in zip(self.masters, params):
                m.copy_(p.detach())
        if self.device.type == "cuda":
            self.model.forward(i.data_ptr(), t.data_ptr(), self.b, self.t, tokens_on_device=True, seed=seed,
                               step=step, train=train)
        else:
            self.model.forward(i.data_ptr(), t.data_ptr() if t is not None else 0, B, T, seed=seed, step=step,
                               train=train)
        self.runs += 1
        self.pending = self.runs if has_targets else None
        self._keep = (i, t)  # the device's copies are read on the stream
        return self.loss * self.scale(B, T) if has_targets else None

    def backward(self, ticket, params, call):
        """The gradients (the plan's own buffers, valid until its next
        backward) of the pass run as `ticket`, recomputing its forward
        first when another forward ran since."""
        if self.pending != ticket:
            self.forward(params, call)
        if self.device.type == "cuda":
            _call.device(self.device)  # autograd's thread: its stream is the forward's
        self.pending = None
        self.model.backward()
        return self.grads

    def hidden(self):
        """The last forward's last hidden state (b, t, D) as a torch view
        (float32, or bfloat16 on a GPU plan of a bf16 or low-bit recipe)."""
        return torch.from_dlpack(self.model.hidden())


class _Loss(torch.autograd.Function):
    """The loss of a pass: dragon's forward now, its backward in
    loss.backward()."""

    @staticmethod
    def forward(ctx, plan, call, *params):
        loss = plan.forward(params, call)
        ctx.plan, ctx.call, ctx.ticket = plan, call, plan.pending
        ctx.k = plan.scale(call[0][2], call[0][3])
        ctx.save_for_backward(*params)  # autograd checks they were not changed in place since
        return loss

    @staticmethod
    def backward(ctx, grad):
        params = ctx.saved_tensors
        grads = ctx.plan.backward(ctx.ticket, params, ctx.call)
        k = grad * ctx.k
        return (None, None) + tuple((g * k).to(p.dtype) for g, p in zip(grads, params))


class BDH(nn.Module):
    """BDH (pathwaycom/bdh's model) on dragon's kernels; see the module doc.

    BDH(config=None, **fields): config a BDHConfig (or any object with its
    fields: pathwaycom/bdh's BDHConfig works), fields overriding it
    (BDH(preset="f32", n_layer=2)). The parameters are made on the CPU
    with dragon's initial weights of config.seed; .to(device), .cuda(),
    .cpu() move them (cuda or cpu; float32 only: the preset says what the
    kernels compute in). train()/eval() turn dropout on and off.
    """

    def __init__(self, config=None, **fields):
        super().__init__()
        c = self.config = _config_of(config, fields)
        D, H, N, V = c.n_embd, c.n_head, c.n_neurons, c.vocab_size
        self.embed = nn.Embedding(V, D)
        self.encoder = nn.Parameter(torch.empty(H, D, N))
        self.encoder_v = nn.Parameter(torch.empty(H, D, N))
        self.decoder = nn.Parameter(torch.empty(H * N, D))
        self.lm_head = nn.Parameter(torch.empty(D, V))
        # dragon's init of the seed (the preset does not change it): a CPU
        # model of these sizes, read once
        init = dragon_bdh.Model("f32", batch=1, time=1, seed=c.seed, device=None, **c.sizes())
        with torch.no_grad():
            for p, q in zip(self._params(), range(5)):
                p.copy_(torch.from_dlpack(init.buffer(q)))
        del init
        #: training forwards run (dropout's step: its masks are drawn from the seed and it)
        self.dropout_step = 0
        self._plans = {}
        self._last = None  # the plan the last forward ran on

    # ---- the reference's interface ------------------------------------------------

    def forward(self, idx, targets=None, return_logits=None):
        """(logits, loss) of a batch, as pathwaycom/bdh's forward.

        idx: (B, T) integer tokens (any integer dtype; on the model's
        device, or the CPU); targets: (B, T) next tokens, or None.
        loss: the mean cross-entropy, a 0-dim float32 tensor that
        loss.backward() differentiates (dragon's backward then runs, from
        what this forward kept); None without targets.
        logits: (B, T, vocab) when return_logits (default: only when there
        are no targets), in the activations' precision (bfloat16 on a GPU
        for bf16, w8a8, bitnet; else float32), else None. They carry no
        gradient: the loss is what backward() differentiates (dragon's
        fused cross-entropy); train on another function of the logits
        with tools/bdh_torch.py's model instead.
        """
        if return_logits is None:
            return_logits = targets is None
        B, T = self._check_tokens(idx, targets)
        plan = self._last = self._plan(B, T)
        c = self.config
        train = self.training
        call = (plan.tokens(idx, targets), c.seed, self.dropout_step, train)
        params = self._params()
        if targets is not None and torch.is_grad_enabled() and any(p.requires_grad for p in params):
            loss = _Loss.apply(plan, call, *params)
        else:
            loss = plan.forward(params, call)
        if train:
            self.dropout_step += 1
        logits = None
        if return_logits:
            with torch.no_grad():
                h = plan.hidden()[:B, :T]
                logits = h @ self.lm_head.detach().to(h.dtype)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """idx (B, T) with max_new_tokens sampled tokens appended, as
        pathwaycom/bdh's generate: each from the softmax of the last
        position's logits over temperature (0: the most likely token),
        kept to the top_k most likely when top_k is given.

        The model decodes from a state (dragon/model.h dg_model_state, on
        the module's device): the prompt is consumed once, then each token
        costs the same at any position, and the context is every token so
        far (no window), dropout off."""
        if max_new_tokens <= 0:
            return idx
        return self._generate_state(idx, max_new_tokens, temperature, top_k)

    @staticmethod
    def _draw(logits, temperature, top_k):
        """(B, 1) tokens from (B, V) logits, as the reference's generate draws."""
        if temperature == 0:
            return logits.argmax(-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = float("-inf")
        return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)

    def _generate_state(self, idx, max_new_tokens, temperature, top_k):
        """generate() on a decoder state: every row prefilled with its
        (B, T) tokens, then a token a row at a time."""
        B, T = self._check_tokens(idx, None)
        plan = self._last = self._plan(B, T)
        with torch.no_grad():
            if plan.device.type == "cuda":
                _call.device(plan.device)  # dragon reads the masters on torch's stream, after these copies
            for m, p in zip(plan.masters, self._params()):
                m.copy_(p.detach())
        V = self.config.vocab_size
        tok = idx.to("cpu", torch.int32, copy=True).contiguous()
        z = plan.model.decode(tok.data_ptr(), B, T, True)
        out = [idx]
        for i in range(max_new_tokens):
            logits = torch.frombuffer(z, dtype=torch.float32).view(B, V).clone()
            nxt = self._draw(logits, temperature, top_k)
            out.append(nxt.to(idx.device, idx.dtype))
            if i + 1 < max_new_tokens:
                step = nxt.to(torch.int32).contiguous()
                z = plan.model.decode(step.data_ptr(), B, 1, False)
        return torch.cat(out, dim=1)

    # ---- dragon's --------------------------------------------------------------------

    def bad_tokens(self):
        """Whether the last forward with tokens on a GPU met one outside
        the vocabulary (its row was made harmless: a zero embedding, no
        loss); reads a flag on the device (a sync). Tokens on the CPU are
        refused by the forward itself (InvalidArgument naming the first)."""
        p = self._last
        return p is not None and p.bad is not None and bool(p.bad)

    def load_checkpoint(self, path):
        """The weights of a `dragon train` checkpoint (or any safetensors
        file with the reference's names), copied into the parameters once
        the file is checked as dragon's own readers check it
        (dragon_bdh.check_weights: its seal, not gradients, finite values)."""
        from safetensors.torch import load

        with open(path, "rb") as f:
            data = f.read()  # read once: the bytes checked are the bytes loaded
        dragon_bdh.check_weights(data, path)
        sd = load(data)
        missing = [n for n in dragon_bdh.PARAMS if n not in sd]
        if missing:
            raise dragon_bdh.InvalidArgument("%s: no %s" % (path, ", ".join(missing)), "invalid argument")
        self.load_state_dict({n: sd[n] for n in dragon_bdh.PARAMS})

    def plans(self):
        """The (device, B, T) of the plans made so far (dragon's models the
        forwards run on; a GPU one holds its activations' memory)."""
        return sorted(((str(k[0]), k[1], k[2]) for k in self._plans), key=str)

    def clear_plans(self):
        """Frees every plan (their memory); the next forward makes one."""
        self._plans, self._last = {}, None

    def extra_repr(self):
        """The config, as print(model) shows it."""
        c = self.config
        return "preset=%s, n_layer=%d, n_embd=%d, n_head=%d, neurons=%d, vocab_size=%d, dropout=%g" % (
            c.preset, c.n_layer, c.n_embd, c.n_head, c.n_neurons, c.vocab_size, c.dropout)

    # ---- internals -------------------------------------------------------------------

    def _params(self):
        return (self.embed.weight, self.encoder, self.encoder_v, self.decoder, self.lm_head)

    def _device(self):
        return self.lm_head.device

    def _check_tokens(self, idx, targets):
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.is_floating_point() or idx.is_complex():
            raise dragon_bdh.InvalidArgument("idx: expected a (B, T) tensor of integer tokens, got %s" % (
                "%s %s" % (tuple(idx.shape), idx.dtype) if isinstance(idx, torch.Tensor) else type(idx).__name__),
                "invalid argument")
        B, T = idx.shape
        if B < 1 or T < 1:
            raise dragon_bdh.InvalidArgument("idx: shape %s, B and T at least 1" % (tuple(idx.shape),),
                                             "invalid argument")
        if targets is not None and (not isinstance(targets, torch.Tensor) or targets.shape != idx.shape or
                                    targets.is_floating_point()):
            raise dragon_bdh.InvalidArgument("targets: expected integer tokens of idx's shape %s, got %s" % (
                tuple(idx.shape), "%s %s" % (tuple(targets.shape), targets.dtype)
                if isinstance(targets, torch.Tensor) else type(targets).__name__), "invalid argument")
        dev = self._device()
        for x, what in ((idx, "idx"), (targets, "targets")):
            if x is not None and x.device.type != "cpu" and x.device != dev:
                raise dragon_bdh.InvalidArgument("%s on %s, the model on %s" % (what, x.device, dev),
                                                 "invalid argument")
        return B, T

    def _plan(self, B, T):
        """The plan a (B, T) batch runs on: the smallest one made that covers
        it, else a new one at (max(B, batch_size), max(T, block_size))."""
        dev = self._device()
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        fit = [k for k, p in self._plans.items() if k[0] == dev and p.covers(B, T)]
        if fit:
            return self._plans[min(fit, key=lambda k: k[1] * k[2])]
        c = self.config
        b, t = max(B, c.batch_size), max(T, c.block_size)
        self._plans[(dev, b, t)] = _Plan(c, dev, b, t)
        return self._plans[(dev, b, t)]

    def _last_logits(self, idx):
        """(B, vocab) float32 logits of idx's last position, dropout off, no
        loss and no backward."""
        B, T = self._check_tokens(idx, None)
        plan = self._last = self._plan(B, T)
        plan.forward(self._params(), (plan.tokens(idx, None), self.config.seed, self.dropout_step, False))
        h = plan.hidden()[:B, T - 1]
        return h.float() @ self.lm_head.float()

    def _apply(self, fn, recurse=True):
        # .to(), .cuda(), .cpu(), .half(), ...: asked of an empty probe first,
        # so a move dragon cannot run is refused before anything moves
        probe = fn(torch.empty(0, dtype=torch.float32, device=self._device()))
        if probe.dtype != torch.float32:
            raise dragon_bdh.Unsupported(
                "dragon_bdh.torch.BDH keeps float32 weights (%s asked): the preset says what its kernels compute "
                "in (BDH(BDHConfig(preset='bf16')) for bfloat16)" % probe.dtype, "unsupported")
        if probe.device.type not in ("cpu", "cuda"):
            raise dragon_bdh.Unsupported("dragon_bdh.torch.BDH runs on cuda or cpu, not %s" % probe.device,
                                         "unsupported")
        if probe.device.type == "cuda":  # dragon's device, or why there is none
            dragon_bdh.Device.get(probe.device.index if probe.device.index is not None
                                  else torch.cuda.current_device())
        out = super()._apply(fn, recurse)
        here = self._device()
        self._plans = {k: p for k, p in self._plans.items() if k[0] == here}
        self._last = None
        return out

    def __getstate__(self):
        # deepcopy and pickle copy the parameters, not dragon's plans
        state = self.__dict__.copy()
        state["_plans"], state["_last"] = {}, None
        return state

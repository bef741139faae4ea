--[[
grad.lua — the four gradient GEMMs of BDH's projection and decoder
(dg_ref_lowrank_grad_input / _weight and dg_ref_decoder_grad_input /
_weight in dragon/ref.h mirror them).

Gradient formats (dragon/spec.h "gradient formats"; GT, OT below):
  src  the gradient the lowrank ops read (grad): f32 | bf16 (GT);
  out  the gradient decoder_grad_input writes (grad_y): f32 | bf16 (OT),
       the f32 sum (times the scale) rounded to nearest even once;
  f32 every other gradient (the decoder ops' grad (B,1,T,E), grad_x,
  grad_w). The spec's text names src / out only when bf16.

  lowrank_grad_input   grad_x[b,i,t,e] = sw · Σ_{h: hin(h)=i} Σ_l grad[b,h,t,l] · w[h,l,e]
    extern "C" __global__ void dg_lowrank_grad_input(const GT *grad,
        const WT *w, const float *sw, float *dst, int B, int T, int splits,
        int kt_per_split)
    grid (ceil(E/bn), ceil(B*T/bm), Hin·splits), z = p·Hin + i (split p,
    input head i). GEMM M = B*T, N = E, K = (H/Hin)·L: with Hin = 1 a
    block's K runs over every head (w is (H·L, E), so the head sum is one
    longer reduction, summed in order, no atomics). dst: grad_x when
    splits == 1, else the partials (below).
  decoder_grad_input   grad_y[b,h,t,l] = sw · Σ_d grad[b,0,t,d] · w[d, h·L + l]
    extern "C" __global__ void dg_decoder_grad_input(const float *grad,
        const WT *w, const float *sw, OT *grad_y, int B, int T)
    grid (ceil(L/bn), ceil(B*T/bm), H). M = B*T, N = L (head h = grid z), K = E.
  lowrank_grad_weight  grad_w[h,l,e] (+)= sa · Σ_{b,t} grad[b,h,t,l] · x[b,hin(h),t,e]
    extern "C" __global__ void dg_lowrank_grad_weight(const GT *grad,
        const XT *x, const float *sa, float *dst, int B, int T, int splits,
        int kt_per_split, int accumulate)
    grid (ceil(E/bn), ceil(L/bm), H·splits). M = L, N = E, K = B*T.
  decoder_grad_weight  grad_w[d, h·L + l] (+)= sa · Σ_{b,t} grad[b,0,t,d] · y[b,h,t,l]
    extern "C" __global__ void dg_decoder_grad_weight(const float *grad,
        const XT *y, const float *sa, float *dst, int B, int T, int splits,
        int kt_per_split, int accumulate)
    grid (ceil(L/bn), ceil(E/bm), H·splits). M = E, N = L (head h), K = B*T.
  and for both grad_weight ops, the deterministic second pass:
    extern "C" __global__ void dg_<op>_reduce(const float *part, int splits,
        const float *sa, float *grad_w, int accumulate)
    any grid, `RNT` threads: grad_w[i] (+)= s · Σ_{p < splits} part[p·NW + i],
    p ascending (NW = H·L·E, the size of grad_w);
  and lowrank_grad_input's:
    extern "C" __global__ void dg_lowrank_grad_input_reduce(const float *part,
        int splits, const float *sw, float *grad_x, int B, int T)
    any grid, `RNT` threads: grad_x[i] = s · Σ_{p < splits} part[p·NX + i],
    p ascending (NX = B·Hin·T·E, the size of grad_x).

  The grad_weight reduction (B*T) is known only at run time, so it is split
  over grid z: block (h, p) sums K tiles [p·kt_per_split, (p+1)·kt_per_split)
  (an empty range sums to 0). splits == 1: the block scales and writes (or
  adds to) grad_w itself; splits > 1: it writes its raw sum to
  dst + p·NW (partials the caller takes from scratch) and the reduce entry
  sums them in a fixed order. lowrank_grad_input's reduction is fixed at
  compile time but long (KT = (H/Hin)·L/BK steps, 512 at the BDH encoder)
  onto few output tiles (B·T x E: 64 of 128x128), so it splits the same
  way: block (i, p) sums K steps [p·kt_per_split, ..) of KT, clipped;
  splits == 1 writes sw·Σ into grad_x (dst), splits > 1 the raw Σ into
  dst + p·NX, and its reduce entry scales. Every path (SIMT, mma.sync,
  wgmma) takes the split, with the same code (grad_ops.lua
  M.GI_SPLIT); the runtime picks the count from the grid and the SM count
  (runtime/ops/grad.c). No float atomics anywhere, so every result is
  reproducible for a fixed (splits, tile).

  WT / XT: float (f32), unsigned short (bf16), int i8x4 words (int8, int4,
  uint8pos), unsigned words (ternary 16 codes, sign1 32). sw / sa: device
  floats, read only when that operand is an integer format (else may be
  NULL). All tensors 16-byte aligned (whole allocations are).

Paths (M.plan picks one from the arch and the tile; render follows it):
  warpgroup tensor cores (templates/grad_wgmma.lua; the default where
    it applies): sm_90a, lowrank_grad_input / _weight with a bf16 gradient
    (src=bf16) and a bf16 other operand (weight=bf16 / act=bf16), WN 1,
    WM 4 or 8, BM = 16·WM, BN 64 | 128 | 256, BK 64, stages 3 or 4.
    wgmma m64nBNk16 bf16 from 128-byte-swizzled shared tiles that a
    cp.async ring fills; the same ABI, grids and splits. The plan is
    arch-specific, so dg_codegen_plan_for promotes an sm_90 spec to it.
    Stages 5 to 8 name its warp-specialized form (path "wgmma tma";
    E and L multiples of 8): a producer warpgroup more a block loads both
    operands by TMA into the ring, the consumers wait on mbarriers
    (templates/wgmma_bf16.lua WS_MAINLOOP), two tensor maps follow the
    op's arguments (runtime/ops/grad.c makes them), and the call needs
    T % 64 == 0 (the runtime takes the ring's 3-stage tile at another T
    for an auto tile, and refuses an explicit one). Its default tile for
    both ops is that form's 128x128x64/8x1/6 where it applies, else
    128x128x64/8x1/3 (two warpgroups, two blocks an SM; grad_wgmma.lua
    M.default_tile has the reasons and the figures).
    decoder_grad_weight takes it too with its f32 gradient and y bf16,
    int8 or uint8pos (E and L multiples of 8; stages 2 to 4): both staged
    through registers and converted as the mma.sync path converts them
    (the gradient rounded to bf16, a scale a token folded into y's rows
    and rounded, one a tensor on the sum); default 128x128x64/8x1/2.
  tensor cores (templates/grad_mma.lua; the default from sm_80 on):
    sm_80+, BK % 16 == 0, warp tiles whole 16x16 blocks. mma.sync m16n8k16
    bf16 with f32 sums. Each element is converted once as it is staged:
    an f32 gradient streams through a cp.async ring and is rounded to
    bf16 into shared memory, a bf16 gradient (src=bf16) streams by
    cp.async straight into the shared tiles ldmatrix reads (no rounding,
    no conversion, half the bytes); the other operand is decoded to bf16
    (exact for every integer code and for bf16, f32 rounded); ldmatrix
    feeds both operands. Layouts, pipeline and precision: grad_mma.lua's notes.
    |got − ref| <= (2^-8 + K·2^-24)·Σ|terms| per output, about 1e-3 of
    the norm. Every op takes it with its default tile, because all four
    are GEMMs whose f32 gradient would otherwise cost fp32 FMA rate; the
    defaults (M.plan's default_tile) at the BDH shape:
      lowrank_grad_input  64x128x64/2x4/4 — streams the gradient (K = H·L,
        537 MB), 128 blocks: 8 warps of 32x32 a block, 3 steps of 16 KiB
        of gradient in flight (one block an SM at 116 KiB, so the runtime
        leaves K whole: 128 blocks for 132 SMs is as good as a split);
      decoder_grad_input  128x128x32/2x2/3 — writes grad_y (537 MB), K = E
        is 8 steps: 64x64 warp tiles, two blocks an SM overlap one's stores
        with the other's math;
      lowrank_grad_weight, decoder_grad_weight 128x128x32/2x2/4 — tensor
        bound (K = B·T): 64x64 warp tiles (the least shared-memory traffic
        a MMA), two blocks an SM, 512 blocks (no split at B·T 4096).
  fp32 SIMT (sm < 80, or BK % 16 != 0, or warp tiles not 16x16 blocks,
    e.g. a reduction 16 does not divide): exact f32 sums, the description
    below.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local GOPS = require("grad_ops")
local SIMT = require("grad_simt")
local MMA = require("grad_mma")
local WG = require("grad_wgmma")
local fmt = string.format

local M = {}

local ACTS = { "f32", "bf16", "int8", "int4", "uint8pos" }
local WEIGHTS = { "f32", "bf16", "int8", "ternary", "sign1" }

local SMEM_STATIC = 48 * 1024

-- The ABI lines of the banner (both paths).
local function about_lines(op, o, entry, sig, c)
  local about = {
    (o.a_kmajor and (op == "lowrank_grad_input"
      and "lowrank_grad_input: grad_x[b,i,t,e] = sw · Σ_{h: hin(h)=i} Σ_l grad[b,h,t,l] · w[h,l,e]"
      or "decoder_grad_input: grad_y[b,h,t,l] = sw · Σ_d grad[b,0,t,d] · w[d, h·L + l]")
      or (op == "lowrank_grad_weight"
      and "lowrank_grad_weight: grad_w[h,l,e] (+)= sa · Σ_{b,t} grad[b,h,t,l] · x[b,hin(h),t,e]"
      or "decoder_grad_weight: grad_w[d, h·L + l] (+)= sa · Σ_{b,t} grad[b,0,t,d] · y[b,h,t,l]")),
    "",
    fmt("extern \"C\" __global__ void %s(%s)", entry, (sig:gsub("%s+", " "))),
  }
  local H, HIN, E, L, bm, bn, nt, bfmt = c.H, c.HIN, c.E, c.L, c.bm, c.bn, c.threads, c.bfmt
  if op == "lowrank_grad_input" then
    about[#about + 1] = fmt("grid (ceil(%d/%d), ceil(B*T/%d), %d·splits), block %d threads; z = split·%d + input head.",
                            E, bn, bm, HIN, nt, HIN)
    about[#about + 1] = fmt("grad (B, %d, T, %d) %s; w (%d, %d, %d) %s; dst: grad_x (B, %d, T, %d) f32 (splits 1)",
                            H, L, c.gfmt, H, L, E, bfmt, HIN, E)
    about[#about + 1] = fmt("  or splits partials of it (the raw sums of K steps [p·kt_per_split, ..) of %d), summed by %s_reduce.",
                            (H // HIN) * L // c.bk, entry)
  elseif op == "decoder_grad_input" then
    about[#about + 1] = fmt("grid (ceil(%d/%d), ceil(B*T/%d), %d), block %d threads.", L, bn, bm, H, nt)
    about[#about + 1] = fmt("grad (B, 1, T, %d) f32; w (%d, %d) %s; grad_y (B, %d, T, %d) %s.",
                            E, E, H * L, bfmt, H, L, c.ofmt)
  elseif op == "lowrank_grad_weight" then
    about[#about + 1] = fmt("grid (ceil(%d/%d), ceil(%d/%d), %d·splits), block %d threads.", E, bn, L, bm, H, nt)
    about[#about + 1] = fmt("grad (B, %d, T, %d) %s; x (B, %d, T, %d) %s; grad_w (%d, %d, %d) f32.",
                            H, L, c.gfmt, HIN, E, bfmt, H, L, E)
  else
    about[#about + 1] = fmt("grid (ceil(%d/%d), ceil(%d/%d), %d·splits), block %d threads.", L, bn, E, bm, H, nt)
    about[#about + 1] = fmt("grad (B, 1, T, %d) f32; y (B, %d, T, %d) %s; grad_w (%d, %d) f32.",
                            E, H, L, bfmt, E, H * L)
  end
  return about
end

local function fields(spec)
  local op = SPEC.one_of(spec, "op", { "lowrank_grad_input", "lowrank_grad_weight",
                                    "decoder_grad_input", "decoder_grad_weight" })
  local k = { op = op, o = GOPS.OPS[op] }
  k.H = SPEC.int_field(spec, "heads", 1)
  k.HIN = op:match("^lowrank") and SPEC.int_field(spec, "in_heads", 1) or 1
  k.E = SPEC.int_field(spec, "embd", 4)
  k.L = SPEC.int_field(spec, "latent", 4)
  k.arch = SPEC.int_field(spec, "arch", 1)
  k.arch_specific = spec.arch_specific == true
  k.bfmt = k.o.w_operand and SPEC.one_of(spec, "weight", WEIGHTS) or SPEC.one_of(spec, "act", ACTS)
  k.F = FM.formats[k.bfmt]
  -- the gradients' formats (dragon/spec.h): the lowrank ops read grad in
  -- src, decoder_grad_input writes grad_y in out; the rest is f32
  k.gfmt = op:match("^lowrank") and SPEC.one_of(spec, "src", { "f32", "bf16" }) or "f32"
  k.ofmt = op == "decoder_grad_input" and SPEC.one_of(spec, "out", { "f32", "bf16" }) or "f32"

  -- scales along the reduction (a weight's per channel in grad_input, an
  -- activation's per token in grad_weight) multiply B's row k as it is
  -- staged; a per-tensor one multiplies the sum once at the end
  k.vec = k.F.code and ((k.o.w_operand and spec.wscale == "channel") or
                        (not k.o.w_operand and spec.ascale == "token")) or false
  -- the reduction of the grad_input ops is a compile-time length; the
  -- grad_weight ops reduce over B·T (run time)
  k.red = op == "lowrank_grad_input" and k.L or (op == "decoder_grad_input" and k.E or 0)
  k.red_name = op == "lowrank_grad_input" and "latent" or "embd"
  -- B's packed axis: E for lowrank (w rows, x rows), L for decoder (w's
  -- H·L columns per head, y rows)
  k.packed_len = op:match("^lowrank") and k.E or k.L
  return k
end

-- The heuristic default tile. Tensor cores from sm_80 when BK (halved from
-- 64 / 32 until it divides the grad_input reduction) is at least 16; at the
-- BDH shape (H 4, E 256, L 8192, B·T 4096):
--   lowrank_grad_input 64x128x64/2x4/4: (E/128)·(B·T/64) = 128 blocks for
--     132 SMs, 8 warps of 32x32 a block (one block an SM, two warps a
--     scheduler), 116 KiB: three 16 KiB gradient steps in flight a block
--     (the op streams 537 MB of gradient);
--   decoder_grad_input 128x128x32/2x2/3: K = E = 256 is 8 steps, so two
--     blocks an SM (85 KiB each) overlap one block's stores with the
--     other's math; 64x64 warp tiles;
--   lowrank_grad_weight, decoder_grad_weight 128x128x32/2x2/4: 64x64 warp
--     tiles (the least shared-memory traffic a MMA), 98 KiB, two blocks an SM.
-- Otherwise (before sm_80, or a reduction 16 does not divide) the SIMT
-- default every GEMM had: 64x64 blocks of 2x2 warps, double-buffered.
local function default_tile(k)
  if WG.applies(k) then return WG.default_tile(k) end
  local op, red = k.op, k.red
  local bk = op == "lowrank_grad_input" and 64 or 32
  while red ~= 0 and bk > 16 and red % bk ~= 0 do bk = bk // 2 end
  if k.arch >= 80 and not (red ~= 0 and red % bk ~= 0) then
    local gw = not k.o.a_kmajor
    return { bm = op == "lowrank_grad_input" and 64 or 128, bn = 128, bk = bk, wm = 2,
             wn = op == "lowrank_grad_input" and 4 or 2,
             stages = (gw or op == "lowrank_grad_input") and 4 or 3, threads = 0 }
  end
  bk = k.F.code and 64 or 32
  while red ~= 0 and bk > 4 and red % bk ~= 0 do bk = bk // 2 end
  return { bm = 64, bn = 64, bk = bk, wm = 2, wn = 2, stages = 2, threads = 0 }
end

-- Shared memory of the SIMT path (static): one or two stages of the A tile
-- (BK·PA floats, PA = BM + 1 when A is transposed in) and the B tile.
local function simt_smem(k, t)
  local pa = k.o.a_kmajor and t.bm + 1 or t.bm
  local stage_bytes = (t.bk * pa + t.bk * t.bn) * 4
  local nbuf = math.min(t.stages, 2)
  if nbuf == 2 and 2 * stage_bytes > SMEM_STATIC then nbuf = 1 end
  return nbuf * stage_bytes, nbuf
end

function M.plan(spec)
  local k = fields(spec)
  local t = TILES.tile_of(spec)
  local auto = TILES.tile_is_auto(t)
  if auto then t = default_tile(k) end
  local ok, err = TILES.gemm_tile_pow2(t, auto)
  if ok and k.red ~= 0 then ok, err = TILES.bk_divides(t, auto, k.red, k.red_name) end
  if ok then ok, err = TILES.stages_ok(t, auto, 1, WG.ws_applies(k) and 8 or 4) end
  if not ok then return nil, err end
  local nt = t.wm * t.wn * 32
  local entry = "dg_" .. k.op
  local p = { tile = t, arch_specific = false, name = k.op .. ".cu", entries = { { name = entry, threads = nt } } }
  if not k.o.a_kmajor or k.o.split then
    p.entries[2] = { name = entry .. "_reduce", threads = GOPS.RNT, smem = 0 }
  end
  if WG.fits(k, t) then
    local smem = WG.smem_bytes(t, k)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    p.path, p.arch_specific, p.smem_bytes, p.entries[1].smem = "wgmma bf16", true, smem, smem
    if WG.ws_tile(t) then
      p.path, p.entries[1].threads = "wgmma tma", WG.threads(t)
    end
    -- decoder_grad_weight's A on both forms: the gradient's bf16 copy, made
    -- first (the runtime launches the entry where the module has it)
    if k.op == "decoder_grad_weight" then
      p.entries[#p.entries + 1] = { name = entry .. "_cast", threads = 256, smem = 0 }
    end
    return p
  end
  -- the warp-tiled paths' warps (a warpgroup tile's are WG.fits' to judge:
  -- decoder_grad_weight's BM 256 takes 16 warps in a column)
  ok, err = TILES.warps_ok(t, auto)
  if not ok then return nil, err end
  if MMA.fits(k.arch, t.bm, t.bn, t.bk, t.wm, t.wn) then
    local acc = (t.bm // t.wm) * (t.bn // t.wn) // 32
    if acc > 128 then
      return TILES.refuse(t, auto, "%d f32 accumulators a thread on the tensor-core path; at most 128 (more warps or a smaller tile)", acc)
    end
    local eu = MMA.unit_eu(k.bfmt, t.bn, k.packed_len % 16 == 0 and t.bn % 16 == 0)
    if t.bn % eu ~= 0 then
      return TILES.refuse(t, auto, "BN must be a multiple of %d (%s units)", eu, k.bfmt)
    end
    local smem = MMA.smem_bytes(k.o.a_kmajor, k.gfmt == "bf16", t.bm, t.bn, t.bk, t.stages)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    p.path, p.smem_bytes, p.entries[1].smem = "mma.sync bf16", smem, smem
    return p
  end
  ok, err = TILES.simt_warp_tile(t, auto)
  if not ok then return nil, err end
  local eu = SIMT.unit_eu(k.bfmt, t.bn)
  if t.bn % eu ~= 0 then
    return TILES.refuse(t, auto, "BN must be a multiple of %d (%s units)", eu, k.bfmt)
  end
  local smem, nbuf = simt_smem(k, t)
  ok, err = TILES.smem_fits(t, auto, smem, k.arch, true)
  if not ok then return nil, err end
  p.path, p.smem_bytes, p.nbuf, p.entries[1].smem = "fp32", smem, nbuf, 0
  return p
end

function M.render(spec, plan)
  local k = fields(spec)
  local op, o, bfmt, F = k.op, k.o, k.bfmt, k.F
  local t = plan.tile
  local entry = "dg_" .. op
  local c = {
    spec = spec, op = op, o = o, entry = entry, bfmt = bfmt, F = F,
    H = k.H, HIN = k.HIN, E = k.E, L = k.L, bm = t.bm, bn = t.bn, bk = t.bk, wm = t.wm, wn = t.wn,
    stages = t.stages, HIN_H = k.HIN == 1 and "0" or "h", arch = SPEC.int_field(spec, "arch", 1),
    bname = o.w_operand and "w" or (op == "lowrank_grad_weight" and "x" or "y"),
    vec = k.vec, gfmt = k.gfmt, ofmt = k.ofmt,
    GT = FM.formats[k.gfmt].ctype, OT = FM.formats[k.ofmt].ctype,
    smem = plan.smem_bytes, nbuf = plan.nbuf, threads = plan.entries[1].threads,
  }
  c.about = about_lines(op, o, entry, (EMIT.subst(o.sig, { BT = F.ctype }):gsub("GT", c.GT):gsub("OT", c.OT)), c)
  local w = EMIT.writer()
  if plan.path == "wgmma bf16" or plan.path == "wgmma tma" then
    w:line(WG.render(c))
  elseif plan.path == "mma.sync bf16" then
    w:line(MMA.render(c))
  else -- fp32 SIMT: sm < 80, or a tile the tensor-core paths cannot run (M.plan)
    SIMT.render(c, w)
  end
  GOPS.reduce_entries(w, o, entry, F.code, k.vec)
  return w:text()
end

return M

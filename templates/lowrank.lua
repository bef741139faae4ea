--[[
lowrank.lua — the low-rank projection of BDH, forward, and its ReLU mask:

  lowrank_fwd  out[b,h,t,l] = relu(s · Σ_e x[b,hin(h),t,e] · w[h,l,e] − thr)
  relu_mask    grad_out[b,h,t,l] = (s · Σ_e x·w − thr) > 0 ? grad[b,h,t,l] : 0
               (y computed exactly as the forward does, so the mask is the
               forward's ReLU mask bit for bit)
  hin(h) = Hin==1 ? 0 : h

Kernel ABI (dragon/ref.h mirrors it in dg_ref_lowrank_fwd / dg_ref_relu_mask;
runtime/ops/lowrank.c launches it):

  extern "C" __global__ void dg_lowrank_fwd(const XT *x, const WT *w,
      const float *sa, const float *sw, OT *out, const float *so,
      float *out_absum, int B, int T)
  extern "C" __global__ void dg_relu_mask(const XT *x, const WT *w,
      const float *sa, const float *sw, const float *grad, float *grad_out,
      int B, int T)

  grid: any number of blocks (1-D): blocks walk the ceil(B*T/bm) ·
  ceil(L/bn) · H tiles (n fastest, then m, then head) with a stride of the
  grid. block: the launch info's threads (wm*wn*32); dynamic shared memory:
  the launch info's smem (tensor-core path; 0 on the others, whose shared
  memory is static). Row m = b*T + t of head h's GEMM (M = B*T rows, N = L
  cols, K = E) reads x row ((b*Hin + hin(h))*T + t) and writes out row
  ((b*H + h)*T + t).
    x    (B, Hin, T, E): f32 | bf16 (unsigned short) | i8x4 int words
         (B, Hin, T, E/4) for int8, int4 and uint8pos (uint8pos lanes unsigned)
    w    (H, L, E): f32 | bf16 | int8 i8x4 (H, L, E/4) | ternary unsigned
         (H, L, E/16) | sign1 unsigned (H, L, E/32)
    sa, sw, so  device pointers to one float each (act, weight, out scale),
         read once; only those the formats need are read (others may be NULL)
    out  (B, H, T, L): float | unsigned short (bf16) | signed char (int8
         codes) | unsigned char (uint8pos codes)
    out_absum  NULL, or a float that receives += Σ|y| over the block's
         outputs (post-ReLU, pre-quantize), one atomicAdd per block and tile
    grad, grad_out  (B, H, T, L) f32; they may alias (no __restrict__: each
         element is read, then written, by one thread)
  x, w, out, grad, grad_out must be 16-byte aligned (whole allocations are);
  B*T < 2^30 (int row arithmetic).
  epi=rope (lowrank_fwd on the warpgroup paths, out=bf16; M.plan refuses
  it elsewhere): two more parameters after T (before the warp-specialized
  form's maps), const float *rope (T, L) (the attention's table) and
  unsigned short *qr (B, H, T, L) bf16, which gets RoPE(out) as rope_fwd
  makes it from out (templates/rope.lua's arithmetic on out's bf16
  values: each product and the sum rounded once, then bf16), so the
  attention's rope=pre operand needs no pass over xs of its own; no
  few-rows entry (the model's decoding keeps epi=store).

Paths (which one a spec takes: M.plan)
  warpgroup tensor cores (templates/lowrank_wgmma.lua, lowrank_fwd on
    sm_90a, a warpgroup tile): integer codes (wgmma s8, exact int32 sums)
    or bf16 act × bf16 weight (wgmma bf16, f32 sums, y = acc); the whole E
    resident in shared memory, the epilogue stores from the accumulators.
    Its K-streaming form (stages >= 3; int8 or bf16 weights): persistent
    tiles whose K slices run through a ring of cp.async stages; bf16's
    auto tile where its rows do not fit resident (past E 352), codes' by
    an explicit tile or a tuning record only (lowrank_wgmma.lua).
    relu_mask never takes it: a bf16 mask recomputes y on the fp32 path,
    so where y is within rounding of thr it may differ from the wgmma
    forward's ReLU (float sums in another order), as it may from the
    reference's; integer masks stay bit for bit.
  tensor cores (templates/mma.lua): act and weight integer codes, sm_80+,
    BK % 32 == 0 (so E % 32 == 0), warp tile whole 16x8 fragments.
    mma.sync m16n8k32 s8.s8 (u8.s8 for uint8pos acts, never wrapped),
    exact int32 sums; cp.async multi-stage pipeline; ternary / sign1 decoded
    to s8 rows in shared memory. Epilogue pairs staged through shared memory
    (stride padded against bank conflicts), then 16-byte (or the largest
    that divides L) coalesced stores. The fast path: BDH's default tile.
  dp4a (SIMT, templates/lowrank_simt.lua): integer × integer otherwise
    (odd tiles, E % 32 != 0, older archs): codes staged into shared memory
    as i8x4 bytes (ternary and sign1 decoded on the way), exact int32 sums
    through dp4a (s32.s32, or u32.s32 for uint8pos activations).
  fp32 (SIMT, templates/lowrank_simt.lua): any float operand: each operand
    converted to f32 while staging, fp32 FMA accumulation, y = acc · (*sa
    if act is integer, *sw if weight is, else 1).
  few rows (templates/lowrank_rows.lua): a second entry of lowrank_fwd's
    module, dg_lowrank_fwd_rows (the same arguments), where it serves the
    spec (float × float, codes × codes): runtime/ops/lowrank.c
    launches it at B·T <= 8 (decoding), warps over the columns, each
    weight row read once.
  Integer paths: y = __fmul_rn((float)acc, __fmul_rn(*sa, *sw)).
  Epilogue (every path): y = __fsub_rn(y, thr); y = y > 0 ? y : 0 (only with
  ReLU), then f32 | bf16 (round half to even) | int8 clamp(rint(y · (1/so)),
  ±127) | uint8pos clamp(rint(y · (1/so)), 0, 255), code 0 when so <= 0. No
  contraction into FMA in the epilogue (__fmul_rn, __fsub_rn, __fmul_rn by __frcp_rn(so)), so
  integer paths match the reference bit for bit. relu_mask keeps
  __fsub_rn(y, thr) > 0 as its mask.
]]
local SPEC = require("spec")
local FM = require("formats")
local TILES = require("tiles")
local SCL = require("scales")
local ROWS = require("lowrank_rows")
local fmt = string.format

local M = {}

local ACTS = { "f32", "bf16", "int8", "int4", "uint8pos" }
local WEIGHTS = { "f32", "bf16", "int8", "ternary", "sign1" }
local OUTS = { "f32", "bf16", "int8", "uint8pos" }

-- The ReLU's threshold of spec (its relu field), nil for none (also
-- decoder_gate.lua's, whose ys is this op's output).
local function relu_of(spec)
  local r = spec.relu
  if r == false or r == nil then return nil end
  SPEC.check(type(r) == "number", "spec.relu=%s: must be false or a number (the threshold)", tostring(r))
  SPEC.check(r == r and r ~= math.huge and r ~= -math.huge, "spec.relu=%s: the threshold must be finite", tostring(r))
  return r
end
M.relu_of = relu_of


--[[
Which path a spec takes (M.plan decides; render follows it):
  wgmma (sm_90a) lowrank_fwd, act and weight integer codes, arch sm_90a, a
                 warpgroup tile (templates/lowrank_wgmma.lua M.fits): the
                 whole E resident, one FMA an output, stores from registers;
  wgmma bf16     the same kernel for bf16 act × bf16 weight (E % 16 == 0,
  (sm_90a)       L % 16 == 0, E·2·(BM + 3·BN) within 227 KiB); other shapes
                 fall back to fp32 (the auto tile) or are refused (a
                 warpgroup tile the SIMT rules refuse);
  wgmma [bf16]   the K-streaming form (a tile of 3 to 8 stages, int8 or
  stream         bf16 weights, lowrank_wgmma.lua M.stream_fits): bf16's auto
                 tile where the resident one does not fit;
  tensor cores   act and weight integer codes, BK a multiple of 32 (so
                 E % 32 == 0), the warp tile (BM/WM x BN/WN) whole 16x8
                 fragments: mma.sync s8 (u8 for uint8pos acts) — the fast path;
  dp4a (SIMT)    integer × integer otherwise (small or odd tiles, E % 32 != 0,
                 arch below sm_80);
  fp32 (SIMT)    any float operand.
]]

-- The spec's fields as the plan and the renderers read them.
local function fields(spec)
  SPEC.check(spec.op == "lowrank_fwd" or spec.op == "relu_mask",
          "lowrank.lua renders ops lowrank_fwd and relu_mask, not %s", tostring(spec.op))
  local k = { op = spec.op, mask = spec.op == "relu_mask" }
  k.H = SPEC.int_field(spec, "heads", 1)
  k.HIN = SPEC.int_field(spec, "in_heads", 1)
  k.E = SPEC.int_field(spec, "embd", 1)
  k.L = SPEC.int_field(spec, "latent", 1)
  k.act = SPEC.one_of(spec, "act", ACTS)
  k.weight = SPEC.one_of(spec, "weight", WEIGHTS)
  k.out = k.mask and "f32" or SPEC.one_of(spec, "out", OUTS)
  k.thr = relu_of(spec)
  k.arch = SPEC.int_field(spec, "arch", 1)
  k.arch_specific = spec.arch_specific == true
  k.entry = k.mask and "dg_relu_mask" or "dg_lowrank_fwd"
  -- epi=rope: RoPE(out) into qr too (templates/lowrank_wgmma.lua)
  k.rope = not k.mask and spec.epi == "rope"
  k.sc = SCL.scale_kind(spec, FM.formats[k.act], FM.formats[k.weight])
  return k
end

-- The heuristic default tile (from sweeps on the H200, bench/kernels
-- --tile and `dragon-gen tune`, BDH shape, M = 4096):
--   wgmma (sm_90a) 128x64/8x1/2: two warpgroups of 64 rows, E resident,
--     64 latent columns a tile, two blocks an SM — 122 us int8 out;
--     256x64/16x1/2 125, 128x128/8x1/2 142, 64x64/4x1/2 205;
--   wgmma bf16 (sm_90a) the same 128x64/8x1/2 (not yet timed): 160 KiB of
--     shared memory at E = 256, one block an SM (256x64 fits too, 224 KiB;
--     128x128 does not);
--   tensor cores 128x128x64/2x4/4 (64x32 warp tiles, 2 blocks an SM): 277
--     us int8 out; 4x2 warps 312, 64x128 329, 64x64 389, 128x64 334, 64x256
--     349; K = embd in 4 steps at BDH (the whole K in flight);
--   SIMT (dp4a / fp32): 64x64 blocks of 2x2 warps (128 threads, 32
--     outputs a thread); BK the largest step up to 64 (codes) or 32
--     (floats) that divides E and whole storage words, double-buffered.
local function default_tile(k)
  local fa, fw = FM.formats[k.act], FM.formats[k.weight]
  local ints = fa.code and fw.code
  local LW = require("lowrank_wgmma")
  if LW.operands(k) and k.op == "lowrank_fwd" and k.arch == 90 and k.arch_specific then
    -- the K step is unused there (the whole E is resident): the largest of
    -- 64, 32, 16 that divides E, so that the plan's BK checks pass
    local bk = 64
    while k.E % bk ~= 0 and bk > 16 do bk = bk // 2 end
    -- bf16 out (the training step's projections): 256x64/16x1/2, one
    -- block of four warpgroups an SM, where the epilogue's issue is what
    -- holds the kernel: on an H100 (`dragon-gen tune`, int8 weights a
    -- scale a channel, int8 codes a scale a token, E 256, H 4, N 8192,
    -- M 4096) 219 us against 128x64's 242.5, the w8a8 step's twelve
    -- projections 2.93 -> 2.80 ms (bench/results/step-train-h100-2026-12-06_lrec.json)
    -- (int8 weights only: the others' and bf16's not timed at this tile)
    -- codes: the warp-specialized form, 128x128, 6 stages of 128 codes
    -- (one 128-byte swizzle row a stage), wherever it fits (int8 weights,
    -- L a multiple of 128, E of 128). Measured on an H100 (2026-12-07, the
    -- w8a8 step's projections, bench/step --train, one call; the same
    -- losses bit for bit): 25M 2.67 -> 2.43 ms (the resident 256x64 before;
    -- step 20.46 -> 20.19), D 768 9.67 -> 7.39 (mma.sync before; step
    -- 60.53 -> 58.09), 1B 19.17 -> 16.28 (mma.sync; step 129.35 -> 126.57).
    -- Its ping-pong twin 64x128x128/4x1/8 lost at each (2.94, 11.60).
    -- bf16 operands: the same form, 64 elements (128 bytes) a stage, where
    -- it fits. Measured on an H100 (2026-12-07, the bf16 step's
    -- projections, bench/step --train, one call, the same losses bit for
    -- bit): 25M 4.62 -> 3.35 ms (the resident 128x64 before; step 22.57 ->
    -- 21.36), D 768 19.18 -> 14.35 (the stream form 128x256; step 67.74 ->
    -- 62.28), 1B 43.21 -> 31.36 (the stream form; step 143.77 -> 131.77);
    -- its ping-pong twin 64x128x64/4x1/8 took 48.24 at 1B
    -- (bench/results/step-train-h100-2026-12-07_bf16_ws.json).
    local tw = { bm = 128, bn = 128, bk = LW.operands(k) == "bf16" and 64 or 128, wm = 8, wn = 1, stages = 6,
                 threads = 0 }
    if LW.ws_fits(k, tw) then return tw end
    if k.out == "bf16" and k.weight == "int8" then
      local t = { bm = 256, bn = 64, bk = bk, wm = 16, wn = 1, stages = 2, threads = 0 }
      if LW.fits(k, t) then return t end
    end
    local t = { bm = 128, bn = 64, bk = bk, wm = 8, wn = 1, stages = 2, threads = 0 }
    if LW.fits(k, t) then return t end
    -- bf16 rows that do not fit resident: the K-streaming form, 128x256,
    -- 64-byte slices (32 bf16), 4 stages (2 in flight), 96 KiB. `dragon-gen
    -- tune` at D 768, H 12, N 8192, B·T 2048 (H200): 1.40 ms a call, where
    -- 128x128/5 took 1.78 and the fp32 path 11.0 (the bf16 step 188 ms
    -- with it). Codes keep the tensor-core path below: mma.sync's
    -- 128x128x64/2x4/4 took 1.44 ms at D 1280, H 16, N 16384, B·T 1024,
    -- the best streaming tile 1.69 (a slice a barrier is too little work
    -- for cp.async and __syncthreads to feed the MMAs); a tuning record
    -- may still pick a streaming tile.
    if LW.operands(k) == "bf16" then
      t = { bm = 128, bn = 256, bk = 32, wm = 8, wn = 1, stages = 4, threads = 0 }
      if LW.stream_fits(k, t) then return t end
    end
  end
  if ints and k.arch >= 80 and k.E % 32 == 0 then
    return { bm = 128, bn = 128, bk = k.E % 64 == 0 and 64 or 32, wm = 2, wn = 4, stages = 4, threads = 0 }
  end
  local cpw = math.max(4, FM.codes_per_word(k.act), FM.codes_per_word(k.weight))
  local bk = ints and 64 or 32
  while k.E % bk ~= 0 and bk > cpw do bk = bk // 2 end
  return { bm = 64, bn = 64, bk = bk, wm = 2, wn = 2, stages = 2, threads = 0 }
end

local function plan_of(k, t, path, arch_specific, threads, smem, dyn)
  k.bm, k.bn, k.bk, k.wm, k.wn, k.stages = t.bm, t.bn, t.bk, t.wm, t.wn, t.stages
  return { tile = t, path = path, arch_specific = arch_specific, name = k.op .. ".cu",
           smem_bytes = smem,
           entries = { { name = k.entry, threads = threads, smem = dyn and smem or 0 } } }
end

local function plan_paths(spec)
  local k = fields(spec)
  local t = TILES.tile_of(spec)
  local auto = TILES.tile_is_auto(t)
  if auto then t = default_tile(k) end
  local ok, err = TILES.gemm_tile_pow2(t, auto)
  if not ok then return nil, err end
  local cpw = math.max(FM.codes_per_word(k.weight), FM.codes_per_word(k.act))
  if t.bk % cpw ~= 0 then
    return TILES.refuse(t, auto, "BK must be a multiple of %d (weight=%s act=%s pack that many codes a word)",
                    cpw, k.weight, k.act)
  end
  ok, err = TILES.bk_divides(t, auto, k.E, "embd")
  if not ok then return nil, err end
  local fa, fw = FM.formats[k.act], FM.formats[k.weight]
  local ints = fa.code and fw.code
  local LW = require("lowrank_wgmma")
  if LW.fits(k, t) then
    return plan_of(k, t, LW.operands(k) == "bf16" and "wgmma bf16" or "wgmma", true, t.bm // 64 * 128,
                   LW.smem(k, t), true)
  end
  if LW.ws_fits(k, t) then
    return plan_of(k, t, LW.operands(k) == "bf16" and "wgmma bf16 tma" or "wgmma tma", true,
                   384, LW.ws_smem(t), true)
  end
  if LW.stream_fits(k, t) then
    return plan_of(k, t, LW.operands(k) == "bf16" and "wgmma bf16 stream" or "wgmma stream", true,
                   t.bm // 64 * 128, LW.stream_smem(k, t), true)
  end
  ok, err = TILES.warps_ok(t, auto)
  if ok then ok, err = TILES.simt_warp_tile(t, auto) end
  if ok then ok, err = TILES.stages_ok(t, auto, 1, 4) end
  if not ok then return nil, err end
  local nt = t.wm * t.wn * 32
  local MMA = require("mma")
  if ints and MMA.fits(k.arch, t.bm, t.bn, t.bk, t.wm, t.wn) then
    -- registers a thread: the int32 accumulators plus the A fragments of
    -- one K chunk (two rows of KC/4 bytes an m16 tile)
    local acc = (t.bm // t.wm) * (t.bn // t.wn) // 32
    local afrag = (t.bm // t.wm // 16) * 2 * (t.bk % 64 == 0 and 4 or 2)
    if acc + afrag > 128 then
      return TILES.refuse(t, auto, "the tensor-core path needs %d accumulator and %d fragment registers a thread; at most 128 (more warps or a smaller tile)",
                      acc, afrag)
    end
    -- the pipeline, and the output tile staged in the same buffer
    local mp = MMA.plan(t.bm, t.bn, t.bk, t.wm, t.wn, t.stages, k.weight)
    local osz = k.mask and 1 or FM.out_types[k.out].size
    local smem = math.max(mp.pipe, t.bm * (t.bn * osz + math.max(16, 8 * osz)), 4 * t.wm * t.wn)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    return plan_of(k, t, "mma.sync", false, nt, smem, true)
  end
  local smem = math.min(t.stages, 2) * (t.bm + t.bn) * t.bk * (ints and 1 or 4)
  ok, err = TILES.smem_fits(t, auto, smem, k.arch, true)
  if not ok then return nil, err end
  return plan_of(k, t, ints and "dp4a" or "fp32", false, nt, smem, false)
end

-- The path's plan, with the few-rows entry (templates/lowrank_rows.lua)
-- after the path's where that entry serves the spec.
function M.plan(spec)
  local p, err = plan_paths(spec)
  local k = fields(spec)
  if p and k.rope and not (p.path:match("^wgmma") and k.out == "bf16") then
    return nil, fmt("epi=rope (RoPE(out) into qr): the warpgroup path (sm_90a, a warpgroup tile) with out=bf16 only; this spec takes the %s path with out=%s",
                    p.path, k.out)
  end
  if p and ROWS.applies(k) and not k.rope then
    p.entries[#p.entries + 1] = { name = ROWS.ENTRY, threads = ROWS.THREADS, smem = 0 }
  end
  return p, err
end

local function render_path(spec, plan)
  local k = fields(spec)
  local t = plan.tile
  k.bm, k.bn, k.bk, k.wm, k.wn, k.stages = t.bm, t.bn, t.bk, t.wm, t.wn, t.stages
  k.smem = plan.smem_bytes
  k.threads = plan.entries[1].threads

  local ot = FM.out_types[k.out].ctype
  k.signature = function(xt, wt)
    if k.mask then
      return fmt("dg_relu_mask(const %s *__restrict__ x, const %s *__restrict__ w,\n"
        .. "\t     const float *__restrict__ sa, const float *__restrict__ sw,\n"
        .. "\t     const float *grad, float *grad_out, int B, int T)", xt, wt)
    end
    return fmt("dg_lowrank_fwd(const %s *__restrict__ x, const %s *__restrict__ w,\n"
      .. "\t       const float *__restrict__ sa, const float *__restrict__ sw,\n"
      .. "\t       %s *__restrict__ out, const float *__restrict__ so,\n"
      .. "\t       float *__restrict__ out_absum, int B, int T%s)", xt, wt, ot,
      k.rope and ",\n\t       const float *__restrict__ rope, unsigned short *__restrict__ qr" or "")
  end
  k.about = function(path, nt, extra)
    local fa, fw = FM.formats[k.act], FM.formats[k.weight]
    local t = {}
    if k.mask then
      t[#t + 1] = "relu_mask: grad_out[b,h,t,l] = (s · Σ_e x[b,hin(h),t,e] · w[h,l,e] − thr) > 0 ? grad : 0"
      t[#t + 1] = ""
      t[#t + 1] = fmt("extern \"C\" __global__ void dg_relu_mask(const %s *x, const %s *w,", fa.ctype, fw.ctype)
      t[#t + 1] = "    const float *sa, const float *sw, const float *grad, float *grad_out, int B, int T)"
    else
      t[#t + 1] = "lowrank_fwd: out[b,h,t,l] = " .. (k.thr and "relu(" or "") ..
        "s · Σ_e x[b,hin(h),t,e] · w[h,l,e]" .. (k.thr and " − thr)" or "")
      t[#t + 1] = ""
      t[#t + 1] = fmt("extern \"C\" __global__ void dg_lowrank_fwd(const %s *x, const %s *w,", fa.ctype, fw.ctype)
      t[#t + 1] = fmt("    const float *sa, const float *sw, %s *out, const float *so, float *out_absum,", ot)
      t[#t + 1] = k.rope and "    int B, int T, const float *rope, unsigned short *qr)" or "    int B, int T)"
      if k.rope then
        t[#t + 1] = "epi=rope: qr (B, H, T, L) bf16 = RoPE(out) by rope (T, L) f32, as rope_fwd makes it from out's bf16 values (each product and the sum rounded once, then bf16)."
      end
    end
    t[#t + 1] = fmt("grid: any number of blocks (they stride over the ceil(B*T/%d)·ceil(%d/%d)·%d tiles);",
                    k.bm, k.L, k.bn, k.H)
    t[#t + 1] = fmt("block %d threads; x, w, out (grad, grad_out) 16-byte aligned.", nt)
    t[#t + 1] = fmt("x (B, %d, T, %d) %s; w (%d, %d, %d) %s; %s (B, %d, T, %d) %s.", k.HIN, k.E, k.act,
                    k.H, k.L, k.E, k.weight, k.mask and "grad, grad_out" or "out", k.H, k.L,
                    k.mask and "f32" or k.out)
    t[#t + 1] = "path: " .. path .. "."
    t[#t + 1] = extra
    return t
  end

  local text
  if plan.path:match("^wgmma") then
    text = require("lowrank_wgmma").render(spec, k)
  elseif plan.path == "mma.sync" then
    text = require("lowrank_mma").render(spec, k)
  else
    text = require("lowrank_simt").render(spec, k)
  end
  return text, k
end

function M.render(spec, plan)
  local text, k = render_path(spec, plan)
  local e = plan.entries[#plan.entries]
  if e and e.name == ROWS.ENTRY then
    text = text .. ROWS.render(k)
  end
  return text
end

return M

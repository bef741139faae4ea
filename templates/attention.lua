--[[
attention.lua — BDH's attention (quadratic form, no softmax, no scaling,
strictly causal, values shared by every head) as five GEMMs, each an op:

  attention_scores       S[i,j]   = Σ_k qr[i,k]·qr[j,k] (j < i; else 0)   qr = RoPE(xs) on the load
  attention_out          out[i,e] = Σ_{j<i} S[i,j]·v[j,e]
  attention_grad_scores  C[i,j]   = dS[i,j] + dS[j,i], dS[i,j] = Σ_e grad[i,e]·v[j,e] (j < i)
  attention_grad_v       gv[j,e]  = Σ_h Σ_{i>j} S[h,i,j]·grad[h,i,e]       (heads in order)
  attention_grad_xs      gxs      = RoPEᵀ(C·qr), qr = RoPE(xs) on the load, RoPEᵀ in the epilogue
                         epi=mask: dxs = (dxs + gxs)·[mask_xs > 0] in place, no gxs

per (b, h) (grid z = B·H; attention_grad_v: z = B, the heads a K loop).
Why five and not two: the GEMMs have different shapes (K = L, T, E or H·T)
and each gets its own tile from the tuner; S is saved by the forward (cheaper
than recomputing the K = L product), and C — symmetric, zero diagonal, both
halves written by one block (the mirror store) — is the caller's workspace
between the two backward GEMMs that read it, so the dxs GEMM is a dense one.

Kernel ABI (runtime/ops/attention.c launches it; dragon/ref.h mirrors it):
  dg_attention_scores(const XT *xs, const float *rope, XT *scores, int B, int T)
  dg_attention_out(const XT *scores, const XT *v, XT *out, int B, int T)
  dg_attention_grad_scores(const float *grad, const XT *v, XT *grad_scores, int B, int T)
  dg_attention_grad_v(const XT *scores, const float *grad, float *grad_v, int B, int T)
  dg_attention_grad_xs(const XT *grad_scores, const XT *xs, const float *rope,
      OT *grad_xs, int B, int T)       OT: the spec's out (f32 | bf16)
  epi=mask (the model's add_mask fused; spec key epi=store|mask, store the
  default and left out of the canonical text):
  dg_attention_grad_xs(const XT *grad_scores, const XT *xs, const float *rope,
      OT *dxs, const XT *mask_xs, int B, int T)
      dxs (B,H,T,L) read and written in place, mask_xs (B,H,T,L) the ReLU's
      output (with rope=pre xs is RoPE(xs), whose sign is not the mask);
      per element dxs = mask_xs > 0 ? __fadd_rn(dxs, g) : 0 with g the f32
      RoPEᵀ value grad_xs would hold, rounded once to OT: step.lua
      add_mask's arithmetic (src=f32), so the fused op is bit for bit the
      pair grad_xs (out=f32) then add_mask on the same tile.
  XT float (act f32) | unsigned short (act bf16). xs (B,H,T,L), rope (T,L)
  (cos, sin at columns 2p, 2p+1), scores / grad_scores (B,H,T,T), v (B,1,T,E),
  grad and out (B,H,T,E), grad_v (B,1,T,E), grad_xs (B,H,T,L). Grid
  (ceil(N/BN), ceil(T/BM), z), N = T, E, E, E, L; the plan's threads and
  dynamic shared memory. Any T >= 1: tile edges and rows that are not
  16-byte aligned (T odd) take guarded element loads.

Every element is staged through registers: global loads of step k+1 are
issued before step k's math, and after it they are widened to f32, turned
by RoPE (the table's pair next to the element pair), masked (tril), rounded
(bf16 path) and stored into the other of two shared buffers; one barrier a
step (stages 2; stages 1: one buffer, two barriers). Blocks wholly above the
diagonal are skipped (scores writes their zeros; grad_scores' mirror writes
them), and K steps that only meet masked elements are never issued
(attention_out stops at the block's last row, attention_grad_v starts at its
first).

Paths (M.plan):
  mma.sync bf16 (act bf16, sm_80+, BK % 16 == 0, warp tiles whole 16x16):
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, f32 sums, operands
    read by ldmatrix (x4; .trans where the operand lands M- or N-major),
    fragment layouts as templates/backward_mma.lua documents them; an
    accumulator pair c0, c1 is columns 2q, 2q+1 of one row, the RoPE pair
    the grad_xs epilogue turns. f32 operands (grad) round to bf16 once.
  fp32 FMA (act f32, or a tile the tensor cores cannot run): a warp's lanes
    are 4 rows x 8 column pairs, each thread TM rows (stride 4) by TN/2
    pairs (stride 16).
  epi=mask on these two paths: the masked sum in the pair store (a pair of
  dxs and of mask_xs read, a pair written, from the accumulator layout).
  On the warpgroup path the epilogue is staged: after the main loop (every
  warpgroup's MMAs waited for, then a barrier) the ring holds the f32 tile
  (BM rows of BN + 8 floats: a half-warp's float2 stores hit 32 distinct
  banks; the plan asks max(ring, BM·(BN+8)·4) + 1 KiB, the ring the larger
  on every tile it takes), then each thread takes 8 consecutive columns of
  a row, consecutive threads along it (a warp covers whole 128-byte lines):
  two float4 reads of the tile (a quarter-warp's lanes 4..7 read their
  second half first: no bank conflicts), RoPEᵀ from the table's 16-byte
  loads, one 16-byte load of dxs and of mask_xs (bf16), the add and the
  mask, one 16-byte store. Rows past T are skipped; L % 8 != 0 takes the
  chunk pair by pair.

Performance, measured on the H200 at B 8, H 4, T 512, L 8192, E 256 (bf16;
tests/test_gpu_attention.c bdh_shape_sampled_bf16 and bdh_shape_warpgroup
print each op's time, cold L2). mma.sync path (rope on the load): scores
945 us (73 TFLOP/s useful), grad_xs 1380 us (100), out 36, grad_scores 59,
grad_v 71. The sm_90a warpgroup path (rope=pre; the chain's rope_fwd takes
185 us a call, twice a layer): scores 377 us (182 TFLOP/s), grad_xs 711 us
(193). Its first version, without the swizzle (16-byte chunks of 8 rows a
warp request), was L2-bound (ncu: L2 throughput 74% and 91% at 100 and 116
TFLOP/s); with the 128-byte swizzle ncu gives scores SM 41% / L2 32%, and
grad_xs L2 78% / DRAM 49% (its f32 output is 537 MB). Written straight from
the accumulators as bf16 (a pair a thread half-fills each 32-byte sector)
grad_xs made the model's attention backward slower than f32 (8.8 ms
against 8.0). Done since: the model's add_mask fused into grad_xs
(epi=mask), with the staged, coalesced epilogue above on the warpgroup
path: no f32 grad_xs written and read back (537 MB each way a layer, ~250
us of traffic at the copy bandwidth) and no add_mask pass; the model runs
it on sm_90 for bf16. Measured in the model on the H200 (bench/step's
profile, w8a8): the attention's backward 6.0 ms a step where grad_xs at f32
and add_mask made it 8.1 (tests/test_gpu_attention.c
bdh_shape_epi_mask_warpgroup prints the op's own time beside the pair's).
The mma.sync path's pair-store form is not measured against the pair it
replaces (the model does not run it). Next: scores on a 128x256 tile, and
RoPE out of the x projection's epilogue.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local TILES = require("tiles")
local DEV = require("device")
local fmt = string.format

local M = {}

local OPS = {}

-- geo: C++ lines defining M, N, K, LDA, LDB, NH, pa, pb, ra, rb, a_hs,
-- b_hs, kt_begin, kt_end, skip (with B, T, z, m0, n0 in scope).
OPS.attention_scores = {
  sig = "const XT *__restrict__ xs, const float *__restrict__ rope, XT *__restrict__ scores, int B, int T",
  at = "act", bt = "act", ot = "act", a_kc = true, b_kc = true, a_rope = true, b_rope = true, mask = 0,
  a_ld = "latent", b_ld = "latent", gz = "B * H", n = "T",
  geo = [[
	const int M = T, N = T, K = L, LDA = L, LDB = L, NH = 1;
	const AT *pa = xs + (long long)z * T * L;
	const BT *pb = pa;
	const float *ra = rope, *rb = rope;
	const long long a_hs = 0, b_hs = 0;
	const int kt_begin = 0, kt_end = (K + BK - 1) / BK;
	const bool skip = n0 >= m0 + BM;	// wholly above the diagonal: zeros
	OT *po = scores + (long long)z * T * T;]],
  skip = [[
		for (int i = tid; i < BM * BN; i += NT) {
			const int m = m0 + i / BN, n = n0 + i % BN;
			if (m < M && n < N)
				po[(long long)m * T + n] = dg_out(0.0f);
		}]],
  store = [[
	auto store_pair = [&](int m, int n, float v0, float v1) {
		OT *o = po + (long long)m * T;
		o[n] = dg_out(n < m ? v0 : 0.0f);
		if (n + 1 < N)
			o[n + 1] = dg_out(n + 1 < m ? v1 : 0.0f);
	};]],
}

OPS.attention_out = {
  sig = "const XT *__restrict__ scores, const XT *__restrict__ v, XT *__restrict__ out, int B, int T",
  at = "act", bt = "act", ot = "act", a_kc = true, b_kc = false, mask = 1,
  a_ld = "T", b_ld = "embd", gz = "B * H", n = "E",
  geo = [[
	const int M = T, N = E, K = T, LDA = T, LDB = E, NH = 1;
	const AT *pa = scores + (long long)z * T * T;
	const BT *pb = v + (long long)(z / H) * T * E;
	const float *ra = nullptr, *rb = nullptr;
	const long long a_hs = 0, b_hs = 0;
	const int kt_begin = 0, kt_end = (min(T, m0 + BM - 1) + BK - 1) / BK;	// j < i <= m0 + BM - 1
	const bool skip = false;
	OT *po = out + (long long)z * T * E;]],
  store = [[
	auto store_pair = [&](int m, int n, float v0, float v1) {
		OT *o = po + (long long)m * E + n;	// E % 4 == 0: the pair is whole
		o[0] = dg_out(v0);
		o[1] = dg_out(v1);
	};]],
}

OPS.attention_grad_scores = {
  sig = "const float *__restrict__ grad, const XT *__restrict__ v, XT *__restrict__ grad_scores, int B, int T",
  at = "f32", bt = "act", ot = "act", a_kc = true, b_kc = true, mask = 0,
  a_ld = "embd", b_ld = "embd", gz = "B * H", n = "T",
  geo = [[
	const int M = T, N = T, K = E, LDA = E, LDB = E, NH = 1;
	const AT *pa = grad + (long long)z * T * E;
	const BT *pb = v + (long long)(z / H) * T * E;
	const float *ra = nullptr, *rb = nullptr;
	const long long a_hs = 0, b_hs = 0;
	const int kt_begin = 0, kt_end = (K + BK - 1) / BK;
	const bool skip = n0 >= m0 + BM;	// above the diagonal: the mirror of a block below writes it
	OT *po = grad_scores + (long long)z * T * T;]],
  skip = "",
  store = [[
	// (m, n) below the diagonal goes to (m, n) and (n, m): C = dS + dSᵀ, each
	// element written once; the diagonal is 0.
	auto store_one = [&](int m, int n, float val) {
		if (n >= N)
			return;
		if (n < m) {
			po[(long long)m * T + n] = dg_out(val);
			po[(long long)n * T + m] = dg_out(val);
		} else if (n == m) {
			po[(long long)m * T + m] = dg_out(0.0f);
		}
	};
	auto store_pair = [&](int m, int n, float v0, float v1) {
		store_one(m, n, v0);
		store_one(m, n + 1, v1);
	};]],
}

OPS.attention_grad_v = {
  sig = "const XT *__restrict__ scores, const float *__restrict__ grad, float *__restrict__ grad_v, int B, int T",
  at = "act", bt = "f32", ot = "f32", a_kc = false, b_kc = false, mask = 2,
  a_ld = "T", b_ld = "embd", gz = "B", n = "E",
  geo = [[
	// z = b; K runs over (h, i), heads in order, i > j >= m0
	const int M = T, N = E, K = T, LDA = T, LDB = E, NH = H;
	const AT *pa = scores + (long long)z * H * T * T;	// A[m = j][k = i] = S[h][i][j]
	const BT *pb = grad + (long long)z * H * T * E;	// B[k = i][n = e]
	const float *ra = nullptr, *rb = nullptr;
	const long long a_hs = (long long)T * T, b_hs = (long long)T * E;
	const int kt_begin = (m0 + 1) / BK, kt_end = (K + BK - 1) / BK;
	const bool skip = false;
	OT *po = grad_v + (long long)z * T * E;]],
  store = [[
	auto store_pair = [&](int m, int n, float v0, float v1) {
		*(float2 *)(po + (long long)m * E + n) = make_float2(v0, v1);
	};]],
}

local GX_GEO = [[
	const int M = T, N = L, K = T, LDA = T, LDB = L, NH = 1;
	const AT *pa = grad_scores + (long long)z * T * T;
	const BT *pb = xs + (long long)z * T * L;	// B[k = j][n] = RoPE(xs)[j][n]
	const float *ra = nullptr, *rb = rope;
	const long long a_hs = 0, b_hs = 0;
	const int kt_begin = 0, kt_end = (K + BK - 1) / BK;
	const bool skip = false;]]

OPS.attention_grad_xs = {
  sig = "const XT *__restrict__ grad_scores, const XT *__restrict__ xs, const float *__restrict__ rope, OT *__restrict__ grad_xs, int B, int T",
  at = "act", bt = "act", ot = "out", a_kc = true, b_kc = false, b_rope = true, mask = 0,
  a_ld = "T", b_ld = "latent", gz = "B * H", n = "L",
  geo = GX_GEO .. [[

	OT *po = grad_xs + (long long)z * T * L;]],
  store = [[
	// RoPEᵀ of row m: the pair (n, n+1) with rope[m][n], rope[m][n+1]
	auto store_pair = [&](int m, int n, float v0, float v1) {
		const float2 cs = __ldg((const float2 *)(rope + (long long)m * L + n));
		dg_store2(po + (long long)m * L + n, __fadd_rn(__fmul_rn(v0, cs.x), __fmul_rn(v1, cs.y)),
			  __fsub_rn(__fmul_rn(v1, cs.x), __fmul_rn(v0, cs.y)));
	};]],
  -- epi=mask: dxs (the out format) in place of grad_xs, and the ReLU's
  -- output mask_xs (act) whose sign masks it
  sig_mask = "const XT *__restrict__ grad_scores, const XT *__restrict__ xs, const float *__restrict__ rope, OT *__restrict__ dxs, const XT *__restrict__ mask_xs, int B, int T",
  geo_mask = GX_GEO .. [[

	OT *po = dxs + (long long)z * T * L;		// read, then written in place
	const XT *pm = mask_xs + (long long)z * T * L;]],
  store_mask = [[
	// RoPEᵀ of row m's pair (n, n+1) with rope[m][n], rope[m][n+1], added
	// into dxs and masked by mask_xs (L % 4 == 0: the pair is whole)
	auto store_pair = [&](int m, int n, float v0, float v1) {
		const long long o = (long long)m * L + n;
		dg_mask_pair(po + o, pm + o, __ldg((const float2 *)(rope + o)), v0, v1);
	};]],
}

local NAMES = { "attention_scores", "attention_out", "attention_grad_scores", "attention_grad_v",
                "attention_grad_xs" }

local function fields(spec)
  local op = SPEC.one_of(spec, "op", NAMES)
  local k = { op = op, o = OPS[op] }
  k.H = SPEC.int_field(spec, "heads", 1)
  k.E = SPEC.int_field(spec, "embd", 4)
  k.L = SPEC.int_field(spec, "latent", 4)
  k.arch = SPEC.int_field(spec, "arch", 1)
  k.arch_specific = spec.arch_specific == true
  k.act = SPEC.one_of(spec, "act", { "f32", "bf16" })
  -- grad_xs writes the gradient format (f32 | bf16); the others' outputs are fixed
  k.out = op == "attention_grad_xs" and SPEC.one_of(spec, "out", { "f32", "bf16" }) or "f32"
  -- rope=pre (scores, grad_xs): the operand is RoPE(xs) already
  k.rope_pre = (op == "attention_scores" or op == "attention_grad_xs") and spec.rope == "pre"
  -- epi=mask (grad_xs): dxs = (dxs + grad_xs)·[mask_xs > 0] in place of grad_xs
  k.epi_mask = op == "attention_grad_xs" and SPEC.one_of(spec, "epi", { "store", "mask" }) == "mask"
  k.a_rope = k.o.a_rope == true and not k.rope_pre
  k.b_rope = k.o.b_rope == true and not k.rope_pre
  return k
end

-- Elements a staging unit holds along an operand's contiguous axis (of
-- compile-time length `ld`, or the run-time T): 8 bf16 (16 bytes) where
-- the rows allow, else 4; never more than the tile's extent along it.
local function unit_of(fmt_, ld, k, tile_len)
  local n = 4
  if fmt_ == "bf16" then
    local len = ld == "latent" and k.L or (ld == "embd" and k.E or nil)
    n = (len == nil or len % 8 == 0) and 8 or 4
  end
  return math.min(n, tile_len)
end

-- The signature, geometry and pair store of k's op (epi=mask: the masked
-- sum's).
local function op_text(k)
  local o = k.o
  if k.epi_mask then return o.sig_mask, o.geo_mask, o.store_mask end
  return o.sig, o.geo, o.store
end

local function operand_fmt(k, f) return f == "act" and k.act or (f == "out" and k.out or "f32") end

-- The sm_90a warpgroup path serves a GEMM whose operands are both bf16
-- activations read raw (no RoPE on the load, no mask): attention_scores
-- and attention_grad_xs with rope=pre.
local function wgmma_op(k)
  local o = k.o
  return k.arch == 90 and k.arch_specific and k.act == "bf16" and o.at == "act" and o.bt == "act" and
         not k.a_rope and not k.b_rope and o.mask == 0
end

-- Its tiles: wgmma_bf16.lua's (M.tile_ok), a ring of 3 or 4 stages (S-1
-- K steps in flight).
local function wgmma_fits(k, t)
  return wgmma_op(k) and require("wgmma_bf16").tile_ok(t, 3, 4)
end

-- The warp-specialized form of that path (templates/attention_tma.lua):
-- the operands along L by TMA, which rows of L % 8 == 0 allow, on tiles
-- with a ring of 5 to 8 stages.
local function tma_op(k)
  return wgmma_op(k) and require("attention_tma").applies(k)
end

-- The heuristic default tile (see the performance note in the module's
-- banner): tensor cores for bf16 from sm_80, 128x128 blocks of 8 warps
-- (64x32 warp tiles, 64 f32 accumulators a thread), BK 32, two buffers;
-- attention_grad_v (z = B only) 64x64 so the grid fills the SMs. fp32:
-- 64x64x16 of 2x2 warps.
local function default_tile(k)
  if wgmma_op(k) then
    -- 2 warpgroups, 64 f32 accumulators a thread; 96 KiB of ring: two
    -- blocks an SM
    return { bm = 128, bn = 128, bk = 64, wm = 8, wn = 1, stages = 3, threads = 0 }
  end
  if k.act == "bf16" and k.arch >= 80 then
    if k.op == "attention_grad_v" then
      return { bm = 64, bn = 64, bk = 32, wm = 2, wn = 2, stages = 2, threads = 0 }
    end
    return { bm = 128, bn = 128, bk = 32, wm = 2, wn = 4, stages = 2, threads = 0 }
  end
  return { bm = 64, bn = 64, bk = 16, wm = 2, wn = 2, stages = 2, threads = 0 }
end

local function mma_fits(k, t)
  local wtm, wtn = t.bm // t.wm, t.bn // t.wn
  return k.act == "bf16" and k.arch >= 80 and t.bk % 16 == 0 and t.bm % t.wm == 0 and t.bn % t.wn == 0 and
         wtm % 16 == 0 and wtn % 16 == 0
end

-- Shared memory bytes of both buffers (stages 2) or one.
local function smem_bytes(k, t, mma)
  local o = k.o
  local pa, arows, pb, brows
  if mma then
    pa, arows = o.a_kc and t.bk + 8 or t.bm + 8, o.a_kc and t.bm or t.bk
    pb, brows = o.b_kc and t.bk + 8 or t.bn + 8, o.b_kc and t.bn or t.bk
  else
    pa, arows, pb, brows = t.bm + 4, t.bk, t.bn + 4, t.bk
  end
  local nbuf = t.stages >= 2 and 2 or 1
  return nbuf * (pa * arows + pb * brows) * (mma and 2 or 4)
end

function M.plan(spec)
  local k = fields(spec)
  local t = TILES.tile_of(spec)
  local auto = TILES.tile_is_auto(t)
  if auto then t = default_tile(k) end
  local ok, err = TILES.gemm_tile_pow2(t, auto)
  if ok then ok, err = TILES.warps_ok(t, auto) end
  if ok then ok, err = TILES.stages_ok(t, auto, 1, tma_op(k) and 8 or (wgmma_op(k) and 4 or 2)) end
  if not ok then return nil, err end
  local nt = t.wm * t.wn * 32
  local p = { tile = t, arch_specific = false, name = k.op .. ".cu",
              entries = { { name = "dg_" .. k.op, threads = nt } } }
  local TMA = require("attention_tma")
  if tma_op(k) and TMA.tile_ok(t) then
    p.path = "wgmma tma"
    p.arch_specific = true
    p.entries[1].threads = TMA.threads(t)
    local smem = TMA.smem_bytes(t, k.epi_mask)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    p.entries[1].smem = smem
    return p
  end
  if wgmma_fits(k, t) then
    p.path = "wgmma bf16"
    p.arch_specific = true
    -- epi=mask stages the f32 tile through the ring once the MMAs are done
    local smem = require("wgmma_bf16").smem_bytes(t, k.epi_mask)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    p.entries[1].smem = smem
    return p
  end
  if t.stages > 4 then
    return TILES.refuse(t, auto, "stages 5 to 8 are the warp-specialized sm_90a path's (attention_scores, rope=pre, L %% 8 == 0), whose tiles have WN 1, BM = 16*WM of 64 or 128, BN 64, 128 or 256 and BK 64, and whose ring fits shared memory")
  end
  if t.stages > 2 then
    return TILES.refuse(t, auto, "stages 3 and 4 are the sm_90a warpgroup path's, whose tiles have WN 1, BM = 16*WM of 64 or 128, BN 64, 128 or 256 and BK 64; the other paths take 1 or 2")
  end
  local mma = mma_fits(k, t)
  if mma then
    local acc = (t.bm // t.wm) * (t.bn // t.wn) // 32
    if acc > 128 then
      return TILES.refuse(t, auto, "%d f32 accumulators a thread on the tensor-core path; at most 128 (more warps or a smaller tile)", acc)
    end
    p.path = "mma.sync bf16"
  else
    local wtm, wtn = t.bm // t.wm, t.bn // t.wn
    if t.bm % t.wm ~= 0 or t.bn % t.wn ~= 0 or wtm % 4 ~= 0 or wtn % 16 ~= 0 then
      return TILES.refuse(t, auto, "each warp's tile (BM/WM x BN/WN) must be a multiple of 4x16 on the fp32 path")
    end
    if (wtm // 4) * (wtn // 8) > 64 then
      return TILES.refuse(t, auto, "%d outputs per thread; at most 64 fit in registers (more warps or a smaller tile)",
                      (wtm // 4) * (wtn // 8))
    end
    p.path = "fp32"
  end
  local smem = smem_bytes(k, t, mma)
  ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
  if not ok then return nil, err end
  p.entries[1].smem = smem
  return p
end

local HELPERS = [[
// ---- helpers (templates/attention.lua) --------------------------------------
__device__ __forceinline__ void dg_ldsm_x4(unsigned (&d)[4], unsigned a)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a) : "memory");
}

__device__ __forceinline__ void dg_ldsm_x4_t(unsigned (&d)[4], unsigned a)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a) : "memory");
}

__device__ __forceinline__ void dg_mma_bf16(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A staging unit: EU consecutive elements of one row of an operand (its
// contiguous axis), raw, and with RoPE the table's EU floats beside them.
template <typename T_, int EU, bool ROPE>
struct dg_unit {
	unsigned raw[EU * (int)sizeof(T_) / 4];
	float tab[ROPE ? EU : 1];
};

// Loads row `row` (of `rows`), elements in0 .. in0+EU-1 (of `inner`) of a
// row-major operand with row length ld (and the rope table's same row and
// columns); zeros outside. Whole, aligned units take 8- or 16-byte loads.
template <typename T_, int EU, bool ROPE>
__device__ __forceinline__ void dg_unit_load(dg_unit<T_, EU, ROPE> &u, const T_ *base, const float *rope,
					     int row, int rows, int in0, int inner, int ld)
{
	constexpr int RW = EU * (int)sizeof(T_) / 4;
#pragma unroll
	for (int i = 0; i < RW; ++i)
		u.raw[i] = 0u;
	if constexpr (ROPE) {
#pragma unroll
		for (int e = 0; e < EU; ++e)
			u.tab[e] = 0.0f;
	}
	if (row >= rows || in0 >= inner)
		return;
	const T_ *p = base + (long long)row * ld + in0;
	if (in0 + EU <= inner && ld % EU == 0) {
		if constexpr (RW % 4 == 0) {
#pragma unroll
			for (int i = 0; i < RW; i += 4) {
				const uint4 v = __ldg((const uint4 *)(const void *)p + i / 4);
				u.raw[i] = v.x; u.raw[i + 1] = v.y; u.raw[i + 2] = v.z; u.raw[i + 3] = v.w;
			}
		} else {
			const uint2 v = __ldg((const uint2 *)(const void *)p);
			u.raw[0] = v.x; u.raw[1] = v.y;
		}
		if constexpr (ROPE) {
			const float *tp = rope + (long long)row * ld + in0;
#pragma unroll
			for (int e = 0; e < EU; e += 4) {
				const float4 c = __ldg((const float4 *)(tp + e));
				u.tab[e] = c.x; u.tab[e + 1] = c.y; u.tab[e + 2] = c.z; u.tab[e + 3] = c.w;
			}
		}
	} else {
#pragma unroll
		for (int e = 0; e < EU; ++e) {
			if (in0 + e >= inner)
				break;
			if constexpr (sizeof(T_) == 2)
				u.raw[e / 2] |= (unsigned)__ldg((const unsigned short *)(const void *)p + e) << (16 * (e & 1));
			else
				u.raw[e] = __float_as_uint(__ldg((const float *)(const void *)p + e));
			if constexpr (ROPE)
				u.tab[e] = __ldg(rope + (long long)row * ld + in0 + e);
		}
	}
}

// The unit's values in f32, turned by RoPE (pairs 2p, 2p+1; the products
// and sums rounded as rope_fwd's).
template <typename T_, int EU, bool ROPE>
__device__ __forceinline__ void dg_unit_vals(const dg_unit<T_, EU, ROPE> &u, float (&f)[EU])
{
#pragma unroll
	for (int e = 0; e < EU; ++e) {
		if constexpr (sizeof(T_) == 2)
			f[e] = __uint_as_float((u.raw[e / 2] >> (16 * (e & 1))) << 16);
		else
			f[e] = __uint_as_float(u.raw[e]);
	}
	if constexpr (ROPE) {
#pragma unroll
		for (int q = 0; q < EU / 2; ++q) {
			const float x0 = f[2 * q], x1 = f[2 * q + 1], c = u.tab[2 * q], s = u.tab[2 * q + 1];
			f[2 * q] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
			f[2 * q + 1] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
		}
	}
}
]]

local HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int E = ${E};		// embd (D)
constexpr int L = ${L};		// latent (N): RoPE pairs along it
typedef ${XT} XT;		// the act format's storage
typedef ${AT} AT;		// A operand storage
typedef ${BT} BT;		// B operand storage
typedef ${OT} OT;		// output storage

// ---- tile ------------------------------------------------------------------
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};	// block tile, K step
constexpr int WM = ${WM}, WN = ${WN};		// warps: WM rows x WN cols
constexpr int NT = WM * WN * 32;		// threads a block
constexpr int NBUF = ${NBUF};			// shared buffers
constexpr int WTM = BM / WM, WTN = BN / WN;	// warp tile

// ---- operands: A[m][k] (${A_DESC}), B[k][n] (${B_DESC})
constexpr bool A_KC = ${A_KC}, B_KC = ${B_KC};	// contiguous along k (else along m / n)
constexpr bool A_ROPE = ${A_ROPE}, B_ROPE = ${B_ROPE};	// RoPE on the load
constexpr int A_MASK = ${A_MASK};		// 0 none; 1 keep k < m; 2 keep k > m
constexpr int EU_A = ${EU_A}, EU_B = ${EU_B};	// elements a staging unit
constexpr int A_UNITS = A_KC ? BM * (BK / EU_A) : BK * (BM / EU_A);
constexpr int B_UNITS = B_KC ? BN * (BK / EU_B) : BK * (BN / EU_B);
constexpr int SA = (A_UNITS + NT - 1) / NT, SB = (B_UNITS + NT - 1) / NT;	// units a thread

// ---- shared memory: NBUF buffers of the A tile then the B tile (${SMEM} bytes)
${SMEM_LAYOUT}
]]

local SMEM_MMA = [[
typedef unsigned short ST;		// bf16 in shared memory
// As[m][k] (A_KC) or As[k][m]; Bs[n][k] (B_KC) or Bs[k][n]: a row is an odd
// number of 16-byte chunks, so an ldmatrix phase's 8 rows hit distinct banks.
constexpr int PA = A_KC ? BK + 8 : BM + 8, PB = B_KC ? BK + 8 : BN + 8;
constexpr int A_ELEMS = (A_KC ? BM : BK) * PA, B_ELEMS = (B_KC ? BN : BK) * PB;
constexpr int BUF_BYTES = (A_ELEMS + B_ELEMS) * 2;
constexpr int MT = WTM / 16, NT8 = WTN / 8;	// m16 x n8 fragments a warp]]

local SMEM_SIMT = [[
typedef float ST;			// f32 in shared memory
constexpr int PA = BM + 4, PB = BN + 4;		// As[k][m], Bs[k][n]
constexpr int A_ELEMS = BK * PA, B_ELEMS = BK * PB;
constexpr int BUF_BYTES = (A_ELEMS + B_ELEMS) * 4;
constexpr int TM = WTM / 4, TNP = WTN / 16;	// rows (stride 4), pairs (stride 16) a thread]]

-- Puts f (EU values of one unit) into shared memory, by the path's layout.
local PUT_MMA = [[
template <int EU>
__device__ __forceinline__ void dg_put(ST *dst, int off, int stride_unused, const float (&f)[EU])
{
	(void)stride_unused;
	if constexpr (EU == 8)
		*(uint4 *)(dst + off) = make_uint4(dg_bf16x2(f[0], f[1]), dg_bf16x2(f[2], f[3]),
						   dg_bf16x2(f[4], f[5]), dg_bf16x2(f[6], f[7]));
	else
		*(uint2 *)(dst + off) = make_uint2(dg_bf16x2(f[0], f[1]), dg_bf16x2(f[2], f[3]));
}
]]

local PUT_SIMT = [[
template <int EU>
__device__ __forceinline__ void dg_put(ST *dst, int off, int stride, const float (&f)[EU])
{
#pragma unroll
	for (int e = 0; e < EU; ++e)
		dst[off + e * stride] = f[e];
}
]]

local KERNEL = [[
extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(${SIG})
{
	extern __shared__ __align__(16) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int wr = warp / WN, wc = warp % WN;
	const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, z = blockIdx.z;
	(void)B;
${GEO}
	if (skip) {
${SKIP}
		return;
	}
	const int nk = kt_end > kt_begin ? kt_end - kt_begin : 0;
	const int nsteps = NH * nk;		// (head, K step) pairs, heads outer

	dg_unit<AT, EU_A, A_ROPE> ua[SA];
	dg_unit<BT, EU_B, B_ROPE> ub[SB];
	auto load = [&](int st) {
		const int h = st / nk, k0 = (kt_begin + st % nk) * BK;
		const AT *ah = pa + h * a_hs;
		const BT *bh = pb + h * b_hs;
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
			if (A_UNITS % NT != 0 && u >= A_UNITS)
				break;
			if constexpr (A_KC)
				dg_unit_load(ua[s], ah, ra, m0 + u / (BK / EU_A), M, k0 + u % (BK / EU_A) * EU_A, K, LDA);
			else
				dg_unit_load(ua[s], ah, ra, k0 + u / (BM / EU_A), K, m0 + u % (BM / EU_A) * EU_A, M, LDA);
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT;
			if (B_UNITS % NT != 0 && u >= B_UNITS)
				break;
			if constexpr (B_KC)
				dg_unit_load(ub[s], bh, rb, n0 + u / (BK / EU_B), N, k0 + u % (BK / EU_B) * EU_B, K, LDB);
			else
				dg_unit_load(ub[s], bh, rb, k0 + u / (BN / EU_B), K, n0 + u % (BN / EU_B) * EU_B, N, LDB);
		}
	};
	auto store = [&](int buf, int st) {
		const int k0 = (kt_begin + st % nk) * BK;
		ST *as = (ST *)(smem + buf * BUF_BYTES);
		ST *bs = as + A_ELEMS;
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
			if (A_UNITS % NT != 0 && u >= A_UNITS)
				break;
			float f[EU_A];
			dg_unit_vals(ua[s], f);
			const int ml = A_KC ? u / (BK / EU_A) : u % (BM / EU_A) * EU_A;
			const int kl = A_KC ? u % (BK / EU_A) * EU_A : u / (BM / EU_A);
			if constexpr (A_MASK != 0) {
#pragma unroll
				for (int e = 0; e < EU_A; ++e) {
					const int m = m0 + ml + (A_KC ? 0 : e), k = k0 + kl + (A_KC ? e : 0);
					if (A_MASK == 1 ? !(k < m) : !(k > m))
						f[e] = 0.0f;
				}
			}
${PUT_A}
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT;
			if (B_UNITS % NT != 0 && u >= B_UNITS)
				break;
			float f[EU_B];
			dg_unit_vals(ub[s], f);
			const int nl = B_KC ? u / (BK / EU_B) : u % (BN / EU_B) * EU_B;
			const int kl = B_KC ? u % (BK / EU_B) * EU_B : u / (BN / EU_B);
${PUT_B}
		}
	};
${COMPUTE}

	// ---- pipeline: step i+1's loads in flight during step i's math
	if (nsteps > 0) {
		load(0);
		store(0, 0);
	}
	__syncthreads();
#pragma unroll 1
	for (int i = 0; i < nsteps; ++i) {
		const bool more = i + 1 < nsteps;
		if (more)
			load(i + 1);
		if constexpr (NBUF == 2) {
			compute(i & 1);
			if (more)
				store((i + 1) & 1, i + 1);	// step i-1's buffer: free since the last barrier
			__syncthreads();
		} else {
			compute(0);
			__syncthreads();
			if (more)
				store(0, i + 1);
			__syncthreads();
		}
	}

	// ---- epilogue: pairs of adjacent columns (n even)
${STORE}
${EPILOGUE}
}
]]

local PUT_A_MMA = "\t\t\tdg_put<EU_A>(as, A_KC ? ml * PA + kl : kl * PA + ml, 1, f);"
local PUT_B_MMA = "\t\t\tdg_put<EU_B>(bs, B_KC ? nl * PB + kl : kl * PB + nl, 1, f);"
local PUT_A_SIMT = "\t\t\tdg_put<EU_A>(as, kl * PA + ml, A_KC ? PA : 1, f);	// As[k][m]"
local PUT_B_SIMT = "\t\t\tdg_put<EU_B>(bs, kl * PB + nl, B_KC ? PB : 1, f);	// Bs[k][n]"

local COMPUTE_MMA = [[
	// ---- tensor cores: lane offsets (bytes) of the ldmatrix rows (see the banner)
	const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
	const int li = lane >> 3, lr = lane & 7;
	const int g = lane >> 2, q = lane & 3;
	const unsigned a_lane = A_KC ? (unsigned)(((wr * WTM + (lane & 15)) * PA + (lane >> 4) * 8) * 2)
				     : (unsigned)((((li >> 1) * 8 + lr) * PA + wr * WTM + (li & 1) * 8) * 2);
	const unsigned b_lane = B_KC ? (unsigned)(((wc * WTN + (li >> 1) * 8 + lr) * PB + (li & 1) * 8) * 2)
				     : (unsigned)((((li & 1) * 8 + lr) * PB + wc * WTN + (li >> 1) * 8) * 2);
	float acc[MT][NT8][4];
#pragma unroll
	for (int mt = 0; mt < MT; ++mt)
#pragma unroll
		for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
			for (int i = 0; i < 4; ++i)
				acc[mt][nt][i] = 0.0f;
	auto compute = [&](int buf) {
		const unsigned as = sbase + buf * BUF_BYTES + a_lane;
		const unsigned bs = sbase + buf * BUF_BYTES + A_ELEMS * 2 + b_lane;
#pragma unroll
		for (int ks = 0; ks < BK / 16; ++ks) {
			unsigned a[MT][4], b[NT8][2];
#pragma unroll
			for (int mt = 0; mt < MT; ++mt) {
				if constexpr (A_KC)
					dg_ldsm_x4(a[mt], as + (mt * 16 * PA + ks * 16) * 2);
				else
					dg_ldsm_x4_t(a[mt], as + (ks * 16 * PA + mt * 16) * 2);
			}
#pragma unroll
			for (int np = 0; np < NT8 / 2; ++np) {
				unsigned d[4];
				if constexpr (B_KC)
					dg_ldsm_x4(d, bs + (np * 16 * PB + ks * 16) * 2);
				else
					dg_ldsm_x4_t(d, bs + (ks * 16 * PB + np * 16) * 2);
				b[2 * np][0] = d[0];
				b[2 * np][1] = d[1];
				b[2 * np + 1][0] = d[2];
				b[2 * np + 1][1] = d[3];
			}
#pragma unroll
			for (int mt = 0; mt < MT; ++mt)
#pragma unroll
				for (int nt = 0; nt < NT8; ++nt)
					dg_mma_bf16(acc[mt][nt], a[mt], b[nt]);
		}
	};]]

local EPI_MMA = [[
#pragma unroll
	for (int mt = 0; mt < MT; ++mt)
#pragma unroll
		for (int hr = 0; hr < 2; ++hr) {
			const int m = m0 + wr * WTM + mt * 16 + g + 8 * hr;
			if (m >= M)
				continue;
#pragma unroll
			for (int nt = 0; nt < NT8; ++nt) {
				const int n = n0 + wc * WTN + nt * 8 + 2 * q;
				if (n < N)
					store_pair(m, n, acc[mt][nt][2 * hr], acc[mt][nt][2 * hr + 1]);
			}
		}]]

local COMPUTE_SIMT = [[
	// ---- fp32 FMA: lanes 4 rows x 8 column pairs
	const int slr = lane >> 3, slc = lane & 7;
	float acc[TM][TNP][2];
#pragma unroll
	for (int i = 0; i < TM; ++i)
#pragma unroll
		for (int j = 0; j < TNP; ++j)
			acc[i][j][0] = acc[i][j][1] = 0.0f;
	auto compute = [&](int buf) {
		const float *as = (const float *)(smem + buf * BUF_BYTES) + wr * WTM + slr;
		const float *bs = (const float *)(smem + buf * BUF_BYTES) + A_ELEMS + wc * WTN + 2 * slc;
#pragma unroll 4
		for (int kk = 0; kk < BK; ++kk) {
			float a[TM];
			float2 b[TNP];
#pragma unroll
			for (int i = 0; i < TM; ++i)
				a[i] = as[kk * PA + 4 * i];
#pragma unroll
			for (int j = 0; j < TNP; ++j)
				b[j] = *(const float2 *)(bs + kk * PB + 16 * j);
#pragma unroll
			for (int i = 0; i < TM; ++i)
#pragma unroll
				for (int j = 0; j < TNP; ++j) {
					acc[i][j][0] = fmaf(a[i], b[j].x, acc[i][j][0]);
					acc[i][j][1] = fmaf(a[i], b[j].y, acc[i][j][1]);
				}
		}
	};]]

local EPI_SIMT = [[
#pragma unroll
	for (int i = 0; i < TM; ++i) {
		const int m = m0 + wr * WTM + slr + 4 * i;
		if (m >= M)
			continue;
#pragma unroll
		for (int j = 0; j < TNP; ++j) {
			const int n = n0 + wc * WTN + 2 * slc + 16 * j;
			if (n < N)
				store_pair(m, n, acc[i][j][0], acc[i][j][1]);
		}
	}]]

local CTYPE = { f32 = "float", bf16 = "unsigned short" }

-- The output conversions of both paths for output format `of`: dg_out (one
-- value) and dg_store2 (an adjacent pair, one store).
local function out_helpers(of)
  return fmt("__device__ __forceinline__ OT dg_out(float x) { return %s; }\n", of == "bf16" and "dg_f32_to_bf16(x)" or "x") ..
    (of == "bf16"
      and "__device__ __forceinline__ void dg_store2(OT *p, float a, float b) { *(unsigned *)p = (unsigned)dg_f32_to_bf16(a) | ((unsigned)dg_f32_to_bf16(b) << 16); }"
      or "__device__ __forceinline__ void dg_store2(OT *p, float a, float b) { *(float2 *)p = make_float2(a, b); }")
end

-- epi=mask's device helpers, after out_helpers (dg_store2) and the
-- kernel's typedefs: a pair's masked sum (the mma.sync and fp32 paths'
-- store, and the staged epilogue's ragged columns) and, with chunk, the
-- staged epilogue's 8-column one (elementwise.lua's VEC_IO loads and stores).
-- The arithmetic is templates/step.lua add_mask's (src=f32): the f32 sum
-- rounded once, then the out format's one rounding; 0 where mask_xs <= 0.
local MASK_PAIR = [[
// ---- epi=mask: dxs = (dxs + g)·[mask_xs > 0] in place, g = RoPEᵀ of the
// f32 sums (templates/attention.lua)
__device__ __forceinline__ float2 dg_ld2(const float *p) { return *(const float2 *)p; }
__device__ __forceinline__ float2 dg_ld2(const unsigned short *p)
{
	const unsigned w = *(const unsigned *)p;
	return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

__device__ __forceinline__ float dg_mask1(float d, float g, float x) { return x > 0.0f ? __fadd_rn(d, g) : 0.0f; }

// The pair (n, n+1) of a row: RoPEᵀ of its sums (v0, v1) with the table's
// (cos, sin) cs, added into dxs at d, masked by mask_xs at x.
__device__ __forceinline__ void dg_mask_pair(OT *d, const XT *x, float2 cs, float v0, float v1)
{
	const float g0 = __fadd_rn(__fmul_rn(v0, cs.x), __fmul_rn(v1, cs.y));
	const float g1 = __fsub_rn(__fmul_rn(v1, cs.x), __fmul_rn(v0, cs.y));
	const float2 dv = dg_ld2(d), xv = dg_ld2(x);
	dg_store2(d, dg_mask1(dv.x, g0, xv.x), dg_mask1(dv.y, g1, xv.y));
}
]]

function M.render(spec, plan)
  local k = fields(spec)
  if plan.path == "wgmma tma" then
    return require("attention_tma").render(spec, plan, k, {
      CTYPE = CTYPE, op_text = op_text, operand_fmt = operand_fmt, out_helpers = out_helpers,
      MASK_PAIR = MASK_PAIR })
  end
  if plan.path == "wgmma bf16" then
    return require("attention_wgmma").render(spec, plan, k, {
      CTYPE = CTYPE, op_text = op_text, operand_fmt = operand_fmt, out_helpers = out_helpers,
      MASK_PAIR = MASK_PAIR })
  end
  local o, t = k.o, plan.tile
  local mma = plan.path == "mma.sync bf16"
  local af, bf, of = operand_fmt(k, o.at), operand_fmt(k, o.bt), operand_fmt(k, o.ot)
  local eu_a = unit_of(af, o.a_ld, k, o.a_kc and t.bk or t.bm)
  local eu_b = unit_of(bf, o.b_ld, k, o.b_kc and t.bk or t.bn)
  local v = {
    H = k.H, E = k.E, L = k.L, XT = CTYPE[k.act], AT = CTYPE[af], BT = CTYPE[bf], OT = CTYPE[of],
    BM = t.bm, BN = t.bn, BK = t.bk, WM = t.wm, WN = t.wn, NBUF = t.stages >= 2 and 2 or 1,
    A_KC = tostring(o.a_kc), B_KC = tostring(o.b_kc),
    A_ROPE = tostring(k.a_rope), B_ROPE = tostring(k.b_rope), A_MASK = o.mask,
    A_DESC = fmt("%s, contiguous along %s", af, o.a_kc and "k" or "m"),
    B_DESC = fmt("%s, contiguous along %s", bf, o.b_kc and "k" or "n"),
    EU_A = eu_a, EU_B = eu_b, SMEM = plan.entries[1].smem,
    SMEM_LAYOUT = mma and SMEM_MMA or SMEM_SIMT,
  }
  local entry = "dg_" .. k.op
  local sig, geo, store = op_text(k)
  local kv = {
    ENTRY = entry, SIG = sig, GEO = geo, SKIP = o.skip or "", STORE = store,
    PUT_A = mma and PUT_A_MMA or PUT_A_SIMT, PUT_B = mma and PUT_B_MMA or PUT_B_SIMT,
    COMPUTE = mma and COMPUTE_MMA or COMPUTE_SIMT, EPILOGUE = mma and EPI_MMA or EPI_SIMT,
  }
  local about = {
    fmt("%s: heads %d, embd %d, latent %d, act %s (templates/attention.lua: the math, the ABI).",
        k.op, k.H, k.E, k.L, k.act),
    "",
    fmt("%s(%s)", entry, (sig:gsub("__restrict__ ", ""))),
    fmt("grid (ceil(%s/%d), ceil(T/%d), %s), %d threads, %d bytes of dynamic shared memory.",
        o.n, t.bn, t.bm, o.gz, t.wm * t.wn * 32, plan.entries[1].smem),
    mma and fmt("path: tensor cores (mma.sync m16n8k16 bf16, f32 sums; sm_%d >= sm_80), warp tile %dx%d, %s.",
                k.arch, t.bm // t.wm, t.bn // t.wn, v.NBUF == 2 and "two shared buffers" or "one shared buffer")
        or fmt("path: fp32 FMA, warp tile %dx%d, %s.", t.bm // t.wm, t.bn // t.wn,
               v.NBUF == 2 and "two shared buffers" or "one shared buffer"),
  }
  if k.epi_mask then
    about[#about + 1] = fmt("epi=mask: dxs (%s) = (dxs + grad_xs)·[mask_xs > 0] in place, from the accumulator pairs.", of)
  end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "attention.lua", about))
  w:line(DEV.helpers({ bf16 = true, bf16x2 = true }))
  w:line(HELPERS)
  w:line(EMIT.subst(HEAD, v))
  w:line(mma and PUT_MMA or PUT_SIMT)
  w:line(out_helpers(of))
  if k.epi_mask then w:line(MASK_PAIR) end
  w:line()
  w:line(EMIT.subst(KERNEL, kv))
  return w:text()
end

return M

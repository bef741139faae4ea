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

Paths (M.plan; the first two are templates/attention_mma.lua's kernel, the
warpgroup ones templates/attention_wgmma.lua's and attention_tma.lua's):
  mma.sync bf16 (act bf16, sm_80+, BK % 16 == 0, warp tiles whole 16x16):
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, f32 sums, operands
    read by ldmatrix (x4; .trans where the operand lands M- or N-major),
    fragment layouts as templates/grad_mma.lua documents them; an
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
replaces (the model does not run it).
Since 2026-12-03 both rope=pre GEMMs default to the warp-specialized path
(templates/attention_tma.lua; grad_xs at T % 8 != 0 the cp.async ring):
scores 174 us a layer (394 TFLOP/s useful, was 377 on the cp.async ring);
grad_xs epi=mask 692 us on 128x128 with 5 stages, 687 on the cp.async
ring's 3 (2 blocks an SM), 690 with 6, 900 on 128x256, 990-1090 on BM 64
tiles (test_gpu_attention warp_specialized_grad_xs prints them): how its
operands are loaded does not move it. It is bound by traffic: a 128x128
tile re-reads 256 KB of operands from L2 for K = T = 512 (2.1 GB a layer,
16 bytes an output) beside its epilogue's dxs, mask_xs and table (1.07 GB
of HBM), and the epilogue does not overlap the next tile's MMAs. A and
B shared by TMA multicast in a 2 x 2 cluster (templates/attention_tma.lua
M.cluster, 6 stages) halves the L2 reads but took 1184 us: with K = 512
a tile is 8 steps, mostly its ring's fill and its epilogue, and a
cluster waits for its slowest block. The persistent form (a ring of 4
stages at BN 128 or 64: templates/attention_tma.lua M.persistent_ok) is
a grid of the SMs' blocks, each walking tiles m fastest,
its producer filling the ring with the next tile's steps while the
consumers run the epilogue, whose staged tile lies beside the ring. It
passes the CPU emulation (tests/test_emu_attention.c: 3 blocks over 8 and
12 tiles, the ring wrapping within and across tiles) and is in the GPU
suite's tiles and timings (test_gpu_attention warp_specialized_grad_xs);
grad_xs's default since it ran on an H100 (758 us against 5 stages' 780,
epi=mask, BDH shape: the epilogue's overlap is not what bounds it). It takes
rope=load too: the producer warpgroup's three idle warps RoPE each
stage's boxes of xs by the table once they land (the MMAs wait for that,
not for the bytes), the bytes of rope=pre on rope_fwd's RoPE(xs), with no
RoPE(xs) in memory and no rope_fwd pass — what the model's keep_qr
(1.6 GB at 25M) buys today (tests/test_emu_attention.c; GPU test
persistent_grad_xs_rope_load passes on an H100, but took 3324 us against
rope=pre's 760 + rope_fwd's 198: the turners are too slow). Then: the
cluster on top of it, RoPE out of the x projection's epilogue. The model's forward keeps RoPE(xs) for the
backward where the plan fits (runtime/train/gpu_model.c keep_qr), so the
backward chain runs no rope_fwd: attention backward 6.02 -> 4.89 ms a
step (w8a8, B 8, T 512).
]]
local SPEC = require("spec")
local TILES = require("tiles")
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
  if tma_op(k) then
    -- the warp-specialized path: 2 consumer warpgroups of 64 x 128 (64 f32
    -- accumulators a thread) and a producer warpgroup, a ring of 5 stages
    -- (160 KiB: one block an SM). attention_grad_xs at T % 8 != 0 (C's
    -- rows cannot be a tensor map) takes the cp.async ring's tile below in
    -- the runtime (runtime/ops/attention.c).
    -- attention_grad_xs the persistent form of 4 stages (a grid of the
    -- SMs' blocks walking the tiles; attention_tma.lua M.persistent_ok):
    -- 758 us against 5 stages' 780 at the BDH shape on an H100 (epi=mask).
    return { bm = 128, bn = 128, bk = 64, wm = 8, wn = 1, stages = k.op == "attention_grad_xs" and 4 or 5,
             threads = 0 }
  end
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
  local load_ws = require("attention_tma").applies_load(k)	-- rope=load: 4 stages name the persistent form
  if ok then ok, err = TILES.stages_ok(t, auto, 1, tma_op(k) and 8 or ((wgmma_op(k) or load_ws) and 4 or 2)) end
  if not ok then return nil, err end
  local nt = t.wm * t.wn * 32
  local p = { tile = t, arch_specific = false, name = k.op .. ".cu",
              entries = { { name = "dg_" .. k.op, threads = nt } } }
  local TMA = require("attention_tma")
  local persistent = (tma_op(k) or TMA.applies_load(k)) and TMA.persistent_ok(k, t)
  if persistent or (tma_op(k) and TMA.tile_ok(t)) then
    p.path = persistent and "wgmma tma persistent" or "wgmma tma"
    p.arch_specific = true
    p.entries[1].threads = TMA.threads(t)
    local smem = persistent and TMA.persistent_smem(t, k.epi_mask, TMA.tma_epi(k, t)) or TMA.smem_bytes(t, k.epi_mask)
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
    return TILES.refuse(t, auto, "stages 5 to 8 are the warp-specialized sm_90a path's (attention_scores and attention_grad_xs, rope=pre, L %% 8 == 0), whose tiles have WN 1, BM = 16*WM of 64 or 128, BN 64, 128 or 256 and BK 64, and whose ring fits shared memory")
  end
  if t.stages > 2 then
    return TILES.refuse(t, auto, "stages 3 and 4 are the sm_90a warpgroup path's (rope=pre; attention_grad_xs with rope=load takes 4 at BN 64 or 128: the persistent form), whose tiles have WN 1, BM = 16*WM of 64 or 128, BN 64, 128 or 256 and BK 64; the other paths take 1 or 2")
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

// One pair's new dxs (d0, d1 in place): RoPEᵀ of its sums (v0, v1) by the
// table's (cos, sin) cs, each product and the sum rounded once, added to
// dxs and masked by mask_xs's (x0, x1). Every epi=mask epilogue's arithmetic.
__device__ __forceinline__ void dg_mask_turn(float &d0, float &d1, float x0, float x1, float2 cs, float v0, float v1)
{
	const float g0 = __fadd_rn(__fmul_rn(v0, cs.x), __fmul_rn(v1, cs.y));
	const float g1 = __fsub_rn(__fmul_rn(v1, cs.x), __fmul_rn(v0, cs.y));
	d0 = dg_mask1(d0, g0, x0);
	d1 = dg_mask1(d1, g1, x1);
}

// The pair (n, n+1) of a row: its sums (v0, v1) turned, added into dxs at
// d and masked by mask_xs at x (dg_mask_turn).
__device__ __forceinline__ void dg_mask_pair(OT *d, const XT *x, float2 cs, float v0, float v1)
{
	float2 dv = dg_ld2(d);
	const float2 xv = dg_ld2(x);
	dg_mask_turn(dv.x, dv.y, xv.x, xv.y, cs, v0, v1);
	dg_store2(d, dv.x, dv.y);
}
]]

function M.render(spec, plan)
  local k = fields(spec)
  -- the pieces every path's kernel shares
  local sh = { CTYPE = CTYPE, op_text = op_text, operand_fmt = operand_fmt, out_helpers = out_helpers,
               MASK_PAIR = MASK_PAIR }
  if plan.path == "wgmma tma" or plan.path == "wgmma tma persistent" then
    return require("attention_tma").render(spec, plan, k, sh)
  end
  if plan.path == "wgmma bf16" then
    return require("attention_wgmma").render(spec, plan, k, sh)
  end
  return require("attention_mma").render(spec, plan, k, sh)
end

return M

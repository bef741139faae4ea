--[[
grad_wgmma.lua — the sm_90a warpgroup path of lowrank_grad_input and
lowrank_grad_weight when both operands are bf16 (src=bf16 and weight=bf16
/ act=bf16), and of decoder_grad_weight with its f32 gradient (read as
the bf16 copy its module's _cast entry makes first) and y bf16 or 8-bit
codes (render_dgw, below: register staging with the mma.sync path's
conversions): the cp.async ring and wgmma m64nBNk16 of templates/wgmma_bf16.lua
(templates/grad.lua picks it with M.fits, keeps the ABI, the grids
and the splits — grad_weight's over B·T, lowrank_grad_input's over K —
and appends the _reduce entries).

GEMM C[m, n] = Σ_k A[m, k] · B[n, k], f32 sums, K steps of BK 64:
  lowrank_grad_input  m = (b, t) of M = B·T, n = e, k = (h - z·HPB)·L + l
    over input head z's heads; blockIdx.z = p·HIN + z, split p summing
    the K steps [p·kt_per_split, (p+1)·kt_per_split) of KT (clipped; an
    empty range writes zeros), the block's step st reading K step
    k_begin + st. A = grad[b, h, t, l], K-major:
    row m's pointer is computed once a thread (dg_a_base: rows are not
    affine in m across b), a K step adds dg_a_koff (a step never straddles
    two heads: BK | L). B = w (H·L, E), B[n][k] = w[z·HPB·L + k, e],
    MN-major (e contiguous), affine rows of E. splits == 1: grad_x (dst)
    = Σ; else the raw Σ into partial p at dst + p·NX (NX = B·HIN·T·E; the
    same sums: bf16 w has no scale), which the reduce entry
    dg_lowrank_grad_input_reduce adds in split order (grad_ops.lua).
  lowrank_grad_weight  per head h = z % H, split p = z / H: m = l, n = e,
    k = (b, t) of K = B·T, the split's K steps [p·kt_per_split, ...).
    A = grad[b, h, t, l] and B = x[b, hin(h), t, e], both MN-major (a K
    row is 64 contiguous l / e). A thread's K rows within a step are
    fixed (KR of them: (tid/8) + j·NT/8), so each step it finds their
    (b, t) by one division each and stages its chunks from those row
    pointers (dg_wb_stage_row). splits == 1: grad_w (+)= Σ; else the raw
    sum into dst + p·NW (an empty split writes zeros), summed by the
    reduce entry in split order.

The warp-specialized form (a tile of 5 to 8 stages; KERNEL, below):
the same prologues and epilogues, but a producer warpgroup (NT threads
more) whose one thread loads each step's A and B by TMA (TMA_LOADS: 64 x 64
boxes of two rank-3 tensor maps, the kernel's last two parameters) into a
ring of S stages, and consumers that wait on a stage's full mbarrier and
free it on its empty one (templates/wgmma_bf16.lua WS_MAINLOOP); no block
barrier in the K loop. One block an SM (193 KiB at 128x128x64/6).

Block: BM/64 warpgroups (WM = BM/16 warps, WN 1), each 64 rows x BN; NT =
2·BM threads. Staging, shared layout, descriptors, accumulator mapping
and ordering are wgmma_bf16.lua's; the pipeline is attention.lua's sm_90a
one: a ring of S stages, P = S-1 K steps of cp.async in flight, a step's
wgmma waited for (wait_group 0) before the next barrier frees its stage;
two blocks an SM (__launch_bounds__(NT, 2)) for 128-row tiles of BN <= 128
hide one block's barrier behind the other's MMAs.

Precision: bf16 operands are exact; products exact in f32, sums f32 (K
ascending within a block): |got − ref| <= K·2^-24·Σ|terms|.

Shared memory (dynamic; M.smem_bytes, grad.lua M.plan checks it):
S·(BM + BN)·BK·2 bytes and 1024 for the atoms' alignment; for
lowrank_grad_weight at least its staged f32 tile, BM·(BN + 8)·4 (smaller
than the ring at every tile it takes: STAGED_GW).
]]
local EMIT = require("emit")
local DEV = require("device")
local WB = require("wgmma_bf16")
local fmt = string.format

local M = {}

-- The path applies to the spec (whatever the tile): sm_90a, one of the two
-- lowrank grads, bf16 gradient and bf16 other operand; grad_input's
-- reduction L a multiple of BK 64. k: grad.lua's fields.
-- decoder_grad_weight: its f32 gradient and its y (bf16, or integer codes
-- of 8 bits: int8, uint8pos) go through registers and are converted to bf16
-- as they are stored (E % 8 == 0 and L % 8 == 0: whole 8-value chunks).
local DGW_Y = { bf16 = true, int8 = true, uint8pos = true }

function M.applies(k)
  if not (k.arch == 90 and k.arch_specific) then return false end
  if k.op == "decoder_grad_weight" then
    return DGW_Y[k.bfmt] == true and k.E % 8 == 0 and k.L % 8 == 0
  end
  return k.gfmt == "bf16" and k.bfmt == "bf16" and
         (k.op == "lowrank_grad_weight" or (k.op == "lowrank_grad_input" and k.L % 64 == 0))
end

-- The warp-specialized form (a producer warpgroup's TMA, templates/
-- wgmma_bf16.lua WS_MAINLOOP) serves the lowrank grads where their rows
-- are a tensor map's (L and E multiples of 8: rows of whole 16 bytes). It
-- also needs T % 64 == 0 (a K step of grad_weight, a 64-row box of
-- grad_input's A, within one b), which only the call knows: the runtime
-- (runtime/ops/grad.c) takes the cp.async ring's tile at another T.
function M.ws_applies(k)
  return M.applies(k) and k.L % 8 == 0 and k.E % 8 == 0
end

-- Whether tile t names the warp-specialized form (wgmma_bf16.lua's rule,
-- as templates/attention_tma.lua's tiles).
M.ws_tile = WB.ws_tile

-- decoder_grad_weight's ring form also takes BM 256 (four warpgroups, 512
-- threads, one block an SM) at BN up to 128 (64 accumulators a thread
-- within 128 registers): at E = 256 a block then holds every d, so each
-- chunk of y is read and decoded by one block, not by E/BM of them, for
-- twice the gradient's bytes a step (A, bf16) — y's decode against L2.
local function dgw_tall(t)
  return t.wm == 16 and t.wn == 1 and t.bk == 64 and (t.bn == 64 or t.bn == 128) and
         t.stages >= 2 and t.stages <= 4
end

-- Its tiles: wgmma_bf16.lua's (M.tile_ok), a ring of 3 or 4 stages
-- (decoder_grad_weight, one step staged ahead in registers: 2 to 4), or
-- the warp-specialized form's 5 to 8.
function M.fits(k, t)
  if not M.applies(k) then return false end
  if M.ws_tile(t) then
    return M.ws_applies(k) and WB.tile_ok(t, 5, 8) and (k.op ~= "decoder_grad_weight" or t.bn <= 128)
  end
  if k.op == "decoder_grad_weight" and t.bm == 256 then return dgw_tall(t) end
  return WB.tile_ok(t, k.op == "decoder_grad_weight" and 2 or 3, 4)
end

-- Threads a block: the tile's warps, and the producer warpgroup of the
-- warp-specialized form.
function M.threads(t)
  return M.ws_tile(t) and WB.ws_threads(t) or t.wm * t.wn * 32
end

-- lowrank_grad_weight's epilogue goes through the ring (STAGED_GW, below)
-- where E holds whole float4 rows.
local function staged_gw(op, E)
  return op == "lowrank_grad_weight" and E % 4 == 0
end

-- decoder_grad_weight's warp-specialized form (DGW_WS_KERNEL): its shared
-- memory with r raw slots — the ring, the 2·S barriers, the slots of y and
-- of the scales, and 1 KiB for the atoms' alignment.
local function dgw_ws_bytes(t, bfmt, r)
  local cb = bfmt == "bf16" and 16 or 8
  return WB.ring_bytes(t, false) + 16 * t.stages + r * (t.bn * t.bk // 8 * cb + 128 * 4 * 4) + 1024
end

-- Its raw slots: 4 (three steps of y in flight a producer thread), fewer
-- (at least 1: none ahead) where the ring leaves no room for them (bf16
-- y's 18 KiB slots beside 5 stages: 3, beside 6: 1).
local function dgw_ws_r(t, bfmt, arch)
  local r = 4
  while r > 1 and dgw_ws_bytes(t, bfmt, r) > require("tiles").smem_limit(arch) do r = r - 1 end
  return r
end

local function dgw_ws_smem(t, bfmt, arch)
  return dgw_ws_bytes(t, bfmt, dgw_ws_r(t, bfmt, arch))
end

-- The ring (or the staged epilogue's tile), and on the warp-specialized
-- form its 2·S mbarriers after it (decoder_grad_weight's: dgw_ws_smem).
function M.smem_bytes(t, k)
  if k.op == "decoder_grad_weight" and M.ws_tile(t) then return dgw_ws_smem(t, k.bfmt, k.arch) end
  return (M.ws_tile(t) and WB.ws_smem_bytes or WB.smem_bytes)(t, staged_gw(k.op, k.E))
end

-- The default tile where the path applies. At the BDH shape (M = B·T 4096,
-- N = E 256):
--   lowrank_grad_input 128x128x64/8x1/3: two warpgroups of m64n128 (64
--     accumulators a thread), 97 KiB, so two blocks an SM
--     (__launch_bounds__(256, 2)): four warpgroups an SM, one block's
--     barrier and stage refill hidden behind the other's MMAs. The tile
--     it replaces, 64x128x64/4x1/4 (one warpgroup, 128 blocks: one an SM,
--     each streaming all of K), measured 433 µs a call, 159 TFLOP/s: a
--     lone warpgroup waits out every barrier and wgmma wait with the
--     tensor cores idle. 128x128 makes (256/128)·(4096/128) = 64 output
--     tiles a grid z, too few alone (64 for the encoder, Hin 1; 256 for
--     encoder_v, Hin 4), so the runtime splits K over grid z
--     (runtime/ops/grad.c gi_splits_of) until the blocks fill two an SM:
--     4 splits of 128 K steps for the encoder (256 blocks for 264 slots
--     on 132 SMs), none for encoder_v (256 blocks already); the partials
--     cost 4 MiB a split, written once and read once by the reduce entry.
--     Three stages (two K steps, 64 KiB, in flight a block, four an SM):
--     four would take 129 KiB, one block an SM. Measured on the H200
--     (tests/test_gpu_grad_bdh.c): the encoder's call 150 µs, 457
--     TFLOP/s, with its 4 splits (433 µs before); the model's 12 calls a
--     step 1.8 ms (4.5 before).
--   lowrank_grad_weight 128x128x64/8x1/3: per head M = L 8192, 512 blocks,
--     97 KiB each: two blocks an SM, 64 accumulators a thread.
--   decoder_grad_weight 128x128x64/8x1/2: M = E 256, N = L 8192 a head,
--     K = B·T (24576 at six layers' stacks): (8192/128)·(256/128)·4 = 512
--     blocks, two an SM. Its staging holds one step in registers (32 words
--     of f32 gradient and 8 of codes or 16 of bf16 a thread) and stores
--     it a step ahead, so a ring of two stages suffices (65 KiB).
--   decoder_grad_weight past 4096 neurons a head: BN 256 (128 accumulators
--     a thread, 240-254 registers, one block an SM): each block reads its
--     f32 gradient rows (A, converted as staged) for twice the columns.
--     `dragon-gen tune` on the H200, w8a8's spec (uint8pos codes, a scale a
--     token), 128x256 against 128x128: D 256, N 8192, K 24576 (the 25M
--     model's six layers) 1.445 against 1.496 ms; D 768, H 12, N 8192, K
--     12288 6.29 against 6.93 ms.
--   decoder_grad_weight at E % 256 == 0: 256x128x64/16x1/3 (dgw_tall),
--     every d in one block, so each chunk of y is read and decoded once.
--     On an H100, w8a8's spec at K 24576: 1080 us in the tuner against
--     128x256's 1329 (with the two-step decode); in the step 1.33 -> 1.10
--     ms (bench/results/step-train-h100-2026-12-06_dgw.json). bf16 y: 977
--     (/2) and 989 us against 1059.
--   The lowrank grads where the warp-specialized form applies (rows of
--     whole 16 bytes): 128x128x64/8x1/6, a TMA producer warpgroup and a
--     ring of six stages (193 KiB, one block an SM). `bench/step --train`
--     (w8a8, each node alone, H200) against the cp.async ring's
--     128x128x64/8x1/3, grad_weight's and grad_input's calls of a step:
--     1B (D 1280, H 16, N 16384, B 2) 22.35 -> 13.72 and 15.76 -> 14.17
--     ms; D 768 (H 12, N 8192, B 4) 9.68 -> 5.82 and 8.04 -> 6.51; 25M
--     2.38 -> 1.63 and 1.78 -> 1.63. The step: 143.9 -> 134.9, 68.3 ->
--     62.9, 22.93 -> 21.96 ms. (At T % 64 != 0 the runtime takes the
--     ring's 128x128x64/8x1/3 instead.)
function M.default_tile(k)
  local dgw = k.op == "decoder_grad_weight"
  if dgw and k.E % 256 == 0 then
    return { bm = 256, bn = 128, bk = 64, wm = 16, wn = 1, stages = 3, threads = 0 }
  end
  return { bm = 128, bn = (dgw and k.L > 4096) and 256 or 128, bk = 64, wm = 8, wn = 1,
           stages = dgw and 2 or (M.ws_applies(k) and 6 or 3), threads = 0 }
end

local HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int HIN = ${HIN};		// input heads of the projection: 1 or H
constexpr int E = ${E};		// embd
constexpr int L = ${L};		// latent width per head
typedef unsigned short GT;	// the gradient (grad): bf16
constexpr int EPW_B = 2;		// bf16 values a 32-bit word (the op table's B rows)

// ---- tile: BM/64 warpgroups along M, each 64 x BN; a ring of S stages
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};
constexpr int NT = (BM / 64) * 128;		// threads a block
constexpr int S = ${S}, P = S - 1;		// stages; K steps fetched ahead
static_assert(BK == 64, "one 128-byte swizzle row of K a step");
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
constexpr int A_UNITS = BM * BK / 8, B_UNITS = BN * BK / 8;	// 16-byte chunks
constexpr int SA = A_UNITS / NT, SB = B_UNITS / NT;	// chunks a thread
static_assert(A_UNITS % NT == 0 && B_UNITS % NT == 0, "whole chunks a thread");
]]

local ADDR = {}

-- grad_input's A rows: as the mma.sync path addresses them
ADDR.lowrank_grad_input = require("grad_ops").ADDR.lowrank_grad_input

ADDR.lowrank_grad_weight = [[
// MN-major staging: unit u = tid + s·NT is K row (u/8) % 64, chunk u % 8 of
// the 64-wide group u / 512; so a thread's K rows are the KR rows
// (tid/8) + j·NT/8, j = s % KR, and its group is s / KR.
constexpr int KR = 512 / NT;

// K row k = b·T + t of A (grad[b, h, t, ·], contiguous along l) and of B
// (x[b, hin(h), t, ·], contiguous along e).
__device__ __forceinline__ const GT *dg_a_krow(const GT *g, int b, int t, int h, int T)
{
	return g + ((long long)(b * H + h) * T + t) * L;
}

__device__ __forceinline__ const unsigned short *dg_b_krow(const unsigned short *x, int b, int t, int h, int T)
{
	return x + ((long long)(b * HIN + ${HIN_H}) * T + t) * E;
}
]]

-- The A and B staging of one step (st: the block's step index), per op.
local LOAD = {}

LOAD.lowrank_grad_input = [[
	// A (grad, K-major): this thread's rows are fixed, their bases once;
	// every chunk is whole (BK | L, L % 8 == 0): a cp.async, zeros past M.
	const GT *a_src[SA];		// chunk 8·(u % 8) of row u / 8 at k = 0; nullptr: zeros
#pragma unroll
	for (int s = 0; s < SA; ++s) {
		const int u = tid + s * NT, r = u >> 3;
		a_src[s] = m0 + r < M ? dg_a_base(grad, m0 + r, z, T) + 8 * (u & 7) : nullptr;
	}
	// B (w, N-major): block z's heads are rows z·HPB·L .. of the (H·L, E) matrix
	const unsigned short *wz = w + (long long)z * HPB * L * E;
	auto load = [&](int st) {	// st: the block's step, K step k_begin + st
		const unsigned as = sbase + (st % S) * STAGE, bs = as + A_BYTES;
		const int kt = k_begin + st;
		const long long off = dg_a_koff(kt, T);
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
			dg_cp16(as + dg_wb_kmaj(u >> 3, u & 7), a_src[s] ? (const void *)(a_src[s] + off) : (const void *)grad,
				   a_src[s] ? 16 : 0);
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, c = u & 7, kk = (u >> 3) & 63, gg = u >> 9;
			dg_wb_stage(bs + dg_wb_mnmaj(gg, kk, c), wz, kt * BK + kk, HPB * L, n0 + 64 * gg + 8 * c, N, E);
		}
	};]]

LOAD.lowrank_grad_weight = [[
	auto load = [&](int st) {
		const unsigned as = sbase + (st % S) * STAGE, bs = as + A_BYTES;
		// this thread's KR K rows of the step: their (b, t), their rows of
		// grad and x (nullptr past K: zeros)
		const int kb = (k_begin + st) * BK;
		const GT *ar[KR];
		const unsigned short *br[KR];
#pragma unroll
		for (int j = 0; j < KR; ++j) {
			const int k = kb + (tid >> 3) + j * (NT / 8);
			ar[j] = nullptr;
			br[j] = nullptr;
			if (k < K) {
				const int b = k / T, t = k - b * T;
				ar[j] = dg_a_krow(grad, b, t, h, T);
				br[j] = dg_b_krow(x, b, t, h, T);
			}
		}
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT, c = u & 7, kk = (u >> 3) & 63, gg = s / KR;
			dg_wb_stage_row(as + dg_wb_mnmaj(gg, kk, c), ar[s % KR], grad, m0 + 64 * gg + 8 * c, MM);
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, c = u & 7, kk = (u >> 3) & 63, gg = s / KR;
			dg_wb_stage_row(bs + dg_wb_mnmaj(gg, kk, c), br[s % KR], grad, n0 + 64 * gg + 8 * c, N);
		}
	};]]

local PROLOGUE = {
  -- the K split of every path (grad_ops.lua M.GI_SPLIT)
  lowrank_grad_input = require("grad_ops").GI_SPLIT.PROLOGUE .. [[

	const int nsteps = k_end - k_begin;
	(void)sw;				// bf16 w: no scale]],
  lowrank_grad_weight = [[
	const int K = B * T;			// the reduction (b, t)
	const int h = blockIdx.z % H, sp = blockIdx.z / H;	// head, split
	const int kt_all = (K + BK - 1) / BK;
	const int k_begin = min(sp * kt_per_split, kt_all);
	const int k_end = min(k_begin + kt_per_split, kt_all);	// empty: writes zeros
	const int nsteps = k_end - k_begin;
	(void)sa;				// bf16 x: no scale]],
}

-- The warp-specialized form's loads of step i (the producer's one thread;
-- full, as, bs in scope), per op: 64 x 64 boxes of the 128-byte swizzle,
-- so each lands as one 64-wide group (MN-major) or 64 rows (K-major) of
-- the layouts above; zeros past the maps' edges. The maps (runtime/ops/
-- grad.c ws_tmaps), bf16 rank 3:
--   lowrank_grad_weight  ma over grad (L, T, B·H), mb over x (E, T, B·HIN):
--     a K step is 64 t of one b (T % 64 == 0), boxes at (m0 + 64g, t, b·H
--     + h) and (n0 + 64g, t, b·HIN + hin(h));
--   lowrank_grad_input  ma over grad (L, T, B·H): 64 rows (b, t) of one b
--     by 64 l of head z·HPB + k / L, K-major; mb over w (E, H·L, 1): 64
--     e by 64 rows z·HPB·L + k.
local TMA_LOADS = {
  lowrank_grad_weight = [[
				const int k0 = (k_begin + i) * BK, b = k0 / T, t = k0 - b * T;
#pragma unroll
				for (int gg = 0; gg < BM / 64; ++gg)	// grad[b, h, t.., m0 + 64gg ..]
					dg_tma_load(as + 8192 * gg, &ma, full, m0 + 64 * gg, t, b * H + h);
#pragma unroll
				for (int gg = 0; gg < BN / 64; ++gg)	// x[b, hin(h), t.., n0 + 64gg ..]
					dg_tma_load(bs + 8192 * gg, &mb, full, n0 + 64 * gg, t, b * HIN + ${HIN_H});]],
  lowrank_grad_input = [[
				const int k = (k_begin + i) * BK, hh = z * HPB + k / L, l0 = k - (k / L) * L;
#pragma unroll
				for (int gg = 0; gg < BM / 64; ++gg) {	// rows m0 + 64gg ..: one b's (past M: zeros)
					const int m = m0 + 64 * gg, b = m / T, t = m - b * T;
					dg_tma_load(as + 8192 * gg, &ma, full, l0, t, b * H + hh);
				}
#pragma unroll
				for (int gg = 0; gg < BN / 64; ++gg)	// w rows z·HPB·L + k .., columns n0 + 64gg ..
					dg_tma_load(bs + 8192 * gg, &mb, full, n0 + 64 * gg, z * HPB * L + k, 0);]],
}

-- Each op's store of one accumulator pair (the body of wgmma_bf16.lua's
-- PAIRS) and its row bound.
local PAIR = {
  lowrank_grad_input = { "M", [[
				*(float2 *)(out + dg_out(m, n, z, T)) = make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]);]] },
  lowrank_grad_weight = { "MM", [[
				float2 *o = (float2 *)(out + dg_out(m, n, h, T));
				float2 v = make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]);
				if (splits == 1 && accumulate) {
					const float2 pv = *o;
					v.x = __fadd_rn(pv.x, v.x);
					v.y = __fadd_rn(pv.y, v.y);
				}
				*o = v;]] },
}

local EPILOGUE = {
  lowrank_grad_input = [[
	// ---- epilogue: splits == 1: grad_x = Σ; else partial sp (out) = the raw
	// Σ (the same: bf16 w has no scale), which the reduce entry sums in split
	// order. The accumulator pairs (rows g, g+8 of the warp's 16, cols
	// 8j + 2q, +1; N is even: a pair is wholly in or out).
${PAIRS}]],
  lowrank_grad_weight = [[
	// ---- epilogue: splits == 1: grad_w (+)= Σ; else the raw sum into
	// partial p (dst + p·NW), summed by the reduce entry. The accumulator
	// pairs (rows g, g+8 of the warp's 16, cols 8j + 2q, +1).
	float *out = splits == 1 ? dst : dst + (long long)sp * NW;
${PAIRS}]],
}

-- lowrank_grad_weight's epilogue when E % 4 == 0: the f32 tile staged in
-- the ring's shared memory (rows of BNP = BN + 8 floats, so that a
-- half-warp's pair stores hit 32 banks), then each thread adds and stores
-- four consecutive e of a row at a time — a warp a whole row of BN, one
-- 16-byte access a lane — with RB of its float4's previous values in
-- flight at once. It replaces one pair at a time from the accumulators,
-- where each pair's read of grad_w waited for the last one's store (they
-- might alias, and the compiler keeps their order): 32 memory round trips
-- a thread a tile. ncu at D 1280, H 16, N 16384 (B·T 1024, H200): 3.36
-- ms a call, 28% of the SM's throughput, 52% of the warps' cycles waiting
-- on those loads; at H 16, N 65536, B·T 256 (4 K steps a tile) 2 ms a
-- call for 137 GFLOP. Loaded 16 at a time from the accumulators instead,
-- the 64 accumulators and 32 loaded values left ptxas 5 loads in flight
-- and the step slower (1B: 38 -> 45 ms for the 12 calls): here the
-- accumulators are dead before the loads.
local STAGED_GW = [[
	// ---- epilogue: splits == 1: grad_w (+)= Σ; else the raw sum into
	// partial p (dst + p·NW), summed by the reduce entry; through shared
	// memory, a float4 of a row at a time (templates/grad_wgmma.lua STAGED_GW)
	float *out = splits == 1 ? dst : dst + (long long)sp * NW;
	const bool rmw = splits == 1 && accumulate;
	constexpr int BNP = BN + 8;		// the staged tile's row (floats)
	constexpr int C4 = BN / 4;		// float4 a row
	constexpr int CH = BM * C4 / NT;	// float4 a thread
	constexpr int RB = CH < 8 ? CH : 8;	// of them in flight
	static_assert(CH % RB == 0 && E % 4 == 0, "whole batches, whole float4 rows");
	__syncthreads();			// every warpgroup's MMAs read the ring
	float *tile = (float *)(smem + (sbase - (unsigned)__cvta_generic_to_shared(smem)));
${STAGE_ACC}
	__syncthreads();
#pragma unroll 1
	for (int c0 = 0; c0 < CH; c0 += RB) {
		float4 pv[RB];
#pragma unroll
		for (int i = 0; i < RB; ++i) {
			const int c = tid + (c0 + i) * NT, r = c / C4, n = n0 + 4 * (c % C4);
			pv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (rmw && m0 + r < MM && n < N)
				pv[i] = *(const float4 *)(out + dg_out(m0 + r, n, h, T));
		}
#pragma unroll
		for (int i = 0; i < RB; ++i) {
			const int c = tid + (c0 + i) * NT, r = c / C4, n = n0 + 4 * (c % C4);
			if (m0 + r < MM && n < N) {
				const float4 v = *(const float4 *)(tile + r * BNP + 4 * (c % C4));
				*(float4 *)(out + dg_out(m0 + r, n, h, T)) = rmw ?
					make_float4(__fadd_rn(pv[i].x, v.x), __fadd_rn(pv[i].y, v.y),
						    __fadd_rn(pv[i].z, v.z), __fadd_rn(pv[i].w, v.w)) : v;
			}
		}
	}]]

-- The kernel of both forms: the cp.async ring's (LOAD: the staging
-- lambda; two blocks an SM where minb says) or the warp-specialized one's
-- (no LOAD: the producer's TMA in WS_MAINLOOP; the epilogues' barriers the
-- consumers' alone; NTB threads, one block an SM).
local KERNEL = [[
extern "C" __global__ void __launch_bounds__(${BOUNDS})
${ENTRY}(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
${PROLOGUE}
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;
${LOAD}${MAINLOOP}

${EPILOGUE}
}
]]

local LOAD_WHY = [[

	// Step st's A and B tiles into its stage (templates/wgmma_bf16.lua: a
	// chunk's place dg_wb_kmaj / dg_wb_mnmaj; 8 consecutive threads read one
	// 128-byte line and fill one 128-byte swizzle row).
]]

-- ---- decoder_grad_weight --------------------------------------------------
-- A is the f32 gradient's bf16 copy (DGW_CAST, launched first by the
-- runtime: grad rounded to nearest even once, as the mma.sync path rounds
-- it) and y bf16 or 8-bit codes, which cp.async cannot decode: a thread
-- loads its chunks of a step into registers (8 values of one K row each: a
-- uint4 of the copy, a uint2 of codes or a uint4 of bf16), decodes y to
-- bf16 — exactly as the mma.sync path does: codes exact, and with per-token scales
-- (ascale=token) B(k, l) = bf16(code · sa[k]) — and stores them with one
-- st.shared.v4 into the chunk's swizzled place (dg_wb_mnmaj; both operands
-- MN-major: a K row is 64 contiguous d / l).
local DGW_HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int E = ${E};		// embd
constexpr int L = ${L};		// latent width per head
typedef unsigned short GT;	// the gradient's bf16 copy (${ENTRY}_cast's, from the f32 grad)
constexpr int EPW_B = ${EPW_B};		// y values a 32-bit word (the op table's B rows)

// ---- tile: BM/64 warpgroups along M (d), each 64 x BN (l); a ring of S stages
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};
constexpr int NT = (BM / 64) * 128;		// threads a block
constexpr int S = ${S};			// stages (one more step waits in registers)
static_assert(BK == 64, "one 128-byte swizzle row of K a step");
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
constexpr int A_UNITS = BM * BK / 8, B_UNITS = BN * BK / 8;	// 8-value chunks (16 bytes of bf16)
constexpr int SA = A_UNITS / NT, SB = B_UNITS / NT;	// chunks a thread
static_assert(A_UNITS % NT == 0 && B_UNITS % NT == 0, "whole chunks a thread");
// MN-major staging: unit u = tid + s·NT is K row (u/8) % 64, chunk u % 8 of
// the 64-wide group u / 512; so a thread's K rows are the KR rows
// (tid/8) + j·NT/8, j = s % KR, and its group is s / KR.
constexpr int KR = 512 / NT;
static_assert(E % 8 == 0 && L % 8 == 0, "whole chunks along d and l");
]]

-- The registers of one staged chunk of y and their decode into a uint4 of
-- four bf16 pairs `d` (r: the raw chunk), per y format.
local DGW_B = {
  bf16 = { T = "uint4", Z = "make_uint4(0u, 0u, 0u, 0u)",
           LOAD = "__ldg((const uint4 *)(br[s % KR] + n / EPW_B))",
           DECODE = "uint4 d = r;" },
  uint8pos = { T = "uint2", Z = "make_uint2(0u, 0u)",
               LOAD = "__ldg((const uint2 *)(br[s % KR] + n / EPW_B))",
               DECODE = "const uint2 lo = dg_u8x4_bf16(r.x), hi = dg_u8x4_bf16(r.y);\n" ..
                        "uint4 d = make_uint4(lo.x, lo.y, hi.x, hi.y);" },
  int8 = { T = "uint2", Z = "make_uint2(0u, 0u)",
           LOAD = "__ldg((const uint2 *)(br[s % KR] + n / EPW_B))",
           DECODE = "const uint2 lo = dg_s8x4_bf16(r.x), hi = dg_s8x4_bf16(r.y);\n" ..
                    "uint4 d = make_uint4(lo.x, lo.y, hi.x, hi.y);" },
}

local DGW_KERNEL = [[
extern "C" __global__ void __launch_bounds__(NT, ${MINB})
${ENTRY}(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
${M_FASTEST}
	const int K = B * T;			// the reduction (b, t)
	const int h = blockIdx.z % H, sp = blockIdx.z / H;	// head, split
	const int kt_all = (K + BK - 1) / BK;
	const int k_begin = min(sp * kt_per_split, kt_all);
	const int k_end = min(k_begin + kt_per_split, kt_all);	// empty: writes zeros
	const int nsteps = k_end - k_begin;
	const unsigned *yw = (const unsigned *)y;	// y as 32-bit words
${SCALE_LOAD}
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;

	// ---- one step in registers: this thread's SA chunks of A (grad rows k,
	// d = m0 + 64·(s / KR) + 8·(u % 8) ..) and SB of B (y rows k, l likewise);
	// zeros past K, E or L (E % 8 == L % 8 == 0: a chunk is wholly in or out).
	uint4 ra[SA];
	${BT_REG} rb[SB];
${RS_DECL}
	auto fetch = [&](int st) {	// st: the block's step, K step k_begin + st
		const int kb = (k_begin + st) * BK;
		const GT *ar[KR];
		const unsigned *br[KR];
#pragma unroll
		for (int j = 0; j < KR; ++j) {
			const int k = kb + (tid >> 3) + j * (NT / 8);
			ar[j] = nullptr;
			br[j] = nullptr;
			if (k < K) {
				const int b = k / T, t = k - b * T;
				ar[j] = dg_a_krow(grad, b, t, h, T);
				br[j] = dg_b_krow(yw, b, t, h, T);
			}
${RS_LOAD}
		}
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int m = m0 + 64 * (s / KR) + 8 * ((tid + s * NT) & 7);
			ra[s] = make_uint4(0u, 0u, 0u, 0u);
			if (ar[s % KR] != nullptr && m < MM)
				ra[s] = __ldg((const uint4 *)(ar[s % KR] + m));
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int n = n0 + 64 * (s / KR) + 8 * ((tid + s * NT) & 7);
			rb[s] = ${BT_ZERO};
			if (br[s % KR] != nullptr && n < N)
				rb[s] = ${B_LOAD};
		}
	};
	// the registers, as bf16, into stage st % S (their swizzled chunks)
	auto put = [&](int st) {
		const unsigned as = sbase + (st % S) * STAGE, bs = as + A_BYTES;
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT, c = u & 7, kk = (u >> 3) & 63, gg = s / KR;
			const uint4 v = ra[s];
			asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
				     :: "r"(as + dg_wb_mnmaj(gg, kk, c)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, c = u & 7, kk = (u >> 3) & 63, gg = s / KR;
			const ${BT_REG} r = rb[s];
${B_DECODE}
			asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
				     :: "r"(bs + dg_wb_mnmaj(gg, kk, c)), "r"(d.x), "r"(d.y), "r"(d.z), "r"(d.w) : "memory");
		}
	};

	float acc[BN / 2];
#pragma unroll
	for (int i = 0; i < BN / 2; ++i)
		acc[i] = 0.0f;
	// ---- pipeline: step i+1 is stored (put) while step i's MMAs run, into
	// the stage step i+1-S had, whose MMAs every warpgroup waited for
	// before this step's barrier; step i+2 is then fetched into the
	// registers, its loads in flight across the next barrier.
	if (nsteps > 0) {
		fetch(0);
		put(0);
		if (nsteps > 1)
			fetch(1);
	}
#pragma unroll 1
	for (int i = 0; i < nsteps; ++i) {
		dg_fence_async_smem();		// this thread's stores of step i, to the tensor cores
		__syncthreads();		// everyone's; and every MMA of step i-1 is done
		// this warpgroup's 64 rows of A: one 64-wide M group
		const unsigned as = sbase + (i % S) * STAGE + wg * 8192, bs = sbase + (i % S) * STAGE + A_BYTES;
		dg_wg_fence();
#pragma unroll
		for (int ks = 0; ks < BK / 16; ++ks)
			dg_wb_mma(acc, dg_wb_desc<false>(as + ks * 2048), dg_wb_desc<false>(bs + ks * 2048), 1);
		dg_wg_commit();
		if (i + 1 < nsteps) {
			put(i + 1);		// S >= 2: not step i's stage
			if (i + 2 < nsteps)
				fetch(i + 2);
		}
		dg_wg_wait<0>();
		dg_wb_pin(acc);
	}

${EPILOGUE}
}
]]

-- decoder_grad_weight's epilogue (both forms): keys SCALED_DESC, PAIRS.
local DGW_EPILOGUE = [[
	// ---- epilogue: splits == 1: grad_w (+)= ${SCALED_DESC}; else the raw sum
	// into partial p (dst + p·NW), summed by the reduce entry. The accumulator
	// pairs (rows g, g+8 of the warp's 16, cols 8j + 2q, +1; N is even).
	float *out = splits == 1 ? dst : dst + (long long)sp * NW;
${PAIRS}]]

local DGW_PAIR = [[
				float2 *o = (float2 *)(out + dg_out(m, n, h, T));
				const float c0 = acc[4 * j + 2 * hr], c1 = acc[4 * j + 2 * hr + 1];
				if (splits != 1) {
					*o = make_float2(c0, c1);
				} else {
					float2 v = make_float2(${S0}, ${S1});
					if (accumulate) {
						const float2 pv = *o;
						v.x = __fadd_rn(pv.x, v.x);
						v.y = __fadd_rn(pv.y, v.y);
					}
					*o = v;
				}]]

-- ---- decoder_grad_weight, warp-specialized (a tile of 5 to 8 stages, BN
-- 64 or 128) ------------------------------------------------------------
-- The ring form's consumers wait out every load and decode at a block
-- barrier. Here a producer warpgroup feeds the consumers through full /
-- empty mbarriers (wgmma_bf16.lua ws_consumers): its first thread loads A
-- by TMA — not grad itself but its bf16 copy, which the runtime makes
-- before the kernel with the module's dg_decoder_grad_weight_cast (grad
-- rounded to nearest even once, exactly as the ring form rounds it as
-- staged; the copy is 1/8 of y's bytes at the BDH shape) — and all 128
-- copy y's chunks of a step by cp.async into a ring of R raw slots (R - 1
-- steps in flight a thread, no registers held), then decode the chunks
-- they copied themselves (so no barrier: a thread waits for its own
-- copies) into the stage's B as the ring form decodes them, fence and
-- arrive. The full barrier counts the 128 arrivals and the first
-- thread's expect_tx (129). The same sums, step for step, as the ring
-- form's: the same bits.
local DGW_WS_HEAD = [[
// ---- the warp-specialized form: consumers NCW warpgroups, a producer warpgroup
constexpr int NCW = BM / 64;			// consumer warpgroups
constexpr int NTB = NT + 128;			// threads a block
constexpr int NP = 128;				// producer threads
constexpr int R = ${R};				// raw slots of y: R - 1 steps in flight a producer thread
constexpr int CB = 32 / EPW_B;			// bytes of an 8-value chunk of y
constexpr int PB = BN * BK / 8 / NP;		// chunks of B a producer thread a step
constexpr int PKR = 512 / NP;			// its K rows: (p / 8) + 16·j
constexpr int RING = ${RING};			// bytes of the ring
constexpr int RAW = BN * BK / 8 * CB;		// bytes of a raw slot of y
constexpr int RAW_S = NP * PKR * 4;		// bytes of a raw slot's scales (one a K row a thread)
constexpr bool REG_MOVE = false;		// BN <= 128: 64 accumulators a thread
constexpr int REG_C = 0;
static_assert(BN <= 128 && PB % PKR == 0, "whole K rows a producer thread");
]]

-- The gradient's bf16 copy both forms read as A (grad, f32, rounded to
-- nearest even once: what staging it in registers rounded it to, so the
-- same sums; 2 bytes a value through L2 on every tile instead of 4).
local DGW_CAST = [[
// grad (B·T·E f32) to bf16, rounded to nearest even: 8 values a thread
// and a step, grid-stride (the kernel's A: its grad argument).
extern "C" __global__ void __launch_bounds__(256)
${ENTRY}_cast(const float *__restrict__ grad, unsigned short *__restrict__ out, long long n8)
{
	for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n8; i += (long long)gridDim.x * 256) {
		const float4 a = __ldg((const float4 *)grad + 2 * i), b = __ldg((const float4 *)grad + 2 * i + 1);
		((uint4 *)out)[i] = make_uint4(dg_bf16x2(a.x, a.y), dg_bf16x2(a.z, a.w), dg_bf16x2(b.x, b.y),
					       dg_bf16x2(b.z, b.w));
	}
}
]]

-- The cast entry ${entry}_cast (decoder_gate_tma.lua's kernel reads the same copy).
function M.cast_entry(entry)
  return EMIT.subst(DGW_CAST, { ENTRY = entry })
end

local DGW_WS_KERNEL = [[
// A chunk of y (16 or 8 bytes) into shared memory by cp.async.
__device__ __forceinline__ void dg_cpy(unsigned dst, const void *src)
{
	if constexpr (CB == 16)
		dg_cp16(dst, src, 16);
	else
		dg_cp8(dst, src, 8);
}


extern "C" __global__ void __launch_bounds__(NTB, 1)
${ENTRY}(${SIG}, const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb)
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
${M_FASTEST}
	const int K = B * T;			// the reduction (b, t); T % 64 == 0 (A's boxes)
	const int h = blockIdx.z % H, sp = blockIdx.z / H;	// head, split
	const int kt_all = (K + BK - 1) / BK;
	const int k_begin = min(sp * kt_per_split, kt_all);
	const int k_end = min(k_begin + kt_per_split, kt_all);	// empty: writes zeros
	const int nsteps = k_end - k_begin;
	(void)grad;				// A: the copy, by the map ma over it
	(void)mb;
${SCALE_LOAD}
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more);
	// after the ring its barriers, full[S] then empty[S], then the raw slots
	const unsigned s0 = (unsigned)__cvta_generic_to_shared(smem);
	const unsigned sbase = (s0 + 1023u) & ~1023u, bars = sbase + RING, raw = bars + 16 * S;
	unsigned char *const rawp = smem + (raw - s0);
${RING_INIT}

	if (wg == NCW) {	// ---- the producer warpgroup
		const int p = tid - NT;
		const unsigned *yw = (const unsigned *)y;	// y as 32-bit words
		// step st's chunks of y that thread p decodes (and its K rows'
		// scales) into raw slot st % R, one commit group
		auto fetch = [&](int st) {
			const unsigned slot = raw + (st % R) * RAW, sslot = raw + R * RAW + (st % R) * RAW_S + p * PKR * 4;
			const int kb = (k_begin + st) * BK;
#pragma unroll
			for (int j = 0; j < PKR; ++j) {
				const int k = kb + (p >> 3) + 16 * j;
				if (k >= K)
					continue;
				const int b = k / T, t = k - b * T;
				const unsigned *row = dg_b_krow(yw, b, t, h, T);
${RS_FETCH}
#pragma unroll
				for (int s = j; s < PB; s += PKR) {
					const int n = n0 + 64 * (s / PKR) + 8 * (p & 7);
					if (n < N)
						dg_cpy(slot + (p + s * NP) * CB, row + n / EPW_B);
				}
			}
			dg_cp_commit();
		};
		// raw slot st % R decoded into B at bs: zeros past K or L
		auto put = [&](int st, unsigned bs) {
			const unsigned char *slot = rawp + (st % R) * RAW;
			const float *rs = (const float *)(rawp + R * RAW + (st % R) * RAW_S) + p * PKR;
			(void)rs;
			const int kb = (k_begin + st) * BK;
#pragma unroll
			for (int s = 0; s < PB; ++s) {
				const int j = s % PKR, kk = (p >> 3) + 16 * j, gg = s / PKR, c = p & 7;
				const int n = n0 + 64 * gg + 8 * c;
				uint4 v = make_uint4(0u, 0u, 0u, 0u);
				if (kb + kk < K && n < N) {
					const ${BT_REG} r = *(const ${BT_REG} *)(slot + (p + s * NP) * CB);
${B_DECODE}
					v = d;
				}
				asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
					     :: "r"(bs + dg_wb_mnmaj(gg, kk, c)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
			}
		};
		for (int st = 0; st < R - 1; ++st) {
			if (st < nsteps)
				fetch(st);
			else
				dg_cp_commit();
		}
		for (int i = 0; i < nsteps; ++i) {
			const int s = i % S;
			if (i + R - 1 < nsteps)
				fetch(i + R - 1);	// into step i-1's slot, decoded by this thread already
			else
				dg_cp_commit();
			dg_cp_wait<R - 1>();		// this thread's copies of step i
			const unsigned full = bars + 8 * s, as = sbase + s * STAGE, bs = as + A_BYTES;
			// the stage's previous use (step i - S) released by every consumer
			dg_mbar_wait(bars + 8 * (S + s), ((i / S) & 1) ^ 1);
			if (p == 0) {
				dg_mbar_expect_tx(full, A_BYTES);
				const int k0 = (k_begin + i) * BK, b = k0 / T, t = k0 - b * T;
#pragma unroll
				for (int gg = 0; gg < BM / 64; ++gg)	// grad[b, 0, t.., m0 + 64gg ..] (its copy)
					dg_tma_load(as + 8192 * gg, &ma, full, m0 + 64 * gg, t, b);
			}
			put(i, bs);
			dg_fence_async_smem();		// this thread's stores, to the tensor cores
			dg_mbar_arrive(full);
		}
		return;
	}

${CONSUMERS}

${EPILOGUE}
}
]]

-- A per-token scale folded into a decoded chunk d (four bf16 pairs) of K
-- row k: B(k, l) · sa[k] (${RS}), rounded to bf16 (the decoded code is exact).
local RS_APPLY = [[
			// B(k, l) · sa[k], rounded to bf16 (the decoded code is exact)
			d.x = dg_bf16x2_times(d.x, ${RS});
			d.y = dg_bf16x2_times(d.y, ${RS});
			d.z = dg_bf16x2_times(d.z, ${RS});
			d.w = dg_bf16x2_times(d.w, ${RS});]]

-- A per-token scale's product of a decoded pair, for RS_APPLY and the
-- fma decode's overflow branch.
local TIMES = [[
// A bf16 pair p (the low half first) times s, each product rounded to bf16.
__device__ __forceinline__ unsigned dg_bf16x2_times(unsigned p, float s)
{
	return dg_bf16x2(__fmul_rn(__uint_as_float(p << 16), s), __fmul_rn(__uint_as_float(p & 0xffff0000u), s));
}
]]

-- uint8pos codes with a scale a token (w8a8's decoder): the decode and the
-- scale in one (dg_u8x4_bf16_scaled), the same bits as dg_u8x4_bf16 then
-- RS_APPLY. The two steps take about five instructions a value (the magic
-- number's byte_perm and subtraction, the pack, the unpack, the product,
-- half a cvt); here (2^23 + c)·s − 2^23·s, which is c·s exactly, goes
-- through one fma, rounded as __fmul_rn(c, s) rounds it: two and a half
-- (byte_perm, fma, half a cvt). −2^23·s is exact unless it overflows (|s|
-- of 2^105 or more, or infinite), where the two steps run instead
-- (tests/test_emu_grad.c dgw_scaled_decode_bit_for_bit).
local U8_SCALED = [[
// Four uint8pos codes of w (bytes 0..3) times s, each rounded to bf16: as
// dg_u8x4_bf16's exact value times s by __fmul_rn, then to bf16.
__device__ __forceinline__ uint2 dg_u8x4_bf16_scaled(unsigned w, float s)
{
	const float c = -8388608.0f * s;	// −2^23·s, exact unless it overflows
	if ((__float_as_uint(c) & 0x7fffffffu) == 0x7f800000u) {
		const uint2 v = dg_u8x4_bf16(w);
		return make_uint2(dg_bf16x2_times(v.x, s), dg_bf16x2_times(v.y, s));
	}
	return make_uint2(dg_bf16x2(__fmaf_rn(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7650)), s, c),
				    __fmaf_rn(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7651)), s, c)),
			  dg_bf16x2(__fmaf_rn(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7652)), s, c),
				    __fmaf_rn(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7653)), s, c)));
}
]]

local U8_SCALED_DECODE = "const uint2 lo = dg_u8x4_bf16_scaled(r.x, ${RS}), hi = dg_u8x4_bf16_scaled(r.y, ${RS});\n" ..
                         "uint4 d = make_uint4(lo.x, lo.y, hi.x, hi.y);"

local function render_dgw(c)
  local o, F = c.o, c.F
  local bt = DGW_B[c.bfmt]
  local at_end = F.code and not c.vec -- a per-token scale goes into B as it is staged
  local function scaled(x) return at_end and fmt("__fmul_rn(%s, s)", x) or x end
  local smem = c.smem
  -- two blocks an SM (at most 128 registers a thread) while the
  -- accumulators allow it, as the lowrank grads
  local minb = (c.bm == 128 and c.bn <= 128) and 2 or 1
  c.about[#c.about + 1] = fmt("path: warpgroup tensor cores (wgmma m64n%dk16 bf16, f32 sums; sm_90a), %d warpgroups,",
                              c.bn, c.bm // 64)
  local ws = M.ws_tile(c)
  if ws then
    c.about[#c.about + 1] = fmt("  warp-specialized: a ring of %d stages (%d bytes of dynamic shared memory, one block an SM), a producer",
                                c.stages, smem)
    c.about[#c.about + 1] = fmt("  warpgroup: A (grad's bf16 copy, %s_cast) by TMA, B (y, %s) by cp.async %s,",
                                c.entry, c.bfmt, c.bfmt == "bf16" and "and copied" or
                                (c.vec and "then times sa[k], rounded to bf16" or "then decoded"))
  else
    c.about[#c.about + 1] = fmt("  a ring of %d stages (%d bytes of dynamic shared memory), __launch_bounds__ for %d block%s an SM;",
                                c.stages, smem, minb, minb == 2 and "s" or "")
    c.about[#c.about + 1] = fmt("  A (grad's bf16 copy, %s_cast) and B (y, %s) %s staged through registers,",
                                c.entry, c.bfmt, c.bfmt == "bf16" and "copied" or (c.vec and "times sa[k], rounded to bf16," or "decoded"))
  end
  c.about[#c.about + 1] = "  both MN-major (templates/grad_wgmma.lua)."
  local w = EMIT.writer()
  w:line(EMIT.banner(c.spec, "grad.lua", c.about))
  w:line(DEV.helpers({ bf16x2 = true, cp_async = true, cp_async_small = ws }))
  w:line(WB.helpers(c.bn, true, true))
  if F.code then w:line(require("grad_mma").I8_HELPERS) end
  local u8s = c.bfmt == "uint8pos" and c.vec
  if c.vec then w:line(TIMES) end
  if u8s then w:line(U8_SCALED) end
  -- y's decode into d, and a per-token scale in it (RS: the scale's
  -- expression, by form)
  local function decode(rs_expr, ind)
    if u8s then return EMIT.indent(EMIT.subst(U8_SCALED_DECODE, { RS = rs_expr }), ind) end
    local d = EMIT.indent(bt.DECODE, ind)
    return c.vec and d .. "\n" .. EMIT.indent(EMIT.subst(RS_APPLY, { RS = rs_expr }), ind - 3) or d
  end
  w:line(EMIT.subst(DGW_HEAD, { H = c.H, E = c.E, L = c.L, EPW_B = F.epw, BM = c.bm, BN = c.bn, BK = c.bk,
                               S = c.stages, ENTRY = c.entry }))
  w:line(EMIT.subst(DGW_CAST, { ENTRY = c.entry }))
  w:line(EMIT.subst(o.text, { HIN_H = "0" }))
  w:line(EMIT.subst(require("grad_ops").ADDR.decoder_grad_weight, { HIN_H = "0" }))
  local rs = c.vec
  local epilogue = EMIT.subst(DGW_EPILOGUE, {
    SCALED_DESC = at_end and "sa · Σ" or "Σ",
    PAIRS = EMIT.subst(WB.PAIRS, { MLIM = "MM", PAIR = EMIT.subst(DGW_PAIR, { S0 = scaled("c0"), S1 = scaled("c1") }) }),
  })
  local scale_load = at_end and "\tconst float s = *sa;\t\t// the activation's scale"
                     or (rs and "\t// per token: the scales go into B as it is staged" or "\t(void)sa;\t\t\t// bf16 y: no scale")
  if ws then
    local ws_dec = decode("rs[j]", 5)
    w:line(EMIT.subst(DGW_WS_HEAD, { R = dgw_ws_r(c, c.bfmt, c.arch), RING = WB.ring_bytes(c, false) }))
    w:line(WB.WS_HELPERS)
    w:line(EMIT.subst(DGW_WS_KERNEL, {
      ENTRY = c.entry, SIG = EMIT.subst(o.sig, { BT = F.ctype }), SCALE_LOAD = scale_load,
      BT_REG = bt.T, B_DECODE = ws_dec,
      M_FASTEST = require("tiles").M_FASTEST,
      RING_INIT = EMIT.subst(WB.RING_INIT, { FULL_COUNT = "NP + 1", EMPTY_COUNT = "NT", INIT_SYNC = "__syncthreads();" }),
      RS_FETCH = rs and "\t\t\t\tdg_cp4(sslot + j * 4, sa + k);\t// dg_b_scale's" or "",
      CONSUMERS = WB.ws_consumers({ A_KC = "false", A_KS = "2048", B_KC = "false", B_KS = "2048" }),
      EPILOGUE = epilogue,
    }))
    return w:text()
  end
  local ring_dec = decode("rs[s % KR]", 3)
  w:line(EMIT.subst(DGW_KERNEL, {
    MINB = minb, ENTRY = c.entry,
    SIG = EMIT.subst(o.sig, { BT = F.ctype }),
    M_FASTEST = require("tiles").M_FASTEST,
    SCALE_LOAD = scale_load,
    BT_REG = bt.T, BT_ZERO = bt.Z, B_LOAD = bt.LOAD,
    B_DECODE = ring_dec,
    RS_DECL = rs and "\tfloat rs[KR];\t\t// the scale of each of this thread's K rows (0 past K)" or "",
    RS_LOAD = rs and "\t\t\trs[j] = k < K ? dg_b_scale(sa, k, h, T) : 0.0f;" or "",
    EPILOGUE = epilogue,
  }))
  return w:text()
end

-- Renders the warpgroup kernel; `c` holds what grad.lua's render worked
-- out (spec, op, its OPS entry o, shape, tile, banner lines).
function M.render(c)
  local o, op = c.o, c.op
  if op == "decoder_grad_weight" then return render_dgw(c) end
  local gi = op == "lowrank_grad_input"
  local ws = M.ws_tile(c)
  -- two blocks an SM (at most 128 registers a thread) while the
  -- accumulators allow it; the warp-specialized form: one, its deep ring
  local minb = (not ws and c.bm == 128 and c.bn <= 128) and 2 or 1
  local smem = c.smem
  c.about[#c.about + 1] = fmt("path: %swarpgroup tensor cores (wgmma m64n%dk16 bf16, f32 sums; sm_90a), %d warpgroups%s,",
                              ws and "warp-specialized " or "", c.bn, c.bm // 64, ws and " and a TMA producer warpgroup" or "")
  c.about[#c.about + 1] = fmt("  a ring of %d stages (%d bytes of dynamic shared memory), __launch_bounds__ for %d block%s an SM;",
                              c.stages, smem, minb, minb == 2 and "s" or "")
  c.about[#c.about + 1] = fmt("  A (grad, bf16) %s, B (%s, bf16) N-major%s (templates/grad_wgmma.lua).",
                              gi and "K-major" or "M-major", c.bname,
                              ws and ", both by TMA (two tensor maps after the op's arguments; T % 64 == 0)" or "")
  local w = EMIT.writer()
  w:line(EMIT.banner(c.spec, "grad.lua", c.about))
  w:line(DEV.helpers({ cp_async = true }))
  w:line(WB.helpers(c.bn, not gi, true))
  w:line(EMIT.subst(HEAD, { H = c.H, HIN = c.HIN, E = c.E, L = c.L, BM = c.bm, BN = c.bn, BK = c.bk, S = c.stages }))
  if ws then
    w:line(WB.WS_HEAD)
    w:line(WB.WS_HELPERS)
  end
  w:line(EMIT.subst(o.text, { HIN_H = c.HIN_H }))
  w:line(EMIT.subst(ADDR[op], { HIN_H = c.HIN_H }))
  local epilogue = staged_gw(op, c.E) and
    EMIT.subst(STAGED_GW, { STAGE_ACC = EMIT.subst(WB.STAGE_ACC, { TILE = "tile", PITCH = "BNP" }) }) or
    EMIT.subst(EPILOGUE[op], { PAIRS = EMIT.subst(WB.PAIRS, { MLIM = PAIR[op][1], PAIR = PAIR[op][2] }) })
  local keys = { A_KC = gi and "true" or "false", A_KS = gi and "32" or "2048", B_KC = "false", B_KS = "2048" }
  local sig = EMIT.subst(o.sig, { BT = "unsigned short" })
  if ws then
    keys.LOADS = EMIT.subst(TMA_LOADS[op], { HIN_H = c.HIN_H })
    keys.RING_BYTES = tostring(WB.ring_bytes(c, staged_gw(op, c.E)))
    sig = sig .. ", const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb"
    epilogue = epilogue:gsub("__syncthreads%(%);", "dg_consumers_sync();")
  end
  w:line(EMIT.subst(KERNEL, {
    BOUNDS = ws and "NTB, 1" or ("NT, " .. minb), ENTRY = c.entry, SIG = sig, PROLOGUE = PROLOGUE[op],
    LOAD = ws and "" or (LOAD_WHY .. LOAD[op] .. "\n\n"), EPILOGUE = epilogue,
    MAINLOOP = ws and WB.ws_loop(keys) or EMIT.subst(WB.MAINLOOP, keys),
  }))
  return w:text()
end

return M

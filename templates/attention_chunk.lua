--[[
attention_chunk.lua — the state GEMMs of BDH attention's chunked form
(sm_90a). With no softmax the attention is linear attention with Q = K =
qr = RoPE(xs) and V = v (DESIGN.md, "Long context"); in chunks of C rows
of T, per (b, h) and chunk c (rows c·C .. c·C + C − 1):

  o_c   = tril(qr_c qr_cᵀ, −1)·v_c  +  qr_c·S_c        S_c = Σ_{k<c} qr_kᵀ v_k
  dqr_c = (dS_c + dS_cᵀ)·qr_c  +  dout_c·S_cᵀ + v_c·R_cᵀ   R_c = Σ_{k>c} qr_kᵀ dout_k
  dv_c  = Σ_h tril(qr_c qr_cᵀ, −1)ᵀ·dout_c  +  Σ_h qr_c·R_c

(runtime/ref/attention_chunked.c is the reference, in double). The
intra-chunk terms are the quadratic kernels of templates/attention.lua run
at T = C on the B·H·(T/C) chunks as sequences of one head (scores, out,
grad_scores and grad_v, none of which reads the RoPE table with rope=pre;
tests/test_ref_attention.c
chunk_pieces_make_the_quadratic_form checks the whole decomposition with
the CPU references); this module renders the rest, six ops of one entry
each (dragon/ops.h, "The chunked form"; runtime/ops/attention_chunk.c
launches them).

  attention_chunk_state  every chunk's S_c (or, reversed, R_c) of one
      (b, h): a GEMM of M = N (rows of the state), N = D, K = T walked in
      order (reversed: from the end), whose accumulators are stored as
      the state of chunk c when the walk reaches it: before its rows, so
      each state holds the chunks before it (after it, reversed). Chunk 0
      (reversed: the last) gets zeros. A = qrᵀ and B = v (or dout) both
      MN-major by TMA. The state is stored as two bf16 matrices, its
      rounding and the rounding's remainder (hi, lo: hi + lo is the f32
      sum to 2^-16 of it), rows 0..N−1 and N..2N−1 of the chunk's (2N, D).
  attention_chunk_out    out_c += qr_c · S_c: M = C rows, N = D, K = 2N
      (qr_c twice, against hi then lo), A K-major, B MN-major; added into
      out (bf16, rounded once, or f32). The walk's first chunk (0, or the
      last for reversed states: its state is zero) returns at once.
  attention_chunk_dq     dxs = (dxs + RoPEᵀ(g))·[mask_xs > 0], g =
      (dS_c + dS_cᵀ)·qr_c + dout_c·S_cᵀ + v_c·R_cᵀ: M = C rows, N = the
      state's rows (latent), K = C + 4D — the chunk's C = dS + dSᵀ (the
      quadratic grad_scores on the chunk, K-major) against qr_c
      (N-major), then dout against S's hi and lo and v against R's (both
      K-major): two transposes, each a loop of its own (a branch a step
      between two wgmma forms has ptxas serialize them all). The epilogue is
      epi=mask's arithmetic, RoPEᵀ taken at the row's place in the whole
      sequence (the quadratic grad_xs run on a chunk as a sequence would
      take it at t mod C, so the intra term is here).
  attention_chunk_vrep   v (B, 1, T, D) bf16 → (B, H, T, D): the values a
      head each, as the quadratic kernels at one head read them.
  attention_chunk_cast   f32 → bf16 (rounded to nearest even): dout for
      the TMA loads of state (reversed) and dq.
  attention_chunk_hsum   dv (B, 1, T, D) f32 = Σ_h gv (B, H, T, D) f32, the
      heads in order.

Kernel ABI (bf16 rank-3 tensor maps, 64 x 64 boxes of the 128-byte
swizzle, zeros past the edges; C, the chunk, is the spec's, a constant):
  dg_attention_chunk_state(ma, mb, unsigned short *states, int B, int T, int reverse)
    ma over qr (N, T, B·H); mb over v (D, T, B) (in_heads 1) or dout (D,
    T, B·H) (in_heads H); states (B·H·T/C, 2N, D) bf16. Grid (D/BN,
    ceil(N/BM), B·H).
  dg_attention_chunk_out(ma, mb, OT *out, int B, int T, int reverse)
    ma over qr (N, T, B·H); mb over states (D, 2N, B·H·T/C); out (B, H,
    T, D) in the spec's out. Grid (D/BN, T/BM, B·H).
  dg_attention_chunk_dq(mc, mq, ma, mv, ms, mr, const float *rope, OT *dxs,
      const unsigned short *mask_xs, int B, int T)
    mc over C (C, C, B·H·T/C) bf16 (the chunks' grad_scores); mq over qr
    (N, T, B·H); ma over dout (D, T, B·H) bf16; mv over v (D, T, B); ms, mr
    over the S and R states (D, 2N, B·H·T/C); rope (T, N) f32; dxs (B, H,
    T, N) OT, read and written; mask_xs (B, H, T, N) bf16, the ReLU's
    output. Grid (ceil(N/BN), T/BM, B·H).
  dg_attention_chunk_vrep(const unsigned short *v, unsigned short *vr, int B, int T)
  dg_attention_chunk_cast(const float *x, unsigned short *y, long long n)
  dg_attention_chunk_hsum(const float *gv, float *dv, int B, int T)
    any grid, the plan's threads (t256 by default).
  Needs: T % C == 0, C % BM == 0 (a tile's rows within one chunk: the
  auto tile takes BM 64 for a chunk of 64), C % 64 == 0, D % 64 == 0,
  N % 8 == 0 (rows of whole 16 bytes for the maps).

The GEMMs are templates/wgmma_bf16.lua's warp-specialized form (a TMA
producer warpgroup, a ring of S stages with full/empty mbarriers, BM/64
consumer warpgroups of m64nBNk16 bf16 with f32 sums), the state's with
its per-step hook: at a chunk's first K step the consumers wait for every
MMA in flight and store the sums so far. The three GEMMs take the same
tile (the op's), each its own transposes (dg_cm_mma_mm, _km, _kk).

Precision: the products are exact in f32 and summed in f32 (K ascending
within a block); a state is the f32 sum split into hi + lo bf16, so its
use in out and dq is within 2^-16 of the f32 state's, where the
quadratic form rounds its scores S to bf16 (2^-9).
]]
local SPEC = require("spec")
local EMIT = require("emit")
local TILES = require("tiles")
local DEV = require("device")
local WB = require("wgmma_bf16")
local fmt = string.format

local M = {}

-- The entry each op renders (one a program).
local ENTRY = {
  attention_chunk_state = "dg_attention_chunk_state", attention_chunk_out = "dg_attention_chunk_out",
  attention_chunk_dq = "dg_attention_chunk_dq", attention_chunk_vrep = "dg_attention_chunk_vrep",
  attention_chunk_cast = "dg_attention_chunk_cast", attention_chunk_hsum = "dg_attention_chunk_hsum",
}
local GEMMS = { attention_chunk_state = true, attention_chunk_out = true, attention_chunk_dq = true }

M.EW_THREADS = 256 -- the element-wise entries' default block

-- The op's fields: heads, embd (D), and for the GEMMs latent (N), chunk
-- (C), arch, act (bf16), in_heads (state: the source's heads), out (out:
-- the output's format; dq: dxs's).
local function fields(spec)
  local op = SPEC.one_of(spec, "op", { "attention_chunk_state", "attention_chunk_out", "attention_chunk_dq",
                                       "attention_chunk_vrep", "attention_chunk_cast", "attention_chunk_hsum" })
  local k = { op = op, gemm = GEMMS[op], H = SPEC.int_field(spec, "heads", 1), D = SPEC.int_field(spec, "embd", 1) }
  if op ~= "attention_chunk_hsum" then SPEC.one_of(spec, "act", { "bf16" }) end
  if not k.gemm then return k end
  k.N = SPEC.int_field(spec, "latent", 2)
  k.C = SPEC.int_field(spec, "chunk", 64)
  k.arch = SPEC.int_field(spec, "arch", 1)
  k.VH = op == "attention_chunk_state" and SPEC.int_field(spec, "in_heads", 1) or 1
  k.out = op ~= "attention_chunk_state" and SPEC.one_of(spec, "out", { "f32", "bf16" }) or "bf16"
  return k
end

-- The default tile: two consumer warpgroups of m64n128, six stages (193
-- KiB, one block an SM), as the lowrank grads' warp-specialized form.
function M.default_tile()
  return { bm = 128, bn = 128, bk = 64, wm = 8, wn = 1, stages = 6, threads = 0 }
end

function M.plan(spec)
  local k = fields(spec)
  if not k.gemm then
    if k.op == "attention_chunk_vrep" and k.D % 8 ~= 0 then
      return nil, fmt("embd=%d: the values are copied 8 (16 bytes) at a time: D must be a multiple of 8", k.D)
    end
    return TILES.threads_plan(spec, { ENTRY[k.op] }, k.op .. ".cu")
  end
  local t = TILES.tile_of(spec)
  local auto = TILES.tile_is_auto(t)
  if auto then
    t = M.default_tile()
    if k.C % t.bm ~= 0 then t.bm, t.wm = 64, 4 end -- a chunk of 64 rows
    -- state's and out's columns are D's: 64-wide where D is an odd number of 64s
    if k.op ~= "attention_chunk_dq" and k.D % t.bn ~= 0 then t.bn = 64 end
  end
  if not (k.arch == 90 and spec.arch_specific) then
    return TILES.refuse(t, auto, "%s runs on sm_90a alone (TMA and warpgroup MMAs): arch=sm_90a", k.op)
  end
  if k.D % 64 ~= 0 then
    return nil, fmt("embd=%d: the chunked attention needs D a multiple of 64 (64-wide boxes of the values)", k.D)
  end
  if k.N % 8 ~= 0 then
    return nil, fmt("latent=%d: the chunked attention needs N a multiple of 8 (rows of whole 16 bytes)", k.N)
  end
  if not WB.tile_ok(t, 5, 8) then
    return TILES.refuse(t, auto, "the chunked attention's GEMMs are warp-specialized: WN 1, BM = 16*WM of 64 or 128, BN 64, 128 or 256, BK 64 and 5 to 8 stages")
  end
  if k.C % t.bm ~= 0 and k.op ~= "attention_chunk_state" then
    return TILES.refuse(t, auto, "BM %d: chunk %d must be a multiple of it (a tile's rows within one chunk)", t.bm, k.C)
  end
  local smem = WB.ws_smem_bytes(t, false)
  local ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
  if not ok then return nil, err end
  return { tile = t, path = "wgmma tma", arch_specific = true, name = k.op .. ".cu",
           entries = { { name = ENTRY[k.op], threads = WB.ws_threads(t), smem = smem } } }
end

local HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int D = ${D};		// embd: the values' width
constexpr int N = ${N};		// latent: the state's rows
constexpr int C = ${C};		// chunk: the rows of T a state covers
constexpr int VH = ${VH};		// state: the source's heads (1: v; H: dout)
typedef ${OT} OT;		// out's and dq's output format

// ---- tile: BM/64 consumer warpgroups along M, each 64 x BN; a producer
// warpgroup; a ring of S stages
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};
constexpr int NT = (BM / 64) * 128;		// consumer threads
constexpr int S = ${S};
static_assert(BK == 64, "one 128-byte swizzle row of K a step");
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
]]

local COMMON = [[
__device__ __forceinline__ float2 dg_ld2(const float *p) { return *(const float2 *)p; }
__device__ __forceinline__ float2 dg_ld2(const unsigned short *p)
{
	const unsigned w = *(const unsigned *)p;
	return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ void dg_st2(float *p, float a, float b) { *(float2 *)p = make_float2(a, b); }
__device__ __forceinline__ void dg_st2(unsigned short *p, float a, float b)
{
	*(unsigned *)p = (unsigned)dg_f32_to_bf16(a) | ((unsigned)dg_f32_to_bf16(b) << 16);
}

// The state's store at a chunk's start: the accumulators (rows m of the
// state, columns n, n+1 of D) as hi = bf16(v) at row m and lo = bf16(v −
// hi) at row N + m of the chunk's (2N, D) at st.
__device__ __forceinline__ void dg_state_put(unsigned short *__restrict__ st, const float (&acc)[BN / 2], int m0,
					     int n0, int wg, int warp, int g, int q)
{
#pragma unroll
	for (int hr = 0; hr < 2; ++hr) {
		const int m = m0 + wg * 64 + (warp & 3) * 16 + g + 8 * hr;
		if (m >= N)
			continue;
#pragma unroll
		for (int j = 0; j < BN / 8; ++j) {
			const int n = n0 + 8 * j + 2 * q;
			if (n < D) {
				const float v0 = acc[4 * j + 2 * hr], v1 = acc[4 * j + 2 * hr + 1];
				const unsigned short h0 = dg_f32_to_bf16(v0), h1 = dg_f32_to_bf16(v1);
				const float r0 = __fsub_rn(v0, dg_bf16_to_f32(h0)), r1 = __fsub_rn(v1, dg_bf16_to_f32(h1));
				*(unsigned *)(st + (long long)m * D + n) = (unsigned)h0 | ((unsigned)h1 << 16);
				*(unsigned *)(st + (long long)(N + m) * D + n) =
					(unsigned)dg_f32_to_bf16(r0) | ((unsigned)dg_f32_to_bf16(r1) << 16);
			}
		}
	}
}
]]

-- The prologue every GEMM entry shares (after its geometry): the aligned
-- ring's base.
local GEMM = [[
extern "C" __global__ void __launch_bounds__(NTB, 1)
${ENTRY}(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, z = blockIdx.z;
	(void)lane; (void)g; (void)q; (void)B;
${GEO}
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;
${MAINLOOP}

${EPILOGUE}
}
]]

local STATE = {
  sig = "const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb, unsigned short *__restrict__ states, int B, int T, int reverse",
  geo = [[
	// block: rows m0.. of the state (N), columns n0.. (D), of (b, h) = z;
	// K = the T rows of (b, h), walked forward or from the end
	const int vz = VH == 1 ? z / H : z;	// v's map: (b); dout's: (b, h)
	const int nsteps = T / BK, ck = C / BK, nc = T / C;]],
  loads = [[
				const int t0 = (reverse ? nsteps - 1 - i : i) * BK;
#pragma unroll
				for (int gg = 0; gg < BM / 64; ++gg)	// qr[b, h, t0.., m0 + 64gg ..]
					dg_tma_load(as + 8192 * gg, &ma, full, m0 + 64 * gg, t0, z);
#pragma unroll
				for (int gg = 0; gg < BN / 64; ++gg)	// v[b, t0.., n0 + 64gg ..] (dout[b, h, ...])
					dg_tma_load(bs + 8192 * gg, &mb, full, n0 + 64 * gg, t0, vz);]],
  step = [[

		if (i % ck == 0) {	// chunk c's first rows: its state is the sums so far
			const int c = reverse ? nc - 1 - i / ck : i / ck;
			dg_wg_wait<0>();
			dg_wb_pin(acc);
			dg_state_put(states + ((long long)z * nc + c) * 2 * N * D, acc, m0, n0, wg, warp, g, q);
		}]],
  mma = "dg_cm_mma_mm", a_kc = false, b_kc = false,
  epilogue = "\t(void)acc;\t// the sums past the last chunk are no chunk's state",
}

local OUT = {
  sig = "const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb, OT *__restrict__ out, int B, int T, int reverse",
  geo = [[
	// block: rows m0.. of (b, h) = z's T (one chunk's: C % BM == 0),
	// columns n0.. of D; K = 2N: qr's row against the state's hi, then lo
	const int nc = T / C, c = m0 / C;
	if (c == (reverse ? nc - 1 : 0))
		return;		// the walk's first chunk: its state is zero, nothing to add
	// hi's rows in NH steps, then lo's (N % BK != 0: the last step of each
	// runs past N, where qr's columns are zeros)
	constexpr int NH = (N + BK - 1) / BK;
	const int nsteps = 2 * NH;]],
  loads = [[
				const int kq = (i < NH ? i : i - NH) * BK, k0 = i < NH ? kq : N + kq;
#pragma unroll
				for (int gg = 0; gg < BM / 64; ++gg)	// qr[b, h, m0 + 64gg.., kq..]
					dg_tma_load(as + 8192 * gg, &ma, full, kq, m0 + 64 * gg, z);
#pragma unroll
				for (int gg = 0; gg < BN / 64; ++gg)	// state rows k0.., columns n0 + 64gg..
					dg_tma_load(bs + 8192 * gg, &mb, full, n0 + 64 * gg, k0, z * nc + c);]],
  mma = "dg_cm_mma_km", a_kc = true, b_kc = false,
  epilogue = [[
	// ---- epilogue: out (+)= the sums, a pair at a time (rows g, g+8 of the
	// warp's 16, columns 8j + 2q, +1)
#pragma unroll
	for (int hr = 0; hr < 2; ++hr) {
		const int m = m0 + wg * 64 + (warp & 3) * 16 + g + 8 * hr;
		if (m >= T)
			continue;
#pragma unroll
		for (int j = 0; j < BN / 8; ++j) {
			const int n = n0 + 8 * j + 2 * q;
			if (n >= D)
				continue;
			const long long o = ((long long)z * T + m) * D + n;
			const float v0 = acc[4 * j + 2 * hr], v1 = acc[4 * j + 2 * hr + 1];
			const float2 pv = dg_ld2(out + o);
			dg_st2(out + o, __fadd_rn(pv.x, v0), __fadd_rn(pv.y, v1));
		}
	}]],
}

local DQ = {
  sig = "const __grid_constant__ dg_tmap mc, const __grid_constant__ dg_tmap mq, const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mv, const __grid_constant__ dg_tmap ms, const __grid_constant__ dg_tmap mr, const float *__restrict__ rope, OT *__restrict__ dxs, const unsigned short *__restrict__ mask_xs, int B, int T",
  geo = [[
	// block: rows m0.. of (b, h) = z's T (one chunk's), columns n0.. of N;
	// K = C + 4D: the chunk's C·qr (B N-major), then dout·S (hi, lo) and
	// v·R (hi, lo) (B K-major)
	const int nc = T / C, c = m0 / C, zc = z * nc + c;
	const int ni = C / BK, nsteps = ni + 4 * D / BK;]],
  loads = [[
				if (i < ni) {
					const int k0 = i * BK;
#pragma unroll
					for (int gg = 0; gg < BM / 64; ++gg)	// C rows m0 − cC + 64gg.., columns k0..
						dg_tma_load(as + 8192 * gg, &mc, full, k0, m0 - c * C + 64 * gg, zc);
#pragma unroll
					for (int gg = 0; gg < BN / 64; ++gg)	// qr[b, h, cC + k0.., n0 + 64gg ..]
						dg_tma_load(bs + 8192 * gg, &mq, full, n0 + 64 * gg, c * C + k0, z);
				} else {
					const int k0 = (i - ni) * BK, seg = k0 / D, kd = k0 - seg * D;
#pragma unroll
					for (int gg = 0; gg < BM / 64; ++gg) {	// dout[b, h, m0 + 64gg.., kd..] or v[b, ...]
						if (seg < 2)
							dg_tma_load(as + 8192 * gg, &ma, full, kd, m0 + 64 * gg, z);
						else
							dg_tma_load(as + 8192 * gg, &mv, full, kd, m0 + 64 * gg, z / H);
					}
#pragma unroll
					for (int gg = 0; gg < BN / 64; ++gg)	// state rows (seg & 1)·N + n0 + 64gg.., columns kd..
						dg_tma_load(bs + 8192 * gg, seg < 2 ? &ms : &mr, full, kd, (seg & 1) * N + n0 + 64 * gg, zc);
				}]],
  -- the chunk's steps [0, ni) B N-major, the states' K-major: two loops
  -- (wgmma_bf16.lua consumers_text), not a branch a step
  split = "ni",
  mma_step = "dg_cm_mma_km(acc, dg_wb_desc<true>(as + ks * 32), dg_wb_desc<false>(bs + ks * 2048), 1);",
  mma_step2 = "dg_cm_mma_kk(acc, dg_wb_desc<true>(as + ks * 32), dg_wb_desc<true>(bs + ks * 32), 1);",
  a_kc = true, b_kc = true,
  epilogue = [[
	// ---- epilogue: dxs = (dxs + RoPEᵀ(sums))·[mask_xs > 0] (epi=mask's
	// arithmetic), a pair (2p, 2p+1) at a time with the table's (cos, sin)
	// of its row's place in the sequence (rows g, g+8 of the warp's 16)
#pragma unroll
	for (int hr = 0; hr < 2; ++hr) {
		const int m = m0 + wg * 64 + (warp & 3) * 16 + g + 8 * hr;
		if (m >= T)
			continue;
#pragma unroll
		for (int j = 0; j < BN / 8; ++j) {
			const int n = n0 + 8 * j + 2 * q;
			if (n >= N)
				continue;
			const float v0 = acc[4 * j + 2 * hr], v1 = acc[4 * j + 2 * hr + 1];
			const float2 cs = dg_ld2(rope + (long long)m * N + n);
			const float g0 = __fadd_rn(__fmul_rn(v0, cs.x), __fmul_rn(v1, cs.y));
			const float g1 = __fsub_rn(__fmul_rn(v1, cs.x), __fmul_rn(v0, cs.y));
			const long long o = ((long long)z * T + m) * N + n;
			const float2 dv = dg_ld2(dxs + o), xv = dg_ld2(mask_xs + o);
			dg_st2(dxs + o, xv.x > 0.0f ? __fadd_rn(dv.x, g0) : 0.0f, xv.y > 0.0f ? __fadd_rn(dv.y, g1) : 0.0f);
		}
	}]],
}

-- The element-wise entries, one a program (EWT threads a block, any grid).
local EW_HEAD = [[
constexpr int H = ${H};		// heads
constexpr int D = ${D};		// embd
constexpr int EWT = ${EWT};		// threads a block
]]

local EW = {
  attention_chunk_vrep = [[
extern "C" __global__ void __launch_bounds__(EWT)
dg_attention_chunk_vrep(const unsigned short *__restrict__ v, unsigned short *__restrict__ vr, int B, int T)
{
	// 8 values (16 bytes) a thread: D % 8 == 0, so a row is whole vectors
	const long long nv = (long long)B * H * T * (D / 8);
	for (long long i = (long long)blockIdx.x * EWT + threadIdx.x; i < nv; i += (long long)gridDim.x * EWT) {
		const long long row = i / (D / 8), e = i - row * (D / 8);	// row = (b·H + h)·T + t
		const long long b = row / ((long long)H * T), t = row % T;
		((uint4 *)vr)[i] = ((const uint4 *)v)[(b * T + t) * (D / 8) + e];
	}
}
]],
  attention_chunk_cast = [[
extern "C" __global__ void __launch_bounds__(EWT)
dg_attention_chunk_cast(const float *__restrict__ x, unsigned short *__restrict__ y, long long n)
{
	for (long long i = (long long)blockIdx.x * EWT + threadIdx.x; i < n; i += (long long)gridDim.x * EWT)
		y[i] = dg_f32_to_bf16(x[i]);
}
]],
  attention_chunk_hsum = [[
extern "C" __global__ void __launch_bounds__(EWT)
dg_attention_chunk_hsum(const float *__restrict__ gv, float *__restrict__ dv, int B, int T)
{
	const long long n = (long long)B * T * D, per = (long long)T * D;
	for (long long i = (long long)blockIdx.x * EWT + threadIdx.x; i < n; i += (long long)gridDim.x * EWT) {
		const long long b = i / per, r = i - b * per;
		float s = 0.0f;
		for (int h = 0; h < H; ++h)	// the heads in order
			s = __fadd_rn(s, gv[(b * H + h) * per + r]);
		dv[i] = s;
	}
}
]],
}

local function gemm(t, e, entry)
  local loop = WB.ws_loop({ LOADS = e.loads, RING_BYTES = tostring(WB.ring_bytes(t, false)),
                            A_KC = tostring(e.a_kc), B_KC = tostring(e.b_kc),
                            A_KS = e.a_kc and "32" or "2048", B_KS = e.b_kc and "32" or "2048",
                            MMA = e.mma, MMA_STEP = e.mma_step, STEP_BEGIN = e.step or "",
                            SPLIT = e.split, MMA_STEP2 = e.mma_step2 })
  return EMIT.subst(GEMM, { ENTRY = entry, SIG = e.sig, GEO = e.geo, MAINLOOP = loop, EPILOGUE = e.epilogue })
end

local GEMM_OF = { attention_chunk_state = STATE, attention_chunk_out = OUT, attention_chunk_dq = DQ }
local ABI = {
  attention_chunk_state = "dg_attention_chunk_state(ma, mb, states, int B, int T, int reverse)   grid (D/BN, ceil(N/BM), B·H)",
  attention_chunk_out = "dg_attention_chunk_out(ma, mb, out, int B, int T, int reverse)   grid (D/BN, T/BM, B·H)",
  attention_chunk_dq = "dg_attention_chunk_dq(mc, mq, ma, mv, ms, mr, rope, dxs, mask_xs, int B, int T)   grid (ceil(N/BN), T/BM, B·H)",
  attention_chunk_vrep = "dg_attention_chunk_vrep(v, vr, int B, int T)   any grid",
  attention_chunk_cast = "dg_attention_chunk_cast(x, y, long long n)   any grid",
  attention_chunk_hsum = "dg_attention_chunk_hsum(gv, dv, int B, int T)   any grid",
}

function M.render(spec, plan)
  local k = fields(spec)
  local t = plan.tile
  local w = EMIT.writer()
  if not k.gemm then
    w:line(EMIT.banner(spec, "attention_chunk.lua", {
      fmt("%s: the chunked attention's element-wise part, heads %d, embd %d.", k.op, k.H, k.D),
      "", ABI[k.op], fmt("  %d threads a block", t.threads) }))
    w:line(DEV.helpers({ bf16 = true }))
    w:line(EMIT.subst(EW_HEAD, { H = k.H, D = k.D, EWT = t.threads }))
    w:line(EW[k.op])
    return w:text()
  end
  w:line(EMIT.banner(spec, "attention_chunk.lua", {
    fmt("%s: the chunked attention's state GEMMs, heads %d, embd %d, latent %d, chunk %d.", k.op, k.H, k.D, k.N, k.C),
    "",
    ABI[k.op],
    fmt("  %d threads, %d bytes of dynamic shared memory", plan.entries[1].threads, plan.entries[1].smem),
    fmt("path: warp-specialized wgmma m64n%dk16 bf16, f32 sums (sm_90a): %d consumer warpgroups, a TMA producer warpgroup, a ring of %d stages; states as bf16 hi + lo.",
        t.bn, t.bm // 64, t.stages),
  }))
  w:line(DEV.helpers({ bf16 = true, cp_async = true }))
  w:line(WB.helpers(t.bn, true, true))
  local e = GEMM_OF[k.op]
  if k.op == "attention_chunk_state" then
    w:line(WB.mma_fn("dg_cm_mma_mm", t.bn, true, true))
  elseif k.op == "attention_chunk_out" then
    w:line(WB.mma_fn("dg_cm_mma_km", t.bn, false, true))
  else
    w:line(WB.mma_fn("dg_cm_mma_km", t.bn, false, true))
    w:line(WB.mma_fn("dg_cm_mma_kk", t.bn, false, false))
  end
  w:line(EMIT.subst(HEAD, { H = k.H, D = k.D, N = k.N, C = k.C, VH = k.VH,
                            OT = k.out == "bf16" and "unsigned short" or "float",
                            BM = t.bm, BN = t.bn, BK = t.bk, S = t.stages }))
  w:line(WB.WS_HEAD)
  w:line(WB.WS_HELPERS)
  w:line(COMMON)
  w:line(gemm(t, e, ENTRY[k.op]))
  return w:text()
end

return M

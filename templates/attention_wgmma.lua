--[[
attention_wgmma.lua — the sm_90a warpgroup path of the attention ops
(templates/attention.lua plans it, holds the math, the ABI and the
measurements, and calls M.render with its shared pieces): operands that
stream by cp.async into 128-byte-swizzled tiles (rope=pre: RoPE(xs)
already), wgmma m64nBNk16 bf16 with f32 sums (templates/wgmma_bf16.lua),
and two epilogues: the accumulator pairs stored as they are, or (grad_xs
epi=mask) the f32 tile staged through the ring and added into dxs 8
columns a thread.
]]
local EMIT = require("emit")
local DEV = require("device")
local EW = require("elementwise")
local fmt = string.format

local M = {}

local HEAD_WG = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int E = ${E};		// embd (D)
constexpr int L = ${L};		// latent (N)
typedef ${XT} XT;		// the act format's storage
typedef ${AT} AT;		// A operand storage (bf16)
typedef ${BT} BT;		// B operand storage (bf16)
typedef ${OT} OT;		// output storage

// ---- tile: BM/64 warpgroups along M, each 64 x BN; a ring of S stages
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};
constexpr int NT = (BM / 64) * 128;		// threads a block
constexpr int S = ${S}, P = S - 1;		// stages; K steps fetched ahead
constexpr bool A_KC = ${A_KC}, B_KC = ${B_KC};	// K-major (else M / N-major)
static_assert(BK == 64, "one 128-byte swizzle row of K a step");
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
constexpr int A_UNITS = BM * BK / 8, B_UNITS = BN * BK / 8;	// 16-byte chunks
constexpr int SA = (A_UNITS + NT - 1) / NT, SB = (B_UNITS + NT - 1) / NT;	// chunks a thread
]]

local KERNEL_WG = [[
extern "C" __global__ void __launch_bounds__(NT, ${MINB})
${ENTRY}(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, z = blockIdx.z;
	(void)B;
${GEO}
	(void)ra; (void)rb;
	if (skip) {
${SKIP}
		return;
	}
	const int nk = kt_end > kt_begin ? kt_end - kt_begin : 0;
	const int nsteps = NH * nk;		// (head, K step) pairs, heads outer
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;

	// Step st's A and B tiles into its stage (templates/wgmma_bf16.lua: a
	// chunk's place dg_wb_kmaj / dg_wb_mnmaj; 8 consecutive threads read one
	// 128-byte line and fill one 128-byte swizzle row).
	auto load = [&](int st) {
		const int h = st / nk, k0 = (kt_begin + st % nk) * BK;
		const unsigned short *ah = (const unsigned short *)(pa + h * a_hs);
		const unsigned short *bh = (const unsigned short *)(pb + h * b_hs);
		const unsigned as = sbase + (st % S) * STAGE, bs = as + A_BYTES;
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
			if (A_UNITS % NT != 0 && u >= A_UNITS)
				break;
			const int c = u & 7;
			if constexpr (A_KC) {	// row m = u/8, chunk c along k
				const int r = u >> 3;
				dg_wb_stage(as + dg_wb_kmaj(r, c), ah, m0 + r, M, k0 + 8 * c, K, LDA);
			} else {		// row k = (u/8)%64, 64-wide group u/512 along m
				const int kk = (u >> 3) & 63, gg = u >> 9;
				dg_wb_stage(as + dg_wb_mnmaj(gg, kk, c), ah, k0 + kk, K, m0 + 64 * gg + 8 * c, M, LDA);
			}
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT;
			if (B_UNITS % NT != 0 && u >= B_UNITS)
				break;
			const int c = u & 7;
			if constexpr (B_KC) {
				const int r = u >> 3;
				dg_wb_stage(bs + dg_wb_kmaj(r, c), bh, n0 + r, N, k0 + 8 * c, K, LDB);
			} else {
				const int kk = (u >> 3) & 63, gg = u >> 9;
				dg_wb_stage(bs + dg_wb_mnmaj(gg, kk, c), bh, k0 + kk, K, n0 + 64 * gg + 8 * c, N, LDB);
			}
		}
	};

${MAINLOOP}

${EPILOGUE}
}
]]

local MASK_CHUNK = [[
// 8 values of T as loaded, their bits (converted where used: as dg_ld
// does, so that a chunk in flight holds 4 registers of bf16, not 8).
template <typename T>
struct dg_raw8 {
	uint4 w[sizeof(T) / 2];
};

template <typename T>
__device__ __forceinline__ void dg_raw8_ld(dg_raw8<T> &r, const T *p)
{
#pragma unroll
	for (int k = 0; k < (int)(sizeof(T) / 2); ++k)
		r.w[k] = ((const uint4 *)p)[k];
}

__device__ __forceinline__ void dg_raw8_f(const dg_raw8<float> &r, float (&f)[8])
{
	const unsigned u[8] = { r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w, r.w[1].x, r.w[1].y, r.w[1].z, r.w[1].w };
#pragma unroll
	for (int j = 0; j < 8; ++j)
		f[j] = __uint_as_float(u[j]);
}

__device__ __forceinline__ void dg_raw8_f(const dg_raw8<unsigned short> &r, float (&f)[8])
{
	const unsigned u[4] = { r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w };
#pragma unroll
	for (int j = 0; j < 4; ++j) {
		f[2 * j] = __uint_as_float(u[j] << 16);
		f[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
	}
}

// 8 values stored whole: one 16-byte store of bf16, two of f32 (as dg_st,
// by __stwb: a plain vector store here reached ptxas as four 4-byte ones,
// the loads of the address being elsewhere).
__device__ __forceinline__ void dg_st8(float *p, const float (&f)[8])
{
	__stwb((float4 *)p, make_float4(f[0], f[1], f[2], f[3]));
	__stwb((float4 *)p + 1, make_float4(f[4], f[5], f[6], f[7]));
}

__device__ __forceinline__ void dg_st8(unsigned short *p, const float (&f)[8])
{
	unsigned u[4];
#pragma unroll
	for (int j = 0; j < 4; ++j)
		u[j] = (unsigned)dg_f32_to_bf16(f[2 * j]) | ((unsigned)dg_f32_to_bf16(f[2 * j + 1]) << 16);
	__stwb((uint4 *)p, make_uint4(u[0], u[1], u[2], u[3]));
}

// The inputs of columns n..n+7 of row m at L % 8 == 0 (then n % 8 == 0 and
// n + 8 <= N = L): the RoPE table's cos/sin pairs, dxs and mask_xs, one
// 16-byte access of each bf16 tensor (two of f32). Loaded apart from their
// use so that a thread's loads of several chunks are in flight together
// (EPI_STAGED): loaded and used chunk by chunk, each chunk's store to dxs
// came before the next chunk's loads, and the staged epilogue waited out
// a round trip to memory a chunk (ptxas cannot move a load of dxs above a
// store to it). Measured on an H100 (the w8a8 step, main's templates and
// these alternately, bench/results/step-train-h100-2026-12-06_epi.json):
// attention backward 4.93/4.93 -> 4.62/4.63 ms, step 21.34/21.35 ->
// 21.04/21.03, the same loss.
struct dg_mask_in {
	float4 c0, c1;		// the table's cos/sin pairs
	dg_raw8<OT> d;		// dxs
	dg_raw8<XT> x;		// mask_xs
};

__device__ __forceinline__ void dg_mask_load(dg_mask_in &in, const OT *po, const XT *pm, const float *rope,
					     int m, int n)
{
	const long long o = (long long)m * L + n;
	in.c0 = __ldg((const float4 *)(rope + o));
	in.c1 = __ldg((const float4 *)(rope + o) + 1);
	dg_raw8_ld(in.d, po + o);
	dg_raw8_ld(in.x, pm + o);
}

// The sums v turned by RoPEᵀ pair by pair, added to in's dxs and masked by
// its mask_xs, stored to dxs.
__device__ __forceinline__ void dg_mask_apply(OT *po, int m, int n, const dg_mask_in &in, const float (&v)[8])
{
	const long long o = (long long)m * L + n;
	const float cs[8] = { in.c0.x, in.c0.y, in.c0.z, in.c0.w, in.c1.x, in.c1.y, in.c1.z, in.c1.w };
	float d[8], x[8];
	dg_raw8_f(in.d, d);
	dg_raw8_f(in.x, x);
#pragma unroll
	for (int p = 0; p < 4; ++p)
		dg_mask_turn(d[2 * p], d[2 * p + 1], x[2 * p], x[2 * p + 1], make_float2(cs[2 * p], cs[2 * p + 1]),
			     v[2 * p], v[2 * p + 1]);
	dg_st8(po + o, d);
}

// Columns n..n+7 of row m (dxs at po, mask_xs at pm, of rows of L) where
// L % 8 != 0: the sums v turned by RoPEᵀ, added and masked pair by pair up
// to L (at L % 8 == 0 the staged epilogue takes dg_mask_load and
// dg_mask_apply, whole 16-byte accesses).
__device__ __forceinline__ void dg_mask_chunk(OT *po, const XT *pm, const float *rope, int m, int n,
					      const float (&v)[8])
{
	const long long o = (long long)m * L + n;
#pragma unroll
	for (int p = 0; p < 4; ++p)
		if (n + 2 * p < L)
			dg_mask_pair(po + o + 2 * p, pm + o + 2 * p, __ldg((const float2 *)(rope + o + 2 * p)),
				     v[2 * p], v[2 * p + 1]);
}
]]

-- The sm_90a path's epilogue with epi=mask: staged through the ring's
-- shared memory so that dxs and mask_xs move in whole 128-byte lines
-- (written from the accumulator layout, a thread's bf16 pair half-fills a
-- 32-byte sector: measured slower than f32 in the model).
local EPI_STAGED_T = [[
	// ---- epilogue (epi=mask), staged. Once every warpgroup's MMAs are
	// done the ring is free: the f32 tile goes into it (rows of CP floats:
	// a half-warp's float2 stores hit 32 distinct banks), then a thread
	// takes 8 consecutive columns of a row, consecutive threads along the
	// row (a warp covers whole 128-byte lines of dxs and mask_xs): RoPEᵀ
	// from the table's 16-byte loads, the add, the mask, one store.
	constexpr int CP = BN + 8, CPR = BN / 8;	// pitch; 8-column chunks a row
	static_assert(BM * CPR % NT == 0, "whole passes over the tile");
	__syncthreads();
	float *ct = (float *)(smem + (sbase - (unsigned)__cvta_generic_to_shared(smem)));
${STAGE_ACC}
	__syncthreads();
	// lanes 4..7 of each quarter-warp read their chunk's second half first,
	// so a quarter-warp's eight float4 reads hit distinct banks
	const int h0 = (lane >> 2) & 1;
	auto staged = [&](int r, int c, float (&v)[8]) {
		const float *src = ct + r * CP + c;
		const float4 a = *(const float4 *)(src + 4 * h0), b = *(const float4 *)(src + 4 - 4 * h0);
		const float4 lo = h0 ? b : a, hi = h0 ? a : b;
		v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
	};
	constexpr int ITS = BM * CPR / NT;	// chunks a thread
	if constexpr (L % 8 == 0) {
		// EB chunks at a time: their loads first (all in flight together),
		// then their sums, adds, masks and stores
		constexpr int EB = ITS % 4 == 0 ? 4 : ITS % 2 == 0 ? 2 : 1;
#pragma unroll 1
		for (int i0 = 0; i0 < ITS; i0 += EB) {
			dg_mask_in in[EB];
#pragma unroll
			for (int e = 0; e < EB; ++e) {
				const int u = tid + (i0 + e) * NT, r = u / CPR, c = u % CPR * 8;
				if (m0 + r < M && n0 + c < N)
					dg_mask_load(in[e], po, pm, rope, m0 + r, n0 + c);
			}
#pragma unroll
			for (int e = 0; e < EB; ++e) {
				const int u = tid + (i0 + e) * NT, r = u / CPR, c = u % CPR * 8;
				if (m0 + r >= M || n0 + c >= N)
					continue;
				float v[8];
				staged(r, c, v);
				dg_mask_apply(po, m0 + r, n0 + c, in[e], v);
			}
		}
	} else {
#pragma unroll 2
		for (int it = 0; it < ITS; ++it) {
			const int u = tid + it * NT, r = u / CPR, c = u % CPR * 8;
			const int m = m0 + r, n = n0 + c;
			if (m >= M || n >= N)
				continue;
			float v[8];
			staged(r, c, v);
			dg_mask_chunk(po, pm, rope, m, n, v);
		}
	}]]
-- the staged epilogue with the accumulators' store into the tile in place
local EPI_STAGED = EMIT.subst(EPI_STAGED_T,
  { STAGE_ACC = EMIT.subst(require("wgmma_bf16").STAGE_ACC, { TILE = "ct", PITCH = "CP" }) })

function M.render(spec, plan, k, sh)
  local WB = require("wgmma_bf16")
  local o, t = k.o, plan.tile
  local of = sh.operand_fmt(k, o.ot)
  local v = {
    H = k.H, E = k.E, L = k.L, XT = sh.CTYPE[k.act], AT = sh.CTYPE.bf16, BT = sh.CTYPE.bf16, OT = sh.CTYPE[of],
    BM = t.bm, BN = t.bn, BK = t.bk, S = t.stages, A_KC = tostring(o.a_kc), B_KC = tostring(o.b_kc),
  }
  -- two blocks an SM (at most 128 registers a thread) while the accumulators
  -- allow it: one block's barrier is hidden by the other's MMAs
  local minb = (t.bn <= 128 and t.bm == 128) and 2 or 1
  local entry = "dg_" .. k.op
  local sig, geo, store = sh.op_text(k)
  local about = {
    fmt("%s: heads %d, embd %d, latent %d, act %s (templates/attention.lua: the math, the ABI).",
        k.op, k.H, k.E, k.L, k.act),
    "",
    fmt("%s(%s)", entry, (sig:gsub("__restrict__ ", ""))),
    fmt("grid (ceil(%s/%d), ceil(T/%d), %s), %d threads, %d bytes of dynamic shared memory.",
        o.n, t.bn, t.bm, o.gz, (t.bm // 64) * 128, plan.entries[1].smem),
    fmt("path: warpgroup tensor cores (wgmma m64n%dk16 bf16, f32 sums; sm_90a), %d warpgroups, a ring of %d stages; A %s, B %s; rope=pre (the operands are RoPE(xs) already).",
        t.bn, t.bm // 64, t.stages, o.a_kc and "K-major" or "M-major", o.b_kc and "K-major" or "N-major"),
  }
  if k.epi_mask then
    about[#about + 1] = fmt("epi=mask: dxs (%s) = (dxs + grad_xs)·[mask_xs > 0] in place, the f32 tile staged through shared memory, 8 columns a thread.", of)
  end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "attention.lua", about))
  w:line(DEV.helpers({ bf16 = true, cp_async = true }))
  w:line(WB.helpers(t.bn, not o.a_kc, not o.b_kc))
  w:line(EMIT.subst(HEAD_WG, v))
  w:line(sh.out_helpers(of))
  if k.epi_mask then
    w:line(EW.VEC_IO)
    w:line(sh.MASK_PAIR)
    w:line(MASK_CHUNK)
  end
  w:line()
  local main = EMIT.subst(WB.MAINLOOP, { A_KC = "A_KC", A_KS = "(A_KC ? 32 : 2048)", B_KC = "B_KC",
                                     B_KS = "(B_KC ? 32 : 2048)" })
  local epi = k.epi_mask and EPI_STAGED or
    "\t// ---- epilogue: the accumulator pairs (rows g, g+8 of the warp's 16)\n" .. store .. "\n" ..
    EMIT.subst(WB.PAIRS, { MLIM = "M",
      PAIR = "\t\t\t\tstore_pair(m, n, acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]);" })
  w:line(EMIT.subst(KERNEL_WG, { ENTRY = entry, SIG = sig, GEO = geo, SKIP = o.skip or "",
                              MINB = minb, MAINLOOP = main, EPILOGUE = epi }))
  return w:text()
end

-- shared with the warp-specialized path (templates/attention_tma.lua)
M.MASK_CHUNK = MASK_CHUNK
M.EPI_STAGED = EPI_STAGED

return M

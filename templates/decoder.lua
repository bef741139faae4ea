--[[
decoder.lua — the decoder tail of BDH, forward (the head sum fused):

  out[b,0,t,d] = s · Σ_h Σ_l y[b,h,t,l] · w[d, h·L + l]

A GEMM with M = B·T rows, N = E columns and K = H·L: row m = b·T + t of A
is y[b,:,t,:] (H segments of L codes, one a head), row d of B is w[d,:].
The grid has few output tiles (M/BM · E/BN), so K is split: work item
(tile, split) sums the K steps [split·KT/nsplit, (split+1)·KT/nsplit) and
the partial sums meet in a workspace ws (M, E); a second entry converts ws
to out.

Kernel ABI (runtime/ops/ops_forward.c launches it; dragon/ref.h mirrors it in
dg_ref_decoder_fwd):

  extern "C" __global__ void dg_decoder_fwd(const YT *y, const WT *w,
      void *ws, int B, int T, int nsplit)
    grid: any number of blocks (they stride over ceil(B·T/BM)·ceil(E/BN)
    tiles × nsplit splits); block and dynamic shared memory from the launch
    info. Integer × integer: ws is int32 (nsplit, M, E): split s writes its
    exact partial sums to slice s with plain stores (every element of its
    rows < M, zeros where its K range is empty), so nothing needs zeroing
    and nothing is added atomically.
    Any float operand: ws is f32 (M, E) and written with plain stores; the
    kernel sums the whole K in one work item (split 0; other splits do
    nothing), so the result is deterministic too: pass nsplit = 1.
  extern "C" __global__ void dg_decoder_fwd_out(const void *ws,
      const float *sa, const float *sw, OT *out, long long n, int nsplit)
    n = B·T·E (a multiple of 4), 256 threads a block, any grid:
    out[i] = __fmul_rn((float)Σ_s ws[s·n + i], s) as f32 or bf16 (round half
    to even; the int32 sum of the nsplit slices is exact in any order);
    s = sa·sw (both integer), sa or sw (one), 1 (none).

    y    (B, H, T, L): i8x4 codes (int8, int4, uint8pos lanes unsigned) |
         f32 | bf16
    w    (E, H·L): int8 i8x4 | ternary (16 a word) | sign1 (32 a word) | f32 |
         bf16, packed along H·L
    y, w, ws, out 16-byte aligned; BK divides L (spec validation).

Paths
  tensor cores   both integer, BK % 32 == 0, warp tile whole 16x8 fragments
                 (templates/mma.lua): cp.async pipeline, mma.sync s8/u8;
  SIMT integer   both integer otherwise: int32 multiply-add, same ABI;
  SIMT float     any float operand: fp32 FMA, K in steps of up to 32.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local SCL = require("scales")
local fmt = string.format

local M = {}

local ACTS = { "f32", "bf16", "int8", "int4", "uint8pos" }
local WEIGHTS = { "f32", "bf16", "int8", "ternary", "sign1" }
local OUTS = { "f32", "bf16" }

local KERNEL_MMA = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int L = ${L};		// latent width per head (a head's K segment)
constexpr int E = ${E};		// model width: the N of the GEMM
constexpr int WDIV = ${WDIV};		// codes a weight storage byte
constexpr long long WROW = (long long)H * L / WDIV;	// bytes a weight row
${CONSTANTS}
constexpr int SMEM_BYTES = ${SMEM};	// dynamic

extern "C" __global__ void __launch_bounds__(NT, ${MINB})
dg_decoder_fwd(const ${YT} *__restrict__ y, const ${WT} *__restrict__ w,
	       void *__restrict__ ws_, int B, int T, int nsplit)
{
	extern __shared__ __align__(16) unsigned char smem[];
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5;
	const int M = B * T;
	int *ws = (int *)ws_;		// (nsplit, M, E) int32 partial sums
	const unsigned char *yb = (const unsigned char *)y;
	const unsigned char *wb = (const unsigned char *)w;
	const void *a_zf = y, *b_zf = w;	// valid addresses for zero-fill copies
	(void)b_zf;
	const int NTN = (E + BN - 1) / BN, NTM = (M + BM - 1) / BM;
	const long long ntile = (long long)NTN * NTM;
#pragma unroll 1
	for (long long item = blockIdx.x; item < ntile * nsplit; item += gridDim.x) {
	const long long tile = item % ntile;
	const int split = (int)(item / ntile);
	const int n0 = (int)(tile % NTN) * BN;
	const int m0 = (int)(tile / NTN) * BM;
	const int kt0 = (int)((long long)split * KT / nsplit);
	const int nkt = (int)((long long)(split + 1) * KT / nsplit) - kt0;
	// A row r: y[b, 0, t, 0] of m = m0 + r; K step kt lies in head kt·BK / L
	// (BK divides L). B row r: w row d = n0 + r.
	auto a_row = [&](int row) -> const unsigned char * {
		const int m = m0 + row;
		if (m >= M)
			return nullptr;
		const int b = m / T, t = m - b * T;
		return yb + ((long long)b * H * T + t) * L;
	};
	auto a_koff = [&](int kt) -> long long {
		const long long kg = (long long)kt * BK;
		const long long hh = kg / L;
		return hh * T * L + (kg - hh * L);
	};
	auto b_row = [&](int row) -> const unsigned char * {
		const int d = n0 + row;
		return d < E ? wb + d * WROW : nullptr;
	};
	auto b_koff = [&](int kt) -> long long { return (long long)kt * (BK / WDIV); };
${GEMM}
	// ---- this split's partial sums into its slice of the workspace (pairs)
	{
		int *slice = ws + (long long)split * M * E;
#pragma unroll
		for (int mt = 0; mt < MT; ++mt)
#pragma unroll
			for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
				for (int hh = 0; hh < 2; ++hh) {
					const int m = m0 + wr * WTM + mt * 16 + g + 8 * hh;
					const int d = n0 + wc * WTN + nt * 8 + 2 * q;	// even; E is even
					if (m < M && d < E)
						*(int2 *)(slice + (long long)m * E + d) =
							make_int2(acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
				}
	}
	__syncthreads();	// the next item's copies overwrite the shared buffers
	}
}
]]

local KERNEL_WG = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int L = ${L};		// latent width per head (a head's K segment)
constexpr int E = ${E};		// model width: the N of the GEMM
constexpr long long WROW = (long long)H * L / ${WDIV};	// bytes a weight row
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};	// block tile, K step (codes)
constexpr int NWG = BM / 64, NT = NWG * 128;	// warpgroups (64 rows each), threads
constexpr int S = ${S};				// stages; S - 2 K steps in flight
constexpr int KT = (int)((long long)H * L / BK);	// K steps of the whole reduction
constexpr int KCH = BK / 16;			// core matrices along K a row
constexpr int SBO = KCH * 128;			// bytes between 8-row core-matrix groups
constexpr int A_BYTES = BM * BK, B_BYTES = BN * BK, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int SA = BM * KCH / NT;		// A chunks a thread a step
constexpr int UB = ${UB};			// codes a B unit (16 bytes of storage)
constexpr bool STAGGER = ${STAGGER};		// K walks staggered by tile (below)
constexpr int SB = (BN * (BK / UB) + NT - 1) / NT;	// B units a thread a step

extern "C" __global__ void __launch_bounds__(NT, 1)
dg_decoder_fwd(const ${YT} *__restrict__ y, const ${WT} *__restrict__ w,
	       void *__restrict__ ws_, int B, int T, int nsplit)
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	const int M = B * T;
	int *ws = (int *)ws_;		// (nsplit, M, E) int32 partial sums
	const unsigned char *yb = (const unsigned char *)y;
	const unsigned char *wb = (const unsigned char *)w;
	const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
	const int NTN = (E + BN - 1) / BN, NTM = (M + BM - 1) / BM;
	const long long ntile = (long long)NTN * NTM;
	int acc[BN / 2];
#pragma unroll
	for (int i = 0; i < BN / 2; ++i)
		acc[i] = 0;
#pragma unroll 1
	for (long long item = blockIdx.x; item < ntile * nsplit; item += gridDim.x) {
	const long long tile = item % ntile;
	const int split = (int)(item / ntile);
	const int n0 = (int)(tile % NTN) * BN;
	const int m0 = (int)(tile / NTN) * BM;
	const int kt0 = (int)((long long)split * KT / nsplit);
	const int nkt = (int)((long long)(split + 1) * KT / nsplit) - kt0;
	int *slice = ws + (long long)split * M * E;	// this split's partial sums
	const int r0 = m0 + wg * 64 + (warp & 3) * 16 + g;
	if (nkt <= 0) {	// an empty K range: its slice is zeros
#pragma unroll
		for (int j = 0; j < BN / 8; ++j)
#pragma unroll
			for (int hh = 0; hh < 2; ++hh) {
				const int m = r0 + 8 * hh, d = n0 + 8 * j + 2 * q;
				if (m < M && d < E)
					*(int2 *)(slice + (long long)m * E + d) = make_int2(0, 0);
			}
		continue;
	}
	// Tiles of one split start their K walk at staggered steps (STAGGER),
	// so that the blocks do not all read the same weight columns (the same
	// L2 lines) at once: step i of the item is K step kstep(i). Only while
	// the weight fits in L2 (BDH 25M: 8 MB): past it, the tiles that share
	// an A or B block must read it at about the same time for L2 to serve
	// it once. Staggered at D 1280, H 16, N 16384 (a 335 MB weight), each
	// tile read its operands from DRAM: 3.8 GB a call, 1.93 ms (ncu), where
	// the operands are 0.6 GB.
	const int rot = STAGGER ? (int)(tile * nkt / ntile) : 0;
	auto kstep = [&](int i) -> int {
		const int r = i + rot;
		return kt0 + (r >= nkt ? r - nkt : r);
	};
	// A chunk u = tid + s·NT: row (u%8) of core group u/(8·KCH), chunk (u/8)%KCH
	const unsigned char *a_src[SA];
	int a_dst[SA];
#pragma unroll
	for (int s = 0; s < SA; ++s) {
		const int u = tid + s * NT;
		const int r = (u & 7) | ((u / (8 * KCH)) << 3), kc = (u >> 3) % KCH;
		const int m = m0 + r;
		a_dst[s] = (r >> 3) * SBO + kc * 128 + (r & 7) * 16;
		a_src[s] = nullptr;
		if (m < M) {
			const int b = m / T, t = m - b * T;
			a_src[s] = yb + ((long long)b * H * T + t) * L + kc * 16;
		}
	}
	// K step kt of an A row lies in head kt·BK / L (BK divides L)
	auto a_koff = [&](int kt) -> long long {
		const long long kg = (long long)kt * BK;
		const long long hh = kg / L;
		return hh * T * L + (kg - hh * L);
	};
	auto issue = [&](int kt, int stg) {
		unsigned char *base = smem + stg * STAGE_BYTES;
		const long long ao = a_koff(kt);
#pragma unroll
		for (int s = 0; s < SA; ++s)
			dg_cp16(base + a_dst[s], a_src[s] ? (const void *)(a_src[s] + ao) : (const void *)yb,
				a_src[s] ? 16 : 0);
${ISSUE_B}
	};
${B_DECODE}
	// ---- pipeline: S - 2 steps in flight; a stage is refilled two steps
	// after the MMAs that read it were issued (wait_group 1 a step).
#pragma unroll
	for (int st = 0; st < S - 2; ++st) {
		if (st < nkt)
			issue(kstep(st), st);
		dg_cp_commit();
${B_PROLOGUE}
	}
${B_PREFETCH}
#pragma unroll 1
	for (int i = 0; i < nkt; ++i) {
		dg_cp_wait<S - 3>();	// step i's copies (this thread's) have landed
		dg_fence_async_smem();	// ... and this thread's decoded stores
		__syncthreads();	// everyone's; every warpgroup's MMAs of step i-2 are done
		const int nx = i + S - 2;
		if (nx < nkt)
			issue(kstep(nx), nx % S);
		dg_cp_commit();
		{
			const unsigned st_addr = sbase + (i % S) * STAGE_BYTES;
			dg_wg_fence();
#pragma unroll
			for (int ks = 0; ks < BK / 32; ++ks)
				dg_wgmma(acc, dg_wg_desc(st_addr + wg * 8 * SBO + ks * 256, SBO),
					 dg_wg_desc(st_addr + A_BYTES + ks * 256, SBO), (i > 0 || ks > 0) ? 1 : 0);
			dg_wg_commit();
		}
${B_STEP}
		dg_wg_wait<1>();
	}
	dg_wg_wait<0>();
	dg_wg_pin(acc);
	// ---- this split's partial sums into its slice of the workspace (pairs)
	{
#pragma unroll
		for (int j = 0; j < BN / 8; ++j)
#pragma unroll
			for (int hh = 0; hh < 2; ++hh) {
				const int m = r0 + 8 * hh;
				const int d = n0 + 8 * j + 2 * q;	// even; E is even
				if (m < M && d < E)
					*(int2 *)(slice + (long long)m * E + d) =
						make_int2(acc[4 * j + 2 * hh], acc[4 * j + 2 * hh + 1]);
			}
	}
	__syncthreads();	// the next item's copies overwrite the shared buffers
	}
}
]]

local KERNEL_SIMT = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int L = ${L};		// latent width per head
constexpr int E = ${E};		// model width: the N of the GEMM
constexpr long long KTOT = (long long)H * L;	// the reduction length
constexpr int BM = ${BM}, BN = ${BN};		// block tile
constexpr int KS = ${KS};			// K elements staged a step
constexpr int WM = ${WM}, WN = ${WN};
constexpr int NT = WM * WN * 32;
constexpr int TM = BM / WM / 4, TN = BN / WN / 8;	// outputs a thread
constexpr int KT = (int)(KTOT / KS);		// K steps
constexpr int SMEM_BYTES = ${SMEM};	// dynamic: A then B, rows of KS + 1

// Element (m, kg) of A = y[b, h, t, l] (kg = h·L + l), element (d, kg) of B.
__device__ __forceinline__ ${AT} dg_a_at(const ${YT} *__restrict__ y, int T, int m, long long kg)
{
	const int b = m / T, t = m - b * T;
	const long long hh = kg / L;
	const long long i = (((long long)b * H + hh) * T + t) * L + (kg - hh * L);
	return ${A_LOAD};
}

__device__ __forceinline__ ${AT} dg_b_at(const ${WT} *__restrict__ w, int d, long long kg)
{
	const long long i = (long long)d * KTOT + kg;
	return ${B_LOAD};
}

extern "C" __global__ void __launch_bounds__(NT)
dg_decoder_fwd(const ${YT} *__restrict__ y, const ${WT} *__restrict__ w,
	       void *__restrict__ ws_, int B, int T, int nsplit)
{
	extern __shared__ __align__(16) unsigned char smem[];
	${AT} (*sa_)[KS + 1] = (${AT} (*)[KS + 1])smem;			// [BM][KS + 1]
	${AT} (*sb_)[KS + 1] = (${AT} (*)[KS + 1])(smem + BM * (KS + 1) * 4);	// [BN][KS + 1]
	${WS_T} *ws = (${WS_T} *)ws_;	// (nsplit, M, E) int32 slices | (M, E) f32
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5;
	const int lr = lane >> 3, lc = lane & 7;
	const int wr = warp / WN, wc = warp % WN;
	const int M = B * T;
	const int NTN = (E + BN - 1) / BN, NTM = (M + BM - 1) / BM;
	const long long ntile = (long long)NTN * NTM;
#pragma unroll 1
	for (long long item = blockIdx.x; item < ntile * nsplit; item += gridDim.x) {
	const long long tile = item % ntile;
	const int split = (int)(item / ntile);
	const int n0 = (int)(tile % NTN) * BN;
	const int m0 = (int)(tile / NTN) * BM;
${RANGE}
	${AT} acc[TM][TN];
#pragma unroll
	for (int i = 0; i < TM; ++i)
#pragma unroll
		for (int j = 0; j < TN; ++j)
			acc[i][j] = 0;
#pragma unroll 1
	for (int ks = kt0; ks < kt1; ++ks) {
		__syncthreads();	// the previous step's reads are done
		for (int e = tid; e < BM * KS; e += NT) {
			const int row = e / KS, kk = e - row * KS;
			const int m = m0 + row;
			sa_[row][kk] = m < M ? dg_a_at(y, T, m, (long long)ks * KS + kk) : (${AT})0;
		}
		for (int e = tid; e < BN * KS; e += NT) {
			const int row = e / KS, kk = e - row * KS;
			const int d = n0 + row;
			sb_[row][kk] = d < E ? dg_b_at(w, d, (long long)ks * KS + kk) : (${AT})0;
		}
		__syncthreads();
#pragma unroll 4
		for (int kk = 0; kk < KS; ++kk) {
			${AT} bv[TN];
#pragma unroll
			for (int j = 0; j < TN; ++j)
				bv[j] = sb_[wc * (BN / WN) + lc + 8 * j][kk];
#pragma unroll
			for (int i = 0; i < TM; ++i) {
				const ${AT} av = sa_[wr * (BM / WM) + lr + 4 * i][kk];
#pragma unroll
				for (int j = 0; j < TN; ++j)
					${MAC};
			}
		}
	}
	if (${STORE_IF}) {
#pragma unroll
		for (int i = 0; i < TM; ++i)
#pragma unroll
			for (int j = 0; j < TN; ++j) {
				const int m = m0 + wr * (BM / WM) + lr + 4 * i;
				const int d = n0 + wc * (BN / WN) + lc + 8 * j;
				if (m < M && d < E)
					${STORE};
			}
	}
	__syncthreads();	// the next item restages the shared buffers
	}
}
]]

local CONVERT = [[
// ws (nsplit slices of M·E) → out, four elements a thread a round.
extern "C" __global__ void __launch_bounds__(256)
dg_decoder_fwd_out(const void *__restrict__ ws_, const float *__restrict__ sa,
		   const float *__restrict__ sw, ${OT} *__restrict__ out, long long n, int nsplit)
{
	const ${WS_T} *ws = (const ${WS_T} *)ws_;
${PRE}
	for (long long i = ((long long)blockIdx.x * 256 + threadIdx.x) * 4; i < n;
	     i += (long long)gridDim.x * 256 * 4) {
		${WS_V} v = *(const ${WS_V} *)(ws + i);
${SUM}
${ROW}
		const float y0 = __fmul_rn(${CVT}(v.x), ${S0}), y1 = __fmul_rn(${CVT}(v.y), ${S1});
		const float y2 = __fmul_rn(${CVT}(v.z), ${S2}), y3 = __fmul_rn(${CVT}(v.w), ${S3});
${STORE}
	}
}
]]


-- The sm_90a path applies (M.plan asks): integer × integer, arch sm_90a,
-- warps WM x 1 in whole warpgroups of 64 rows (BM = 16·WM), BN 64, 128 or
-- 256, BK a multiple of 32 (64 for ternary, 128 for sign1: whole 16-byte
-- storage units), 3 to 8 stages, the stages within 227 KiB.
local function wgmma_fits(k, t)
  local unit = k.weight == "ternary" and 64 or (k.weight == "sign1" and 128 or 32)
  return k.arch == 90 and k.arch_specific and k.ints and
    t.wn == 1 and t.wm % 4 == 0 and t.wm <= 16 and t.bm == 16 * t.wm and
    (t.bn == 64 or t.bn == 128 or t.bn == 256) and t.bk % unit == 0 and t.stages >= 3 and t.stages <= 8 and
    t.stages * (t.bm + t.bn) * t.bk <= 227 * 1024
end

local function render_wg(H, L, E, act, weight, fa, fw, bm, bn, bk, stages, nt, smem)
  local WG = require("wgmma")
  local MMA = require("mma")
  local wdiv = FM.i8x4_words(weight)
  local v = { H = H, L = L, E = E, WDIV = wdiv, BM = bm, BN = bn, BK = bk, S = stages,
              YT = fa.ctype, WT = fw.ctype, UB = weight == "ternary" and 64 or (weight == "sign1" and 128 or 16),
              -- the weight's bytes within 16 MiB (a third of the H200's L2)
              STAGGER = (E * H * L // wdiv <= 16 * 1024 * 1024) and "true" or "false",
              ISSUE_B = "", B_DECODE = "", B_PROLOGUE = "", B_PREFETCH = "", B_STEP = "" }
  if weight ~= "ternary" and weight ~= "sign1" then
    v.ISSUE_B = [[
		const long long bo = (long long)kt * BK;
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT;
			if (u < BN * KCH) {
				const int p = (u & 7) | ((u / (8 * KCH)) << 3), kc = (u >> 3) % KCH;
				const int d = n0 + p;
				dg_cp16(base + A_BYTES + (p >> 3) * SBO + kc * 128 + (p & 7) * 16,
					d < E ? (const void *)(wb + d * WROW + bo + kc * 16) : (const void *)wb, d < E ? 16 : 0);
			}
		}]]
  else
    local dec = WG.unit_decoder(weight)
    v.B_DECODE = EMIT.subst([[
	// B: packed weight units (16 bytes, UB codes) loaded to registers one
	// step ahead, decoded to s8 core-matrix rows after the step's MMAs issue.
	// Unit u = tid + s·NT: row (u%8) of core group u/(8·UPR), unit (u/8)%UPR.
	constexpr int UPR = BK / UB;
	uint4 rb[SB];
	auto b_load = [&](int kt) {
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT;
			rb[s] = make_uint4(0u, 0u, 0u, 0u);
			if (u < BN * UPR) {
				const int p = (u & 7) | ((u / (8 * UPR)) << 3), c = (u >> 3) % UPR;
				const int d = n0 + p;
				if (d < E)
					rb[s] = __ldg((const uint4 *)(wb + d * WROW + (long long)kt * (BK / ${WDIV}) + c * 16));
			}
		}
	};
	auto b_store = [&](int stg) {
		unsigned char *dst = smem + stg * STAGE_BYTES + A_BYTES;
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT;
			if (u < BN * UPR) {
				const int p = (u & 7) | ((u / (8 * UPR)) << 3), c = (u >> 3) % UPR;
				unsigned char *o = dst + (p >> 3) * SBO + c * (UB / 16) * 128 + (p & 7) * 16;
${DEC}
			}
		}
	};]], { DEC = dec, WDIV = wdiv })
    v.B_PROLOGUE = [[
		if (st < nkt) {
			b_load(kstep(st));
			b_store(st);
		}]]
    v.B_PREFETCH = "\tif (S - 2 < nkt)\n\t\tb_load(kstep(S - 2));"
    v.B_STEP = [[
		if (nx < nkt) {
			b_store(nx % S);	// stage nx % S was read by step i-2's MMAs: done
			if (nx + 1 < nkt)
				b_load(kstep(nx + 1));
		}]]
  end
  local main = MMA.helpers({ decode = false }, fa.unsigned) .. "\n" .. WG.helpers(bn, fa.unsigned) .. "\n" ..
    (weight == "ternary" and (WG.decoders .. "\n") or "") .. EMIT.subst(KERNEL_WG, v)
  local about = fmt("integer × integer on warpgroup tensor cores (sm_90a): wgmma m64n%dk32 %s.s8, %d stages "
    .. "(%d K steps in flight)%s, split-K into int32 slices", bn, FM.mma_type(act), stages, stages - 2,
    (weight == "ternary" or weight == "sign1") and (", " .. weight .. " weights decoded to s8 in shared memory") or "")
  return main, about
end

-- ---- the warp-specialized form (sm_90a, int8 weights, 8-bit codes) ------
-- A producer warpgroup (the block's last) walks the block's work items
-- (tile, split) and their K steps, and loads each step's A (64 rows of y
-- codes a box: (b, t) rows of one b, 128 codes of one head) and B (BN
-- weight rows, 128 codes) by TMA into a ring of S stages with the 128-byte
-- swizzle; the consumer warpgroups wait on a stage's full mbarrier, run
-- four wgmma m64nBNk32 on it (K-major descriptors, the swizzle's: layout
-- type 1, 1024 bytes between 8-row groups, a k32 step 32 bytes further),
-- and free it on its empty one once those MMAs completed (one step in
-- flight across the wait). Each item's int32 sums go to its slice as the
-- ring path's do, while the producer is already loading the next item's
-- steps. The kernel takes two tensor maps after (B, T, nsplit), made by
-- runtime/ops/decoder.c: ma over y (L, T, B·H) bytes, boxes 128 x 64; mb
-- over w (H·L, E, 1), boxes 128 x BN. It needs T % 64 == 0 (a box's 64
-- rows within one b): at another T the runtime takes the ring's tile.
local function ws_applies(k)
  return k.arch == 90 and k.arch_specific and k.weight == "int8" and (k.act == "int8" or k.act == "uint8pos")
end

-- Its tiles: WN 1, WM 4 or 8 (BM 64 or 128), BN 64 | 128 | 256, BK 128
-- (one 128-byte swizzle row of codes a step), 5 to 8 stages (which name
-- the form, as the bf16 GEMMs' warp-specialized tiles do); the ring, its
-- mbarriers and 1 KiB of alignment within 227 KiB.
local function ws_smem(t)
  return t.stages * (t.bm + t.bn) * t.bk + 16 * t.stages + 1024
end

local function ws_fits(k, t)
  return ws_applies(k) and t.wn == 1 and (t.wm == 4 or t.wm == 8) and t.bm == 16 * t.wm and
    (t.bn == 64 or t.bn == 128 or t.bn == 256) and t.bk == 128 and t.stages >= 5 and t.stages <= 8 and
    ws_smem(t) <= 227 * 1024
end

local KERNEL_WS = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int L = ${L};		// latent width per head (a head's K segment)
constexpr int E = ${E};		// model width: the N of the GEMM
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};	// block tile, K step (codes)
constexpr int NCW_ = BM / 64, NT = NCW_ * 128;	// consumer warpgroups, their threads
constexpr int S = ${S};				// stages
constexpr int KT = (int)((long long)H * L / BK);	// K steps of the whole reduction
constexpr int A_BYTES = BM * BK, B_BYTES = BN * BK, STAGE = A_BYTES + B_BYTES;
static_assert(BK == 128 && L % BK == 0, "a step is one 128-byte swizzle row of one head's codes");
${WS_HEAD}
${WS_HELPERS}
${SW_DESC}
extern "C" __global__ void __launch_bounds__(NTB, 1)
dg_decoder_fwd(const ${YT} *__restrict__ y, const ${WT} *__restrict__ w,
	       void *__restrict__ ws_, int B, int T, int nsplit,
	       const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb)
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	const int M = B * T;
	int *ws = (int *)ws_;		// (nsplit, M, E) int32 partial sums
	(void)y;
	(void)w;
	const int NTN = (E + BN - 1) / BN, NTM = (M + BM - 1) / BM;
	const long long ntile = (long long)NTN * NTM, nitem = ntile * nsplit;
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more);
	// the barriers after the ring: full[S] (the producer's expect_tx and the
	// bytes), then empty[S] (every consumer thread)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;
	const unsigned bars = sbase + S * STAGE;
${RING_START}
			int i = 0;	// the block's step, over all its items
#pragma unroll 1
			for (long long item = blockIdx.x; item < nitem; item += gridDim.x) {
				const long long tile = item % ntile;
				const int split = (int)(item / ntile);
				const int n0 = (int)(tile % NTN) * BN, m0 = (int)(tile / NTN) * BM;
				const int kt0 = (int)((long long)split * KT / nsplit);
				const int nkt = (int)((long long)(split + 1) * KT / nsplit) - kt0;
#pragma unroll 1
				for (int j = 0; j < nkt; ++j, ++i) {
					const int s = i % S;
					const unsigned full = bars + 8 * s, as = sbase + s * STAGE, bs = as + A_BYTES;
					// the stage's previous use (step i - S) released by every consumer
					dg_mbar_wait(bars + 8 * (S + s), ((i / S) & 1) ^ 1);
					dg_mbar_expect_tx(full, TX);
					const int kg = (kt0 + j) * BK, hh = kg / L, l0 = kg - hh * L;
#pragma unroll
					for (int gg = 0; gg < BM / 64; ++gg) {	// rows m0 + 64gg ..: one b's (past M: zeros)
						const int m = m0 + 64 * gg, b = m / T, t = m - b * T;
						dg_tma_load(as + 8192 * gg, &ma, full, l0, t, b * H + hh);
					}
					dg_tma_load(bs, &mb, full, kg, n0, 0);	// w rows n0 .. n0 + BN - 1 (past E: zeros)
				}
			}
		}
		return;
	}

	// ---- the consumers: warpgroup wg, rows wg·64 .. +63 of each tile
	if constexpr (REG_MOVE)
		dg_reg_alloc<REG_C>();
	int acc[BN / 2];
	int i = 0;
#pragma unroll 1
	for (long long item = blockIdx.x; item < nitem; item += gridDim.x) {
		const long long tile = item % ntile;
		const int split = (int)(item / ntile);
		const int n0 = (int)(tile % NTN) * BN, m0 = (int)(tile / NTN) * BM;
		const int kt0 = (int)((long long)split * KT / nsplit);
		const int nkt = (int)((long long)(split + 1) * KT / nsplit) - kt0;
#pragma unroll
		for (int r = 0; r < BN / 2; ++r)
			acc[r] = 0;
#pragma unroll 1
		for (int j = 0; j < nkt; ++j, ++i) {
			const int s = i % S;
			dg_mbar_wait(bars + 8 * s, (i / S) & 1);
			const unsigned as = sbase + s * STAGE + wg * 8192, bs = sbase + s * STAGE + A_BYTES;
			dg_wg_fence();
#pragma unroll
			for (int ks = 0; ks < BK / 32; ++ks)
				dg_wgmma(acc, dg_sw_desc(as + 32 * ks), dg_sw_desc(bs + 32 * ks), 1);
			dg_wg_commit();
			// step i-1's MMAs done: its stage is free (a step of this item)
			dg_wg_wait<1>();
			dg_wg_pin(acc);
			if (j > 0)
				dg_mbar_arrive(bars + 8 * (S + (i - 1) % S));
		}
		dg_wg_wait<0>();
		dg_wg_pin(acc);
		if (nkt > 0)	// the item's last step
			dg_mbar_arrive(bars + 8 * (S + (i - 1) % S));
		// ---- this split's partial sums into its slice (pairs; an empty K
		// range writes zeros)
		int *slice = ws + (long long)split * M * E;
		const int r0 = m0 + wg * 64 + (warp & 3) * 16 + g;
#pragma unroll
		for (int jn = 0; jn < BN / 8; ++jn)
#pragma unroll
			for (int hr = 0; hr < 2; ++hr) {
				const int m = r0 + 8 * hr, d = n0 + 8 * jn + 2 * q;	// d even; E is even
				if (m < M && d < E)
					*(int2 *)(slice + (long long)m * E + d) = make_int2(acc[4 * jn + 2 * hr], acc[4 * jn + 2 * hr + 1]);
			}
	}
}
]]

local function render_ws(H, L, E, act, fa, fw, t)
  local WG = require("wgmma")
  local WB = require("wgmma_bf16")
  local main = WG.helpers(t.bn, fa.unsigned) .. "\n" .. EMIT.subst(KERNEL_WS, {
    H = H, L = L, E = E, BM = t.bm, BN = t.bn, BK = t.bk, S = t.stages, YT = fa.ctype, WT = fw.ctype,
    WS_HEAD = WB.WS_HEAD, WS_HELPERS = WB.WS_HELPERS, SW_DESC = WG.SW_DESC,
    RING_START = EMIT.subst(WB.RING_START, { EMPTY_COUNT = "NT", INIT_SYNC = "__syncthreads();" }) })
  local about = fmt("integer × integer, warp-specialized (sm_90a): a TMA producer warpgroup, %d consumer warpgroups "
    .. "of wgmma m64n%dk32 %s.s8, a ring of %d stages with full/empty mbarriers; two tensor maps follow nsplit "
    .. "(T %% 64 == 0); split-K into int32 slices", t.bm // 64, t.bn, FM.mma_type(act), t.stages)
  return main, about
end

local function fields(spec)
  SPEC.check(spec.op == "decoder_fwd", "decoder.lua renders op decoder_fwd, not %s", tostring(spec.op))
  local k = {}
  k.H = SPEC.int_field(spec, "heads", 1)
  k.E = SPEC.int_field(spec, "embd", 4)
  k.L = SPEC.int_field(spec, "latent", 1)
  k.act = SPEC.one_of(spec, "act", ACTS)
  k.weight = SPEC.one_of(spec, "weight", WEIGHTS)
  k.out = SPEC.one_of(spec, "out", OUTS)
  k.arch = SPEC.int_field(spec, "arch", 1)
  k.arch_specific = spec.arch_specific == true
  k.fa, k.fw = FM.formats[k.act], FM.formats[k.weight]
  k.ints = k.fa.code and k.fw.code
  return k
end

-- The heuristic default tile (sweeps on the H200, BDH shape, M = 4096):
--   wgmma (sm_90a): two warpgroups of 64 rows, all 256 columns of BDH's E,
--     K in 128-code steps, 4 stages — ternary 128x256x128/8x1/4 123 us;
--     128x256x64/8x1/6 129, 256x128x64/16x1/6 148;
--   tensor cores 64x128x64/2x2/4 (4 warps, several blocks an SM): 152 us
--     int8 weights; 128x64 205, 128x128/2x4/3 193, 128x128 239,
--     128x256/4x4 269, 64x256 252;
--   SIMT: 64x64 blocks of 2x2 warps, BK the largest step up to 64 (codes)
--     or 32 (floats) that divides L and whole storage words.
-- The warp-specialized form as the default where it applies (int8
-- weights, 8-bit codes, L % 128 == 0; bench/kernels on the H200, BDH
-- shape, M = 4096, int8 · int8 → bf16): 64x256x128/4x1/5, one consumer
-- warpgroup of 128 accumulators a thread, 201 KiB, 67.2 us; 128x128x128/
-- 8x1/6 75.7 us; the 4-stage wgmma tile above 185.9 us (cuBLASLt bf16
-- 105.4). Where E < 256, 128x128x128/8x1/6. A T that is not a multiple of
-- 64 runs the same tile on the 4-stage path (dg__tma_rows_tile).
local WS_DEFAULT = true

local function default_tile(k)
  local L = k.L
  if WS_DEFAULT and ws_applies(k) and L % 128 == 0 then
    if k.E >= 256 then
      return { bm = 64, bn = 256, bk = 128, wm = 4, wn = 1, stages = 5, threads = 0 }
    end
    return { bm = 128, bn = 128, bk = 128, wm = 8, wn = 1, stages = 6, threads = 0 }
  end
  if k.ints and k.arch == 90 and k.arch_specific then
    local t = { bm = 128, bn = k.E >= 256 and 256 or (k.E > 64 and 128 or 64),
                bk = L % 128 == 0 and 128 or (L % 64 == 0 and 64 or 32), wm = 8, wn = 1, stages = 4, threads = 0 }
    if L % t.bk == 0 and wgmma_fits(k, t) then return t end
  end
  if k.ints and k.arch >= 80 and L % 32 == 0 then
    return { bm = 64, bn = 128, bk = L % 64 == 0 and 64 or 32, wm = 2, wn = 2, stages = 4, threads = 0 }
  end
  local cpw = math.max(4, FM.codes_per_word(k.act), FM.codes_per_word(k.weight))
  local bk = k.ints and 64 or 32
  while L % bk ~= 0 and bk > cpw do bk = bk // 2 end
  return { bm = 64, bn = 64, bk = bk, wm = 2, wn = 2, stages = 2, threads = 0 }
end

local function plan_of(t, path, arch_specific, nt, smem)
  return { tile = t, path = path, arch_specific = arch_specific, name = "decoder_fwd.cu", smem_bytes = smem,
           entries = { { name = "dg_decoder_fwd", threads = nt, smem = smem },
                       { name = "dg_decoder_fwd_out", threads = 256, smem = 0 } } }
end

function M.plan(spec)
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
  ok, err = TILES.bk_divides(t, auto, k.L, "latent")
  if not ok then return nil, err end
  if ws_fits(k, t) then
    return plan_of(t, "wgmma tma", true, t.bm // 64 * 128 + 128, ws_smem(t))
  end
  if wgmma_fits(k, t) then
    -- each warpgroup holds a 64 x BN int32 accumulator: BN/2 registers a
    -- thread, plus about 32 for addresses and the pipeline, under the
    -- register file's share of a thread at this block size
    local nt = t.bm // 64 * 128
    local cap = math.min(255, 65536 // nt)
    if t.bn // 2 + 32 > cap then
      return TILES.refuse(t, auto, "the warpgroup path holds BN/2 = %d accumulators a thread; at %d threads a thread gets at most %d registers (BM <= 128 or BN <= 128)",
                      t.bn // 2, nt, cap)
    end
    return plan_of(t, "wgmma", true, nt, t.stages * (t.bm + t.bn) * t.bk)
  end
  ok, err = TILES.warps_ok(t, auto)
  if ok then ok, err = TILES.simt_warp_tile(t, auto) end
  if ok then ok, err = TILES.stages_ok(t, auto, 1, 4) end
  if not ok then return nil, err end
  local MMA = require("mma")
  if k.ints and MMA.fits(k.arch, t.bm, t.bn, t.bk, t.wm, t.wn) then
    local acc = (t.bm // t.wm) * (t.bn // t.wn) // 32
    local afrag = (t.bm // t.wm // 16) * 2 * (t.bk % 64 == 0 and 4 or 2)
    if acc + afrag > 128 then
      return TILES.refuse(t, auto, "the tensor-core path needs %d accumulator and %d fragment registers a thread; at most 128 (more warps or a smaller tile)",
                      acc, afrag)
    end
    local smem = MMA.plan(t.bm, t.bn, t.bk, t.wm, t.wn, t.stages, k.weight).pipe
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    return plan_of(t, "mma.sync", false, t.wm * t.wn * 32, smem)
  end
  local smem = (t.bm + t.bn) * (math.min(t.bk, 32) + 1) * 4
  ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
  if not ok then return nil, err end
  return plan_of(t, "simt", false, t.wm * t.wn * 32, smem)
end

function M.render(spec, plan)
  local k = fields(spec)
  local H, E, L, act, weight, out, fa, fw = k.H, k.E, k.L, k.act, k.weight, k.out, k.fa, k.fw
  local t = plan.tile
  local bm, bn, bk, wm, wn, stages = t.bm, t.bn, t.bk, t.wm, t.wn, t.stages
  local int_path = k.ints
  local MMA = require("mma")
  local use_wg = plan.path == "wgmma"
  local use_mma = plan.path == "mma.sync"

  local helpers = { bf16 = (out == "bf16" or act == "bf16" or weight == "bf16") or nil }
  local w = EMIT.writer()
  local main, about, launch_main, smem, nt
  if plan.path == "wgmma tma" then
    nt, smem = plan.entries[1].threads, plan.smem_bytes
    main, about = render_ws(H, L, E, act, fa, fw, t)
  elseif use_wg then
    nt, smem = plan.entries[1].threads, plan.smem_bytes
    main, about = render_wg(H, L, E, act, weight, fa, fw, bm, bn, bk, stages, nt, smem)
    helpers.sign1 = (weight == "sign1") or nil
  elseif use_mma then
    local p = MMA.plan(bm, bn, bk, wm, wn, stages, weight)
    local wdiv = FM.i8x4_words(weight)
    smem = plan.smem_bytes
    nt = plan.entries[1].threads
    FM.decoders(weight, helpers)
    main = MMA.helpers(p, fa.unsigned) .. "\n" .. EMIT.subst(KERNEL_MMA, {
      H = H, L = L, E = E, WDIV = wdiv, CONSTANTS = MMA.constants(p, H * L), SMEM = smem,
      MINB = (p.nt <= 256 and 2 * (smem + 1024) <= 227 * 1024) and 2 or 1,
      YT = fa.ctype, WT = fw.ctype, GEMM = MMA.gemm(p),
    })
    about = fmt("integer × integer on tensor cores: mma.sync m16n8k32 %s.s8 (%d stages, row stride %d), "
      .. "split-K into int32 slices", FM.mma_type(act), p.stages, p.rs)
  else
    local ks = math.min(bk, 32)
    nt = plan.entries[1].threads
    smem = plan.smem_bytes
    local v = { H = H, L = L, E = E, BM = bm, BN = bn, KS = ks, WM = wm, WN = wn, SMEM = smem,
                YT = fa.ctype, WT = fw.ctype }
    if int_path then
      v.AT = "int"
      v.WS_T = "int"
      v.MAC = "acc[i][j] += av * bv[j]"
      v.STORE = "ws[(long long)split * M * E + (long long)m * E + d] = acc[i][j]"
      v.STORE_IF = "true"	-- every split writes its slice, zeros included
      v.RANGE = [[
	const int kt0 = (int)((long long)split * KT / nsplit);
	const int kt1 = (int)((long long)(split + 1) * KT / nsplit);]]
    else
      v.AT = "float"
      v.WS_T = "float"
      v.MAC = "acc[i][j] = fmaf(av, bv[j], acc[i][j])"
      v.STORE = "ws[(long long)m * E + d] = acc[i][j]"
      v.STORE_IF = "kt1 > kt0"	-- split 0 alone (nsplit = 1)
      v.RANGE = [[
	// float sums: one work item sums the whole K (split 0), so the result
	// does not depend on nsplit
	const int kt0 = 0, kt1 = split == 0 ? KT : 0;]]
    end
    if fa.code then
      v.A_LOAD = fa.unsigned and "(" .. v.AT .. ")((const unsigned char *)y)[i]"
        or "(" .. v.AT .. ")((const signed char *)y)[i]"
    elseif act == "bf16" then
      v.A_LOAD = "dg_bf16_to_f32(y[i])"
    else
      v.A_LOAD = "y[i]"
    end
    if weight == "int8" then
      v.B_LOAD = "(" .. v.AT .. ")((const signed char *)w)[i]"
    elseif weight == "ternary" then
      v.B_LOAD = "(" .. v.AT .. ")dg_tern_at(w, i)"
      helpers.tern_at = true
    elseif weight == "sign1" then
      v.B_LOAD = "(" .. v.AT .. ")((w[i >> 5] >> (i & 31)) & 1u ? 1 : -1)"
    elseif weight == "bf16" then
      v.B_LOAD = "dg_bf16_to_f32(w[i])"
    else
      v.B_LOAD = "w[i]"
    end
    main = EMIT.subst(KERNEL_SIMT, v)
    about = int_path and "integer × integer, SIMT: int32 multiply-add, split-K into int32 slices"
      or "float (SIMT): operands converted to f32, fp32 FMA, K unsplit (deterministic)"
  end

  -- the convert entry
  local cv = { OT = FM.out_types[out].ctype }
  if int_path then
    cv.WS_T, cv.WS_V, cv.CVT = "int", "int4", "__int2float_rn"
    cv.SUM = [[
		for (int sp = 1; sp < nsplit; ++sp) {	// exact int32 sums of the slices
			const int4 u = *(const int4 *)(ws + sp * n + i);
			v.x += u.x;
			v.y += u.y;
			v.z += u.z;
			v.w += u.w;
		}]]
  else
    cv.WS_T, cv.WS_V, cv.CVT = "float", "float4", ""
    cv.SUM = "\t\t(void)nsplit;	// one f32 slice"
  end
  -- the scales: per launch, or per row m = i / E (token b·T + t) and per
  -- column d = i % E (channel); E % 4 == 0, so i..i+3 share a row
  local sc = SCL.scale_kind(spec, fa, fw)
  local pre = SCL.scale_prologue(sc)
  cv.PRE = #pre > 0 and ("\t" .. table.concat(pre, "\n\t")) or "\t(void)sa;\n\t(void)sw;"
  local rl = {}
  if sc.vec then
    rl[#rl + 1] = "\t\tconst long long m = i / E;	// the row: token b·T + t"
    rl[#rl + 1] = "\t\tconst int d = (int)(i - m * E);	// the column: channel d"
  end
  if sc.sa_vec then rl[#rl + 1] = "\t\tconst float sa_m = sa[m];" end
  cv.ROW = table.concat(rl, "\n")
  for j = 0, 3 do
    cv["S" .. j] = SCL.scale_expr(sc, "sa_m", fmt("sw[d + %d]", j)) or "1.0f"
  end
  if out == "f32" then
    cv.STORE = "\t\t*(float4 *)(out + i) = make_float4(y0, y1, y2, y3);"
  else
    cv.STORE = "\t\t*(uint2 *)(out + i) = make_uint2((unsigned)dg_f32_to_bf16(y0) | ((unsigned)dg_f32_to_bf16(y1) << 16),\n"
      .. "\t\t\t\t\t      (unsigned)dg_f32_to_bf16(y2) | ((unsigned)dg_f32_to_bf16(y3) << 16));"
  end

  local tern_at = [[
// Ternary code i of a packed row-major stream (00 0, 01 +1, 11 -1, 10 0).
__device__ __forceinline__ int dg_tern_at(const unsigned *__restrict__ w, long long i)
{
	const unsigned c = (w[i >> 4] >> (2 * (i & 15))) & 3u;
	return c == 1u ? 1 : (c == 3u ? -1 : 0);
}
]]
  local want_tern_at = helpers.tern_at
  helpers.tern_at = nil
  w:line(EMIT.banner(spec, "decoder.lua", {
    "decoder_fwd: out[b,0,t,d] = s · Σ_h Σ_l y[b,h,t,l] · w[d, h·L + l]",
    "",
    fmt("extern \"C\" __global__ void dg_decoder_fwd(const %s *y, const %s *w, void *ws, int B, int T, int nsplit%s)",
        fa.ctype, fw.ctype, plan.path == "wgmma tma" and ", const dg_tmap ma, const dg_tmap mb" or ""),
    fmt("extern \"C\" __global__ void dg_decoder_fwd_out(const void *ws, const float *sa, const float *sw, %s *out, long long n, int nsplit)",
        cv.OT),
    fmt("y (B, %d, T, %d) %s; w (%d, %d) %s; ws (B·T, %d) %s; out (B, 1, T, %d) %s.", H, L, act, E, H * L,
        weight, E, int_path and "int32, a slice a split" or "f32", E, out),
    fmt("tile %dx%dx%d/%dx%d/%d: block %d threads, %d bytes of dynamic shared memory.", bm, bn, bk, wm, wn,
        stages, nt, smem),
    "path: " .. about .. ".",
  }))
  w:line(DEV.helpers(helpers))
  if want_tern_at then w:line(tern_at) end
  w:line(main)
  w:line(EMIT.subst(CONVERT, cv))
  return w:text()
end

return M

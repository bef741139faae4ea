--[[
loss_tc.lua — lmhead_ce on tensor cores: the path loss.lua takes for a
large vocabulary (M.applies), where a row of logits no longer fits beside
others in shared memory and the fused-rows kernel's CUDA-core dot products
(one row a block at V 50304) cost hundreds of milliseconds a step. The
logits are never stored, in f32 or otherwise (llm.c's fused classifier is
the model): the lm_head GEMM runs twice, once for the softmax's statistics
and once, with the log-sum-exp known, for dlogits, which its epilogue
writes in bf16 as the two weight/input GEMMs' operand.

  extern "C" __global__ void dg_lmhead_ce_cast(const XT *x, const WT *w,
      bf16 *xb, bf16 *wb, long long rows)
    xb (rows, E) = bf16(x); wb (E, VP) = bf16(w), its columns V..VP-1
    zero (VP: V rounded up to 8, so every row of wb and dlogits starts
    16-byte aligned). Round half to even, NaN kept.
  dg_lmhead_ce(xb, wb, targets, stats, zt, rows)
    z = xb·wb on a 128x128 tile (K = E); per row of the tile the max m
    and s = Σ exp(z − m) over its valid columns (< V) from the f32
    accumulators, stats[r][tile] = (m, s) (NTV = ceil(V / 128) tiles a
    row); zt[r] = z[r][t] (t = targets[r]) by the one tile that holds it.
  dg_lmhead_ce_rows(stats, zt, targets, row_loss, lse, rows, bad)
    a warp a row: (m, s) of the tiles combined in order, lse = m + log s,
    row_loss = lse − zt (0 for a target outside 0..V-1, which sets *bad).
  dg_lmhead_ce_loss(row_loss, rows, loss)                  (loss.lua's)
  dg_lmhead_ce_dlogits(xb, wb, targets, lse, dlogits, rows, inv_rows,
      grad_scale)
    z again; dlogits[r][c] = (exp(z − lse[r]) − [c == t])·inv_rows
    (·*grad_scale), bf16, 0 for a bad target's row and the columns V..VP-1.
  dg_lmhead_ce_dx(dlogits, wb, out, rows, splits)
    dx (rows, E) = dlogits·wbᵀ (K = VP); grid z = splits of the K tiles
    (splits 1: into dx; more: the parts (splits, rows, E) f32, which
  dg_lmhead_ce_dx_sum(part, dx, rows, splits)
    sums in order p = 0, 1, ...).
  dg_lmhead_ce_dw(xb, dlogits, dw, rows, accumulate)
    dw (E, V) (accumulate: +)= xbᵀ·dlogits (K = rows).

The GEMM (dg_lt_gemm): C[m][n] = Σ_k A[m][k]·B[n][k] on a 128x128 tile,
BK 32, 8 warps (2 along M by 4 along N, a warp 64x32), mma.sync m16n8k16
bf16 with f32 sums, a 3-stage cp.async ring (16-byte chunks, zero-filled
past the edges). Each operand is K-major (its rows along K: xb in the
logits, dlogits and wb in dx) or MN-major (rows along K, each holding
consecutive m or n: wb in the logits, xb and dlogits in dw); ldmatrix
(.trans for MN-major) reads the fragments. Shared rows are padded (K-major
40 bf16, MN-major 136) so the eight rows of an ldmatrix phase fall on
distinct banks. Every sum has a fixed order (k ascending within a block,
the splits in order): the results are bitwise the same run to run.

Precision: x and w are rounded to bf16 (as torch's autocast does for the
lm_head), products exact, sums f32; the loss comes from the f32 logits;
the GEMM epilogues' exponentials are __expf (ex2.approx: a few ulp, below
the bf16 rounding of dlogits; the row combination keeps expf); dlogits is
rounded to bf16 for the two GEMMs that read it.

Occupancy: the GEMM entries are bounded to 128 registers (two blocks of 8
warps an SM, 60 KiB of ring each); at 135 the statistics kernel ran one
block an SM and took 1.42 ms at R 4096, V 50304 on the H200 (ncu), where
dlogits, the same GEMM at two blocks, took 0.93. ncu put the epilogues'
ALU work (expf then) above the tensor pipe's.
]]
local EMIT = require("emit")
local FM = require("formats")
local ABSUM = require("absum")
local fmt = string.format

local M = {}

-- The smallest vocabulary the path takes for a bf16 input; an f32 input
-- keeps the fused-rows kernel (f32 logits, exact as the reference) up to
-- llm.c's padded GPT-2 vocabulary (a row of 4096 + 50304 floats still fits
-- an sm_90 block) and comes here only past it. E a multiple of 8 (16-byte
-- rows of xb), and sm_80.
M.MIN_V_BF16 = 4096
M.MAX_V_F32_ROWS = 50304
local TILE, BK, STAGES, NT = 128, 32, 3, 256
local KM_LD, MN_LD = BK + 8, TILE + 8
M.SMEM = STAGES * 2 * math.max(TILE * KM_LD, BK * MN_LD) * 2

function M.applies(E, V, src)
  if E % 8 ~= 0 then return false end
  if src == "bf16" then return V >= M.MIN_V_BF16 end
  return V > M.MAX_V_F32_ROWS
end

-- dg_lmhead_ce (the op's first entry, by the templates' rule) is the
-- statistics GEMM; the cast runs before it.
M.ENTRIES = { "dg_lmhead_ce", "dg_lmhead_ce_cast", "dg_lmhead_ce_rows", "dg_lmhead_ce_loss",
              "dg_lmhead_ce_dlogits", "dg_lmhead_ce_dx", "dg_lmhead_ce_dx_sum", "dg_lmhead_ce_dw" }

local GEMM = [[
constexpr int VP = (V + 7) / 8 * 8;	// a row of wb and dlogits, in bf16
constexpr int NTV = (V + 127) / 128;	// tiles of 128 columns a row of logits
constexpr int GT = ${TILE}, GBK = ${BK}, GST = ${STAGES}, GNT = ${NT};
constexpr int KM_LD = ${KM_LD}, MN_LD = ${MN_LD};
constexpr int GSTAGE = (GT * KM_LD > GBK * MN_LD ? GT * KM_LD : GBK * MN_LD);	// bf16 an operand a stage
typedef unsigned short bf16;

__device__ __forceinline__ void dg_lt_cp16(void *dst, const void *src, bool ok)
{
	const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}

// One operand's tile of a K step into shared memory: K-major (GT rows of
// ld elements, the step's GBK along each) or MN-major (GBK rows k of ld
// elements, GT consecutive m/n in each). rows: the m/n extent; K: the
// reduction's. 512 chunks of 16 bytes, two a thread.
template <bool KMAJ>
__device__ __forceinline__ void dg_lt_stage(bf16 *s, const bf16 *__restrict__ g, long long ld, long long r0,
					    long long rows, long long k0, long long K)
{
#pragma unroll
	for (int j = 0; j < 2; ++j) {
		const int c = threadIdx.x + j * GNT;
		if (KMAJ) {
			const int row = c >> 2, kc = (c & 3) * 8;
			const bool ok = r0 + row < rows && k0 + kc < K;
			dg_lt_cp16(s + row * KM_LD + kc, ok ? g + (r0 + row) * ld + k0 + kc : g, ok);
		} else {
			const int row = c >> 4, mc = (c & 15) * 8;
			const bool ok = k0 + row < K && r0 + mc < rows;
			dg_lt_cp16(s + row * MN_LD + mc, ok ? g + (k0 + row) * ld + r0 + mc : g, ok);
		}
	}
}

__device__ __forceinline__ void dg_lt_ldm(unsigned r[4], const bf16 *p)
{
	const unsigned a = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void dg_lt_ldm_t(unsigned r[4], const bf16 *p)
{
	const unsigned a = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void dg_lt_mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
		     "{%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc[mi][ni][i] += the block tile (m0, n0) over K tiles [kt0, kt1): A
// (M rows) and B (N rows) with their majors. Warp w: rows 64·(w % 2),
// columns 32·(w / 2) of the tile; acc[mi][ni] is the m16n8 fragment at
// (16·mi, 8·ni) of the warp's: i = 0: (g, 2q), 1: (g, 2q + 1), 2: (g + 8,
// 2q), 3: (g + 8, 2q + 1), lane = 4g + q.
template <bool AK, bool BKM>
__device__ __forceinline__ void dg_lt_gemm(float acc[4][4][4], bf16 *smem, const bf16 *__restrict__ A, long long lda,
					   long long M, const bf16 *__restrict__ B, long long ldb, long long N, long long K,
					   long long m0, long long n0, int kt0, int kt1)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int wm = (warp & 1) * 64, wn = (warp >> 1) * 32;
#pragma unroll
	for (int i = 0; i < 4; ++i)
#pragma unroll
		for (int j = 0; j < 4; ++j)
#pragma unroll
			for (int e = 0; e < 4; ++e)
				acc[i][j][e] = 0.0f;
	const int nk = kt1 - kt0;
#pragma unroll
	for (int s = 0; s < GST - 1; ++s) {
		if (s < nk) {
			bf16 *st = smem + s * 2 * GSTAGE;
			dg_lt_stage<AK>(st, A, lda, m0, M, (long long)(kt0 + s) * GBK, K);
			dg_lt_stage<BKM>(st + GSTAGE, B, ldb, n0, N, (long long)(kt0 + s) * GBK, K);
		}
		asm volatile("cp.async.commit_group;\n" ::);
	}
	for (int t = 0; t < nk; ++t) {
		asm volatile("cp.async.wait_group %0;\n" ::"n"(GST - 2));
		__syncthreads();
		{
			const int tn = t + GST - 1;
			if (tn < nk) {
				bf16 *st = smem + (tn % GST) * 2 * GSTAGE;
				dg_lt_stage<AK>(st, A, lda, m0, M, (long long)(kt0 + tn) * GBK, K);
				dg_lt_stage<BKM>(st + GSTAGE, B, ldb, n0, N, (long long)(kt0 + tn) * GBK, K);
			}
			asm volatile("cp.async.commit_group;\n" ::);
		}
		const bf16 *sa = smem + (t % GST) * 2 * GSTAGE, *sb = sa + GSTAGE;
		const int j = lane >> 3, i = lane & 7;
#pragma unroll
		for (int kk = 0; kk < GBK; kk += 16) {
			unsigned a[4][4], b[4][2];
#pragma unroll
			for (int mi = 0; mi < 4; ++mi) {
				if (AK)
					dg_lt_ldm(a[mi], sa + (wm + mi * 16 + (lane & 15)) * KM_LD + kk + (lane >> 4) * 8);
				else
					dg_lt_ldm_t(a[mi], sa + (kk + (j >> 1) * 8 + i) * MN_LD + wm + mi * 16 + (j & 1) * 8);
			}
#pragma unroll
			for (int nj = 0; nj < 2; ++nj) {
				unsigned r[4];
				if (BKM)
					dg_lt_ldm(r, sb + (wn + nj * 16 + (j >> 1) * 8 + i) * KM_LD + kk + (j & 1) * 8);
				else
					dg_lt_ldm_t(r, sb + (kk + (j & 1) * 8 + i) * MN_LD + wn + nj * 16 + (j >> 1) * 8);
				b[2 * nj][0] = r[0];
				b[2 * nj][1] = r[1];
				b[2 * nj + 1][0] = r[2];
				b[2 * nj + 1][1] = r[3];
			}
#pragma unroll
			for (int mi = 0; mi < 4; ++mi)
#pragma unroll
				for (int ni = 0; ni < 4; ++ni)
					dg_lt_mma(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
		}
	}
	asm volatile("cp.async.wait_group 0;\n" ::);
	__syncthreads();	// the ring is free for the caller's epilogue
}

// Where the calling thread's accumulators lie in the block tile (dg_lt_gemm's
// mapping): acc[mi][ni][2h + e] is row fr + 16·mi + 8·h, column fc + 8·ni + e.
__device__ __forceinline__ void dg_lt_origin(int &fr, int &fc)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	fr = (warp & 1) * 64 + (lane >> 2);
	fc = (warp >> 1) * 32 + 2 * (lane & 3);
}

extern "C" __global__ void __launch_bounds__(GNT)
dg_lmhead_ce_cast(const ${XT} *__restrict__ x, const ${WT} *__restrict__ w, bf16 *__restrict__ xb,
		  bf16 *__restrict__ wb, long long rows)
{
	const long long nx = rows * E, n = nx + (long long)E * VP;
	for (long long i = (long long)blockIdx.x * GNT + threadIdx.x; i < n; i += (long long)gridDim.x * GNT) {
		if (i < nx) {
			xb[i] = dg_f32_to_bf16(dg_ld(x, i));
		} else {
			const long long j = i - nx, e = j / VP, v = j % VP;
			wb[j] = v < V ? dg_f32_to_bf16(dg_ld(w, e * V + v)) : (bf16)0;
		}
	}
}

// The logits' statistics: grid (NTV, row tiles).
extern "C" __global__ void __launch_bounds__(GNT, 2)
dg_lmhead_ce(const bf16 *__restrict__ xb, const bf16 *__restrict__ wb, const int *__restrict__ targets,
		   float2 *__restrict__ stats, float *__restrict__ zt, long long rows)
{
	extern __shared__ float4 dg_smem[];
	__shared__ float red_m[GT][4], red_s[GT][4];
	float acc[4][4][4];
	const long long m0 = (long long)blockIdx.y * GT, n0 = (long long)blockIdx.x * GT;
	dg_lt_gemm<true, false>(acc, (bf16 *)dg_smem, xb, E, rows, wb, VP, VP, E, m0, n0, 0, (E + GBK - 1) / GBK);
	int fr, fc;
	dg_lt_origin(fr, fc);
#pragma unroll
	for (int mi = 0; mi < 4; ++mi)
#pragma unroll
		for (int h = 0; h < 2; ++h) {
			const int rl = fr + mi * 16 + 8 * h;
			const long long r = m0 + rl;
			const int t = r < rows ? __ldg(targets + r) : -1;
			float mx = __int_as_float(0xff800000);
#pragma unroll
			for (int ni = 0; ni < 4; ++ni)
#pragma unroll
				for (int e = 0; e < 2; ++e) {
					const long long c = n0 + fc + ni * 8 + e;
					const float z = acc[mi][ni][2 * h + e];
					if (c < V) {
						mx = fmaxf(mx, z);
						if (c == t)
							zt[r] = z;
					}
				}
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
			float s = 0.0f;
#pragma unroll
			for (int ni = 0; ni < 4; ++ni)
#pragma unroll
				for (int e = 0; e < 2; ++e)
					if (n0 + fc + ni * 8 + e < V)
						s += __expf(acc[mi][ni][2 * h + e] - mx);
			s += __shfl_xor_sync(0xffffffffu, s, 1);
			s += __shfl_xor_sync(0xffffffffu, s, 2);
			if ((threadIdx.x & 3) == 0) {	// a quad's first lane, for its warp's 32 columns
				red_m[rl][threadIdx.x >> 6] = mx;
				red_s[rl][threadIdx.x >> 6] = s;
			}
		}
	__syncthreads();
	if (threadIdx.x < GT) {
		const long long r = m0 + threadIdx.x;
		float mx = red_m[threadIdx.x][0];
#pragma unroll
		for (int j = 1; j < 4; ++j)
			mx = fmaxf(mx, red_m[threadIdx.x][j]);
		float s = 0.0f;
#pragma unroll
		for (int j = 0; j < 4; ++j)
			if (red_s[threadIdx.x][j] > 0.0f)	// a warp's columns all past V: (-inf, 0)
				s += red_s[threadIdx.x][j] * __expf(red_m[threadIdx.x][j] - mx);
		if (r < rows)
			stats[r * NTV + blockIdx.x] = make_float2(mx, s);
	}
}

// A warp a row: the tiles' (m, s) combined, lane-strided then by butterflies.
extern "C" __global__ void __launch_bounds__(GNT)
dg_lmhead_ce_rows(const float2 *__restrict__ stats, const float *__restrict__ zt, const int *__restrict__ targets,
		  float *__restrict__ row_loss, float *__restrict__ lse_out, long long rows, int *bad)
{
	const int lane = threadIdx.x & 31;
	for (long long r = ((long long)blockIdx.x * GNT + threadIdx.x) >> 5; r < rows;
	     r += ((long long)gridDim.x * GNT) >> 5) {
		float m = __int_as_float(0xff800000), s = 0.0f;
		for (int j = lane; j < NTV; j += 32) {
			const float2 p = stats[r * NTV + j];
			const float mn = fmaxf(m, p.x);
			s = (s > 0.0f ? s * expf(m - mn) : 0.0f) + p.y * expf(p.x - mn);
			m = mn;
		}
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) {
			const float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);
			const float mn = fmaxf(m, mo);
			// the same two terms in the same order on both lanes of a pair
			const float a = s > 0.0f ? s * expf(m - mn) : 0.0f, b = so > 0.0f ? so * expf(mo - mn) : 0.0f;
			s = (lane & o) ? b + a : a + b;
			m = mn;
		}
		if (lane == 0) {
			const int t = __ldg(targets + r);
			const bool ok = t >= 0 && t < V;
			const float lse = m + logf(s);
			lse_out[r] = lse;
			row_loss[r] = ok ? lse - zt[r] : 0.0f;
			if (!ok && bad)
				*bad = 1;
		}
	}
}

// dlogits: grid (NTV, row tiles).
extern "C" __global__ void __launch_bounds__(GNT, 2)
dg_lmhead_ce_dlogits(const bf16 *__restrict__ xb, const bf16 *__restrict__ wb, const int *__restrict__ targets,
		     const float *__restrict__ lse, bf16 *__restrict__ dlogits, long long rows, float inv_rows,
		     const float *grad_scale)
{
	extern __shared__ float4 dg_smem[];
	float acc[4][4][4];
	if (grad_scale)
		inv_rows = __fmul_rn(inv_rows, *grad_scale);
	const long long m0 = (long long)blockIdx.y * GT, n0 = (long long)blockIdx.x * GT;
	dg_lt_gemm<true, false>(acc, (bf16 *)dg_smem, xb, E, rows, wb, VP, VP, E, m0, n0, 0, (E + GBK - 1) / GBK);
	int fr, fc;
	dg_lt_origin(fr, fc);
#pragma unroll
	for (int mi = 0; mi < 4; ++mi)
#pragma unroll
		for (int h = 0; h < 2; ++h) {
			const long long r = m0 + fr + mi * 16 + 8 * h;
			if (r >= rows)
				continue;
			const int t = __ldg(targets + r);
			const bool ok = t >= 0 && t < V;
			const float l = ok ? lse[r] : 0.0f;
#pragma unroll
			for (int ni = 0; ni < 4; ++ni) {
				const long long c = n0 + fc + ni * 8;
				if (c >= VP)
					continue;
				float d[2];
#pragma unroll
				for (int e = 0; e < 2; ++e)
					d[e] = ok && c + e < V
						       ? (__expf(acc[mi][ni][2 * h + e] - l) - (c + e == t ? 1.0f : 0.0f)) * inv_rows
						       : 0.0f;
				*(unsigned *)(dlogits + r * VP + c) = dg_pack2(d[0], d[1]);
			}
		}
}

// dx: grid (column tiles of E, row tiles, splits).
extern "C" __global__ void __launch_bounds__(GNT, 2)
dg_lmhead_ce_dx(const bf16 *__restrict__ dlogits, const bf16 *__restrict__ wb, float *__restrict__ out,
		long long rows, int splits)
{
	extern __shared__ float4 dg_smem[];
	float acc[4][4][4];
	constexpr int KT = (VP + GBK - 1) / GBK;
	const int per = (KT + splits - 1) / splits, p = blockIdx.z;
	const int kt0 = min(KT, p * per), kt1 = min(KT, kt0 + per);
	const long long m0 = (long long)blockIdx.y * GT, n0 = (long long)blockIdx.x * GT;
	dg_lt_gemm<true, true>(acc, (bf16 *)dg_smem, dlogits, VP, rows, wb, VP, E, VP, m0, n0, kt0, kt1);
	float *o = out + (splits > 1 ? (long long)p * rows * E : 0LL);
	int fr, fc;
	dg_lt_origin(fr, fc);
#pragma unroll
	for (int mi = 0; mi < 4; ++mi)
#pragma unroll
		for (int h = 0; h < 2; ++h) {
			const long long r = m0 + fr + mi * 16 + 8 * h;
			if (r >= rows)
				continue;
#pragma unroll
			for (int ni = 0; ni < 4; ++ni) {
				const long long c = n0 + fc + ni * 8;
				if (c < E)	// E % 8 == 0: c + 1 < E too
					*(float2 *)(o + r * E + c) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
			}
		}
}

extern "C" __global__ void __launch_bounds__(GNT)
dg_lmhead_ce_dx_sum(const float *__restrict__ part, float *__restrict__ dx, long long rows, int splits)
{
	const long long n = rows * E;
	for (long long i = (long long)blockIdx.x * GNT + threadIdx.x; i < n; i += (long long)gridDim.x * GNT) {
		float s = part[i];
		for (int p = 1; p < splits; ++p)
			s = __fadd_rn(s, part[(long long)p * n + i]);
		dx[i] = s;
	}
}

// dw: grid (column tiles of V, row tiles of E).
extern "C" __global__ void __launch_bounds__(GNT, 2)
dg_lmhead_ce_dw(const bf16 *__restrict__ xb, const bf16 *__restrict__ dlogits, float *__restrict__ dw,
		long long rows, int accumulate)
{
	extern __shared__ float4 dg_smem[];
	float acc[4][4][4];
	const long long m0 = (long long)blockIdx.y * GT, n0 = (long long)blockIdx.x * GT;
	dg_lt_gemm<false, false>(acc, (bf16 *)dg_smem, xb, E, E, dlogits, VP, VP, rows, m0, n0, 0,
				 (int)((rows + GBK - 1) / GBK));
	int fr, fc;
	dg_lt_origin(fr, fc);
#pragma unroll
	for (int mi = 0; mi < 4; ++mi)
#pragma unroll
		for (int h = 0; h < 2; ++h) {
			const long long k = m0 + fr + mi * 16 + 8 * h;
			if (k >= E)
				continue;
#pragma unroll
			for (int ni = 0; ni < 4; ++ni)
#pragma unroll
				for (int e = 0; e < 2; ++e) {
					const long long v = n0 + fc + ni * 8 + e;
					if (v < V) {
						float *o = dw + k * V + v;
						const float a = acc[mi][ni][2 * h + e];
						*o = accumulate ? __fadd_rn(*o, a) : a;
					}
				}
		}
}
]]

function M.plan(p, E, V, arch)
  if arch < 80 then
    return nil, fmt("vocab=%d: the lm_head's tensor-core path (a vocabulary of %d or more in bf16, more than %d in f32) needs sm_80 or newer, not sm_%d",
                    V, M.MIN_V_BF16, M.MAX_V_F32_ROWS, arch)
  end
  p.path = "tensor-core"
  p.entries = {}
  for i, e in ipairs(M.ENTRIES) do p.entries[i] = { name = e, threads = NT, smem = 0 } end
  for _, i in ipairs({ 1, 5, 6, 8 }) do p.entries[i].smem = M.SMEM end
  p.entries[4].threads = p.tile.threads
  return p
end

function M.render(spec, plan, v, common, loss_kernel)
  local E, V = v.E, v.V
  local vp = (V + 7) // 8 * 8
  local about = {
    fmt("lmhead_ce on tensor cores: loss = mean CE(x (rows, %d) %s · w (%d, %d) %s, targets); backward: dx, dw (f32).",
        E, spec.src, E, V, spec.weight),
    fmt("x and w rounded to bf16 (w padded to %d columns), logits in f32 accumulators never stored;", vp),
    "dlogits stored as bf16 for dx and dw. mma.sync m16n8k16 bf16, 128x128 tiles, 3-stage cp.async ring.",
    "",
    fmt("dg_lmhead_ce_cast(x, w, xb, wb, rows)          any grid, %d threads", NT),
    fmt("dg_lmhead_ce(xb, wb, targets, stats, zt, rows) (the statistics)   grid (%d, row tiles), %d threads, %d bytes",
        (V + 127) // 128, NT, M.SMEM),
    fmt("dg_lmhead_ce_rows(stats, zt, targets, row_loss, lse, rows, bad)   any grid, %d threads: a warp a row", NT),
    fmt("dg_lmhead_ce_loss(row_loss, rows, loss)        <<<1, %d>>>", plan.tile.threads),
    fmt("dg_lmhead_ce_dlogits(xb, wb, targets, lse, dlogits, rows, inv_rows, grad_scale)   as stats"),
    fmt("dg_lmhead_ce_dx(dlogits, wb, out, rows, splits)   grid (%d, row tiles, splits)", (E + 127) // 128),
    "dg_lmhead_ce_dx_sum(part, dx, rows, splits)   any grid",
    fmt("dg_lmhead_ce_dw(xb, dlogits, dw, rows, accumulate)   grid (%d, %d)", (V + 127) // 128, (E + 127) // 128),
  }
  local vars = {}
  for k, x in pairs(v) do vars[k] = x end
  vars.TILE, vars.BK, vars.STAGES, vars.NT, vars.KM_LD, vars.MN_LD = TILE, BK, STAGES, NT, KM_LD, MN_LD
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "loss_tc.lua", about))
  w:line(require("device").helpers({ bf16 = true, bf16x2_exact = true }))
  w:line(EMIT.subst(common, v))
  w:line(EMIT.subst(GEMM, vars))
  w:line(EMIT.subst(loss_kernel, v))
  return w:text()
end

return M

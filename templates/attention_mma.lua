--[[
attention_mma.lua — the register-staged kernel of the attention ops: the
mma.sync bf16 path (tensor cores, act bf16, sm_80+) and the fp32 FMA path
(act f32, or a tile the tensor cores cannot run), one kernel text whose
staging, compute and epilogue the path picks (templates/attention.lua
plans it, holds the math, the ABI and the measurements, and calls M.render
with its shared pieces).
]]
local EMIT = require("emit")
local DEV = require("device")
local fmt = string.format

local M = {}

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

local HELPERS = [[
// ---- helpers (templates/attention_mma.lua) ----------------------------------
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

function M.render(spec, plan, k, sh)
  local o, t = k.o, plan.tile
  local mma = plan.path == "mma.sync bf16"
  local af, bf, of = sh.operand_fmt(k, o.at), sh.operand_fmt(k, o.bt), sh.operand_fmt(k, o.ot)
  local eu_a = unit_of(af, o.a_ld, k, o.a_kc and t.bk or t.bm)
  local eu_b = unit_of(bf, o.b_ld, k, o.b_kc and t.bk or t.bn)
  local v = {
    H = k.H, E = k.E, L = k.L, XT = sh.CTYPE[k.act], AT = sh.CTYPE[af], BT = sh.CTYPE[bf], OT = sh.CTYPE[of],
    BM = t.bm, BN = t.bn, BK = t.bk, WM = t.wm, WN = t.wn, NBUF = t.stages >= 2 and 2 or 1,
    A_KC = tostring(o.a_kc), B_KC = tostring(o.b_kc),
    A_ROPE = tostring(k.a_rope), B_ROPE = tostring(k.b_rope), A_MASK = o.mask,
    A_DESC = fmt("%s, contiguous along %s", af, o.a_kc and "k" or "m"),
    B_DESC = fmt("%s, contiguous along %s", bf, o.b_kc and "k" or "n"),
    EU_A = eu_a, EU_B = eu_b, SMEM = plan.entries[1].smem,
    SMEM_LAYOUT = mma and SMEM_MMA or SMEM_SIMT,
  }
  local entry = "dg_" .. k.op
  local sig, geo, store = sh.op_text(k)
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
  w:line(sh.out_helpers(of))
  if k.epi_mask then w:line(sh.MASK_PAIR) end
  w:line()
  w:line(EMIT.subst(KERNEL, kv))
  return w:text()
end

return M

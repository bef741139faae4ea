--[[
backward.lua — the four backward GEMMs of BDH's projection and decoder
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
  wgmma) takes the split, with the same code (backward_mma.lua
  M.GI_SPLIT); the runtime picks the count from the grid and the SM count
  (runtime/ops/grad.c). No float atomics anywhere, so every result is
  reproducible for a fixed (splits, tile).

  WT / XT: float (f32), unsigned short (bf16), int i8x4 words (int8, int4,
  uint8pos), unsigned words (ternary 16 codes, sign1 32). sw / sa: device
  floats, read only when that operand is an integer format (else may be
  NULL). All tensors 16-byte aligned (whole allocations are).

Paths (M.plan picks one from the arch and the tile; render follows it):
  warpgroup tensor cores (templates/backward_wgmma.lua; the default where
    it applies): sm_90a, lowrank_grad_input / _weight with a bf16 gradient
    (src=bf16) and a bf16 other operand (weight=bf16 / act=bf16), WN 1,
    WM 4 or 8, BM = 16·WM, BN 64 | 128 | 256, BK 64, stages 3 or 4.
    wgmma m64nBNk16 bf16 from 128-byte-swizzled shared tiles that a
    cp.async ring fills; the same ABI, grids and splits. The plan is
    arch-specific, so dg_codegen_plan_for promotes an sm_90 spec to it.
    Its default tile for both ops is 128x128x64/8x1/3 (two warpgroups,
    two blocks an SM; backward_wgmma.lua M.default_tile has the reasons).
  tensor cores (templates/backward_mma.lua; the default from sm_80 on):
    sm_80+, BK % 16 == 0, warp tiles whole 16x16 blocks. mma.sync m16n8k16
    bf16 with f32 sums. Each element is converted once as it is staged:
    an f32 gradient streams through a cp.async ring and is rounded to
    bf16 into shared memory, a bf16 gradient (src=bf16) streams by
    cp.async straight into the shared tiles ldmatrix reads (no rounding,
    no conversion, half the bytes); the other operand is decoded to bf16
    (exact for every integer code and for bf16, f32 rounded); ldmatrix
    feeds both operands. Layouts, pipeline and precision: backward_mma.lua's notes.
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

SIMT path: fp32 FMA on a block tile. The gradient is a float (a bf16 one
widened exactly as it is loaded), so an exact integer path (dp4a) does not
apply; the integer operand's codes
are decoded to floats exactly (|code| <= 255) while they are staged into
shared memory, and its scale multiplies the f32 sum once at the end.
Shared tiles are k-major —
As[k][m], Bs[k][n] — so the inner loop reads a column of A and a row of B
per k:
  * A (the f32 gradient) is K-major in the grad_input ops (a row of grad
    is contiguous along the reduction): 16-byte loads along k, transposed
    into As whose rows are padded by one float, so the scattered stores do
    not collide in a bank. In the grad_weight ops A is M-major (contiguous
    along l or d): 16-byte loads land as 16-byte stores, no transpose.
  * B (weight or activation, any storage format) is N-major in all four
    ops: one unit (4 values, or one ternary / sign1 word) a thread, decoded
    to floats and stored as float4s along the row.
  * a warp's 32 lanes are 4 rows × 8 cols of its tile; a thread owns
    TM = bm/wm/4 rows (strided by 4) by TN = bn/wn/8 cols (strided by 8), so
    each k reads 4 distinct A words and 8 consecutive B words a warp
    (broadcasts, no conflicts), and stores write 8 consecutive floats a row.
  * stages >= 2: two shared buffers, the next K step's global loads in
    flight in registers while the current one is computed (one barrier a
    step) — when two buffers fit in 48 KiB of static shared memory; a tile
    that fits only once runs single-buffered.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local MMA = require("backward_mma")
local WG = require("backward_wgmma")
local fmt = string.format

local M = {}

local ACTS = { "f32", "bf16", "int8", "int4", "uint8pos" }
local WEIGHTS = { "f32", "bf16", "int8", "ternary", "sign1" }

local SMEM_STATIC = 48 * 1024

-- ---- the B operand: decode units of one storage format -----------------------

-- How one staging unit of format f is loaded and decoded: EU values along n,
-- NWB raw 32-bit words in flight, the load statement (fills r[] from the
-- word pointer p at element n) and the decode statement (writes EU floats at
-- bd, 16-byte aligned, from r[]).
local function b_unit(f, bn)
  local F = FM.formats[f]
  if f == "f32" then
    return { EU = 4, NWB = 4,
      load = "const uint4 v = __ldg((const uint4 *)(p + n));\n" ..
             "r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;",
      decode = "*(float4 *)bd = make_float4(__uint_as_float(r[0]), __uint_as_float(r[1]),\n" ..
               "\t\t\t\t  __uint_as_float(r[2]), __uint_as_float(r[3]));" }
  elseif f == "bf16" then
    return { EU = 4, NWB = 2,
      load = "const uint2 v = __ldg((const uint2 *)(p + n / 2));\n" ..
             "r[0] = v.x; r[1] = v.y;",
      decode = "*(float4 *)bd = make_float4(__uint_as_float(r[0] << 16), __uint_as_float(r[0] & 0xffff0000u),\n" ..
               "\t\t\t\t  __uint_as_float(r[1] << 16), __uint_as_float(r[1] & 0xffff0000u));" }
  elseif f == "ternary" then
    return { EU = 16, NWB = 1,
      load = "r[0] = __ldg(p + n / 16);",
      decode = fmt([[
#pragma unroll
for (int c = 0; c < 4; ++c) {	// 16 codes = four float4
	const unsigned q = (r[0] >> (8 * c)) & 0xffu;
	*(float4 *)(bd + 4 * c) = make_float4(%s);
}]], FM.quad(FM.floats_of_unit(f, "q"), 1, ",\n\t\t\t\t\t       ")) }
  elseif f == "sign1" then
    -- bn 16: a unit is half a word (the shift picks the half)
    local eu = math.min(32, bn)
    return { EU = eu, NWB = 1,
      load = "r[0] = __ldg(p + n / 32) >> (n % 32);",
      decode = fmt([[
#pragma unroll
for (int c = 0; c < %d; ++c) {	// %d codes = %d float4
	const unsigned q = (r[0] >> (4 * c)) & 15u;
	*(float4 *)(bd + 4 * c) = make_float4(%s);
}]], eu // 4, eu, eu // 4, FM.quad(FM.floats_of_unit(f, "q"), 1, ",\n\t\t\t\t\t       ")) }
  else -- i8x4 codes: int8, int4, uint8pos
    return { EU = 4, NWB = 1,
      load = "r[0] = __ldg(p + n / 4);",
      decode = fmt("*(float4 *)bd = make_float4(%s);", FM.quad(FM.floats_of_unit(f, "r[0]"))) }
  end
end

local indent = EMIT.indent

-- ---- per-op addressing ------------------------------------------------------
-- Each op gives device functions (text) over the compile-time constants:
--   K-major A (grad_input ops): dg_a_row(g, m, kt, z, T) → the BK floats
--     A(m, kt·BK ..) (contiguous), m < M.
--   M-major A (grad_weight ops): dg_a_col(g, k, h, T) → p with A(m, k) = p[m].
--   dg_b_row(wp, k, z, T) → word pointer of B's row k (element n in word
--     n / EPW_B); k is the tile's global k (kt·BK + kk).
--   dg_out(m, n, z, T) → the element offset of output (m, n).

local OPS = {}

OPS.lowrank_grad_input = {
  a_kmajor = true, w_operand = true, out_name = "grad_x", scale = "sw", split = true,
  sig = "const GT *__restrict__ grad, const ${BT} *__restrict__ w, const float *__restrict__ sw,\n" ..
        "\t\tfloat *__restrict__ dst, int B, int T, int splits, int kt_per_split",
  text = [[
constexpr int HPB = H / HIN;		// heads a block reduces over (H when Hin = 1)
constexpr int N = E;			// output cols
constexpr int KT = HPB * L / BK;	// K steps (a step never straddles two heads: BK | L)

// A(m, k) = grad[b, h, t, l] with m = b*T + t and k = (h - z*HPB)*L + l.
__device__ __forceinline__ const GT *dg_a_row(const GT *g, int m, int kt, int z, int T)
{
	const int k = kt * BK;
	const int h = z * HPB + k / L, l = k % L;
	const int b = m / T, t = m - b * T;
	return g + ((long long)(b * H + h) * T + t) * L + l;
}

// B(k, e) = w[h, l, e]: w is (H·L, E), and block z's heads are rows z·HPB·L ..
__device__ __forceinline__ const unsigned *dg_b_row(const unsigned *wp, int k, int z, int T)
{
	return wp + ((long long)z * HPB * L + k) * (E / EPW_B);
}

__device__ __forceinline__ long long dg_out(int m, int n, int z, int T)
{
	const int b = m / T, t = m - b * T;
	return ((long long)(b * HIN + z) * T + t) * E + n;
}

// The scale of B's row k per channel (wscale=channel): w's row z·HPB·L + k.
__device__ __forceinline__ float dg_b_scale(const float *sv, int k, int z, int T)
{
	return sv[(long long)z * HPB * L + k];
}
]],
}

OPS.decoder_grad_input = {
  a_kmajor = true, w_operand = true, out_name = "grad_y", scale = "sw",
  sig = "const GT *__restrict__ grad, const ${BT} *__restrict__ w, const float *__restrict__ sw,\n" ..
        "\t\tOT *__restrict__ grad_y, int B, int T",
  text = [[
constexpr int N = L;			// output cols (head z's latent)
constexpr int KT = E / BK;		// K steps

// A(m, d) = grad[b, 0, t, d], m = b*T + t.
__device__ __forceinline__ const GT *dg_a_row(const GT *g, int m, int kt, int z, int T)
{
	return g + (long long)m * E + kt * BK;
}

// B(d, l) = w[d, z·L + l]: w is (E, H·L), packed along H·L (L % EPW_B == 0).
__device__ __forceinline__ const unsigned *dg_b_row(const unsigned *wp, int k, int z, int T)
{
	return wp + (long long)k * (H * L / EPW_B) + z * (L / EPW_B);
}

__device__ __forceinline__ long long dg_out(int m, int n, int z, int T)
{
	const int b = m / T, t = m - b * T;
	return ((long long)(b * H + z) * T + t) * L + n;
}

// The scale of B's row k per channel (wscale=channel): w's row d = k.
__device__ __forceinline__ float dg_b_scale(const float *sv, int k, int z, int T)
{
	return sv[k];
}
]],
}

OPS.lowrank_grad_weight = {
  a_kmajor = false, w_operand = false, out_name = "dst", scale = "sa",
  sig = "const GT *__restrict__ grad, const ${BT} *__restrict__ x, const float *__restrict__ sa,\n" ..
        "\t\tfloat *__restrict__ dst, int B, int T, int splits, int kt_per_split, int accumulate",
  text = [[
constexpr int MM = L;			// output rows (l)
constexpr int N = E;			// output cols (e)
constexpr long long NW = (long long)H * L * E;	// elements of grad_w (one partial)

// A(l, k) = grad[b, h, t, l] with k = b*T + t: p[l].
__device__ __forceinline__ const GT *dg_a_col(const GT *g, int k, int h, int T)
{
	const int b = k / T, t = k - b * T;
	return g + ((long long)(b * H + h) * T + t) * L;
}

// B(k, e) = x[b, hin(h), t, e].
__device__ __forceinline__ const unsigned *dg_b_row(const unsigned *xp, int k, int h, int T)
{
	const int b = k / T, t = k - b * T;
	return xp + ((long long)(b * HIN + ${HIN_H}) * T + t) * (E / EPW_B);
}

__device__ __forceinline__ long long dg_out(int m, int n, int h, int T)
{
	return ((long long)h * L + m) * E + n;
}

// The scale of B's row k per token (ascale=token): x's row (b, hin(h), t).
__device__ __forceinline__ float dg_b_scale(const float *sv, int k, int h, int T)
{
	const int b = k / T, t = k - b * T;
	return sv[(long long)(b * HIN + ${HIN_H}) * T + t];
}
]],
}

OPS.decoder_grad_weight = {
  a_kmajor = false, w_operand = false, out_name = "dst", scale = "sa",
  sig = "const GT *__restrict__ grad, const ${BT} *__restrict__ y, const float *__restrict__ sa,\n" ..
        "\t\tfloat *__restrict__ dst, int B, int T, int splits, int kt_per_split, int accumulate",
  text = [[
constexpr int MM = E;			// output rows (d)
constexpr int N = L;			// output cols (head h's latent)
constexpr long long NW = (long long)H * L * E;	// elements of grad_w (one partial)

// A(d, k) = grad[b, 0, t, d] with k = b*T + t: p[d].
__device__ __forceinline__ const GT *dg_a_col(const GT *g, int k, int h, int T)
{
	return g + (long long)k * E;
}

// B(k, l) = y[b, h, t, l].
__device__ __forceinline__ const unsigned *dg_b_row(const unsigned *yp, int k, int h, int T)
{
	const int b = k / T, t = k - b * T;
	return yp + ((long long)(b * H + h) * T + t) * (L / EPW_B);
}

__device__ __forceinline__ long long dg_out(int m, int n, int h, int T)
{
	return (long long)m * (H * L) + (long long)h * L + n;
}

// The scale of B's row k per token (ascale=token): y's token k = b·T + t.
__device__ __forceinline__ float dg_b_scale(const float *sv, int k, int h, int T)
{
	return sv[k];
}
]],
}

-- ---- the kernel ---------------------------------------------------------------

local HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int HIN = ${HIN};		// input heads of the projection: 1 or H
constexpr int E = ${E};		// embd
constexpr int L = ${L};		// latent width per head
typedef ${GT} GT;		// the gradient read (grad): ${gfmt}
typedef ${OT} OT;		// decoder_grad_input's grad_y: ${ofmt}

// Four consecutive values of A (16-byte aligned f32, 8-byte aligned bf16,
// widened exactly) as floats.
__device__ __forceinline__ float4 dg_a4(const float *p)
{
	return __ldg((const float4 *)p);
}

__device__ __forceinline__ float4 dg_a4(const unsigned short *p)
{
	const uint2 u = __ldg((const uint2 *)p);
	return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
			   __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// ---- tile ------------------------------------------------------------------
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};	// block tile, K step
constexpr int WM = ${WM}, WN = ${WN};		// warps a block: WM rows x WN cols
constexpr int NT = WM * WN * 32;		// threads a block
constexpr int TM = BM / WM / 4;		// rows a thread: lr + 4i of its warp's rows
constexpr int TN = BN / WN / 8;		// cols a thread: lc + 8j of its warp's cols
constexpr int NBUF = ${NBUF};			// shared buffers (2: double-buffered)

// ---- shared memory (floats): As[k][m] at k*PA + m, then Bs[k][n] at
// A_FL + k*BN + n, a buffer each stage.
constexpr int PA = ${PA};		// A row pitch: ${PA_WHY}
constexpr int A_FL = BK * PA;
constexpr int B_FL = BK * BN;
constexpr int STAGE_FL = A_FL + B_FL;
constexpr int SMEM_FL = NBUF * STAGE_FL;	// ${SMEM} bytes

// ---- staging: A in float4 units, B in units of EU_B values (${bfmt})
constexpr int UA = ${UA};			// A units a tile row (${UA_WHY})
constexpr int A_UNITS = ${A_UNITS};
constexpr int SA = (A_UNITS + NT - 1) / NT;	// A units a thread
constexpr int EPW_B = ${EPW_B};		// B values a 32-bit storage word
constexpr int EU_B = ${EU_B};		// B values a unit
constexpr int NWB = ${NWB};			// raw words a B unit
constexpr int UB = BN / EU_B;			// B units a tile row
constexpr int SB = (BK * UB + NT - 1) / NT;	// B units a thread
]]

local KERNEL = [=[
extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(${SIG})
{
	__shared__ __align__(16) float smem[SMEM_FL];
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5;
	const int lr = lane >> 3, lc = lane & 7;	// lane's row / col in its warp
	const int wr = warp / WN, wc = warp % WN;	// warp's row / col in the block
	const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
${PROLOGUE}
	const unsigned *bw = (const unsigned *)${BNAME};	// B as 32-bit words

	float ra[SA][4];		// one K step of staging, in flight
	unsigned rb[SB][NWB];
	bool rbv[SB];		// B unit inside K and N (else it stores zeros)
${RBS_DECL}
	auto load_step = [&](int kt) {
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
${LOAD_A}
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, kk = u / UB, n = n0 + (u % UB) * EU_B;
			const int k = kt * BK + kk;
			rbv[s] = ${B_GUARD}${K_GUARD_B}n < N;
${RBS_LOAD}
#pragma unroll
			for (int i = 0; i < NWB; ++i)
				rb[s][i] = 0u;
			if (rbv[s]) {
				const unsigned *p = dg_b_row(bw, k, ${ZH}, T);
				unsigned (&r)[NWB] = rb[s];
${LOAD_B}
			}
		}
	};
	auto store_step = [&](float *stage) {
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
${STORE_A}
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, kk = u / UB, nu = u % UB;
			if (${B_GUARD_S}true) {
				float *bd = stage + A_FL + kk * BN + nu * EU_B;	// Bs[kk][nu·EU_B ..]
				const unsigned (&r)[NWB] = rb[s];
				if (rbv[s]) {
${DECODE_B}
${RBS_APPLY}
				} else {
#pragma unroll
					for (int c = 0; c < EU_B / 4; ++c)
						*(float4 *)(bd + 4 * c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				}
			}
		}
	};

	int a_off[TM], b_off[TN];	// this thread's rows of As / cols of Bs
#pragma unroll
	for (int i = 0; i < TM; ++i)
		a_off[i] = wr * (BM / WM) + lr + 4 * i;
#pragma unroll
	for (int j = 0; j < TN; ++j)
		b_off[j] = wc * (BN / WN) + lc + 8 * j;

	// fp32 sums (FMA), k ascending within a thread.
	float acc[TM][TN];
#pragma unroll
	for (int i = 0; i < TM; ++i)
#pragma unroll
		for (int j = 0; j < TN; ++j)
			acc[i][j] = 0.0f;
	auto compute_step = [&](const float *stage) {
		const float *as = stage, *bs = stage + A_FL;
#pragma unroll 4
		for (int k = 0; k < BK; ++k) {
			float a[TM], b[TN];
#pragma unroll
			for (int i = 0; i < TM; ++i)
				a[i] = as[k * PA + a_off[i]];
#pragma unroll
			for (int j = 0; j < TN; ++j)
				b[j] = bs[k * BN + b_off[j]];
#pragma unroll
			for (int i = 0; i < TM; ++i)
#pragma unroll
				for (int j = 0; j < TN; ++j)
					acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
		}
	};

${MAINLOOP}

${EPILOGUE}
}
]=]

-- K-major A (grad_input ops): unit u = (row u / UA, float4 u % UA along k).
local LOAD_A_KMAJOR = [[
			const int row = u / UA, kq = u % UA, m = m0 + row;
			float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (${A_GUARD}m < M)
				v = dg_a4(dg_a_row(grad, m, kt, z, T) + 4 * kq);
			ra[s][0] = v.x; ra[s][1] = v.y; ra[s][2] = v.z; ra[s][3] = v.w;]]

-- Transposed into As[k][m]: with the pitch BM + 1, store c of a warp's lanes
-- (UA k-quads of 32/UA rows) lands in distinct banks.
local STORE_A_KMAJOR = [[
			const int row = u / UA, kq = u % UA;
			if (${A_GUARD}true) {
#pragma unroll
				for (int c = 0; c < 4; ++c)
					stage[(4 * kq + c) * PA + row] = ra[s][c];
			}]]

-- M-major A (grad_weight ops): unit u = (k row u / UA, float4 u % UA along m).
local LOAD_A_MMAJOR = [[
			const int kk = u / UA, m = m0 + (u % UA) * 4, k = kt * BK + kk;
			float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (${A_GUARD}k < K && m < MM)	// MM % 4 == 0: a float4 is wholly in or out
				v = dg_a4(dg_a_col(grad, k, h, T) + m);
			ra[s][0] = v.x; ra[s][1] = v.y; ra[s][2] = v.z; ra[s][3] = v.w;]]

local STORE_A_MMAJOR = [[
			const int kk = u / UA, mq = u % UA;
			if (${A_GUARD}true)
				*(float4 *)(stage + kk * PA + 4 * mq) = make_float4(ra[s][0], ra[s][1], ra[s][2], ra[s][3]);]]

local MAIN_2 = [[
	// Double-buffered: step i+1's global loads are issued before step i is
	// computed and land in the other buffer after it; one barrier a step.
	if (k_begin < k_end) {
		load_step(k_begin);
		store_step(smem);
		__syncthreads();
#pragma unroll 1
		for (int kt = k_begin; kt < k_end; ++kt) {
			const int i = kt - k_begin;
			if (kt + 1 < k_end)
				load_step(kt + 1);
			compute_step(smem + (i & 1) * STAGE_FL);
			if (kt + 1 < k_end)
				store_step(smem + ((i + 1) & 1) * STAGE_FL);
			__syncthreads();
		}
	}]]

local MAIN_1 = [[
	// Single buffer: load, barrier, compute, barrier.
#pragma unroll 1
	for (int kt = k_begin; kt < k_end; ++kt) {
		load_step(kt);
		store_step(smem);
		__syncthreads();
		compute_step(smem);
		__syncthreads();
	}]]

local EPI_INPUT = [[
	// ---- epilogue: ${SCALE_WHY}
${SCALE_LOAD}
#pragma unroll
	for (int i = 0; i < TM; ++i) {
		const int m = m0 + a_off[i];
		if (m >= M)
			continue;
#pragma unroll
		for (int j = 0; j < TN; ++j) {
			const int n = n0 + b_off[j];
			if (n < N)
				${OUT}[dg_out(m, n, z, T)] = ${CONV}(${SCALED});
		}
	}]]

local EPI_WEIGHT = [[
	// ---- epilogue: splits == 1: grad_w (+)= ${SCALED_DESC}; else the raw sum
	// into partial p (dst + p·NW), summed by the reduce entry.
${SCALE_LOAD}
	float *out = splits == 1 ? dst : dst + (long long)sp * NW;
#pragma unroll
	for (int i = 0; i < TM; ++i) {
		const int m = m0 + a_off[i];
		if (m >= MM)
			continue;
#pragma unroll
		for (int j = 0; j < TN; ++j) {
			const int n = n0 + b_off[j];
			if (n >= N)
				continue;
			const long long o = dg_out(m, n, h, T);
			if (splits != 1)
				out[o] = acc[i][j];
			else
				out[o] = accumulate ? __fadd_rn(out[o], ${SCALED}) : ${SCALED};
		}
	}]]

-- The reduce entries' loop body: float4 iv of Σ_{p < splits} part[p·${NP} ..],
-- p ascending, into sum (iv, part, splits in scope).
local REDUCE_SUM = [[
		float4 sum = __ldg((const float4 *)part + iv);
		for (int q = 1; q < splits; ++q) {
			const float4 v = __ldg((const float4 *)(part + (long long)q * ${NP}) + iv);
			sum.x = __fadd_rn(sum.x, v.x);
			sum.y = __fadd_rn(sum.y, v.y);
			sum.z = __fadd_rn(sum.z, v.z);
			sum.w = __fadd_rn(sum.w, v.w);
		}]]

local REDUCE = [[

// grad_w[i] (+)= s · Σ_{p < splits} part[p·NW + i], p ascending; float4 a
// thread (NW % 4 == 0), grid-stride.
extern "C" __global__ void __launch_bounds__(RNT)
${ENTRY}_reduce(const float *__restrict__ part, int splits, const float *__restrict__ sa,
		float *__restrict__ grad_w, int accumulate)
{
${SCALE_LOAD}
	const long long nv = NW / 4;
	for (long long iv = (long long)blockIdx.x * RNT + threadIdx.x; iv < nv;
	     iv += (long long)gridDim.x * RNT) {
${SUM}
${SCALE_APPLY}
		if (accumulate) {
			const float4 o = ((const float4 *)grad_w)[iv];
			sum.x = __fadd_rn(o.x, sum.x);
			sum.y = __fadd_rn(o.y, sum.y);
			sum.z = __fadd_rn(o.z, sum.z);
			sum.w = __fadd_rn(o.w, sum.w);
		}
		((float4 *)grad_w)[iv] = sum;
	}
}
]]

-- lowrank_grad_input's: the partials of its K split (B and T at run time).
local REDUCE_INPUT = [[

// grad_x[i] = s · Σ_{p < splits} part[p·NX + i], p ascending, NX = B·HIN·T·E
// (the elements of grad_x); float4 a thread (E % 4 == 0), grid-stride.
extern "C" __global__ void __launch_bounds__(RNT)
${ENTRY}_reduce(const float *__restrict__ part, int splits, const float *__restrict__ sw,
		float *__restrict__ grad_x, int B, int T)
{
${SCALE_LOAD}
	const long long NX = (long long)B * HIN * T * E;
	const long long nv = NX / 4;
	for (long long iv = (long long)blockIdx.x * RNT + threadIdx.x; iv < nv;
	     iv += (long long)gridDim.x * RNT) {
${SUM}
${SCALE_APPLY}
		((float4 *)grad_x)[iv] = sum;
	}
}
]]

local RNT = 256 -- threads a block of the reduce entry

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
  local H, HIN, E, L, bm, bn, nt, bfmt = c.H, c.HIN, c.E, c.L, c.bm, c.bn, c.wm * c.wn * 32, c.bfmt
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

-- Appends the reduce entry of the grad_weight ops and lowrank_grad_input
-- (M.plan lists it): the sum of a split's partials, in split order.
local function finish(w, o, entry, is_code, vec)
  if vec then is_code = false end -- the scales went into B as it was staged
  if o.a_kmajor and not o.split then return end
  local sn = o.scale
  w:line(fmt("constexpr int RNT = %d;\t\t// threads a block of %s_reduce", RNT, entry))
  w:line(EMIT.subst(o.split and REDUCE_INPUT or REDUCE, {
    ENTRY = entry, SUM = EMIT.subst(REDUCE_SUM, { NP = o.split and "NX" or "NW" }),
    SCALE_LOAD = is_code and fmt("\tconst float s = *%s;\t\t// the %s's scale", sn, o.w_operand and "weight" or "activation")
      or (vec and fmt("\t(void)%s;\t// per %s: the scales went into B as it was staged", sn,
                      o.w_operand and "channel" or "token")
      or "\t// float operand: no scale"),
    SCALE_APPLY = is_code and "\t\tsum.x = __fmul_rn(sum.x, s);\n\t\tsum.y = __fmul_rn(sum.y, s);\n" ..
                              "\t\tsum.z = __fmul_rn(sum.z, s);\n\t\tsum.w = __fmul_rn(sum.w, s);" or "",
  }))
end

local function fields(spec)
  local op = SPEC.one_of(spec, "op", { "lowrank_grad_input", "lowrank_grad_weight",
                                    "decoder_grad_input", "decoder_grad_weight" })
  local k = { op = op, o = OPS[op] }
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
  if ok then ok, err = TILES.warps_ok(t, auto) end
  if ok then ok, err = TILES.stages_ok(t, auto, 1, 4) end
  if not ok then return nil, err end
  local nt = t.wm * t.wn * 32
  local entry = "dg_" .. k.op
  local p = { tile = t, arch_specific = false, name = k.op .. ".cu", entries = { { name = entry, threads = nt } } }
  if not k.o.a_kmajor or k.o.split then
    p.entries[2] = { name = entry .. "_reduce", threads = RNT, smem = 0 }
  end
  if WG.fits(k, t) then
    local smem = WG.smem_bytes(t)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    p.path, p.arch_specific, p.smem_bytes, p.entries[1].smem = "wgmma bf16", true, smem, smem
    return p
  end
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
  local eu = b_unit(k.bfmt, t.bn).EU
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
  local op, o, H, HIN, E, L, bfmt, F = k.op, k.o, k.H, k.HIN, k.E, k.L, k.bfmt, k.F
  local t = plan.tile
  local bm, bn, bk, wm, wn, stages = t.bm, t.bn, t.bk, t.wm, t.wn, t.stages
  local entry = "dg_" .. op
  local c = {
    spec = spec, op = op, o = o, entry = entry, bfmt = bfmt, F = F,
    H = H, HIN = HIN, E = E, L = L, bm = bm, bn = bn, bk = bk, wm = wm, wn = wn, stages = stages,
    HIN_H = HIN == 1 and "0" or "h", arch = SPEC.int_field(spec, "arch", 1),
    bname = o.w_operand and "w" or (op == "lowrank_grad_weight" and "x" or "y"),
    vec = k.vec, gfmt = k.gfmt, ofmt = k.ofmt,
    GT = FM.formats[k.gfmt].ctype, OT = FM.formats[k.ofmt].ctype,
  }
  if plan.path == "wgmma bf16" then
    c.about = about_lines(op, o, entry, (EMIT.subst(o.sig, { BT = F.ctype }):gsub("GT", c.GT):gsub("OT", c.OT)), c)
    c.smem = plan.smem_bytes
    local w = EMIT.writer()
    w:line(WG.render(c))
    finish(w, o, entry, F.code, k.vec)
    return w:text()
  end
  if plan.path == "mma.sync bf16" then
    c.about = about_lines(op, o, entry, (EMIT.subst(o.sig, { BT = F.ctype }):gsub("GT", c.GT):gsub("OT", c.OT)), c)
    c.smem = plan.smem_bytes
    local w = EMIT.writer()
    w:line(MMA.render(c))
    finish(w, o, entry, F.code, k.vec)
    return w:text()
  end

  -- fp32 SIMT: sm < 80, or a tile the tensor-core path cannot run (M.plan)
  local u = b_unit(bfmt, bn)
  local pa = o.a_kmajor and bm + 1 or bm
  local nbuf, smem = plan.nbuf, plan.smem_bytes
  local nt = wm * wn * 32
  local ua = o.a_kmajor and bk // 4 or bm // 4
  local a_units = o.a_kmajor and bm * ua or bk * ua
  local a_guard = a_units % nt ~= 0 and "u < A_UNITS && " or ""
  local ub = bn // u.EU
  local b_guard = (bk * ub) % nt ~= 0 and "u < BK * UB && " or ""

  local ctype = F.ctype
  local is_code = F.code and not k.vec -- a vector scale is applied to B, not the sum
  local v = {
    H = H, HIN = HIN, E = E, L = L,
    BM = bm, BN = bn, BK = bk, WM = wm, WN = wn, NBUF = nbuf,
    PA = pa, PA_WHY = o.a_kmajor and "BM + 1 (A is transposed in; the pad spreads its stores over the banks)"
                                 or "BM (A lands as it is, float4 stores)",
    SMEM = smem, bfmt = bfmt, GT = c.GT, OT = c.OT, gfmt = k.gfmt, ofmt = k.ofmt,
    UA = ua, UA_WHY = o.a_kmajor and "float4s along k" or "float4s along m", A_UNITS = a_units,
    EPW_B = F.epw, EU_B = u.EU, NWB = u.NWB,
  }

  local kv = {
    ENTRY = entry, BT = ctype, BNAME = o.w_operand and "w" or (op == "lowrank_grad_weight" and "x" or "y"),
    A_GUARD = a_guard, B_GUARD = b_guard, B_GUARD_S = b_guard,
    HIN_H = HIN == 1 and "0" or "h",
  }
  kv.SIG = EMIT.subst(o.sig, kv)
  local scale_name = o.scale
  local scale_load = is_code and fmt("\tconst float s = *%s;		// the %s's scale", scale_name,
                                     o.w_operand and "weight" or "activation")
                             or "\t// float operand: no scale"
  local scaled = is_code and "__fmul_rn(acc[i][j], s)" or "acc[i][j]"
  if o.split then
    -- lowrank_grad_input: split K (backward_mma.lua M.GI_SPLIT, all paths)
    kv.PROLOGUE = MMA.GI_SPLIT.PROLOGUE
    kv.ZH = "z"
    kv.K_GUARD_B = ""
    kv.LOAD_A = EMIT.subst(LOAD_A_KMAJOR, kv)
    kv.STORE_A = EMIT.subst(STORE_A_KMAJOR, kv)
    kv.EPILOGUE = EMIT.subst(EPI_INPUT, {
      SCALE_WHY = MMA.GI_SPLIT.why(is_code),
      SCALE_LOAD = is_code and MMA.GI_SPLIT.SCALE_LOAD or scale_load, OUT = "out", SCALED = scaled,
      CONV = "" })
  elseif o.a_kmajor then
    kv.PROLOGUE = "\tconst int M = B * T;\t\t\t// output rows (b, t)\n" ..
                  "\tconst int z = blockIdx.z;\t\t// head" ..
                  "\n\tconst int k_begin = 0, k_end = KT;"
    kv.ZH = "z"
    kv.K_GUARD_B = ""
    kv.LOAD_A = EMIT.subst(LOAD_A_KMAJOR, kv)
    kv.STORE_A = EMIT.subst(STORE_A_KMAJOR, kv)
    kv.EPILOGUE = EMIT.subst(EPI_INPUT, {
      SCALE_WHY = is_code and fmt("%s = %s · Σ (the integer operand's scale, once)", o.out_name, scale_name)
                          or fmt("%s = Σ", o.out_name),
      SCALE_LOAD = scale_load, OUT = o.out_name, SCALED = scaled,
      CONV = k.ofmt == "bf16" and "dg_f32_to_bf16" or "" })
  else
    kv.PROLOGUE = "\tconst int K = B * T;\t\t\t// the reduction (b, t)\n" ..
                  "\tconst int h = blockIdx.z % H, sp = blockIdx.z / H;	// head, split\n" ..
                  "\tconst int kt_all = (K + BK - 1) / BK;\n" ..
                  "\tconst int k_begin = min(sp * kt_per_split, kt_all);\n" ..
                  "\tconst int k_end = min(k_begin + kt_per_split, kt_all);	// empty: writes zeros"
    kv.ZH = "h"
    kv.K_GUARD_B = "k < K && "
    kv.LOAD_A = EMIT.subst(LOAD_A_MMAJOR, kv)
    kv.STORE_A = EMIT.subst(STORE_A_MMAJOR, kv)
    kv.EPILOGUE = EMIT.subst(EPI_WEIGHT, {
      SCALED_DESC = is_code and "sa · Σ" or "Σ",
      SCALE_LOAD = scale_load, SCALED = scaled })
  end
  kv.LOAD_B = indent(u.load, 4)
  kv.DECODE_B = indent(u.decode, 5)
  kv.RBS_DECL, kv.RBS_LOAD, kv.RBS_APPLY = "", "", ""
  if k.vec then
    kv.RBS_DECL = "\tfloat rbs[SB];\t\t// the scale of each unit's B row (per " ..
                  (o.w_operand and "channel" or "token") .. ")"
    kv.RBS_LOAD = fmt("\t\t\trbs[s] = rbv[s] ? dg_b_scale(%s, k, %s, T) : 0.0f;", o.scale, kv.ZH)
    kv.RBS_APPLY = "#pragma unroll\n\t\t\t\t\tfor (int c = 0; c < EU_B; ++c)\t// B(k, n) · s_k, rounded once\n" ..
                   "\t\t\t\t\t\tbd[c] = __fmul_rn(bd[c], rbs[s]);"
    kv.EPILOGUE = "\t(void)" .. o.scale .. ";\t// the scales went into B as it was staged\n" .. kv.EPILOGUE
  end
  kv.MAINLOOP = nbuf == 2 and MAIN_2 or MAIN_1

  local helpers = {}
  if k.ofmt == "bf16" then helpers.bf16 = true end
  FM.decoders(bfmt, helpers, true)

  local about = about_lines(op, o, entry, (kv.SIG:gsub("GT", c.GT):gsub("OT", c.OT)), c)
  about[#about + 1] = fmt("path: fp32 FMA, %s operand decoded to f32 while staged; shared memory %d bytes, %s.",
                          bfmt, smem, nbuf == 2 and "double-buffered" or "single buffer")

  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "backward.lua", about))
  w:line(DEV.helpers(helpers))
  w:line(EMIT.subst(HEAD, v))
  w:line(EMIT.subst(o.text, { HIN_H = kv.HIN_H }))
  w:line(EMIT.subst(KERNEL, kv))
  finish(w, o, entry, F.code, k.vec)
  return w:text()
end

return M

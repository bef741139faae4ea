--[[
gate_quant.lua — BDH's gate and the decoder's input quantizer in one pass
(a low-bit recipe's forward; dg_ref_gate_quant mirrors it): for every token
(b, t), over its H·L values of every head,

  xy[i]    = keep(i) ? (xs[i]·ys[i])·s : 0    gate_fwd's (templates/gate.lua),
             rounded to src's precision (bf16: once, to nearest even)
  scale    = max|xy| / qmax                   quantize_act ascale=token's
  codes[i] = clamp(rint(xy[i] / scale))       (templates/quantize.lua)

so the codes and scales are gate_fwd's xy through quantize_act's token
quantizer bit for bit, without xy in memory: xs and ys are read once and
the codes written once (the BDH layer, B 8, T 512, H 4, L 8192, bf16: 537 MB
in, 134 MB out, 158 µs at 4.25 TB/s, against gate_fwd's 805 MB and the
quantizer's 402 MB).

Kernel ABI (XT: src's type, float | unsigned short (bf16); CT: unsigned
char (uint8pos) | signed char (int8)):
  extern "C" __global__ void dg_gate_quant(const XT *xs, const XT *ys,
      long long rows, int T, float p, unsigned long long seed, unsigned step,
      unsigned layer, const unsigned *step_at, unsigned long long elem0,
      float *scales, CT *codes)
  xs, ys, codes (B, H, T, L); scales (B·T); rows = B·T; the dropout's
  arguments as gate_fwd's (keep(i) from element elem0 + i of the flat
  tensor); any grid (a block a token, grid-stride over tokens), the plan's
  threads a block.

A block a token (512 threads unless the tile says): vector j of the token
(VE values: 16 bytes of src) is thread j % NT's; a thread issues the loads
of its first RV vectors of xs and ys before any use, makes their xy, keeps
them in registers as src values and folds their max; past RV it folds and
later makes them again (the same bits). The block's max: an
xor butterfly a warp, the warps in order (max is order-free: any order gives
these bits). Then the codes of each vector by quantize.lua's dg_quant_vec
(a multiply by the token's reciprocal, exact by its argument) in one store.
A token whose L is not a whole number of vectors, or a tensor not 16-byte
aligned (codes VE-byte), goes element by element (dg_quant).

The staged form (tile t<N>/1, M.staged_fits): the token's xy in shared
memory instead of registers (H·L values of src: 64 KiB at the BDH shape in
bf16), so a thread holds only the loads in flight (U vectors of xs and of
ys at a time) and three blocks fit an SM where the register form fits one
of 512 threads (the register form keeps loads in flight only at a token's
start; ncu on the token quantizer it came from: 25% occupancy, the warps
mostly waiting on loads). Vector j is thread j % NT's in both passes and
lives at slot j of the stage, so a thread reads back only what it wrote:
the barriers are the max's, as in the register form. The same values in
the same order: the codes and scales are the register form's bit for bit.
The grid is a block a token (the scheduler balances them).
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local GATE = require("gate")
local Q = require("quantize")
local fmt = string.format

local M = {}

-- What both forms share: the constants, the dropout and quantizer
-- functions, the vector and element helpers.
local PRELUDE = [[
constexpr int H = ${H};		// heads: a token's segments
constexpr int L = ${L};		// latent: a segment's values
constexpr int NT = ${NT};		// threads a block
constexpr int NW = NT / 32;		// warps a block
constexpr int VE = ${VE};		// values a vector (16 bytes of src)
${FORM_CONSTS}
${QCONSTS}
typedef ${XT} XT;		// xs, ys (src)
typedef ${CT} CT;		// codes (act)

${PHILOX}
${QUANT_FN}

${QUANT_VEC_FN}

__device__ __forceinline__ float dg_ldx(const float *p, long long i) { return p[i]; }
__device__ __forceinline__ float dg_ldx(const unsigned short *p, long long i) { return dg_bf16_to_f32(p[i]); }

// A product rounded to src's precision, as gate_fwd stores it.
__device__ __forceinline__ float dg_to_src(float v)
{
	return ${ROUND};
}

// The floats of a vector's 16 bytes.
__device__ __forceinline__ void dg_unpack(const uint4 &q, float (&f)[VE])
{
${UNPACK}
}

// Vector j of the token at base (segments seg apart): its element offset.
__device__ __forceinline__ long long dg_vec_off(long long base, long long seg, int j)
{
	constexpr int CV = L / VE;
	const int g = (int)((unsigned)j / CV);	// j >= 0: no sign to mend
	return base + g * seg + (long long)(j - g * CV) * VE;
}

// Element i of the token at base: its offset.
__device__ __forceinline__ long long dg_elem_off(long long base, long long seg, int i)
{
	const int g = i / L;
	return base + g * seg + (i - g * L);
}

// xy of the VE values whose xs and ys are the 16 bytes ra and rb, packed
// back as src (the pack rounds to src's precision: bf16 by cvt.rn.bf16x2,
// a pair an instruction, dg_to_src's bits but a NaN's payload, which no
// max or code reads); keep: their dropout bits.
__device__ __forceinline__ uint4 dg_xy(const uint4 &ra, const uint4 &rb, unsigned keep, float s)
{
	float a[VE], b[VE], o[VE];
	dg_unpack(ra, a);
	dg_unpack(rb, b);
#pragma unroll
	for (int j = 0; j < VE; ++j)
		o[j] = (keep >> j) & 1u ? __fmul_rn(__fmul_rn(a[j], b[j]), s) : 0.0f;
${PACK}
}

// xy of the vector whose first draw is e (e = its offset + elem0, a
// multiple of 8: bf16's 8 values, elem0 whole Philox blocks), dropout on
// (0 < thr <= 65535): the block's 8 16-bit draws compared as they are (the
// high half against thr·2^16), no bits packed and taken apart again.
__device__ __forceinline__ uint4 dg_xy_whole(const uint4 &ra, const uint4 &rb, unsigned long long e, unsigned thr,
					     float s, unsigned long long seed, unsigned step, unsigned layer)
{
	const uint4 r = dg_drop_block(e >> 3, seed, step, layer);
	const unsigned w[4] = { r.x, r.y, r.z, r.w }, th = thr << 16;
	float a[VE], b[VE], o[VE];
	dg_unpack(ra, a);
	dg_unpack(rb, b);
#pragma unroll
	for (int j = 0; j < VE; ++j) {
		const bool keep = (j & 1) ? w[j >> 1] >= th : (w[j >> 1] << 16) >= th;
		o[j] = keep ? __fmul_rn(__fmul_rn(a[j], b[j]), s) : 0.0f;
	}
${PACK}
}

// xy of the one value at element off (the element path).
__device__ __forceinline__ float dg_xy1(const XT *__restrict__ xs, const XT *__restrict__ ys, long long off,
				       unsigned long long elem0, unsigned thr, unsigned long long seed, unsigned step,
				       unsigned layer, float s)
{
	const bool keep = dg_keep1((unsigned long long)off + elem0, thr, seed, step, layer);
	return keep ? dg_to_src(__fmul_rn(__fmul_rn(dg_ldx(xs, off), dg_ldx(ys, off)), s)) : 0.0f;
}


// The block's max of each thread's a (an xor butterfly a warp, then the
// warps in order: max is order-free, so any order gives these bits); red
// holds a float a warp and is free again on return.
__device__ __forceinline__ float dg_block_max(float a, float *red, int lane, int warp)
{
#pragma unroll
	for (int m = 16; m > 0; m >>= 1)
		a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, m));
	if (lane == 0)
		red[warp] = a;
	__syncthreads();
	a = red[0];
#pragma unroll
	for (int w = 1; w < NW; ++w)
		a = fmaxf(a, red[w]);
	__syncthreads();	// red is rewritten by the next token
	return a;
}

// a folded with |v| of the VE values of a vector's 16 bytes
__device__ __forceinline__ float dg_vec_absmax(const uint4 &q, float a)
{
	float f[VE];
	dg_unpack(q, f);
#pragma unroll
	for (int e = 0; e < VE; ++e)
		a = fmaxf(a, fabsf(f[e]));
	return a;
}

${AMAX}

// The token's scale from each thread's max a (dg_block_max), its
// reciprocal in si, written to scales[r] by thread 0.
__device__ __forceinline__ float dg_token_scale(float a, float *red, int lane, int warp, int tid,
					       float *__restrict__ scales, long long r, float2 &si)
{
	a = dg_block_max(a, red, lane, warp);
	const float sc = __fdiv_rn(a, (float)QMAX);
	si = dg_quant_inv(sc);
	if (tid == 0)
		scales[r] = sc;
	return sc;
}

// The element path (a token not of whole vectors, or tensors not aligned):
// a thread's max over its elements of the token at base, then their codes.
__device__ __forceinline__ float dg_elem_max(const XT *__restrict__ xs, const XT *__restrict__ ys, long long base,
					     long long seg, unsigned long long elem0, unsigned thr, unsigned long long seed,
					     unsigned step, unsigned layer, float s, int tid)
{
	float a = 0.0f;
	for (int i = tid; i < H * L; i += NT)
		a = fmaxf(a, fabsf(dg_xy1(xs, ys, dg_elem_off(base, seg, i), elem0, thr, seed, step, layer, s)));
	return a;
}

__device__ __forceinline__ void dg_elem_codes(const XT *__restrict__ xs, const XT *__restrict__ ys, long long base,
					      long long seg, unsigned long long elem0, unsigned thr, unsigned long long seed,
					      unsigned step, unsigned layer, float s, int tid, float sc, CT *__restrict__ codes)
{
	for (int i = tid; i < H * L; i += NT) {
		const long long off = dg_elem_off(base, seg, i);
		codes[off] = (CT)dg_quant(dg_xy1(xs, ys, off, elem0, thr, seed, step, layer, s), sc);
	}
}
]]

-- The register form (the banner).
local KERNEL = [[
// xy of the VE values at element off.
__device__ __forceinline__ uint4 dg_xy_vec(const XT *__restrict__ xs, const XT *__restrict__ ys, long long off,
					   unsigned keep, float s)
{
	return dg_xy(__ldg((const uint4 *)(xs + off)), __ldg((const uint4 *)(ys + off)), keep, s);
}

extern "C" __global__ void __launch_bounds__(NT)
dg_gate_quant(const XT *__restrict__ xs, const XT *__restrict__ ys, long long rows, int T, float p,
	      unsigned long long seed, unsigned step, unsigned layer, const unsigned *__restrict__ step_at,
	      unsigned long long elem0, float *__restrict__ scales, CT *__restrict__ codes)
{
	if (step_at)
		step += *step_at;		// a captured step's, from its control block
	const unsigned thr = dg_drop_threshold(p);
	const float s = p > 0.0f ? __fdiv_rn(1.0f, __fsub_rn(1.0f, p)) : 1.0f;	// 1/(1 - p)
	__shared__ float red[NW];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const long long seg = (long long)T * L;
	constexpr int NV = H * (L / VE);	// whole vectors a token (when L % VE == 0)
	const bool vec = L % VE == 0 && ((unsigned long long)xs & 15ull) == 0 && ((unsigned long long)ys & 15ull) == 0 &&
			 ((unsigned long long)codes & (unsigned long long)(VE - 1)) == 0;
	for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
		const long long b = r / T, base = (b * H * T + (r - b * T)) * L;
		uint4 q[RV];	// a thread's first RV vectors: xs, then their xy
		float a = 0.0f;
		if (vec) {
			{
				uint4 rb[RV];
#pragma unroll
				for (int k = 0; k < RV; ++k) {	// every load first
					const int j = tid + k * NT;
					if (j < NV) {
						const long long off = dg_vec_off(base, seg, j);
						q[k] = __ldg((const uint4 *)(xs + off));
						rb[k] = __ldg((const uint4 *)(ys + off));
					}
				}
#pragma unroll
				for (int k = 0; k < RV; ++k) {
					const int j = tid + k * NT;
					if (j < NV) {
						const long long off = dg_vec_off(base, seg, j);
						q[k] = dg_xy(q[k], rb[k], dg_keep_at<VE>((unsigned long long)off + elem0, thr, seed, step, layer), s);
					}
				}
			}
#pragma unroll
			for (int k = 0; k < RV; ++k)
				if (tid + k * NT < NV)
					a = dg_vec_absmax(q[k], a);
			for (int j = tid + RV * NT; j < NV; j += NT) {	// past the registers: made again below
				const long long off = dg_vec_off(base, seg, j);
				a = dg_vec_absmax(dg_xy_vec(xs, ys, off, dg_keep_at<VE>((unsigned long long)off + elem0, thr, seed, step, layer), s), a);
			}
		} else {
			a = dg_elem_max(xs, ys, base, seg, elem0, thr, seed, step, layer, s, tid);
		}
		float2 si;
		const float sc = dg_token_scale(a, red, lane, warp, tid, scales, r, si);
		if (vec) {
#pragma unroll
			for (int k = 0; k < RV; ++k) {
				const int j = tid + k * NT;
				if (j < NV) {
					float f[VE];
					dg_unpack(q[k], f);
					unsigned w[VE / 4];
					dg_quant_vec(f, sc, si, w);
					const long long off = dg_vec_off(base, seg, j);
${STORE}
				}
			}
			for (int j = tid + RV * NT; j < NV; j += NT) {
				const long long off = dg_vec_off(base, seg, j);
				float f[VE];
				dg_unpack(dg_xy_vec(xs, ys, off, dg_keep_at<VE>((unsigned long long)off + elem0, thr, seed, step, layer), s), f);
				unsigned w[VE / 4];
				dg_quant_vec(f, sc, si, w);
${STORE}
			}
		} else {
			dg_elem_codes(xs, ys, base, seg, elem0, thr, seed, step, layer, s, tid, sc, codes);
		}
	}
}
]]

-- The staged form (the banner): xy in shared memory, U vectors of xs and
-- ys a thread in flight.
local KERNEL_STAGED = [[
extern "C" __global__ void __launch_bounds__(NT)
dg_gate_quant(const XT *__restrict__ xs, const XT *__restrict__ ys, long long rows, int T, float p,
	      unsigned long long seed, unsigned step, unsigned layer, const unsigned *__restrict__ step_at,
	      unsigned long long elem0, float *__restrict__ scales, CT *__restrict__ codes)
{
	if (step_at)
		step += *step_at;		// a captured step's, from its control block
	const unsigned thr = dg_drop_threshold(p);
	const float s = p > 0.0f ? __fdiv_rn(1.0f, __fsub_rn(1.0f, p)) : 1.0f;	// 1/(1 - p)
	extern __shared__ __align__(16) uint4 sxy[];	// the token's xy: vector j at slot j
	__shared__ float red[NW];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const long long seg = (long long)T * L;
	constexpr int NV = H * (L / VE);	// the token's vectors
	const bool vec = ((unsigned long long)xs & 15ull) == 0 && ((unsigned long long)ys & 15ull) == 0 &&
			 ((unsigned long long)codes & (unsigned long long)(VE - 1)) == 0;
	const bool whole = VE == 8 && (elem0 & 7ull) == 0ull && thr <= 0xffffu;	// dg_xy_whole's draws
	constexpr bool FULLB = NV % (U * NT) == 0;	// every batch whole
	constexpr bool HEADB = (L / VE) % (U * NT) == 0;	// every batch within one head (so whole)
	constexpr bool HEADT = (L / VE) % NT == 0;	// a head's vectors whole strides of the block
	for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
		const long long b = r / T, base = (b * H * T + (r - b * T)) * L;
		float a = 0.0f;
		if (vec) {
			dg_amax_t m = 0;
			// MODE (uniform; each its own copy of the loop, so a batch's
			// U Philox chains are one block of code the scheduler
			// interleaves): 0 no dropout, 1 whole blocks (dg_xy_whole), 2
			// dg_keep_at's bits
			auto stage = [&](const int MODE) {
				for (int j0 = tid; j0 < NV; j0 += U * NT) {
					uint4 ra[U], rb[U];
					long long off[U];
#pragma unroll
					for (int u = 0; u < U; ++u) {	// the batch's loads first
						const int j = j0 + u * NT;
						// a batch within one head: its vectors NT·VE values apart
						off[u] = HEADB ? (u == 0 ? dg_vec_off(base, seg, j0) : off[0] + (long long)u * NT * VE)
							       : dg_vec_off(base, seg, j);
						if (FULLB || j < NV) {
							ra[u] = __ldg((const uint4 *)(xs + off[u]));
							rb[u] = __ldg((const uint4 *)(ys + off[u]));
						}
					}
#pragma unroll
					for (int u = 0; u < U; ++u) {
						const int j = j0 + u * NT;
						if (FULLB || j < NV) {
							const unsigned long long e = (unsigned long long)off[u] + elem0;
							const uint4 q = MODE == 0 ? dg_xy(ra[u], rb[u], 0xffffffffu, s)
								      : MODE == 1 ? dg_xy_whole(ra[u], rb[u], e, thr, s, seed, step, layer)
										  : dg_xy(ra[u], rb[u], dg_keep_at<VE>(e, thr, seed, step, layer), s);
							sxy[j] = q;
							m = dg_amax_fold(q, m);
						}
					}
				}
			};
			if (thr == 0u)
				stage(0);
			else if (whole)
				stage(1);
			else
				stage(2);
			a = dg_amax_value(m);
		} else {
			a = dg_elem_max(xs, ys, base, seg, elem0, thr, seed, step, layer, s, tid);
		}
		float2 si;
		const float sc = dg_token_scale(a, red, lane, warp, tid, scales, r, si);
		if (vec) {
			auto codes_of = [&](int j, long long off) {
				float f[VE];
				dg_unpack(sxy[j], f);
				unsigned w[VE / 4];
				dg_quant_vec(f, sc, si, w);
${STORE}
			};
			if (HEADT) {	// a head's vectors a whole number of strides: its offset once
#pragma unroll 1
				for (int g = 0; g < H; ++g) {
					const long long hb = base + (long long)g * seg;
					for (int jj = tid; jj < L / VE; jj += NT)	// the slots this thread wrote
						codes_of(g * (L / VE) + jj, hb + (long long)jj * VE);
				}
			} else {
				for (int j = tid; j < NV; j += NT)	// the slots this thread wrote
					codes_of(j, dg_vec_off(base, seg, j));
			}
		} else {
			dg_elem_codes(xs, ys, base, seg, elem0, thr, seed, step, layer, s, tid, sc, codes);
		}
	}
}
]]

local UNPACK = {
  bf16 = [[
	const unsigned u[4] = { q.x, q.y, q.z, q.w };
#pragma unroll
	for (int j = 0; j < 4; ++j) {
		f[2 * j] = __uint_as_float(u[j] << 16);
		f[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
	}]],
  f32 = [[
	f[0] = __uint_as_float(q.x), f[1] = __uint_as_float(q.y);
	f[2] = __uint_as_float(q.z), f[3] = __uint_as_float(q.w);]],
}

-- o (f32 products) into 16 bytes of src: bf16 rounded to nearest even a
-- pair an instruction, f32 as they are.
local PACK = {
  bf16 = [[
	return make_uint4(dg_bf16x2(o[0], o[1]), dg_bf16x2(o[2], o[3]), dg_bf16x2(o[4], o[5]), dg_bf16x2(o[6], o[7]));]],
  f32 = [[
	return make_uint4(__float_as_uint(o[0]), __float_as_uint(o[1]), __float_as_uint(o[2]), __float_as_uint(o[3]));]],
}

-- A thread's max of |xy| over its vectors: bf16 a pair of lanes at a time
-- (max.bf16x2 of the values with their sign bits cleared: the same max as
-- fmaxf of the widened values, NaN ignored likewise, the two lanes widened
-- once at the end); f32 as the values.
local AMAX = {
  bf16 = [[
typedef unsigned dg_amax_t;	// a bf16 pair: the max of the even and of the odd values
__device__ __forceinline__ unsigned dg_bmax2(unsigned x, unsigned y)
{
	unsigned d;
	asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(y));
	return d;
}
__device__ __forceinline__ dg_amax_t dg_amax_fold(const uint4 &q, dg_amax_t m)
{
	m = dg_bmax2(m, q.x & 0x7fff7fffu);
	m = dg_bmax2(m, q.y & 0x7fff7fffu);
	m = dg_bmax2(m, q.z & 0x7fff7fffu);
	return dg_bmax2(m, q.w & 0x7fff7fffu);
}
__device__ __forceinline__ float dg_amax_value(dg_amax_t m)
{
	return fmaxf(__uint_as_float(m << 16), __uint_as_float(m & 0xffff0000u));
}]],
  f32 = [[
typedef float dg_amax_t;
__device__ __forceinline__ dg_amax_t dg_amax_fold(const uint4 &q, dg_amax_t m) { return dg_vec_absmax(q, m); }
__device__ __forceinline__ float dg_amax_value(dg_amax_t m) { return m; }]],
}

local STORE = {
  [8] = "\t\t\t\t\t*(uint2 *)(codes + off) = make_uint2(w[0], w[1]);",
  [4] = "\t\t\t\t\t*(unsigned *)(codes + off) = w[0];",
}

local ACTS = { "uint8pos", "int8" }

-- Vectors a thread keeps in registers: the token's, up to 8 (xs's and
-- ys's loads all in flight at once: 64 registers).
local function keep_vectors(H, L, ve, nt)
  local nv = H * (L // ve)
  return math.max(1, math.min(8, (nv + nt - 1) // nt))
end

-- The auto tile: 512 threads of the register form (a BDH token, 32768
-- bf16 values, is 8 vectors a thread, all in registers), or the staged
-- form's 256 (t256/1) where a token's values fill every thread with a
-- vector and fit three blocks an SM. At the BDH shape (B 8, H 4, T 512,
-- L 8192 bf16: 64 KiB a token) on an H100 the staged t256/1 took 443 us
-- (p 0) / 526 (p 0.1) against the register form's 564 / 619 (t128/1: 589
-- / 643): the staged form reads xs and ys once, coalesced, and its second
-- pass (scale, quantize, store) reads shared memory, where the register
-- form's 8 vectors a thread hold two blocks an SM. ncu on an H100 (the w8a8
-- step, p 0.1): 363 us, DRAM at 54%, but 0.70 instructions issued a cycle a
-- scheduler: bound by issuing (56 an element, half of them Philox's). With
-- one Philox block drawing 8 elements (16-bit draws, dragon/rng.h) and xy
-- packed by cvt.rn.bf16x2: the step's gate_quant 2.26 -> 1.76 ms (6 layers).
local AUTO_THREADS = 512
local AUTO_STAGED_THREADS = 256

-- Vectors of xs and of ys a thread of the staged form has in flight: 4
-- (64 bytes each way; 64 registers of loads would leave two blocks of 256
-- an SM, not three).
local STAGED_U = 4

-- The staged form's shared memory: the token's H·L values of src.
local function stage_bytes(H, L, src)
  return H * L * (src == "bf16" and 2 or 4)
end

-- Whether the staged form (tile t<N>/1) takes the spec's shape: whole
-- vectors a segment (L a multiple of VE) and the token within the
-- shared memory a block may have on the arch; else nil and why.
function M.staged_fits(H, L, src, arch)
  local ve = src == "bf16" and 8 or 4
  if L % ve ~= 0 then
    return nil, fmt("the staged form takes whole %d-value vectors a head: latent %d is not a multiple of %d", ve, L, ve)
  end
  local bytes, limit = stage_bytes(H, L, src), TILES.smem_limit(arch)
  if bytes > limit then
    return nil, fmt("the staged form keeps a token's %d values of %s in shared memory, %d bytes, more than the %d an sm_%d block can have",
                    H * L, src, bytes, limit, arch)
  end
  return true
end

function M.plan(spec)
  SPEC.one_of(spec, "op", { "gate_quant" })
  local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
  SPEC.one_of(spec, "act", ACTS)
  local H = SPEC.int_field(spec, "heads", 1)
  local L = SPEC.int_field(spec, "latent", 1)
  local arch = SPEC.int_field(spec, "arch", 1)
  local auto = TILES.tile_is_auto(TILES.tile_of(spec))
  local p, why = TILES.threads_plan(spec, { "dg_gate_quant" }, "gate_quant.cu", 1)
  if p and auto then
    local ve = src == "bf16" and 8 or 4
    local staged = M.staged_fits(H, L, src, arch) and H * L // ve >= AUTO_STAGED_THREADS and
                   3 * stage_bytes(H, L, src) <= TILES.smem_limit(arch)
    p.tile.threads = staged and AUTO_STAGED_THREADS or AUTO_THREADS
    p.tile.stages = staged and 1 or 0
    p.entries[1].threads = p.tile.threads
  end
  if p and p.tile.stages == 1 then
    local ok, err = M.staged_fits(H, L, src, arch)
    if not ok then return TILES.refuse(p.tile, false, "%s", err) end
    p.entries[1].smem = stage_bytes(H, L, src)
  end
  return p, why
end

function M.render(spec, plan)
  SPEC.one_of(spec, "op", { "gate_quant" })
  local H = SPEC.int_field(spec, "heads", 1)
  local L = SPEC.int_field(spec, "latent", 1)
  local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
  local act = SPEC.one_of(spec, "act", ACTS)
  local nt = plan.tile.threads
  local staged = plan.tile.stages == 1
  local qmax = FM.formats[act].qmax
  local ve = src == "bf16" and 8 or 4
  local rv = keep_vectors(H, L, ve, nt)
  local v = {
    H = H, L = L, NT = nt, VE = ve,
    FORM_CONSTS = staged and fmt("constexpr int U = %d;\t\t// vectors of xs and of ys a thread has in flight", STAGED_U) or
      fmt("constexpr int RV = %d;\t\t// vectors a thread keeps in registers", rv),
    QCONSTS = EMIT.subst(Q.QCONSTS, { QMAX = qmax, QLO = act == "uint8pos" and 0 or -qmax, act = act }),
    XT = src == "bf16" and "unsigned short" or "float",
    CT = act == "uint8pos" and "unsigned char" or "signed char",
    PHILOX = GATE.PHILOX, QUANT_FN = Q.QUANT_FN, QUANT_VEC_FN = Q.QUANT_VEC_FN,
    ROUND = src == "bf16" and "dg_bf16_to_f32(dg_f32_to_bf16(v))" or "v",
    UNPACK = UNPACK[src], PACK = PACK[src], STORE = STORE[ve], AMAX = AMAX[src],
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "gate_quant.lua", {
    fmt("gate_quant: codes (B, %d, T, %d) %s (qmax %d) and a scale a token = quantize_act(gate_fwd(xs, ys)) over", H, L,
        act, qmax),
    fmt("the token's %d values, xs and ys %s; no xy in memory.", H * L, src),
    "",
    fmt("dg_gate_quant(xs, ys, long long rows, int T, float p, seed, step, layer, step_at, elem0, scales, codes)"),
    staged and fmt("   a block a token, %d threads, %d-value vectors, the token's xy staged in %d bytes of dynamic shared memory",
                   nt, ve, stage_bytes(H, L, src)) or
      fmt("   a block a token (grid-stride), %d threads, %d-value vectors, %d a thread in registers", nt, ve, rv),
  }))
  w:line(DEV.helpers({ bf16 = true, bf16x2 = true, code = true }))
  w:line(EMIT.subst(PRELUDE, v))
  w:line(EMIT.subst(staged and KERNEL_STAGED or KERNEL, v))
  return w:text()
end

return M

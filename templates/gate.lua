--[[
gate.lua — BDH's gate xy = dropout(xs · ys) and its backward, element-wise
over the flat (B, H, T, L) tensors (dg_ref_gate_op mirrors them):

  gate_fwd  xy[i]  = keep(i) ? (xs[i]·ys[i])·s : 0
  gate_bwd  g      = keep(i) ? dxy[i]·s : 0
            dxs[i] = g·ys[i]
            dys[i] = ys[i] > 0 ? g·xs[i] : 0     written over dxy (in place)
  s = 1/(1 − p) (1 when p = 0); keep(i) = dg_dropout_keep(seed, step, layer,
  e, p) of dragon/rng.h at e = elem0 + i: the 16-bit half e % 2 of word
  (e/2) % 4 of Philox4x32-10 at counter (e/8 low, e/8 high, step, layer)
  under key (seed low, seed high), kept when it is at least the threshold
  floor(p·2^16) (every element when that is 0). elem0 places the tensor in a larger one's stream: a
  data-parallel rank running rows row0 .. of the global batch passes
  row0·H·T·L, and draws the masks one process running it all draws there
  (0: the tensor's own).

Kernel ABI (XT: act's type, GT: the gradients' (spec out; gate_bwd only),
each float (f32) | unsigned short (bf16)):
  extern "C" __global__ void dg_gate_fwd(const XT *xs, const XT *ys, XT *xy,
      int B, int T, float p, unsigned long long seed, unsigned step, unsigned layer,
      const unsigned *step_at, unsigned long long elem0)
  extern "C" __global__ void dg_gate_bwd(GT *dxy, const XT *xs, const XT *ys,
      GT *dxs, int B, int T, float p, unsigned long long seed, unsigned step,
      unsigned layer, const unsigned *step_at, unsigned long long elem0)
  step_at: NULL, or a device word added to step (a step captured into a
  CUDA graph reads its step from its control block).
  elem0: added to every element's index before its draw, any value (a
  vector whose first draw is not a whole Philox block's takes the blocks it
  straddles: dg_keep_at).
  gate_bwd's gradients follow dragon/spec.h's convention: out is the format
  of every gradient it writes, dys written over dxy included, so dxy, dys
  and dxs are all `out` (f32 by default).
  any grid (grid-stride over vectors of VE elements: 16 bytes of the
  narrowest tensor, 4 when every tensor is f32, else 8 — half a Philox
  block or one), the plan's threads a block; 16-byte aligned.

Schedule: 16-byte vectors, two a thread an iteration (U) with all their
loads issued before the first use, kept as raw words (64 bytes in flight a
thread for gate_fwd bf16 at 57 registers: 64 KiB an SM); the Philox
blocks of a vector drawn once (8 bf16 elements: two blocks); bf16 results
packed two an instruction (cvt.rn.bf16x2 on sm_80 on, a pair holding a
NaN by dg_f32_to_bf16).

Bytes and time at the BDH shape (B 8, H 4, T 512, L 8192, bf16): gate_fwd
reads xs and ys and writes xy, 3 × 268 MB = 805 MB: 189 µs at 4.25 TB/s,
1.14 ms a step (6 layers). gate_bwd (bf16 gradients) reads dxy, xs, ys
and writes dxs, dys: 1.34 GB, 316 µs (the sm_90 bf16 model runs it fused
into decoder_gate_bwd instead).

Arithmetic: every product rounded once (__fmul_rn), s = __fdiv_rn(1, 1 − p):
the reference's C, bit for bit; bf16 values are read exactly and bf16
results are the f32 result rounded to nearest even once. p, seed, step,
layer and elem0 are kernel arguments (step plus *step_at), so one kernel
serves every step, layer, rate and rank.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local TILES = require("tiles")
local DEV = require("device")
local EW = require("elementwise")
local fmt = string.format

local M = {}

-- The dropout's mask bits, also read by templates/decoder_gate.lua (the
-- gate's backward fused into the decoder input gradient).
local PHILOX = [[
// Philox4x32-10 (dragon/rng.h dg_philox4x32): the block of counter
// (c0, c1, c2, c3) under key (k0, k1).
__device__ __forceinline__ uint4 dg_philox(unsigned c0, unsigned c1, unsigned c2, unsigned c3,
					   unsigned k0, unsigned k1)
{
#pragma unroll
	for (int r = 0; r < 10; ++r) {
		const unsigned lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
		const unsigned lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
		c0 = hi1 ^ c1 ^ k0;
		c1 = lo1;
		c2 = hi0 ^ c3 ^ k1;
		c3 = lo0;
		k0 += 0x9E3779B9u;
		k1 += 0xBB67AE85u;
	}
	return make_uint4(c0, c1, c2, c3);
}

// The drop threshold of p (dg_dropout_threshold): an element is dropped
// when its 16-bit draw is below it; 0 keeps every element, 65536 none.
__device__ __forceinline__ unsigned dg_drop_threshold(float p)
{
	if (!(p > 0.0f))
		return 0u;
	if (!(p < 1.0f))
		return 65536u;
	return (unsigned)((double)p * 65536.0);
}

// The dropout stream's Philox block q of (seed, step, layer) (dragon/rng.h
// dg_dropout_keep: counter (q low, q high, step, layer), key (seed low,
// seed high)): the draws of elements 8·q .. 8·q+7.
__device__ __forceinline__ uint4 dg_drop_block(unsigned long long q, unsigned long long seed, unsigned step,
					       unsigned layer)
{
	return dg_philox((unsigned)q, (unsigned)(q >> 32), step, layer, (unsigned)seed, (unsigned)(seed >> 32));
}

// Whether each of the 8 elements of one Philox block r survives (element
// 8·q + j: its draw the 16-bit half j % 2 of word j / 2, at least thr).
__device__ __forceinline__ void dg_keep8_flags(const uint4 &r, unsigned thr, bool (&keep)[8])
{
	const unsigned w[4] = { r.x, r.y, r.z, r.w };
#pragma unroll
	for (int k = 0; k < 4; ++k) {
		keep[2 * k] = (w[k] & 0xffffu) >= thr;
		keep[2 * k + 1] = (w[k] >> 16) >= thr;
	}
}

// The same as bits (bit j: element 8·q + j).
__device__ __forceinline__ unsigned dg_keep8(const uint4 &r, unsigned thr)
{
	bool keep[8];
	dg_keep8_flags(r, thr, keep);
	unsigned bits = 0u;
#pragma unroll
	for (int j = 0; j < 8; ++j)
		bits |= (unsigned)keep[j] << j;
	return bits;
}

// The keep bits of the 8·G elements of Philox blocks q0 .. q0+G-1 (bit j:
// element 8·q0 + j).
template <int G>
__device__ __forceinline__ unsigned dg_keep_bits(unsigned long long q0, unsigned thr,
						 unsigned long long seed, unsigned step, unsigned layer)
{
	if (thr == 0u)
		return 0xffffffffu;
	unsigned bits = 0u;
#pragma unroll
	for (int g = 0; g < G; ++g)
		bits |= dg_keep8(dg_drop_block(q0 + g, seed, step, layer), thr) << (8 * g);
	return bits;
}

// Whether element i survives.
__device__ __forceinline__ bool dg_keep1(unsigned long long i, unsigned thr, unsigned long long seed,
					 unsigned step, unsigned layer)
{
	return ((dg_keep_bits<1>(i >> 3, thr, seed, step, layer) >> (i & 7ull)) & 1u) != 0u;
}

// The keep bits of the N elements i .. i+N-1 (bit j: element i + j), any i:
// the blocks from i/8 that N elements from a multiple of 4 cover (one for
// N = 4 or 8 at a multiple of N), and one more where i's place in its block
// makes them straddle it (an elem0 that is not whole blocks: uniform across
// the grid, so the branch does not diverge).
template <int N>
__device__ __forceinline__ unsigned dg_keep_at(unsigned long long i, unsigned thr, unsigned long long seed,
					       unsigned step, unsigned layer)
{
	static_assert(N % 4 == 0 && N <= 16, "whole half blocks, and one block more, in a word");
	constexpr int NB = (N + 7) / 8;
	const unsigned sh = (unsigned)(i & 7ull);
	unsigned bits = dg_keep_bits<NB>(i >> 3, thr, seed, step, layer);
	if (sh + N <= 8u * NB)
		return (bits >> sh) & ((1u << N) - 1u);
	const unsigned hi = dg_keep_bits<1>((i >> 3) + NB, thr, seed, step, layer);
	return (unsigned)((((unsigned long long)hi << (8 * NB)) | bits) >> sh) & ((1u << N) - 1u);
}
]]

M.PHILOX = PHILOX

local CONSTS = [[
constexpr int H = ${H};		// heads
constexpr int L = ${L};		// latent
constexpr int NT = ${NT};		// threads a block
constexpr int VE = ${VE};		// elements a vector: 16 bytes of the narrowest tensor
constexpr int U = ${U};		// vectors a thread an iteration, all loaded before the first use
typedef ${XT} XT;		// xs, ys, xy (act)
typedef ${GT} GT;		// dxy, dys, dxs (gate_bwd's out)
]]

local PRE = [[
	if (step_at)
		step += *step_at;		// a captured step's, from its control block
	const unsigned thr = dg_drop_threshold(p);
	const float s = p > 0.0f ? __fdiv_rn(1.0f, __fsub_rn(1.0f, p)) : 1.0f;	// 1/(1 - p)]]

-- The loop: U vectors a thread an iteration (iv = i0 + u·NT, so a warp's
-- accesses of each u are whole lines), every load of the U vectors issued
-- before the first use and kept as raw 16-byte words (half the registers
-- of floats for bf16), then the mask, the arithmetic and the stores; the
-- last n % VE elements one at a time.
local LOOP = [[
extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(${PARAMS})
{
	const long long n = ${N};
	const long long nv = n / VE;			// whole vectors
	const long long first = (long long)blockIdx.x * (NT * U) + threadIdx.x;
	const long long stride = (long long)gridDim.x * (NT * U);
${PRE}
	for (long long i0 = first; i0 < nv; i0 += stride) {
${VEC}
	}
	for (long long i = nv * VE + (long long)blockIdx.x * NT + threadIdx.x; i < n; i += (long long)gridDim.x * NT) {
${ONE}
	}
}
]]

-- Raw vectors: the 16-byte words of vector iv (VE elements) of an f32 or
-- bf16 tensor, their floats, and the store of VE floats (bf16: a pair an
-- instruction, device.lua's dg_pack2).
local RAW = [[
template <typename T>
struct dg_raw {
	uint4 w[(VE * sizeof(T) + 15) / 16];	// (1 for a bf16 type where VE is 4: never read)
};

template <typename T>
__device__ __forceinline__ void dg_ldr(const T *p, long long iv, dg_raw<T> &r)
{
#pragma unroll
	for (int k = 0; k < VE * (int)sizeof(T) / 16; ++k)
		r.w[k] = ((const uint4 *)p)[iv * (VE * (long long)sizeof(T) / 16) + k];
}

__device__ __forceinline__ void dg_unr(const dg_raw<float> &r, float (&f)[VE])
{
#pragma unroll
	for (int k = 0; k < VE / 4; ++k) {
		f[4 * k] = __uint_as_float(r.w[k].x), f[4 * k + 1] = __uint_as_float(r.w[k].y);
		f[4 * k + 2] = __uint_as_float(r.w[k].z), f[4 * k + 3] = __uint_as_float(r.w[k].w);
	}
}

__device__ __forceinline__ void dg_unr(const dg_raw<unsigned short> &r, float (&f)[VE])
{
#pragma unroll
	for (int k = 0; k < VE / 8; ++k) {
		const unsigned u[4] = { r.w[k].x, r.w[k].y, r.w[k].z, r.w[k].w };
#pragma unroll
		for (int j = 0; j < 4; ++j) {
			f[8 * k + 2 * j] = __uint_as_float(u[j] << 16);
			f[8 * k + 2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
		}
	}
}

__device__ __forceinline__ void dg_stv(float *p, long long iv, const float (&f)[VE])
{
	dg_st(p, iv, f);
}

__device__ __forceinline__ void dg_stv(unsigned short *p, long long iv, const float (&f)[VE])
{
#pragma unroll
	for (int k = 0; k < VE / 8; ++k)
		((uint4 *)p)[iv * (VE / 8) + k] = make_uint4(dg_pack2(f[8 * k], f[8 * k + 1]), dg_pack2(f[8 * k + 2], f[8 * k + 3]),
							     dg_pack2(f[8 * k + 4], f[8 * k + 5]), dg_pack2(f[8 * k + 6], f[8 * k + 7]));
}
]]

local FWD_VEC = [[
		dg_raw<XT> ra[U], rb[U];
#pragma unroll
		for (int u = 0; u < U; ++u)		// every load first
			if (i0 + u * NT < nv) {
				dg_ldr(xs, i0 + u * NT, ra[u]);
				dg_ldr(ys, i0 + u * NT, rb[u]);
			}
#pragma unroll
		for (int u = 0; u < U; ++u) {
			const long long iv = i0 + u * NT;
			if (iv >= nv)
				break;
			float a[VE], b[VE], o[VE];
			dg_unr(ra[u], a);
			dg_unr(rb[u], b);
			const unsigned keep = dg_keep_at<VE>((unsigned long long)iv * VE + elem0, thr, seed, step, layer);
#pragma unroll
			for (int j = 0; j < VE; ++j)
				o[j] = (keep >> j) & 1u ? __fmul_rn(__fmul_rn(a[j], b[j]), s) : 0.0f;
			dg_stv(xy, iv, o);
		}]]

local FWD_ONE = [[
		const bool keep = dg_keep1((unsigned long long)i + elem0, thr, seed, step, layer);
		dg_st1(xy, i, keep ? __fmul_rn(__fmul_rn(dg_ld1(xs, i), dg_ld1(ys, i)), s) : 0.0f);]]

local BWD_VEC = [[
		dg_raw<GT> rd[U];
		dg_raw<XT> ra[U], rb[U];
#pragma unroll
		for (int u = 0; u < U; ++u)		// every load first
			if (i0 + u * NT < nv) {
				dg_ldr(dxy, i0 + u * NT, rd[u]);
				dg_ldr(xs, i0 + u * NT, ra[u]);
				dg_ldr(ys, i0 + u * NT, rb[u]);
			}
#pragma unroll
		for (int u = 0; u < U; ++u) {
			const long long iv = i0 + u * NT;
			if (iv >= nv)
				break;
			float d[VE], a[VE], b[VE], gx[VE];
			dg_unr(rd[u], d);
			dg_unr(ra[u], a);
			dg_unr(rb[u], b);
			const unsigned keep = dg_keep_at<VE>((unsigned long long)iv * VE + elem0, thr, seed, step, layer);
#pragma unroll
			for (int j = 0; j < VE; ++j) {
				const float g = (keep >> j) & 1u ? __fmul_rn(d[j], s) : 0.0f;
				gx[j] = __fmul_rn(g, b[j]);
				d[j] = b[j] > 0.0f ? __fmul_rn(g, a[j]) : 0.0f;	// dys, over dxy
			}
			dg_stv(dxs, iv, gx);
			dg_stv(dxy, iv, d);
		}]]

local BWD_ONE = [[
		const bool keep = dg_keep1((unsigned long long)i + elem0, thr, seed, step, layer);
		const float g = keep ? __fmul_rn(dg_ld1(dxy, i), s) : 0.0f;
		const float y = dg_ld1(ys, i);
		dg_st1(dxs, i, __fmul_rn(g, y));
		dg_st1(dxy, i, y > 0.0f ? __fmul_rn(g, dg_ld1(xs, i)) : 0.0f);]]

local OPS = { "gate_fwd", "gate_bwd" }

-- Vectors a thread an iteration (the loop's U). The kernel takes any grid;
-- runtime/ops/gate.c sizes its grid by NT·U vectors a block (GATE_UNROLL).
M.UNROLL = 2

function M.plan(spec)
  local op = SPEC.one_of(spec, "op", OPS)
  return TILES.threads_plan(spec, { "dg_" .. op }, op .. ".cu")
end

function M.render(spec, plan)
  local op = SPEC.one_of(spec, "op", OPS)
  local H = SPEC.int_field(spec, "heads", 1)
  local L = SPEC.int_field(spec, "latent", 1)
  local act = SPEC.one_of(spec, "act", { "f32", "bf16" })
  -- gate_bwd's gradients (dragon/spec.h): dxy, dys over it, dxs
  local grad = op == "gate_bwd" and SPEC.one_of(spec, "out", { "f32", "bf16" }) or "f32"
  local nt = plan.tile.threads
  local xt = act == "bf16" and "unsigned short" or "float"
  local gt = grad == "bf16" and "unsigned short" or "float"
  local ve = (act == "bf16" or grad == "bf16") and 8 or 4
  local drop = "float p, unsigned long long seed, unsigned step, unsigned layer, " ..
               "const unsigned *__restrict__ step_at, unsigned long long elem0"
  local v = {
    ENTRY = "dg_" .. op, N = "(long long)B * H * T * L", PRE = PRE,
  }
  local about
  if op == "gate_fwd" then
    v.PARAMS = "const XT *__restrict__ xs, const XT *__restrict__ ys, XT *__restrict__ xy, int B, int T, " .. drop
    v.VEC, v.ONE = FWD_VEC, FWD_ONE
    about = fmt("gate_fwd: xy (B, %d, T, %d) %s = keep ? xs·ys·(1/(1−p)) : 0, xs and ys %s.", H, L, act, act)
  else
    v.PARAMS = "GT *__restrict__ dxy, const XT *__restrict__ xs, const XT *__restrict__ ys, " ..
               "GT *__restrict__ dxs, int B, int T, " .. drop
    v.VEC, v.ONE = BWD_VEC, BWD_ONE
    about = fmt("gate_bwd: dxs = g·ys, dys = [ys > 0]·g·xs over dxy (B, %d, T, %d), g = keep ? dxy/(1−p) : 0; dxy, dys, dxs %s; xs, ys %s.",
                H, L, grad, act)
  end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "gate.lua", {
    about, "",
    fmt("%s(%s)   any grid, %d threads", v.ENTRY, v.PARAMS, nt),
    fmt("path: element-wise, 16-byte vectors grid-stride, %d a thread an iteration with every load first;", M.UNROLL),
    "the dropout mask from Philox4x32-10 (dragon/rng.h).",
  }))
  w:line(DEV.helpers({ bf16 = true, bf16x2_exact = true }))
  w:line(EMIT.subst(CONSTS, { H = H, L = L, NT = nt, VE = ve, XT = xt, GT = gt, U = M.UNROLL }))
  w:line(EW.VEC_IO)
  w:line(RAW)
  w:line(PHILOX)
  w:line(EMIT.subst(LOOP, v))
  return w:text()
end

return M

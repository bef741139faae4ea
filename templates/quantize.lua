--[[
quantize.lua — per-tensor activation quantize, f32 | bf16 → int8 | int4 |
uint8pos codes, in three launches (dg_ref_quantize_act mirrors them):

  extern "C" __global__ void dg_quantize_act_absum(const ST *x, long long n,
      float *partials)
    any grid G, `threads` a block; grid-stride over x; partials[blockIdx.x] =
    Σ|x| of the block's elements, summed per thread in a fixed order and
    reduced by a fixed tree, so the partials are deterministic for a fixed G.
  extern "C" __global__ void dg_quantize_act_scale(const float *partials,
      int n_partials, long long n, float *scale)
    <<<1, threads>>>: Σ partials in double in a fixed order;
    *scale = (float)(2·sum / (n·qmax)), 0 when the sum is 0.
  extern "C" __global__ void dg_quantize_act_apply(const ST *x, long long n,
      const float *scale, CT *codes)
    any grid; codes[i] = clamp(__float2int_rn(__fdiv_rn(x[i], s)), lo, qmax),
    0 when s == 0; lo = -qmax, or 0 for uint8pos.

  ST: float (src f32) or unsigned short (src bf16). CT: signed char, or
  unsigned char for uint8pos. qmax: int8 127, int4 7 (one code a byte),
  uint8pos 255. 16-byte vector loads are used when x is 16-byte aligned
  (checked at run time), scalar ones otherwise.

A scale a token (ascale=token) is one launch instead, of the entry
dg_quantize_act_rows (a block a token) or dg_quantize_act_rows_warp (a
warp a token), rendered by templates/qrows.lua (its banner has the plan):
scales[r] = max|x| / qmax over the token's G·C values (a float division),
its codes those of dg_quant as above, computed by a multiply with the
row's reciprocal where that provably gives the same code and by an exact
test in double within 2^-12 of a half-integer (dg_quant_vec below: no
division).

What the BDH w8a8 step (B 8, T 512, D 256, H 4, N 8192; 6 layers) moves
through the token quantizer, a layer: the xy token (B,4,T,8192) bf16 →
uint8pos, one pass: 268 MB in, 134 MB of codes and 16 KB of scales out,
402 MB, 95 µs at 4.25 TB/s; the x (B,1,T,256) and a (B·H,1,T,256) tokens
→ int8: 3.2 MB and 12.6 MB, 0.7 and 3.0 µs. A step: 2.51 GB, 0.59 ms.
Each value is read once from memory: the block entry keeps a token in
registers between its max and its codes and stages the next token in
shared memory meanwhile (templates/qrows.lua).
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local ABSUM = require("absum")
local R = require("qrows")
local fmt = string.format

local M = {}

local KERNELS = [[
constexpr int NT = ${NT};		// threads a block
${QCONSTS}
constexpr int RED = ${RED};		// first step of the tree reduction (a power of two)
constexpr int VE = ${VE};		// elements of one 16-byte load

${SRC_READER}

${QUANT_FN}

${ABSUM_SCALE}

extern "C" __global__ void __launch_bounds__(NT)
dg_quantize_act_apply(const ${ST} *__restrict__ x, long long n, const float *__restrict__ scale,
		      ${CT} *__restrict__ codes)
{
	const float s = *scale;
	const long long first = (long long)blockIdx.x * NT + threadIdx.x;
	const long long stride = (long long)gridDim.x * NT;
	long long done = 0;
	if (((unsigned long long)x & 15ull) == 0 && ((unsigned long long)codes & (VE - 1)) == 0) {
		const long long nv = n / VE;
		for (long long iv = first; iv < nv; iv += stride) {
			float f[VE];
			dg_src_vec(x, iv, f);
			unsigned q[VE / 4];	// VE codes, four a word, code j in byte j % 4
#pragma unroll
			for (int k = 0; k < VE / 4; ++k)
				q[k] = 0u;
#pragma unroll
			for (int j = 0; j < VE; ++j)
				q[j / 4] |= ((unsigned)dg_quant(f[j], s) & 0xffu) << (8 * (j % 4));
${STORE_VEC}
		}
		done = nv * VE;
	}
	for (long long i = done + first; i < n; i += stride)
		codes[i] = (${CT})dg_quant(dg_src(x, i), s);
}
]]

-- The code of one value (both paths).
local QUANT_FN = [[
// The code of one value with scale s (s == 0: every code is 0). A zero
// value is code 0 without the division: IEEE division (div.rn) sends a zero
// numerator to its slow path, and a sparse activation is mostly zeros (the
// BDH xy quantizer ran at 2.3x its memory time without this).
__device__ __forceinline__ int dg_quant(float v, float s)
{
	return (s == 0.0f || v == 0.0f) ? 0 : dg_code(__fdiv_rn(v, s), QLO, QMAX);
}]]

-- A token's codes a vector at a time (the rows entries): one multiply by the
-- row's reciprocal in place of a division a value, the same codes, and no
-- division anywhere (its slow path is a call, around which ptxas spills).
--
-- Why it is exact. The row's constants: f, a power of two bringing s·f
-- into [2^-126, 2^125] (1 for nearly every row; 2^32 for a subnormal s,
-- 2^-32 past 2^125), and si = rcp.rn(s·f); a value's v' = v·f (exact, or
-- for s past 2^125 inexact only where |v/s| < 2^-219) and y = fl(v'·si).
-- Then q = v'/(s·f) = v/s and y is within |q|·2^-23·(1 + 2^-24) of q (two
-- roundings of 2^-24). Every |v| of the row is at most its max m and
-- s = fl(m/qmax), so |q| ≤ 1.5·qmax (the 1.5 only where s is subnormal
-- and coarse; qmax·(1 + 2^-22) otherwise) ≤ 383 and |y − q| < 2^-14.
-- dg_quant's code is rint(fl(q)) clamped; fl(q) lies on q's side of every
-- half-integer h, or on h itself exactly when |q − h| ≤ ulp(h)/2 ≤ 2^-15
-- (rounding is monotone, h is a float and its last bit is 0). So where y
-- is farther than 2^-12 from every half-integer, y and fl(q) lie strictly
-- between the same two half-integers and round to the same integer:
-- y + 1.5·2^23 is rint(y) + 1.5·2^23 (exact, half to even, for
-- |y| < 2^22), whose bits are 0x4b400000 + rint(y), clamped as integers,
-- their low byte the code. Near h = floor(y) + 1/2 (dg_quant_near): with
-- d = v' − h·(s·f) in double (h·s·f has at most 34 bits; v' and h·s·f are
-- within a factor 2, so d is exact), fl(q) = h where |d| ≤ s·f·ulp(h)/2
-- (code: h's even neighbour), else it is above h where d > 0 (code
-- floor(y) + 1), below otherwise (floor(y)). A NaN v gives 0; s = 0 or
-- infinite gives (si, f) = (0, 0): every code 0, as dg_quant's.
local QUANT_VEC_FN = [[
// The row's constants of dg_quant_vec, (si, f): f a power of two that
// brings s·f into [2^-126, 2^125] and si = rcp.rn(s·f); (0, 0) where s is
// 0 or infinite (every code 0).
__device__ __forceinline__ float2 dg_quant_inv(float s)
{
	if (!(s > 0.0f) || s > 3.40282347e38f)
		return make_float2(0.0f, 0.0f);
	const float f = s < 1.17549435e-38f ? 4294967296.0f : (s > 4.25352959e37f ? 2.32830644e-10f : 1.0f);
	return make_float2(__frcp_rn(__fmul_rn(s, f)), f);
}

// The code of v (already v·f) at scale s (already s·f) where y = v·si is
// within 2^-12 of h = floor(y) + 1/2: rint(fl(v/s)) decided exactly in
// double (templates/quantize.lua has the argument); a NaN gives 0.
__device__ __forceinline__ int dg_quant_near(float v, float s, float y)
{
	if (v != v)
		return 0;
	const float kf = floorf(y), h = __fadd_rn(kf, 0.5f);
	const double d = __dsub_rn((double)v, __dmul_rn((double)h, (double)s));	// exact
	const float ulp = __int_as_float((__float_as_int(h) & 0x7f800000) - (23 << 23));
	const double half = __dmul_rn(__dmul_rn((double)s, (double)ulp), 0.5);	// exact
	const int k = (int)kf;
	const int c = fabs(d) <= half ? k + (k & 1) : (d > 0.0 ? k + 1 : k);
	return min(max(c, QLO), QMAX);
}

// The N codes of f at scale s, four a word (code e in byte e % 4): exactly
// dg_quant's, by a multiply with the row's si = dg_quant_inv(s) where y is
// not within 2^-12 of a half-integer, else by dg_quant_near. UNIT: si.y is 1
// (nearly every row), so v·si.y is v, exactly, and is not multiplied.
template <int N, bool UNIT>
__device__ __forceinline__ void dg_quant_vec_f(const float (&f)[N], float s, float2 si, unsigned (&w)[N / 4])
{
	constexpr float RM = 12582912.0f;	// 1.5·2^23: y + RM is rint(y) + RM
	constexpr int RB = 0x4b400000;		// its bits at rint(y) = 0
	constexpr float NEAR = 0.499755859375f;	// 0.5 − 2^-12
	int b[N];
	bool near = false;
#pragma unroll
	for (int e = 0; e < N; ++e) {
		const float y = UNIT ? __fmul_rn(f[e], si.x) : __fmul_rn(__fmul_rn(f[e], si.y), si.x);
		const float t = __fadd_rn(y, RM);
		near |= !(fabsf(__fsub_rn(y, __fsub_rn(t, RM))) < NEAR);
		// UNIT: s normal, so |y| <= QMAX·(1 + 2^-21) and rint(y) is within
		// ±QMAX (the argument above): only uint8pos's floor 0 can bind
		b[e] = UNIT ? (QLO == 0 ? max(__float_as_int(t), RB) : __float_as_int(t))
			    : min(max(__float_as_int(t), RB + QLO), RB + QMAX);
	}
	if (near) {	// rare: a rolled loop, each near value exactly
		const float sf = __fmul_rn(s, si.y);
#pragma unroll 1
		for (int e = 0; e < N; ++e) {
			float fv = f[0];
#pragma unroll
			for (int k = 1; k < N; ++k)
				fv = e == k ? f[k] : fv;
			const float v = __fmul_rn(fv, si.y), y = __fmul_rn(v, si.x);
			if (!(fabsf(__fsub_rn(y, __fsub_rn(__fadd_rn(y, RM), RM))) < NEAR)) {
				const int c = dg_quant_near(v, sf, y);
#pragma unroll
				for (int k = 0; k < N; ++k)
					b[k] = e == k ? c : b[k];
			}
		}
	}
#pragma unroll
	for (int k = 0; k < N / 4; ++k)
		w[k] = __byte_perm(__byte_perm(b[4 * k], b[4 * k + 1], 0x0040),
				   __byte_perm(b[4 * k + 2], b[4 * k + 3], 0x0040), 0x5410);
}

// dg_quant_vec_f, the row's si.y deciding which (uniform across a row).
template <int N>
__device__ __forceinline__ void dg_quant_vec(const float (&f)[N], float s, float2 si, unsigned (&w)[N / 4])
{
	if (si.y == 1.0f)
		dg_quant_vec_f<N, true>(f, s, si, w);
	else
		dg_quant_vec_f<N, false>(f, s, si, w);
}]]

-- The constants of dg_quant.
local QCONSTS = [[
constexpr int QMAX = ${QMAX};		// ${act}: codes in [QLO, QMAX]
constexpr int QLO = ${QLO};]]

-- The token quantizer's pieces, for a kernel that makes its values and
-- quantizes them the same way (templates/gate_quant.lua): the same codes.
M.QUANT_FN, M.QUANT_VEC_FN, M.QCONSTS = QUANT_FN, QUANT_VEC_FN, QCONSTS

local ACTS = { "int8", "int4", "uint8pos" }

local ENTRIES = { "dg_quantize_act_absum", "dg_quantize_act_scale", "dg_quantize_act_apply" }

function M.plan(spec)
  SPEC.check(spec.op == "quantize_act", "quantize.lua renders op quantize_act, not %s", tostring(spec.op))
  if spec.ascale == "token" then
    return R.plan(spec, "dg_quantize_act", "quantize_act.cu")
  end
  return TILES.threads_plan(spec, ENTRIES, "quantize_act.cu")
end

function M.render(spec, plan)
  local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
  local act = SPEC.one_of(spec, "act", ACTS)
  local nt = plan.tile.threads

  local qmax = FM.formats[act].qmax
  local v = ABSUM.src_vars(src, "x")
  v.NT, v.QMAX, v.QLO, v.RED, v.act = nt, qmax, act == "uint8pos" and 0 or -qmax, ABSUM.tree_first(nt), act
  v.ST, v.CT = FM.formats[src].ctype, act == "uint8pos" and "unsigned char" or "signed char"
  v.P, v.PREFIX, v.ACC, v.CAST = "x", "dg_quantize_act", "float", ""
  v.SCALE_EXPR = "2.0 * sum / ((double)n * (double)QMAX)"
  v.SRC_READER, v.QUANT_FN, v.QCONSTS = EMIT.subst(ABSUM.SRC_READER, v), QUANT_FN, EMIT.subst(QCONSTS, v)
  if spec.ascale == "token" then
    return R.render(spec, plan, {
      file = "quantize.lua", prefix = "dg_quantize_act", src = src, ct = v.CT, acc = "float",
      combine = "fmaxf(a, v)", scale = "__fdiv_rn(r0, (float)QMAX)", quant = "dg_quant",
      consts = v.QCONSTS, quant_fn = QUANT_FN, quant_vec_fn = QUANT_VEC_FN,
      scale_aux = "dg_quant_inv(s)", scale_aux_what = "reciprocal and pre-scale (dg_quant_inv)",
      head = { fmt("quantize_act: %s → %s codes (qmax %d), a scale a token: s = max|x|/qmax over the token,", src,
                   act, qmax),
               "codes = clamp(rint(x / s)) (0 where s == 0)." },
    })
  end
  v.ABSUM_SCALE = EMIT.subst(ABSUM.ABSUM_SCALE, v)
  local want = { code = true }
  if src == "bf16" then want.bf16 = true end

  local about = {
    fmt("quantize_act: %s → %s codes (qmax %d), scale 2·mean|x|/qmax, per tensor.", src, act, qmax),
    "",
    fmt("dg_quantize_act_absum(const %s *x, long long n, float *partials)   any grid, %d threads", v.ST, nt),
    "dg_quantize_act_scale(const float *partials, int n_partials, long long n, float *scale)   <<<1, "
      .. nt .. ">>>",
    fmt("dg_quantize_act_apply(const %s *x, long long n, const float *scale, %s *codes)   any grid", v.ST, v.CT),
  }

  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "quantize.lua", about))
  w:line(DEV.helpers(want))
  w:line(EMIT.subst(KERNELS, v))
  return w:text()
end

return M

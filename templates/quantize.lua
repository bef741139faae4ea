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
row's reciprocal where that provably gives the same code (dg_quant_vec
below: a division only within 2^-12 of a half-integer).

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
-- row's reciprocal in place of a division a value, the same codes.
--
-- Why it is exact: with s normal and at most 2^125, si = rcp.rn(s) is
-- normal and y = fl(v·si) is within |q|·2^-23·(1 + 2^-24) of q = v/s
-- (two roundings of 2^-24 each); every |v| of the row is at most its max m
-- and s = fl(m/qmax), so |q|, |y| ≤ qmax·(1 + 2^-22) ≤ 256 and
-- |y − q| ≤ 2^-15. dg_quant's code is rint(fl(q)) clamped; fl(q) lies on
-- q's side of every half-integer h or on h itself only when
-- |q − h| ≤ ulp(h)/2 ≤ 2^-16 (rounding is monotone and h is a float). So
-- where y is farther than 2^-12 from every half-integer, y and fl(q) lie
-- strictly between the same two half-integers and round to the same
-- integer; anywhere else (and for a NaN v, whose y is NaN) the vector
-- takes dg_quant's division. rint(y) is y + 1.5·2^23 (exact to an integer,
-- half to even, for |y| < 2^22), and that float's bits are
-- 0x4b400000 + rint(y), whose low byte is the code. No clamp to qmax is
-- needed: y ≤ m·si·(1 + 2^-24) ≤ qmax·(1 + 3·2^-24) < qmax + 1/2, so
-- |rint(y)| ≤ qmax; uint8pos alone clamps its negatives to 0.
local QUANT_VEC_FN = [[
// The row's reciprocal for dg_quant_vec: rcp.rn(s) where s is normal and at
// most 2^125, else 0 (every code of the row by the division).
__device__ __forceinline__ float dg_quant_inv(float s)
{
	return s >= 1.17549435e-38f && s <= 4.25352959e37f ? __frcp_rn(s) : 0.0f;
}

// The N codes of f at scale s, four a word (code e in byte e % 4): exactly
// dg_quant's, by a multiply with si = dg_quant_inv(s) where y = v·si is not
// within 2^-12 of a half-integer, else by dg_quant (templates/quantize.lua
// has the argument).
template <int N>
__device__ __forceinline__ void dg_quant_vec(const float (&f)[N], float s, float si, unsigned (&w)[N / 4])
{
	constexpr float RM = 12582912.0f;	// 1.5·2^23: y + RM is rint(y) + RM
	constexpr int RB = 0x4b400000;		// its bits at rint(y) = 0
	int b[N];
	bool near = !(si != 0.0f);
#pragma unroll
	for (int e = 0; e < N; ++e) {
		const float y = __fmul_rn(f[e], si);
		const float t = __fadd_rn(y, RM);
		near |= !(fabsf(__fsub_rn(y, __fsub_rn(t, RM))) < 0.499755859375f);	// 0.5 − 2^-12
		b[e] = QLO < 0 ? __float_as_int(t) : max(__float_as_int(t), RB);	// |rint(y)| ≤ qmax already
	}
	if (near) {	// rare: one division site in a rolled loop (no spills around its slow path)
#pragma unroll 1
		for (int e = 0; e < N; ++e) {
			float v = f[0];
#pragma unroll
			for (int k = 1; k < N; ++k)
				v = e == k ? f[k] : v;
			const int c = dg_quant(v, s);
#pragma unroll
			for (int k = 0; k < N; ++k)
				b[k] = e == k ? c : b[k];
		}
	}
#pragma unroll
	for (int k = 0; k < N / 4; ++k)
		w[k] = __byte_perm(__byte_perm(b[4 * k], b[4 * k + 1], 0x0040),
				   __byte_perm(b[4 * k + 2], b[4 * k + 3], 0x0040), 0x5410);
}]]

-- The constants of dg_quant.
local QCONSTS = [[
constexpr int QMAX = ${QMAX};		// ${act}: codes in [QLO, QMAX]
constexpr int QLO = ${QLO};]]

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
      scale_aux = "dg_quant_inv(s)", scale_aux_what = "reciprocal (dg_quant_inv)",
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

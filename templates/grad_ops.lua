--[[
grad_ops.lua — what the four gradient GEMMs (templates/grad.lua) are per
op, the same on every path (grad_simt.lua, grad_mma.lua, grad_wgmma.lua):

  * OPS: each op's signature, its operands' roles and the device functions
    that address A, B, the output and B's per-row scales;
  * ADDR: the addressing the cp.async paths stage A (and B) by;
  * GI_SPLIT: lowrank_grad_input's K split (its prologue, its scale);
  * the reduce entries that add the splits' partials in split order
    (reduce_entries, RNT threads a block).
]]
local EMIT = require("emit")
local fmt = string.format

local M = {}

-- ---- per-op addressing ------------------------------------------------------
-- Each op gives device functions (text) over the compile-time constants:
--   K-major A (grad_input ops): dg_a_row(g, m, kt, z, T) → the BK floats
--     A(m, kt·BK ..) (contiguous), m < M.
--   M-major A (grad_weight ops): dg_a_col(g, k, h, T) → p with A(m, k) = p[m].
--   dg_b_row(wp, k, z, T) → word pointer of B's row k (element n in word
--     n / EPW_B); k is the tile's global k (kt·BK + kk).
--   dg_out(m, n, z, T) → the element offset of output (m, n).

local OPS = {}
M.OPS = OPS

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

-- ---- lowrank_grad_input's K split ---------------------------------------------
-- The same on every path (grad_simt.lua, grad_mma.lua and grad_wgmma.lua
-- read it here): grid z = split·HIN + input head; block (z, sp) sums the K
-- steps [sp·kt_per_split, (sp+1)·kt_per_split) of KT, clipped (an empty
-- range sums to 0 and writes zeros), into grad_x (splits 1: scaled) or
-- partial sp at dst + sp·NX (NX = B·HIN·T·E; raw sums the reduce entry
-- adds in split order and scales). `out` is where the epilogue writes.
M.GI_SPLIT = {
  PROLOGUE = [[
	const int M = B * T;			// output rows (b, t)
	const int z = blockIdx.z % HIN, sp = blockIdx.z / HIN;	// input head, split
	const int k_begin = min(sp * kt_per_split, KT);
	const int k_end = min(k_begin + kt_per_split, KT);	// empty: writes zeros
	// grad_x (splits 1), or partial sp (M·HIN·E floats each)
	float *const out = splits == 1 ? dst : dst + (long long)sp * M * HIN * E;]],
  -- a per-tensor scale multiplies grad_x only: a partial is the raw sum
  -- (times 1.0f, exact), scaled once by the reduce entry
  SCALE_LOAD = "\tconst float s = splits == 1 ? *sw : 1.0f;\t// the weight's scale (partials: raw)",
}

-- The epilogue's headline of the split (is_code: a per-tensor scale).
function M.GI_SPLIT.why(is_code)
  return (is_code and "splits == 1: grad_x = sw · Σ (the integer operand's scale, once)"
                   or "splits == 1: grad_x = Σ") ..
         ";\n\t// else partial sp = the raw Σ (the reduce entry adds the partials in\n\t// split order, then scales)"
end

-- ---- per-op addressing of the cp.async staging (on top of OPS' text) -----

local ADDR = {}
M.ADDR = ADDR

ADDR.lowrank_grad_input = [[
// A row m's base (k = 0 of block z's heads) and the offset of K step kt
// from it (a step never straddles two heads: BK | L).
__device__ __forceinline__ const GT *dg_a_base(const GT *g, int m, int z, int T)
{
	const int b = m / T, t = m - b * T;
	return g + ((long long)(b * H + z * HPB) * T + t) * L;
}

__device__ __forceinline__ long long dg_a_koff(int kt, int T)
{
	const int k = kt * BK;
	return (long long)(k / L) * T * L + k % L;
}
]]

ADDR.decoder_grad_input = [[
// A row m's base and the offset of K step kt from it.
__device__ __forceinline__ const GT *dg_a_base(const GT *g, int m, int z, int T)
{
	return g + (long long)m * E;
}

__device__ __forceinline__ long long dg_a_koff(int kt, int T)
{
	return (long long)kt * BK;
}
]]

ADDR.lowrank_grad_weight = [[
// Row k = b*T + t of A (grad, contiguous along l) and of B (x, packed
// along e), from (b, t).
__device__ __forceinline__ const GT *dg_a_krow(const GT *g, int b, int t, int h, int T)
{
	return g + ((long long)(b * H + h) * T + t) * L;
}

__device__ __forceinline__ const unsigned *dg_b_krow(const unsigned *xp, int b, int t, int h, int T)
{
	return xp + ((long long)(b * HIN + ${HIN_H}) * T + t) * (E / EPW_B);
}
]]

ADDR.decoder_grad_weight = [[
// Row k = b*T + t of A (grad, contiguous along d) and of B (y, packed
// along l), from (b, t).
__device__ __forceinline__ const GT *dg_a_krow(const GT *g, int b, int t, int h, int T)
{
	return g + (long long)(b * T + t) * E;
}

__device__ __forceinline__ const unsigned *dg_b_krow(const unsigned *yp, int b, int t, int h, int T)
{
	return yp + ((long long)(b * H + h) * T + t) * (L / EPW_B);
}
]]

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
M.RNT = RNT

-- Appends the reduce entry of the grad_weight ops and lowrank_grad_input
-- (grad.lua M.plan lists it): the sum of a split's partials, in split order.
function M.reduce_entries(w, o, entry, is_code, vec)
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

return M

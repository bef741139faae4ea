--[[
rope.lua — BDH's rotary position embedding, element-wise, from a table
(dg_ref_rope_fwd / dg_ref_rope_bwd mirror it):

  rope_fwd  out[b,h,t,2p]   = x[2p]·cos − x[2p+1]·sin
            out[b,h,t,2p+1] = x[2p+1]·cos + x[2p]·sin
  rope_bwd  grad_x[2p]      = g[2p]·cos + g[2p+1]·sin       (the transpose)
            grad_x[2p+1]    = g[2p+1]·cos − g[2p]·sin
  (cos, sin) = (rope[t, 2p], rope[t, 2p+1]): the table (T, L) f32 holds the
  pair of element pair p of row t at the same index (dg_ref_rope_pairs), so
  a float2 load next to the element pair's load gives both.

Kernel ABI:
  extern "C" __global__ void dg_rope_fwd(const XT *x, const float *rope,
      XT *out, int B, int T)            XT float (f32) | unsigned short (bf16)
  extern "C" __global__ void dg_rope_bwd(const float *grad, const float *rope,
      float *grad_x, int B, int T)
  any grid (grid-stride over the B·H·T·L/2 pairs), the plan's threads a
  block; x, out (B, H, T, L), rope (T, L); 8-byte aligned.

Arithmetic: each product and the sum rounded once (__fmul_rn, __fadd_rn, no
contraction into FMA), in f32 — what the reference's C computes, bit for
bit; bf16 inputs widen exactly and the result rounds to nearest even once.
The attention kernels (attention.lua) inline the same arithmetic on their
loads and in their epilogue, so scores of bf16 xs see exactly rope_fwd's
bf16 output.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local TILES = require("tiles")
local DEV = require("device")
local fmt = string.format

local M = {}

local KERNEL = [[
constexpr int H = ${H};		// heads
constexpr int L = ${L};		// latent: pairs (2p, 2p+1) along it
constexpr int NT = ${NT};		// threads a block
constexpr int VP = L % 8 == 0 ? 4 : 1;	// pairs a unit of the vector loop

// One pair: (x0, x1) turned by (c, s) into (y0, y1).
__device__ __forceinline__ void dg_turn(float x0, float x1, float c, float s, float &y0, float &y1)
{
${MATH}
}

extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(const ${XT} *__restrict__ src, const float *__restrict__ rope, ${XT} *__restrict__ dst, int B, int T)
{
	const long long np = (long long)B * H * T * (L / 2);	// pairs
	const long long stride = (long long)gridDim.x * NT;
	const long long first = (long long)blockIdx.x * NT + threadIdx.x;
	if (VP == 4 && (((unsigned long long)src | (unsigned long long)dst | (unsigned long long)rope) & 15u) == 0) {
		// 4 pairs a thread: 16-byte loads and stores (the table: two)
		const long long nu = np / 4;
		for (long long u = first; u < nu; u += stride) {
			const int row = (int)(u / (L / 8));	// (b, h, t): B·H·T < 2^31
			const int p = (int)(u - (long long)row * (L / 8)) * 4;
			const int t = row % T;
			const float4 *tp = (const float4 *)(rope + (long long)t * L + 2 * p);
			const float4 c01 = __ldg(tp), c23 = __ldg(tp + 1);
			const float cs[8] = { c01.x, c01.y, c01.z, c01.w, c23.x, c23.y, c23.z, c23.w };
			float x[8], y[8];
${VLOAD}
#pragma unroll
			for (int j = 0; j < 4; ++j)
				dg_turn(x[2 * j], x[2 * j + 1], cs[2 * j], cs[2 * j + 1], y[2 * j], y[2 * j + 1]);
${VSTORE}
		}
		return;
	}
	for (long long i = first; i < np; i += stride) {
		const long long row = i / (L / 2);		// (b, h, t)
		const int p = (int)(i - row * (L / 2));
		const int t = (int)(row % T);
		const float2 cs = __ldg((const float2 *)(rope + (long long)t * L) + p);
${LOAD}
		float y0, y1;
		dg_turn(x0, x1, cs.x, cs.y, y0, y1);
${STORE}
	}
}
]]

function M.plan(spec)
  local op = SPEC.one_of(spec, "op", { "rope_fwd", "rope_bwd" })
  return TILES.threads_plan(spec, { "dg_" .. op }, op .. ".cu")
end

function M.render(spec, plan)
  local op = SPEC.one_of(spec, "op", { "rope_fwd", "rope_bwd" })
  local H = SPEC.int_field(spec, "heads", 1)
  local L = SPEC.int_field(spec, "latent", 2)
  SPEC.check(L % 2 == 0, "spec.latent=%d: must be even (RoPE turns pairs)", L)
  local act = op == "rope_fwd" and SPEC.one_of(spec, "act", { "f32", "bf16" }) or "f32"
  local bf = act == "bf16"
  local v = {
    H = H, L = L, NT = plan.tile.threads, ENTRY = "dg_" .. op, XT = bf and "unsigned short" or "float",
  }
  if bf then
    v.LOAD = "\t\tconst unsigned w = __ldg((const unsigned *)src + i);	// two bf16: element 2p low\n" ..
             "\t\tconst float x0 = __uint_as_float(w << 16), x1 = __uint_as_float(w & 0xffff0000u);"
    v.STORE = "\t\t((unsigned *)dst)[i] = (unsigned)dg_f32_to_bf16(y0) | ((unsigned)dg_f32_to_bf16(y1) << 16);"
    v.VLOAD = [[
			const uint4 w = __ldg((const uint4 *)src + u);
			const unsigned wv[4] = { w.x, w.y, w.z, w.w };
#pragma unroll
			for (int j = 0; j < 4; ++j) {
				x[2 * j] = __uint_as_float(wv[j] << 16);
				x[2 * j + 1] = __uint_as_float(wv[j] & 0xffff0000u);
			}]]
    v.VSTORE = [[
			unsigned o[4];
#pragma unroll
			for (int j = 0; j < 4; ++j)
				o[j] = (unsigned)dg_f32_to_bf16(y[2 * j]) | ((unsigned)dg_f32_to_bf16(y[2 * j + 1]) << 16);
			((uint4 *)dst)[u] = make_uint4(o[0], o[1], o[2], o[3]);]]
  else
    v.LOAD = "\t\tconst float2 xv = __ldg((const float2 *)src + i);\n\t\tconst float x0 = xv.x, x1 = xv.y;"
    v.STORE = "\t\t((float2 *)dst)[i] = make_float2(y0, y1);"
    v.VLOAD = [[
			const float4 a = __ldg((const float4 *)src + 2 * u), b = __ldg((const float4 *)src + 2 * u + 1);
			x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;]]
    v.VSTORE = [[
			((float4 *)dst)[2 * u] = make_float4(y[0], y[1], y[2], y[3]);
			((float4 *)dst)[2 * u + 1] = make_float4(y[4], y[5], y[6], y[7]);]]
  end
  if op == "rope_fwd" then
    v.MATH = "\ty0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));\n" ..
             "\ty1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));"
  else
    v.MATH = "\ty0 = __fadd_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));\n" ..
             "\ty1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));"
  end
  local about = {
    op == "rope_fwd"
      and fmt("rope_fwd: out (B, %d, T, %d) %s = x·cos + rot(x)·sin from rope (T, %d) f32 (cos, sin) pairs.", H, L, act, L)
      or fmt("rope_bwd: grad_x (B, %d, T, %d) f32 = grad·cos + rotᵀ(grad·sin) from rope (T, %d) f32.", H, L, L),
    "",
    fmt("%s(const %s *src, const float *rope, %s *dst, int B, int T)   any grid, %d threads",
        v.ENTRY, v.XT, v.XT, v.NT),
    "path: element-wise (grid-stride): 4 pairs a thread by 16-byte accesses when L % 8 == 0 and the",
    "tensors are 16-byte aligned, else a pair a thread; f32 products rounded as the reference's.",
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "rope.lua", about))
  if bf then w:line(DEV.helpers({ bf16 = true })) end
  w:line(EMIT.subst(KERNEL, v))
  return w:text()
end

return M

--[[
norm.lua — layer norm over E without affine parameters (PyTorch's
nn.LayerNorm(E, elementwise_affine=False): biased variance, eps inside the
square root), alone and fused with the residual add; forward and backward.
dg_ref_layernorm_fwd / dg_ref_layernorm_bwd are the references.

  extern "C" __global__ void dg_layernorm_fwd(const ST *x, OT *y,
      float *rstd, long long rows, float eps)
  extern "C" __global__ void dg_resid_ln_fwd(const ST *x, const ST *y,
      OT *out, float *rstd, long long rows, float eps)
    h = x (+ y); mean = Σh/E; var = Σ(h − mean)²/E; rstd = 1/sqrt(var + eps)
    (round to nearest); y | out = (h − mean)·rstd; rstd (R) f32 is saved.
  extern "C" __global__ void dg_layernorm_bwd(const float *dy, const ST *y,
      const float *rstd, float *dx, long long rows, int accumulate)
  extern "C" __global__ void dg_resid_ln_bwd(const float *dout,
      const ST *out, const float *rstd, float *dx, float *dy, long long rows,
      int accumulate)
    g = rstd·(dy − mean(dy) − y·mean(dy·y)), y the forward's output;
    dx = g (accumulate: dx += g); resid_ln_bwd also dy = g (the gradient of
    the block output; dx is the residual stream's).

  ST: the input format (src: float | bf16 as unsigned short), OT: the output
  format (out). E (embd) is a compile-time constant, a multiple of 4: one
  warp a row, lane l holding the 4-element vectors l, l+32, ... in
  registers (16-byte loads for f32, 8-byte for bf16). Sums: each lane adds
  its elements in order, then a butterfly of warp shuffles (every lane gets
  the same bits), so a result depends on nothing but its row: any grid, run
  to run bitwise the same. Rows are walked grid-stride, NT/32 a block.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local fmt = string.format

local M = {}

local OPS = { "layernorm_fwd", "layernorm_bwd", "resid_ln_fwd", "resid_ln_bwd" }
local MAX_E = 4096 -- a row in one warp's registers: at most 32 vectors a lane (past 2048 the
                   -- backward's two rows spill to local memory: correct, not fast)

local COMMON = [[
constexpr int E = ${E};			// embd: the normalized width
constexpr int NT = ${NT};		// threads a block
constexpr int WPB = NT / 32;		// rows (warps) a block
constexpr int NV = E / 4;		// 4-element vectors a row
constexpr int VPL = (NV + 31) / 32;	// vectors a lane
constexpr float INV_E = ${INV_E};	// 1/E, rounded once

// Σ over the warp by a butterfly: every lane gets the same bits.
__device__ __forceinline__ float dg_warp_sum(float s)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	return s;
}

// Vector j of a row of 4-element vectors, as four floats.
__device__ __forceinline__ float4 dg_ld4(const float *p, int j)
{
	return __ldg((const float4 *)p + j);
}

__device__ __forceinline__ float4 dg_ld4(const unsigned short *p, int j)
{
	const uint2 u = __ldg((const uint2 *)p + j);
	return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
			   __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

__device__ __forceinline__ void dg_st4(float *p, int j, float4 v)
{
	((float4 *)p)[j] = v;
}

__device__ __forceinline__ void dg_st4(unsigned short *p, int j, float4 v)
{
	((uint2 *)p)[j] = make_uint2((unsigned)dg_f32_to_bf16(v.x) | (unsigned)dg_f32_to_bf16(v.y) << 16,
				     (unsigned)dg_f32_to_bf16(v.z) | (unsigned)dg_f32_to_bf16(v.w) << 16);
}
]]

local FWD = [[
extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(${PARAMS}, float *__restrict__ rstd, long long rows, float eps)
{
	const int lane = threadIdx.x & 31;
	for (long long r = (long long)blockIdx.x * WPB + threadIdx.x / 32; r < rows;
	     r += (long long)gridDim.x * WPB) {
		const long long off = r * E;
		float4 v[VPL];
		float s = 0.0f;
#pragma unroll
		for (int i = 0; i < VPL; ++i) {
			const int j = lane + 32 * i;
			v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (j < NV) {
				v[i] = ${LOAD};
				s += v[i].x;
				s += v[i].y;
				s += v[i].z;
				s += v[i].w;
			}
		}
		const float mean = __fmul_rn(dg_warp_sum(s), INV_E);
		float q = 0.0f;
#pragma unroll
		for (int i = 0; i < VPL; ++i) {
			if (lane + 32 * i < NV) {
				v[i].x = __fsub_rn(v[i].x, mean);
				v[i].y = __fsub_rn(v[i].y, mean);
				v[i].z = __fsub_rn(v[i].z, mean);
				v[i].w = __fsub_rn(v[i].w, mean);
				q = __fmaf_rn(v[i].x, v[i].x, q);
				q = __fmaf_rn(v[i].y, v[i].y, q);
				q = __fmaf_rn(v[i].z, v[i].z, q);
				q = __fmaf_rn(v[i].w, v[i].w, q);
			}
		}
		const float rs = __frsqrt_rn(__fadd_rn(__fmul_rn(dg_warp_sum(q), INV_E), eps));
#pragma unroll
		for (int i = 0; i < VPL; ++i) {
			const int j = lane + 32 * i;
			if (j < NV)
				dg_st4(${OUTP} + off, j, make_float4(__fmul_rn(v[i].x, rs), __fmul_rn(v[i].y, rs),
								 __fmul_rn(v[i].z, rs), __fmul_rn(v[i].w, rs)));
		}
		if (lane == 0)
			rstd[r] = rs;
	}
}
]]

local BWD = [[
extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(const float *__restrict__ ${G}, const ${ST} *__restrict__ ${Y}, const float *__restrict__ rstd,
	 float *__restrict__ dx,${DY_PARAM} long long rows, int accumulate)
{
	const int lane = threadIdx.x & 31;
	for (long long r = (long long)blockIdx.x * WPB + threadIdx.x / 32; r < rows;
	     r += (long long)gridDim.x * WPB) {
		const long long off = r * E;
		float4 g[VPL], yv[VPL];
		float sg = 0.0f, sgy = 0.0f;
#pragma unroll
		for (int i = 0; i < VPL; ++i) {
			const int j = lane + 32 * i;
			g[i] = yv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (j < NV) {
				g[i] = dg_ld4(${G} + off, j);
				yv[i] = dg_ld4(${Y} + off, j);
				sg += g[i].x;
				sg += g[i].y;
				sg += g[i].z;
				sg += g[i].w;
				sgy = __fmaf_rn(g[i].x, yv[i].x, sgy);
				sgy = __fmaf_rn(g[i].y, yv[i].y, sgy);
				sgy = __fmaf_rn(g[i].z, yv[i].z, sgy);
				sgy = __fmaf_rn(g[i].w, yv[i].w, sgy);
			}
		}
		const float mg = __fmul_rn(dg_warp_sum(sg), INV_E);
		const float mgy = __fmul_rn(dg_warp_sum(sgy), INV_E);
		const float rs = __ldg(rstd + r);
#pragma unroll
		for (int i = 0; i < VPL; ++i) {
			const int j = lane + 32 * i;
			if (j >= NV)
				continue;
			float4 d;
			d.x = __fmul_rn(rs, __fsub_rn(__fsub_rn(g[i].x, mg), __fmul_rn(yv[i].x, mgy)));
			d.y = __fmul_rn(rs, __fsub_rn(__fsub_rn(g[i].y, mg), __fmul_rn(yv[i].y, mgy)));
			d.z = __fmul_rn(rs, __fsub_rn(__fsub_rn(g[i].z, mg), __fmul_rn(yv[i].z, mgy)));
			d.w = __fmul_rn(rs, __fsub_rn(__fsub_rn(g[i].w, mg), __fmul_rn(yv[i].w, mgy)));
${DY_STORE}			if (accumulate) {
				const float4 o = ((const float4 *)(dx + off))[j];
				d.x = __fadd_rn(o.x, d.x);
				d.y = __fadd_rn(o.y, d.y);
				d.z = __fadd_rn(o.z, d.z);
				d.w = __fadd_rn(o.w, d.w);
			}
			dg_st4(dx + off, j, d);
		}
	}
}
]]

local function op_of(spec)
  return SPEC.one_of(spec, "op", OPS)
end

function M.plan(spec)
  local op = op_of(spec)
  local E = SPEC.int_field(spec, "embd", 4)
  local p, err = TILES.threads_plan(spec, { "dg_" .. op }, op .. ".cu")
  if not p then return nil, err end
  if E % 4 ~= 0 or E > MAX_E then
    return nil, fmt("embd=%d: %s holds a row in one warp's registers: a multiple of 4 up to %d",
                    E, op, MAX_E)
  end
  p.path = "warp-per-row"
  return p
end

function M.render(spec, plan)
  local op = op_of(spec)
  local E = SPEC.int_field(spec, "embd", 4)
  local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
  local nt = plan.tile.threads
  local ST = FM.formats[src].ctype
  local v = { E = E, NT = nt, INV_E = EMIT.cfloat(1.0 / E), ENTRY = "dg_" .. op, ST = ST }
  local about, body
  local fwd = op == "layernorm_fwd" or op == "resid_ln_fwd"
  if fwd then
    local out = SPEC.one_of(spec, "out", { "f32", "bf16" })
    local OT = FM.formats[out].ctype
    if op == "layernorm_fwd" then
      v.PARAMS = fmt("const %s *__restrict__ x, %s *__restrict__ y", ST, OT)
      v.LOAD, v.OUTP = "dg_ld4(x + off, j)", "y"
    else
      v.PARAMS = fmt("const %s *__restrict__ x, const %s *__restrict__ y, %s *__restrict__ out", ST, ST, OT)
      v.LOAD, v.OUTP = "dg_resid4(x + off, y + off, j)", "out"
    end
    about = {
      fmt("%s: %s (rows, %d) %s → %s, rstd (rows) f32; no affine, biased variance.", op,
          op == "layernorm_fwd" and "y = LN(x)" or "out = LN(x + y)", E, src, out),
      "",
      fmt("%s(%s, float *rstd, long long rows, float eps)   any grid, %d threads (%d rows a block)",
          v.ENTRY, v.PARAMS:gsub("__restrict__ ", ""), nt, nt // 32),
    }
    body = EMIT.subst(FWD, v)
    if op == "resid_ln_fwd" then
      body = [[
// x + y, vector j, in f32 (the residual add, rounded once).
template <typename T>
__device__ __forceinline__ float4 dg_resid4(const T *x, const T *y, int j)
{
	const float4 a = dg_ld4(x, j), b = dg_ld4(y, j);
	return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}
]] .. body
    end
  else
    if op == "layernorm_bwd" then
      v.G, v.Y, v.DY_PARAM, v.DY_STORE = "dy", "y", "", ""
    else
      v.G, v.Y, v.DY_PARAM = "dout", "out", " float *__restrict__ dy,"
      v.DY_STORE = "\t\t\tdg_st4(dy + off, j, d);\n"
    end
    about = {
      fmt("%s: dx (rows, %d) f32 (+)= rstd·(%s − mean(%s) − %s·mean(%s·%s)), %s %s%s.", op, E, v.G, v.G,
          v.Y, v.G, v.Y, v.Y, src, op == "resid_ln_bwd" and "; dy = the same gradient" or ""),
      "",
      fmt("%s(const float *%s, const %s *%s, const float *rstd, float *dx,%s long long rows, int accumulate)",
          v.ENTRY, v.G, ST, v.Y, op == "resid_ln_bwd" and " float *dy," or ""),
      fmt("   any grid, %d threads (%d rows a block)", nt, nt // 32),
    }
    body = EMIT.subst(BWD, v)
  end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "norm.lua", about))
  w:line(DEV.helpers({ bf16 = true }))
  w:line(EMIT.subst(COMMON, v))
  w:line(body)
  return w:text()
end

return M

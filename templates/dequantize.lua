--[[
dequantize.lua — codes back to floats (dg_ref_dequantize mirrors it):

  out[r, c] = round(code[r, c] × s_r)      codes (R, C), out (R, C)

  s_r: *scale (ascale=tensor) or scale[r] (ascale=token: one float a row);
  the product in f32 (__fmul_rn), then (out=bf16) rounded to nearest even
  once; out=f32 keeps the product. Codes: int8 / int4 (signed char, one a
  byte), uint8pos (unsigned char, 0..255).

Kernel ABI:
  extern "C" __global__ void dg_dequantize(const CT *codes,
      const float *scale, OT *out, long long rows, long long cols)
  any grid, the plan's threads a block (a multiple of 32). codes and out
  are 16-byte aligned (the op's checks), so vector iv — codes
  8·iv..8·iv+7, one 8-byte load, one 16-byte (bf16) or two (f32) stores —
  is aligned; vectors are walked grid-stride, then the last n % 8 codes
  one at a time. A scale a row needs a vector inside one row: when C is
  not a multiple of 8 every code is walked one at a time.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local EW = require("elementwise")
local fmt = string.format

local M = {}

local KERNEL = [[
constexpr int NT = ${NT};		// threads a block
constexpr int VE = 8;		// codes a vector: one 8-byte load
typedef ${CT} CT;		// a code (${act})
typedef ${OT} OT;		// an output (${out})

extern "C" __global__ void __launch_bounds__(NT)
dg_dequantize(const CT *__restrict__ codes, const float *__restrict__ scale, OT *__restrict__ out,
	      long long rows, long long cols)
{
	const long long n = rows * cols;
	const long long first = (long long)blockIdx.x * NT + threadIdx.x;
	const long long stride = (long long)gridDim.x * NT;
${S0}
	long long done = 0;
	if (${VEC_OK}) {
		const long long nv = n / VE;
		for (long long iv = first; iv < nv; iv += stride) {
			const uint2 w = __ldg((const uint2 *)codes + iv);
			const float s = ${S_VEC};
			float f[VE];
#pragma unroll
			for (int j = 0; j < 4; ++j) {
				f[j] = __fmul_rn(${CODE_F}(w.x, j), s);
				f[4 + j] = __fmul_rn(${CODE_F}(w.y, j), s);
			}
			dg_st(out, iv, f);
		}
		done = nv * VE;
	}
	for (long long i = done + first; i < n; i += stride)
		dg_st1(out, i, __fmul_rn((float)__ldg(codes + i), ${S_ONE}));
}
]]

function M.plan(spec)
  SPEC.one_of(spec, "op", { "dequantize" })
  return TILES.threads_plan(spec, { "dg_dequantize" }, "dequantize.cu")
end

function M.render(spec, plan)
  local act = SPEC.one_of(spec, "act", { "int8", "int4", "uint8pos" })
  local out = SPEC.one_of(spec, "out", { "bf16", "f32" })
  local rows = SPEC.one_of(spec, "ascale", { "tensor", "token" }) == "token"
  local nt = plan.tile.threads
  local u = act == "uint8pos"
  local v = {
    NT = nt, act = act, out = out,
    CT = u and "unsigned char" or "signed char",
    OT = out == "bf16" and "unsigned short" or "float",
    CODE_F = FM.lane_reader(act),	-- formats.lua's i8x4f: lane j of a word of four codes
    S0 = rows and "" or "\tconst float s0 = __ldg(scale);",
    VEC_OK = rows and "cols % VE == 0" or "true",
    S_VEC = rows and "__ldg(scale + iv * VE / cols)" or "s0",
    S_ONE = rows and "__ldg(scale + i / cols)" or "s0",
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "dequantize.lua", {
    fmt("dequantize: codes (R, C) %s → out (R, C) %s = code × s, s %s; the f32 product%s.", act, out,
        rows and "a row (scale[r])" or "a tensor (*scale)", out == "bf16" and " rounded to nearest even once" or ""),
    "",
    fmt("dg_dequantize(const %s *codes, const float *scale, %s *out, long long rows, long long cols)   any grid, %d threads",
        v.CT, v.OT, nt),
    "path: element-wise, 8 codes a vector grid-stride" .. (rows and " (C a multiple of 8; else one at a time)." or "."),
  }))
  w:line(DEV.helpers({ bf16 = true, i8x4f = true }))
  w:line(EW.VEC_IO)
  w:line(EMIT.subst(KERNEL, v))
  return w:text()
end

return M

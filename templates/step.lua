--[[
step.lua — the training step's element-wise glue and its layout change
(dg_ref_add_mask / dg_ref_add3 / dg_ref_transpose mirror them):

  add_mask   dxs[i] = xs[i] > 0 ? dxs[i] + other[i] : 0   in place; the
             gradient of xs = relu(·) from its two consumers, masked;
             dxs in `out`, other in `src` (dragon/spec.h's gradient
             convention: out what it writes, read first here; src what it
             only reads), xs in `act`; each f32 | bf16, bf16 read exactly
             and the f32 sum rounded to nearest even once
  add3       out[i] = (a[i] + b[i]) + c[i]                 any shape, f32;
             out may alias a (each element is read before it is written)
  transpose  out[r, l, e] = in[r, e, l]                    in (R, E, L) f32 →
             out (R, L, E) act (bf16 rounded to nearest even once)

Kernel ABI:
  extern "C" __global__ void dg_add_mask(GT *dxs, const ST *other,
      const XT *xs, int B, int T)                GT, ST, XT float | unsigned short
  extern "C" __global__ void dg_add3(const float *a, const float *b,
      const float *c, float *out, long long n)
  extern "C" __global__ void dg_transpose(const float *in, OT *out, long long R)
  any grid, the plan's threads a block (a multiple of 32); 16-byte aligned.
  add_mask and add3 walk vectors grid-stride (VE elements: 16 bytes of the
  narrowest tensor, 4 when all are f32, else 8); transpose walks
  32x32 tiles grid-stride through shared memory (pitch 33: the column reads
  are free of bank conflicts), read along L and written along E, both
  coalesced.

Arithmetic: each sum rounded once (__fadd_rn, in the order written), as the
reference's C.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local TILES = require("tiles")
local DEV = require("device")
local EW = require("elementwise")
local fmt = string.format

local M = {}

local OPS = { "add_mask", "add3", "transpose" }

local MASK_VEC = [[
		float d[VE], o[VE], x[VE];
		dg_ld(dxs, iv, d);
		dg_ld(other, iv, o);
		dg_ld(xs, iv, x);
#pragma unroll
		for (int j = 0; j < VE; ++j)
			d[j] = x[j] > 0.0f ? __fadd_rn(d[j], o[j]) : 0.0f;
		dg_st(dxs, iv, d);]]

local MASK_ONE = [[
		dg_st1(dxs, i, dg_ld1(xs, i) > 0.0f ? __fadd_rn(dg_ld1(dxs, i), dg_ld1(other, i)) : 0.0f);]]

local ADD3_VEC = [[
		float x[VE], y[VE], z[VE];
		dg_ld(a, iv, x);
		dg_ld(b, iv, y);
		dg_ld(c, iv, z);
#pragma unroll
		for (int j = 0; j < VE; ++j)
			x[j] = __fadd_rn(__fadd_rn(x[j], y[j]), z[j]);
		dg_st(out, iv, x);]]

local ADD3_ONE = [[
		out[i] = __fadd_rn(__fadd_rn(a[i], b[i]), c[i]);]]

local TRANSPOSE = [[
constexpr int E = ${E};		// rows of a plane of in (columns of out)
constexpr int L = ${L};		// columns of in (rows of out)
constexpr int NT = ${NT};		// threads a block: NT / 32 tile rows a pass
constexpr int TS = 32;		// tile side
constexpr int ET = (E + TS - 1) / TS, LT = (L + TS - 1) / TS;

extern "C" __global__ void __launch_bounds__(NT)
dg_transpose(const float *__restrict__ in, ${OT} *__restrict__ out, long long R)
{
	__shared__ float tile[TS][TS + 1];	// (e, l) of the tile
	const int tx = threadIdx.x % TS, ty = threadIdx.x / TS;
	const long long ntiles = R * ET * LT;
	for (long long tl = blockIdx.x; tl < ntiles; tl += gridDim.x) {
		const long long r = tl / (ET * LT);
		const int rest = (int)(tl - r * (ET * LT));
		const int e0 = rest / LT * TS, l0 = rest % LT * TS;
		const float *src = in + r * E * (long long)L;		// (E, L)
		${OT} *dst = out + r * E * (long long)L;		// (L, E)
		for (int y = ty; y < TS; y += NT / TS)		// along L: coalesced reads
			if (e0 + y < E && l0 + tx < L)
				tile[y][tx] = __ldg(src + (long long)(e0 + y) * L + l0 + tx);
		__syncthreads();
		for (int y = ty; y < TS; y += NT / TS)		// along E: coalesced writes
			if (l0 + y < L && e0 + tx < E)
				dst[(long long)(l0 + y) * E + e0 + tx] = ${CONV}(tile[tx][y]);
		__syncthreads();
	}
}
]]

function M.plan(spec)
  local op = SPEC.one_of(spec, "op", OPS)
  return TILES.threads_plan(spec, { "dg_" .. op }, op .. ".cu")
end

local function render_add_mask(spec, nt)
  local H = SPEC.int_field(spec, "heads", 1)
  local L = SPEC.int_field(spec, "latent", 1)
  local act = SPEC.one_of(spec, "act", { "f32", "bf16" })
  local grad = SPEC.one_of(spec, "out", { "f32", "bf16" })  -- dxs, written (and read)
  local other = SPEC.one_of(spec, "src", { "f32", "bf16" }) -- other, read
  local function ctype(f) return f == "bf16" and "unsigned short" or "float" end
  local ve = (act == "bf16" or grad == "bf16" or other == "bf16") and 8 or 4
  local v = {
    ENTRY = "dg_add_mask", N = "(long long)B * H * T * L", PRE = "",
    PARAMS = "GT *__restrict__ dxs, const ST *__restrict__ other, const XT *__restrict__ xs, int B, int T",
    VEC = MASK_VEC, ONE = MASK_ONE,
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "step.lua", {
    fmt("add_mask: dxs (B, %d, T, %d) %s = xs > 0 ? dxs + other : 0, in place; other %s, xs %s.",
        H, L, grad, other, act), "",
    fmt("dg_add_mask(%s)   any grid, %d threads", v.PARAMS, nt),
    "path: element-wise, 16-byte vectors grid-stride.",
  }))
  w:line(DEV.helpers({ bf16 = true }))
  w:linef("constexpr int H = %d;\t\t// heads\nconstexpr int L = %d;\t\t// latent", H, L)
  w:linef("constexpr int NT = %d;\t\t// threads a block\nconstexpr int VE = %d;\t\t// elements a vector: 16 bytes of the narrowest tensor",
          nt, ve)
  w:linef("typedef %s GT;\t\t// dxs (out)\ntypedef %s ST;\t\t// other (src)\ntypedef %s XT;\t\t// xs (act)",
          ctype(grad), ctype(other), ctype(act))
  w:line(EW.VEC_IO)
  w:line(EMIT.subst(EW.ELEMENTWISE, v))
  return w:text()
end

local function render_add3(spec, nt)
  local v = {
    ENTRY = "dg_add3", N = "n_all", PRE = "",
    PARAMS = "const float *a, const float *b, const float *c, float *out, long long n_all",
    VEC = ADD3_VEC, ONE = ADD3_ONE,
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "step.lua", {
    "add3: out (any shape) f32 = (a + b) + c; out may alias a.", "",
    fmt("dg_add3(%s)   any grid, %d threads", v.PARAMS, nt),
    "path: element-wise, 16-byte vectors grid-stride.",
  }))
  w:line(DEV.helpers({ bf16 = true }))
  w:linef("constexpr int NT = %d;\t\t// threads a block\nconstexpr int VE = 4;\t\t// floats a 16-byte vector", nt)
  w:line(EW.VEC_IO)
  w:line(EMIT.subst(EW.ELEMENTWISE, v))
  return w:text()
end

local function render_transpose(spec, nt)
  local E = SPEC.int_field(spec, "embd", 1)
  local L = SPEC.int_field(spec, "latent", 1)
  local act = SPEC.one_of(spec, "act", { "f32", "bf16" })
  local bf = act == "bf16"
  local ot = bf and "unsigned short" or "float"
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "step.lua", {
    fmt("transpose: in (R, %d, %d) f32 → out (R, %d, %d) %s.", E, L, L, E, act), "",
    fmt("dg_transpose(const float *in, %s *out, long long R)   any grid, %d threads", ot, nt),
    "path: 32x32 tiles through shared memory, grid-stride; coalesced reads and writes.",
  }))
  if bf then w:line(DEV.helpers({ bf16 = true })) end
  w:line(EMIT.subst(TRANSPOSE, { E = E, L = L, NT = nt, OT = ot, CONV = bf and "dg_f32_to_bf16" or "" }))
  return w:text()
end

function M.render(spec, plan)
  local op = SPEC.one_of(spec, "op", OPS)
  local nt = plan.tile.threads
  if op == "add_mask" then return render_add_mask(spec, nt) end
  if op == "add3" then return render_add3(spec, nt) end
  return render_transpose(spec, nt)
end

return M

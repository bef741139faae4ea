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
  any grid, the plan's threads a block: x grid-strides over the columns
  (t, unit) of the (T, L) table, y over the B·H rows (b, h) in groups of
  RB (the host sets y > 1 only when the columns alone cannot fill the GPU);
  x, out (B, H, T, L), rope (T, L); 8-byte aligned; B·H < 2^31.

Schedule: a thread reads the table's (cos, sin) of its column once and
turns that column of every (b, h) row it is given, RB rows at a time with
all RB loads issued before the first use: the table (T·L·4 bytes, 16.8 MB
at T 512, L 8192) is read from memory once instead of once a row, and no
index is divided at run time (a column's t is a division by the constant
L/8 or L/2; a row's offset is r·T·L/VE + the column's). A unit is 4 pairs
by 16-byte loads and stores when L % 8 == 0 and the tensors are 16-byte
aligned (RB 8 bf16 rows: 128 bytes in flight a thread; RB 4 for f32),
else one pair (RB 8).

Bytes and time at the BDH shape (B 8, H 4, T 512, L 8192): rope_fwd bf16
reads x 268 MB and the table 16.8 MB and writes 268 MB: 553 MB, 130 µs
at 4.25 TB/s (126 µs without the table); rope_bwd f32 moves 1.09 GB:
257 µs.

Arithmetic: each product and the sum rounded once (__fmul_rn, __fadd_rn, no
contraction into FMA), in f32 — what the reference's C computes, bit for
bit; bf16 inputs widen exactly and the result rounds to nearest even once
(a pair an instruction, device.lua's dg_pack2: dg_f32_to_bf16's bits).
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

-- RoPE of one pair packed as bf16 (w: element 2p low, 2p + 1 high) by
-- (c, s), rope_fwd's arithmetic (y0 = x0·c − x1·s, y1 = x1·c + x0·s, each
-- product and the sum rounded once, then to bf16): for the kernels that
-- turn bf16 pairs in place of a rope_fwd pass (attention_tma.lua's
-- turners, lowrank_wgmma.lua's epi=rope); they include device.lua's bf16
-- helper (dg_f32_to_bf16).
M.TURN_BF16X2 = [[
__device__ __forceinline__ unsigned dg_turn(unsigned w, float c, float s)
{
	const float x0 = __uint_as_float(w << 16), x1 = __uint_as_float(w & 0xffff0000u);
	const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
	const float y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
	return (unsigned)dg_f32_to_bf16(y0) | ((unsigned)dg_f32_to_bf16(y1) << 16);
}
]]

local KERNEL = [[
constexpr int H = ${H};		// heads
constexpr int L = ${L};		// latent: pairs (2p, 2p+1) along it
constexpr int NT = ${NT};		// threads a block
constexpr int VP = L % 8 == 0 ? 4 : 1;	// pairs a unit of the vector path
constexpr int RBV = ${RBV};		// rows a thread has in flight, vector path
constexpr int RB1 = 8;			// rows a thread has in flight, pair path

// One pair: (x0, x1) turned by (c, s) into (y0, y1).
__device__ __forceinline__ void dg_turn(float x0, float x1, float c, float s, float &y0, float &y1)
{
${MATH}
}

extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(const ${XT} *__restrict__ src, const float *__restrict__ rope, ${XT} *__restrict__ dst, int B, int T)
{
	const int rows = B * H;				// (b, h)
	const long long cstride = (long long)gridDim.x * NT;
	const long long first = (long long)blockIdx.x * NT + threadIdx.x;
	if (VP == 4 && (((unsigned long long)src | (unsigned long long)dst | (unsigned long long)rope) & 15u) == 0) {
		// a column: 4 pairs (8 elements) of row t, a unit of every (b, h)
		const long long nc = (long long)T * (L / 8);	// also the units from one (b, h) row to the next
		for (long long c = first; c < nc; c += cstride) {
			const int t = (int)(c / (L / 8));
			const float4 *tp = (const float4 *)(rope + (long long)t * L) + 2 * (c - t * (L / 8));
			const float4 c01 = __ldg(tp), c23 = __ldg(tp + 1);
			const float cs[8] = { c01.x, c01.y, c01.z, c01.w, c23.x, c23.y, c23.z, c23.w };
			for (int r0 = blockIdx.y * RBV; r0 < rows; r0 += gridDim.y * RBV) {
				${VT} w[RBV];${VDECL2}
#pragma unroll
				for (int k = 0; k < RBV; ++k)	// every load before the first use
					if (r0 + k < rows) {
						${VLOAD}
					}
#pragma unroll
				for (int k = 0; k < RBV; ++k) {
					if (r0 + k >= rows)
						break;
					float x[8], y[8];
${VUNPACK}
#pragma unroll
					for (int j = 0; j < 4; ++j)
						dg_turn(x[2 * j], x[2 * j + 1], cs[2 * j], cs[2 * j + 1], y[2 * j], y[2 * j + 1]);
${VSTORE}
				}
			}
		}
		return;
	}
	// a column: one pair of row t, of every (b, h)
	const long long nc = (long long)T * (L / 2);	// also the pairs from one (b, h) row to the next
	for (long long c = first; c < nc; c += cstride) {
		const int t = (int)(c / (L / 2));
		const float2 cs = __ldg((const float2 *)(rope + (long long)t * L) + (c - t * (L / 2)));
		for (int r0 = blockIdx.y * RB1; r0 < rows; r0 += gridDim.y * RB1) {
			${PT} w[RB1];
#pragma unroll
			for (int k = 0; k < RB1; ++k)
				if (r0 + k < rows)
					w[k] = ${LOAD};
#pragma unroll
			for (int k = 0; k < RB1; ++k) {
				if (r0 + k >= rows)
					break;
${UNPACK}
				float y0, y1;
				dg_turn(x0, x1, cs.x, cs.y, y0, y1);
${STORE}
			}
		}
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
  -- units (vector path) and pairs (pair path) of row r at column c:
  -- index (r0 + k)·nc + c, nc the columns (long long)
  local at = "(r0 + k) * nc + c"
  if bf then
    v.RBV, v.VT, v.PT, v.VDECL2 = 8, "uint4", "unsigned", ""
    v.VLOAD = "w[k] = __ldg((const uint4 *)src + " .. at .. ");"
    v.VUNPACK = [[
					const unsigned wv[4] = { w[k].x, w[k].y, w[k].z, w[k].w };
#pragma unroll
					for (int j = 0; j < 4; ++j) {
						x[2 * j] = __uint_as_float(wv[j] << 16);
						x[2 * j + 1] = __uint_as_float(wv[j] & 0xffff0000u);
					}]]
    v.VSTORE = [[
					unsigned o[4];
#pragma unroll
					for (int j = 0; j < 4; ++j)
						o[j] = dg_pack2(y[2 * j], y[2 * j + 1]);
					((uint4 *)dst)[]] .. at .. [[] = make_uint4(o[0], o[1], o[2], o[3]);]]
    v.LOAD = "__ldg((const unsigned *)src + " .. at .. ")"	-- two bf16: element 2p low
    v.UNPACK = "\t\t\t\tconst float x0 = __uint_as_float(w[k] << 16), x1 = __uint_as_float(w[k] & 0xffff0000u);"
    v.STORE = "\t\t\t\t((unsigned *)dst)[" .. at .. "] = dg_pack2(y0, y1);"
  else
    -- a unit of 8 floats: two float4, so RBV 4 keeps 128 bytes in flight
    v.RBV, v.VT, v.PT, v.VDECL2 = 4, "float4", "float2", "\n\t\t\t\tfloat4 w2[RBV];	// the unit's second half"
    v.VLOAD = "w[k] = __ldg((const float4 *)src + 2 * (" .. at .. "));\n\t\t\t\t\t\t" ..
              "w2[k] = __ldg((const float4 *)src + 2 * (" .. at .. ") + 1);"
    v.VUNPACK = [[
					x[0] = w[k].x; x[1] = w[k].y; x[2] = w[k].z; x[3] = w[k].w;
					x[4] = w2[k].x; x[5] = w2[k].y; x[6] = w2[k].z; x[7] = w2[k].w;]]
    v.VSTORE = [[
					((float4 *)dst)[2 * (]] .. at .. [[)] = make_float4(y[0], y[1], y[2], y[3]);
					((float4 *)dst)[2 * (]] .. at .. [[) + 1] = make_float4(y[4], y[5], y[6], y[7]);]]
    v.LOAD = "__ldg((const float2 *)src + " .. at .. ")"
    v.UNPACK = "\t\t\t\tconst float x0 = w[k].x, x1 = w[k].y;"
    v.STORE = "\t\t\t\t((float2 *)dst)[" .. at .. "] = make_float2(y0, y1);"
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
    "path: element-wise: x grid-strides over the table's columns (t, unit), y over the B·H rows in groups;",
    "a thread reads its column's (cos, sin) once and turns it in every row it is given, RB rows in flight;",
    "a unit is 4 pairs by 16-byte accesses when L % 8 == 0 and the tensors are 16-byte aligned, else a pair;",
    "f32 products rounded as the reference's.",
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "rope.lua", about))
  if bf then w:line(DEV.helpers({ bf16 = true, bf16x2_exact = true })) end
  w:line(EMIT.subst(KERNEL, v))
  return w:text()
end

return M

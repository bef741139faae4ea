--[[
embed.lua — the token embedding and its gradient (dg_ref_embed_fwd /
dg_ref_embed_bwd are the references):

  extern "C" __global__ void dg_embed_fwd(const int *idx,
      const float *table, OT *out, long long rows, int *bad)
    out[r, :] = table[idx[r], :] (f32, or rounded to bf16). A token outside
    0..V-1 reads nothing: its row of out is written as zeros and, when bad
    is not NULL, *bad = 1 (the op never clears it). One warp a row, 16-byte
    loads; rows grid-stride, NT/32 a block.
  extern "C" __global__ void dg_embed_bwd(const int *idx, const ST *dout,
      float *dtable, long long rows, int accumulate)
    dtable[v, :] (accumulate: +)= Σ_{r: idx[r] = v} dout[r, :], the sum in
    token order (r increasing), in f32 — exactly the reference's order, so
    the result is the reference's bit for bit. No atomics: block unit
    (VB vocab rows v0.., column chunk) owns NT columns of those rows (their
    sums in shared memory, a column a thread), scans every token in chunks
    of NT, compacts the chunk's matches in order (warp ballots) and adds
    their rows. Tokens outside 0..V-1 match no row and add nothing. Units
    grid-stride: ceil(V/VB)·ceil(E/NT) of them (VB: vocab_rows below).

  E (embd), V (vocab) are compile-time constants; E a multiple of 4.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local fmt = string.format

local M = {}

local OPS = { "embed_fwd", "embed_bwd" }

local COMMON = [[
constexpr int E = ${E};			// embd
constexpr int V = ${V};			// vocab: token ids 0..V-1
constexpr int NT = ${NT};		// threads a block
constexpr int NW = NT / 32;		// warps a block
constexpr int NV = E / 4;		// 4-element vectors a row
]]

local FWD = [[
__device__ __forceinline__ void dg_st4(float *p, int j, float4 v)
{
	((float4 *)p)[j] = v;
}

__device__ __forceinline__ void dg_st4(unsigned short *p, int j, float4 v)
{
	((uint2 *)p)[j] = make_uint2((unsigned)dg_f32_to_bf16(v.x) | (unsigned)dg_f32_to_bf16(v.y) << 16,
				     (unsigned)dg_f32_to_bf16(v.z) | (unsigned)dg_f32_to_bf16(v.w) << 16);
}

extern "C" __global__ void __launch_bounds__(NT)
dg_embed_fwd(const int *__restrict__ idx, const float *__restrict__ table, ${OT} *__restrict__ out,
	     long long rows, int *bad)
{
	const int lane = threadIdx.x & 31;
	for (long long r = (long long)blockIdx.x * NW + threadIdx.x / 32; r < rows;
	     r += (long long)gridDim.x * NW) {
		const int t = __ldg(idx + r);
		const bool ok = t >= 0 && t < V;
		const float4 *src = (const float4 *)(table + (long long)(ok ? t : 0) * E);
		${OT} *dst = out + r * E;
		for (int j = lane; j < NV; j += 32)
			dg_st4(dst, j, ok ? __ldg(src + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
		if (!ok && lane == 0 && bad)
			*bad = 1;
	}
}
]]

local BWD = [=[
constexpr int CCH = (E + NT - 1) / NT;	// column chunks a vocab row
constexpr int VB = ${VB};		// vocab rows a unit
constexpr long long NU = (long long)((V + VB - 1) / VB) * CCH;	// units

__device__ __forceinline__ float dg_ld(const float *p, long long i)
{
	return __ldg(p + i);
}

__device__ __forceinline__ float dg_ld(const unsigned short *p, long long i)
{
	return dg_bf16_to_f32(__ldg(p + i));
}

extern "C" __global__ void __launch_bounds__(NT)
dg_embed_bwd(const int *__restrict__ idx, const ${ST} *__restrict__ dout, float *__restrict__ dtable,
	     long long rows, int accumulate)
{
	__shared__ int hits[NT];	// the chunk's matching rows, in order (offsets from base)
	__shared__ int hrow[NT];	// and their vocab rows (from v0)
	__shared__ int counts[NW];	// matches of each warp in the chunk
	__shared__ float acc[VB][NT];	// the unit's sums: thread tid owns column tid of each row
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const unsigned below = (1u << lane) - 1u;
	for (long long u = blockIdx.x; u < NU; u += gridDim.x) {
		const int v0 = (int)(u / CCH) * VB;
		const int col = (int)(u % CCH) * NT + tid;
#pragma unroll
		for (int r = 0; r < VB; ++r)
			acc[r][tid] = (accumulate && col < E && v0 + r < V) ? dtable[(long long)(v0 + r) * E + col] : 0.0f;
		for (long long base = 0; base < rows; base += NT) {
			const long long i = base + tid;
			const int t = i < rows ? __ldg(idx + i) : -1;
			const bool hit = t >= v0 && t < v0 + VB && t < V;
			const unsigned m = __ballot_sync(0xffffffffu, hit);
			if (lane == 0)
				counts[warp] = __popc(m);
			__syncthreads();
			int before = 0, total = 0;
#pragma unroll
			for (int w = 0; w < NW; ++w) {
				const int c = counts[w];
				before += w < warp ? c : 0;
				total += c;
			}
			if (hit) {
				hits[before + __popc(m & below)] = tid;
				hrow[before + __popc(m & below)] = t - v0;
			}
			__syncthreads();
			if (col < E)
				for (int h = 0; h < total; ++h)
					acc[hrow[h]][tid] = __fadd_rn(acc[hrow[h]][tid], dg_ld(dout, (base + hits[h]) * E + col));
			__syncthreads();	// hits and counts are rewritten by the next chunk
		}
#pragma unroll
		for (int r = 0; r < VB; ++r)
			if (col < E && v0 + r < V)
				dtable[(long long)(v0 + r) * E + col] = acc[r][tid];
	}
}
]=]

-- Vocab rows a unit of embed_bwd: one up to V 2047 (a unit a row, as many
-- units as rows), then doubling with V up to 32 (V 32768 on), so the units
-- each scan the tokens once for VB rows: at V 50304 (4096 tokens, E 256)
-- a unit a row scanned the batch 50304 times, 0.35 ms on the H200. The
-- sums take VB·NT floats of shared memory: at most 32 KiB (VB 8 at 1024
-- threads).
local function vocab_rows(V, nt)
  local vb = 1
  while vb < 32 and vb * 2 * 1024 <= V and vb * 2 * nt <= 8192 do vb = vb * 2 end
  return vb
end

function M.plan(spec)
  local op = SPEC.one_of(spec, "op", OPS)
  local p, err = TILES.threads_plan(spec, { "dg_" .. op }, op .. ".cu")
  if not p then return nil, err end
  p.path = op == "embed_fwd" and "warp-per-row" or "vocab-row-owner"
  return p
end

function M.render(spec, plan)
  local op = SPEC.one_of(spec, "op", OPS)
  local E = SPEC.int_field(spec, "embd", 4)
  local V = SPEC.int_field(spec, "vocab", 2)
  local nt = plan.tile.threads
  local v = { E = E, V = V, NT = nt }
  local about, body
  if op == "embed_fwd" then
    local out = SPEC.one_of(spec, "out", { "f32", "bf16" })
    v.OT = FM.formats[out].ctype
    about = {
      fmt("embed_fwd: out (rows, %d) %s = table (%d, %d) f32 [idx (rows) i32]; a token outside 0..%d",
          E, out, V, E, V - 1),
      "writes a zero row and sets *bad = 1.",
      "",
      fmt("dg_embed_fwd(const int *idx, const float *table, %s *out, long long rows, int *bad)", v.OT),
      fmt("   any grid, %d threads (%d rows a block)", nt, nt // 32),
    }
    body = EMIT.subst(FWD, v)
  else
    local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
    v.ST = FM.formats[src].ctype
    v.VB = vocab_rows(V, nt)
    about = {
      fmt("embed_bwd: dtable (%d, %d) f32 (+)= dout (rows, %d) %s summed by token, in token order.", V, E, E, src),
      "",
      fmt("dg_embed_bwd(const int *idx, const %s *dout, float *dtable, long long rows, int accumulate)", v.ST),
      fmt("   any grid (%d units of %d vocab row%s), %d threads", (V + v.VB - 1) // v.VB * ((E + nt - 1) // nt), v.VB,
          v.VB == 1 and "" or "s", nt),
    }
    body = EMIT.subst(BWD, v)
  end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "embed.lua", about))
  w:line(DEV.helpers({ bf16 = true }))
  w:line(EMIT.subst(COMMON, v))
  w:line(body)
  return w:text()
end

return M

--[[
logits.lua — the lm_head's logits of a few rows, for decoding (family loss;
dg_ref_lmhead_logits is the reference):

  extern "C" __global__ void dg_lmhead_logits(const XT *x, const float *w,
      float *logits, long long rows)
    logits[r][v] = Σ_k x[r][k]·w[k][v], summed in double with k increasing
    and rounded once to f32. A product of two floats is exact in double, so
    each step of the sum is one rounding whether fused or not: the result is
    bit for bit the host's `z += (double)x·w` in the same order (the
    reference, and dg_model_logits). A block unit is BR rows by NT columns:
    thread t owns column v = unit's first + t and keeps BR double sums; the
    x values are read by every lane of a warp at once (one broadcast each),
    w along v (coalesced). Units grid-stride: ceil(rows/BR)·ceil(V/NT).
    The sums run over chunks of KC = 64 k: a thread's KC values of w are
    loaded at once, the unit's rows of x for the chunk staged in shared
    memory, then the chunk's fmas in k order (one w load waited for at a
    time, as before, took 90 us for one row at E = V = 256 on the H200).

  XT: the src format (float | bf16). E (embd), V (vocab) compile-time
  constants. The default tile is t64 (a decoder's few rows over V = 256
  columns still spread over several SMs).
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local fmt = string.format

local M = {}

local BR = 4   -- rows a block unit
local DEFAULT_THREADS = 64

local BODY = [[
constexpr int E = ${E};			// embd: the reduction
constexpr int V = ${V};			// vocab: logits a row
constexpr int NT = ${NT};		// threads a block: columns a unit
constexpr int BR = ${BR};		// rows a unit
constexpr int VB = (V + NT - 1) / NT;	// column blocks
constexpr int KC = E < 64 ? E : 64;	// k a chunk: a thread's loads of w in flight

__device__ __forceinline__ float dg_ld(const float *p, long long i)
{
	return __ldg(p + i);
}

__device__ __forceinline__ float dg_ld(const unsigned short *p, long long i)
{
	return dg_bf16_to_f32(__ldg(p + i));
}

extern "C" __global__ void __launch_bounds__(NT)
dg_lmhead_logits(const ${XT} *__restrict__ x, const float *__restrict__ w, float *__restrict__ logits,
		 long long rows)
{
	__shared__ float xk[BR][KC];	// the unit's rows of x, a chunk of k
	const long long units = (rows + BR - 1) / BR * VB;
	for (long long u = blockIdx.x; u < units; u += gridDim.x) {
		const long long r0 = u / VB * BR;
		const int v = (int)(u % VB) * NT + (int)threadIdx.x;
		const int nr = rows - r0 < BR ? (int)(rows - r0) : BR;
		double acc[BR];
#pragma unroll
		for (int r = 0; r < BR; ++r)
			acc[r] = 0.0;
		for (int k0 = 0; k0 < E; k0 += KC) {
			// the chunk's KC values of w in flight at once, then its sums
			float wk[KC];
#pragma unroll
			for (int j = 0; j < KC; ++j)
				wk[j] = v < V && k0 + j < E ? __ldg(w + (long long)(k0 + j) * V + v) : 0.0f;
			__syncthreads();	// the previous chunk's xk read
			for (int i = threadIdx.x; i < BR * KC; i += NT) {
				const int r = i / KC, k = k0 + i % KC;
				xk[r][i % KC] = r < nr && k < E ? dg_ld(x, (r0 + r) * E + k) : 0.0f;
			}
			__syncthreads();
#pragma unroll
			for (int j = 0; j < KC; ++j) {
				if (k0 + j < E) {
					const double wv = (double)wk[j];
#pragma unroll
					for (int r = 0; r < BR; ++r)
						acc[r] = __fma_rn((double)xk[r][j], wv, acc[r]);
				}
			}
		}
		if (v < V) {
#pragma unroll
			for (int r = 0; r < BR; ++r)
				if (r < nr)
					logits[(r0 + r) * V + v] = __double2float_rn(acc[r]);
		}
	}
}
]]

function M.plan(spec)
  SPEC.check(spec.op == "lmhead_logits", "logits.lua renders op lmhead_logits, not %s", tostring(spec.op))
  SPEC.int_field(spec, "embd", 4)
  SPEC.int_field(spec, "vocab", 2)
  local auto = TILES.tile_is_auto(TILES.tile_of(spec))
  local p, err = TILES.threads_plan(spec, { "dg_lmhead_logits" }, "lmhead_logits.cu")
  if not p then return nil, err end
  if auto then
    p.tile.threads = DEFAULT_THREADS
    p.entries[1].threads = DEFAULT_THREADS
  end
  p.path = "rows-by-columns"
  p.br = BR
  return p
end

function M.render(spec, plan)
  local E = SPEC.int_field(spec, "embd", 4)
  local V = SPEC.int_field(spec, "vocab", 2)
  local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
  local nt = plan.tile.threads
  local v = { E = E, V = V, NT = nt, BR = BR, XT = FM.formats[src].ctype }
  local about = {
    fmt("lmhead_logits: logits (rows, %d) f32 = x (rows, %d) %s · w (%d, %d) f32, each summed in", V, E, src, E, V),
    "double with k increasing, rounded once to f32.",
    "",
    fmt("dg_lmhead_logits(const %s *x, const float *w, float *logits, long long rows)", v.XT),
    fmt("   any grid (ceil(rows/%d)·%d units), %d threads", BR, (V + nt - 1) // nt, nt),
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "logits.lua", about))
  w:line(DEV.helpers({ bf16 = true }))
  w:line(EMIT.subst(BODY, v))
  return w:text()
end

return M

--[[
loss.lua — lm_head and softmax cross-entropy fused (dg_ref_lmhead_ce is the
reference). A large vocabulary (bf16 x and V >= 4096, or f32 x and V >
50304; loss_tc.lua's M.applies) takes the tensor-core path of loss_tc.lua;
otherwise three kernels a call:

  extern "C" __global__ void dg_lmhead_ce(const XT *x, const WT *w,
      const int *targets, float *row_loss, DT *dlogits, float *dx,
      long long rows, float inv_rows, const float *grad_scale, int backward,
      int *bad)
    A block takes BR rows at a time (grid-stride): their x rows go to shared
    memory as f32, then logits z = x·w (E, V) for all V columns into shared
    memory (thread t owns columns t, t+NT, ...; the sum over k in order),
    then a warp a row: m = max z, lse = m + log Σ exp(z − m), row_loss[r] =
    lse − z[target]. With backward: dlogits = (softmax − onehot)·inv_rows
    (inv_rows·*grad_scale when grad_scale is not NULL: the loss scaler's S,
    a power of two, so the product is exact and dlogits is S times the
    unscaled one bit for bit) replaces z in shared memory and is stored to dlogits (DT: f32, or bf16
    on the bf16 path) for the weight gradient, and dx = dlogits·wᵀ (thread
    t owns k = t, t+NT, ...; the sum over v in order). Logits never reach
    global memory. A target outside 0..V-1 gives row loss 0 and a zero
    dlogits row (so a zero dx row, nothing in dw) and sets *bad = 1 when bad
    is not NULL.
    Dynamic shared memory: BR·(E + V) floats (BR rows of x, then of z); the
    op reads BR back from it as smem / (4·(E + V)).
  extern "C" __global__ void dg_lmhead_ce_loss(const float *row_loss,
      long long rows, float *loss)
    <<<1, NT>>>: *loss = Σ row_loss / rows, summed in double in a fixed
    order (thread-strided, then a fixed tree).
  extern "C" __global__ void dg_lmhead_ce_dw(const XT *x, const DT *dlogits,
      float *out, long long rows, int splits, int accumulate)
    dw (E, V) (accumulate: +)= xᵀ·dlogits: a block a 32x32 tile of dw (256
    threads: 4 k's by 1 v each), the rows in chunks of 32 through shared
    memory; grid y = splits, split s summing its own whole chunks of rows
    (ceil(chunks / splits) of them) in order. splits 1: into dw itself;
    more: into the parts (splits, E, V), which
  extern "C" __global__ void dg_lmhead_ce_dw_sum(const float *part,
      float *dw, int splits, int accumulate)
    sums in order s = 0, 1, ... into dw. The runtime picks splits from R, E
    and V alone (runtime/ops/loss.c), so dw is the same bits on any device:
    one split took 0.34 ms at R 4096, E = V = 256 on the H200 (64 blocks,
    each the whole R); 32 splits give 2048 blocks of 128 rows.

  XT, WT: src and weight formats (float | bf16). E (embd), V (vocab)
  compile-time constants. Every sum has a fixed order: run to run bitwise
  the same, on any grid.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local ABSUM = require("absum")
local TC = require("loss_tc")
local fmt = string.format

local M = {}

local DWT = 32   -- dw tile: DWT x DWT outputs a block
local DW_NT = 256

local COMMON = [[
constexpr int E = ${E};			// embd: the reduction of the logits
constexpr int V = ${V};			// vocab: logits a row
constexpr int NT = ${NT};		// threads a block (the fused kernel, the loss)
constexpr int NW = NT / 32;
constexpr int BR = ${BR};		// rows a block of the fused kernel
constexpr int DWT = ${DWT};		// dw tile edge
constexpr int DW_NT = ${DW_NT};		// threads of a dw block
constexpr int RED = ${RED};		// first step of the loss tree

__device__ __forceinline__ float dg_ld(const float *p, long long i)
{
	return __ldg(p + i);
}

__device__ __forceinline__ float dg_ld(const unsigned short *p, long long i)
{
	return dg_bf16_to_f32(__ldg(p + i));
}

__device__ __forceinline__ void dg_st(float *p, long long i, float v)
{
	p[i] = v;
}

__device__ __forceinline__ void dg_st(unsigned short *p, long long i, float v)
{
	p[i] = dg_f32_to_bf16(v);
}

// Butterflies: every lane gets the same bits.
__device__ __forceinline__ float dg_warp_sum(float s)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	return s;
}

__device__ __forceinline__ float dg_warp_max(float s)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
	return s;
}
]]

local LOSS = [[
extern "C" __global__ void __launch_bounds__(NT)
dg_lmhead_ce_loss(const float *__restrict__ row_loss, long long rows, float *__restrict__ loss)
{
	__shared__ double red[NT];
	const int tid = threadIdx.x;
	if (blockIdx.x != 0)
		return;			// one block does it all (<<<1, NT>>>)
	double s = 0.0;
	for (long long i = tid; i < rows; i += NT)
		s += (double)row_loss[i];
	red[tid] = s;
	__syncthreads();
#pragma unroll
	for (int o = RED; o > 0; o >>= 1) {
		if (tid < o && tid + o < NT)
			red[tid] += red[tid + o];
		__syncthreads();
	}
	if (tid == 0)
		*loss = (float)(red[0] / (double)rows);
}
]]

local FUSED = [[
extern "C" __global__ void __launch_bounds__(NT)
dg_lmhead_ce(const ${XT} *__restrict__ x, const ${WT} *__restrict__ w, const int *__restrict__ targets,
	     float *__restrict__ row_loss, ${DT} *__restrict__ dlogits, float *__restrict__ dx,
	     long long rows, float inv_rows, const float *grad_scale, int backward, int *bad)
{
	if (backward && grad_scale)
		inv_rows = __fmul_rn(inv_rows, *grad_scale);
	extern __shared__ float4 dg_smem[];
	float *xs = (float *)dg_smem;		// (BR, E): the block's rows of x
	float *zs = xs + BR * E;		// (BR, V): their logits, then dlogits
	__shared__ int tg[BR];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	for (long long r0 = (long long)blockIdx.x * BR; r0 < rows; r0 += (long long)gridDim.x * BR) {
		const int nr = rows - r0 < BR ? (int)(rows - r0) : BR;
		for (int i = tid; i < BR * E; i += NT) {
			const int rr = i / E;
			xs[i] = rr < nr ? dg_ld(x, r0 * E + i) : 0.0f;
		}
		if (tid < BR)
			tg[tid] = tid < nr ? __ldg(targets + r0 + tid) : 0;
		__syncthreads();
		// logits: z[r][v] = Σ_k x[r][k]·w[k][v], k in order
		for (int v = tid; v < V; v += NT) {
			float acc[BR];
#pragma unroll
			for (int r = 0; r < BR; ++r)
				acc[r] = 0.0f;
#pragma unroll 2
			for (int k = 0; k < E; k += 4) {
				const float w0 = dg_ld(w, (long long)k * V + v), w1 = dg_ld(w, (long long)(k + 1) * V + v);
				const float w2 = dg_ld(w, (long long)(k + 2) * V + v), w3 = dg_ld(w, (long long)(k + 3) * V + v);
#pragma unroll
				for (int r = 0; r < BR; ++r) {
					const float4 xv = *(const float4 *)(xs + r * E + k);
					acc[r] = __fmaf_rn(xv.x, w0, acc[r]);
					acc[r] = __fmaf_rn(xv.y, w1, acc[r]);
					acc[r] = __fmaf_rn(xv.z, w2, acc[r]);
					acc[r] = __fmaf_rn(xv.w, w3, acc[r]);
				}
			}
#pragma unroll
			for (int r = 0; r < BR; ++r)
				zs[r * V + v] = acc[r];
		}
		__syncthreads();
		// softmax, the row loss, dlogits: a warp a row
		for (int rr = warp; rr < nr; rr += NW) {
			float *z = zs + rr * V;
			const int t = tg[rr];
			const bool ok = t >= 0 && t < V;
			float m = __int_as_float(0xff800000);	// -inf
			for (int v = lane; v < V; v += 32)
				m = fmaxf(m, z[v]);
			m = dg_warp_max(m);
			float se = 0.0f;
			for (int v = lane; v < V; v += 32)
				se += expf(z[v] - m);
			const float lse = m + logf(dg_warp_sum(se));
			const float zt = ok ? z[t] : 0.0f;
			__syncwarp();	// every lane has read z[t] before any overwrites it
			if (lane == 0) {
				row_loss[r0 + rr] = ok ? lse - zt : 0.0f;
				if (!ok && bad)
					*bad = 1;
			}
			if (backward)
				for (int v = lane; v < V; v += 32) {
					const float d = ok ? (expf(z[v] - lse) - (v == t ? 1.0f : 0.0f)) * inv_rows : 0.0f;
					z[v] = d;
					dg_st(dlogits, (r0 + rr) * V + v, d);
				}
		}
		__syncthreads();
		if (backward) {
			// dx[r][k] = Σ_v dlogits[r][v]·w[k][v], v in order
			for (int k = tid; k < E; k += NT) {
				float acc[BR];
#pragma unroll
				for (int r = 0; r < BR; ++r)
					acc[r] = 0.0f;
				const ${WT} *wk = w + (long long)k * V;
#pragma unroll 4
				for (int v = 0; v < V; ++v) {
					const float wv = dg_ld(wk, v);
#pragma unroll
					for (int r = 0; r < BR; ++r)
						acc[r] = __fmaf_rn(zs[r * V + v], wv, acc[r]);
				}
#pragma unroll
				for (int r = 0; r < BR; ++r)
					if (r < nr)
						dx[(r0 + r) * E + k] = acc[r];
			}
			__syncthreads();	// xs and zs are rewritten by the next rows
		}
	}
}

extern "C" __global__ void __launch_bounds__(DW_NT)
dg_lmhead_ce_dw(const ${XT} *__restrict__ x, const ${DT} *__restrict__ dlogits, float *__restrict__ out,
		long long rows, int splits, int accumulate)
{
	constexpr int TK = (E + DWT - 1) / DWT, TV = (V + DWT - 1) / DWT;
	__shared__ float xs[DWT][DWT + 1];	// (rows of the chunk, k)
	__shared__ float ds[DWT][DWT + 1];	// (rows of the chunk, v)
	const int tx = threadIdx.x % DWT, ty = threadIdx.x / DWT;	// v, first k
	constexpr int KPT = DWT * DWT / DW_NT;				// k's a thread
	// split s (grid y) sums the chunks of rows [s·rps, (s+1)·rps)
	const long long chunks = (rows + DWT - 1) / DWT;
	const long long rps = (chunks + splits - 1) / splits * DWT;
	const int s = blockIdx.y;
	const long long r_begin = s * rps, r_end = min(rows, r_begin + rps);
	for (int tile = blockIdx.x; tile < TK * TV; tile += gridDim.x) {
		const int k0 = tile / TV * DWT, v0 = tile % TV * DWT;
		float acc[KPT];
#pragma unroll
		for (int j = 0; j < KPT; ++j)
			acc[j] = 0.0f;
		for (long long c0 = r_begin; c0 < r_end; c0 += DWT) {
			for (int i = threadIdx.x; i < DWT * DWT; i += DW_NT) {
				const int rr = i / DWT, cc = i % DWT;
				const long long r = c0 + rr;
				xs[rr][cc] = r < r_end && k0 + cc < E ? dg_ld(x, r * E + k0 + cc) : 0.0f;
				ds[rr][cc] = r < r_end && v0 + cc < V ? dg_ld(dlogits, r * V + v0 + cc) : 0.0f;
			}
			__syncthreads();
#pragma unroll 8
			for (int rr = 0; rr < DWT; ++rr) {
				const float d = ds[rr][tx];
#pragma unroll
				for (int j = 0; j < KPT; ++j)
					acc[j] = __fmaf_rn(xs[rr][ty + j * (DW_NT / DWT)], d, acc[j]);
			}
			__syncthreads();
		}
#pragma unroll
		for (int j = 0; j < KPT; ++j) {
			const int k = k0 + ty + j * (DW_NT / DWT), v = v0 + tx;
			if (k < E && v < V) {
				// one split: dw itself; more: this split's part (s, E, V)
				float *o = out + (long long)s * E * V + (long long)k * V + v;
				*o = splits == 1 && accumulate ? __fadd_rn(*o, acc[j]) : acc[j];
			}
		}
	}
}

// dw (accumulate: +)= the splits' parts summed in order s = 0, 1, ...
extern "C" __global__ void __launch_bounds__(DW_NT)
dg_lmhead_ce_dw_sum(const float *__restrict__ part, float *__restrict__ dw, int splits, int accumulate)
{
	for (long long i = (long long)blockIdx.x * DW_NT + threadIdx.x; i < (long long)E * V;
	     i += (long long)gridDim.x * DW_NT) {
		float acc = part[i];
		for (int s = 1; s < splits; ++s)
			acc = __fadd_rn(acc, part[(long long)s * E * V + i]);
		dw[i] = accumulate ? __fadd_rn(dw[i], acc) : acc;
	}
}
]]

-- Rows a block of the fused kernel: the most of 16, 8, 4, 2, 1 whose x
-- and logits rows fit in the arch's shared memory.
local function rows_a_block(E, V, arch)
  local limit = TILES.smem_limit(arch)
  for _, br in ipairs({ 16, 8, 4, 2, 1 }) do
    if br * (E + V) * 4 <= limit then return br end
  end
  return nil
end

function M.plan(spec)
  SPEC.check(spec.op == "lmhead_ce", "loss.lua renders op lmhead_ce, not %s", tostring(spec.op))
  local E = SPEC.int_field(spec, "embd", 4)
  local V = SPEC.int_field(spec, "vocab", 2)
  local arch = SPEC.int_field(spec, "arch", 0)
  local p, err = TILES.threads_plan(spec, { "dg_lmhead_ce", "dg_lmhead_ce_loss", "dg_lmhead_ce_dw",
                                        "dg_lmhead_ce_dw_sum" }, "lmhead_ce.cu")
  if not p then return nil, err end
  local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
  if TC.applies(E, V, src) then return TC.plan(p, E, V, arch) end
  local br = rows_a_block(E, V, arch)
  if not br then
    return nil, fmt("vocab=%d: a row of x and its logits (embd + vocab = %d floats) must fit in the %d bytes of shared memory of an sm_%d block",
                    V, E + V, TILES.smem_limit(arch), arch)
  end
  p.path = "fused-rows"
  p.entries[1].smem = br * (E + V) * 4
  p.entries[3].threads = DW_NT
  p.entries[4].threads = DW_NT
  p.br = br
  return p
end

function M.render(spec, plan)
  local E = SPEC.int_field(spec, "embd", 4)
  local V = SPEC.int_field(spec, "vocab", 2)
  local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
  local wf = SPEC.one_of(spec, "weight", { "f32", "bf16" })
  local nt = plan.tile.threads
  local v = {
    E = E, V = V, NT = nt, BR = plan.br or 1, DWT = DWT, DW_NT = DW_NT, RED = ABSUM.tree_first(nt),
    XT = FM.formats[src].ctype, WT = FM.formats[wf].ctype, DT = FM.formats[src].ctype,
  }
  if plan.path == "tensor-core" then return TC.render(spec, plan, v, COMMON, LOSS) end
  local about = {
    fmt("lmhead_ce: loss = mean CE(x (rows, %d) %s · w (%d, %d) %s, targets); backward: dx, dw (f32),",
        E, src, E, V, wf),
    fmt("dlogits stored as %s for dw. %d rows a block, %d bytes of dynamic shared memory.", src, plan.br,
        plan.br * (E + V) * 4),
    "",
    fmt("dg_lmhead_ce(const %s *x, const %s *w, const int *targets, float *row_loss, %s *dlogits,", v.XT, v.WT, v.DT),
    fmt("    float *dx, long long rows, float inv_rows, const float *grad_scale, int backward, int *bad)   any grid, %d threads", nt),
    fmt("dg_lmhead_ce_loss(const float *row_loss, long long rows, float *loss)   <<<1, %d>>>", nt),
    fmt("dg_lmhead_ce_dw(const %s *x, const %s *dlogits, float *out, long long rows, int splits, int accumulate)", v.XT, v.DT),
    fmt("    grid (any: %d tiles, splits), %d threads: out = dw (splits 1) or the parts (splits, E, V)", ((E + DWT - 1) // DWT) * ((V + DWT - 1) // DWT), DW_NT),
    fmt("dg_lmhead_ce_dw_sum(const float *part, float *dw, int splits, int accumulate)   any grid, %d threads", DW_NT),
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "loss.lua", about))
  w:line(DEV.helpers({ bf16 = true }))
  w:line(EMIT.subst(COMMON, v))
  w:line(EMIT.subst(FUSED, v))
  w:line(EMIT.subst(LOSS, v))
  return w:text()
end

return M

--[[
optim.lua — the optimizer's kernels (dg_ref_adamw mirrors the update):

  dg_adamw_update        one AdamW update of n parameters in place, the step's
                  scalars from its control block (dragon/optim.h
                  dg_adamw_ctl): nothing when ctl.skip, else
                    g = grad·scale; p = p·d (decay); m = lerp(m, g, w);
                    v = v·b2 + (w2·g)·g; p = p + (−s)·(m/(sqrt(v)/cs + eps))
                  each operation f32, rounded once (__fmul_rn, __fsqrt_rn,
                  ...): the reference's C bit for bit. copy (may be NULL):
                  p's new value rounded to bf16 as it is written.
  dg_grad_sumsq  Σ grad² of one gradient in double: PARTS blocks (the
                  grid must be exactly that), each writing its partial to
                  part[blockIdx.x] (a thread's grid-stride sum in order,
                  then a fixed tree over the block).
  dg_grad_clip   one block: sq = Σ part[0 .. nparts) (each thread's
                  stride in order, then the tree), norm = sqrt(sq), scale
                  = min(1, clip/(norm + 1e-6)) (1 when clip is 0), skip =
                  the norm is not finite; written into the control block.
                  With the loss scaler on (ctl.scaler) the gradients are
                  S = ctl.loss_scale times the true ones: norm = sqrt(sq)/S
                  and sq/S² are written (the true ones), the clip factor
                  is the true norm's, scale = factor/S (the update unscales
                  and clips in one multiply), then S and good_steps move
                  by dg_ref_loss_scale_update's rule (halved on a skip,
                  doubled after growth_interval finite steps).
  The sums depend on nothing but the data: run to run, bit for bit.

Kernel ABI (runtime/ops/optim.c launches them):
  extern "C" __global__ void dg_adamw_update(float *p, const float *grad, float *m,
      float *v, const dg_adamw_ctl_t *ctl, dg_adamw_ctl_t cv,
      unsigned short *copy, long long n, int decay)
    ctl NULL: the scalars of cv (passed by value); any grid, the plan's
    threads; every pointer 16-byte aligned.
  extern "C" __global__ void dg_grad_sumsq(const float *grad, long long n,
      double *part)                                   grid PARTS
  extern "C" __global__ void dg_grad_clip(const double *part, int nparts,
      dg_adamw_ctl_t *ctl)                            grid 1
]]
local SPEC = require("spec")
local EMIT = require("emit")
local TILES = require("tiles")
local DEV = require("device")
local fmt = string.format

local M = {}

local PARTS = 264 -- partial sums a gradient: two blocks an H200 SM

local KERNELS = [[
constexpr int NT = ${NT};		// threads a block (a power of two)
constexpr int PARTS = ${PARTS};		// dg_grad_sumsq's blocks
static_assert((NT & (NT - 1)) == 0, "the tree sums halve the block");

// dragon/optim.h dg_adamw_ctl, field for field (80 bytes)
struct dg_adamw_ctl_t {
	float lr, d, s, cs, w, b2, w2, eps, clip;
	unsigned step, scaler, growth_interval;
	float scale;
	unsigned skip;
	float loss_scale;
	unsigned good_steps;
	double sq, norm;
};
static_assert(sizeof(dg_adamw_ctl_t) == 80, "the host's layout");

__device__ __forceinline__ void dg_adamw1(const dg_adamw_ctl_t &c, bool decay, float &x, float gr,
					  float &m, float &v)
{
	const float g = __fmul_rn(gr, c.scale);
	if (decay)
		x = __fmul_rn(x, c.d);
	m = c.w < 0.5f ? __fadd_rn(m, __fmul_rn(c.w, __fsub_rn(g, m)))
		       : __fsub_rn(g, __fmul_rn(__fsub_rn(g, m), __fsub_rn(1.0f, c.w)));
	v = __fadd_rn(__fmul_rn(v, c.b2), __fmul_rn(__fmul_rn(c.w2, g), g));
	const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.cs), c.eps);
	x = __fadd_rn(x, __fmul_rn(-c.s, __fdiv_rn(m, den)));
}

extern "C" __global__ void __launch_bounds__(NT)
dg_adamw_update(float *__restrict__ p, const float *__restrict__ grad, float *__restrict__ m,
	 float *__restrict__ v, const dg_adamw_ctl_t *__restrict__ ctl, dg_adamw_ctl_t cv,
	 unsigned short *__restrict__ copy, long long n, int decay)
{
	const dg_adamw_ctl_t c = ctl ? *ctl : cv;
	if (c.skip)
		return;
	const bool dk = decay != 0;
	const long long first = (long long)blockIdx.x * NT + threadIdx.x;
	const long long stride = (long long)gridDim.x * NT;
	const long long nv = n / 4;
	for (long long iv = first; iv < nv; iv += stride) {
		float4 x = ((float4 *)p)[iv], mm = ((float4 *)m)[iv], vv = ((float4 *)v)[iv];
		const float4 g = __ldg((const float4 *)grad + iv);
		dg_adamw1(c, dk, x.x, g.x, mm.x, vv.x);
		dg_adamw1(c, dk, x.y, g.y, mm.y, vv.y);
		dg_adamw1(c, dk, x.z, g.z, mm.z, vv.z);
		dg_adamw1(c, dk, x.w, g.w, mm.w, vv.w);
		((float4 *)p)[iv] = x;
		((float4 *)m)[iv] = mm;
		((float4 *)v)[iv] = vv;
		if (copy) {
			uint2 b;
			b.x = (unsigned)dg_f32_to_bf16(x.x) | (unsigned)dg_f32_to_bf16(x.y) << 16;
			b.y = (unsigned)dg_f32_to_bf16(x.z) | (unsigned)dg_f32_to_bf16(x.w) << 16;
			((uint2 *)copy)[iv] = b;
		}
	}
	for (long long i = nv * 4 + first; i < n; i += stride) {
		float x = p[i], mi = m[i], vi = v[i];
		dg_adamw1(c, dk, x, __ldg(grad + i), mi, vi);
		p[i] = x;
		m[i] = mi;
		v[i] = vi;
		if (copy)
			copy[i] = dg_f32_to_bf16(x);
	}
}

// The block's sum of one double a thread, by a fixed tree (every block the
// same order); the total in thread 0.
__device__ __forceinline__ double dg_block_sum(double x)
{
	__shared__ double sh[NT];
	sh[threadIdx.x] = x;
	__syncthreads();
	for (int h = NT / 2; h > 0; h >>= 1) {
		if ((int)threadIdx.x < h)
			sh[threadIdx.x] += sh[threadIdx.x + h];
		__syncthreads();
	}
	return sh[0];
}

extern "C" __global__ void __launch_bounds__(NT)
dg_grad_sumsq(const float *__restrict__ grad, long long n, double *__restrict__ part)
{
	double acc = 0.0;
	const long long nv = n / 4, first = (long long)blockIdx.x * NT + threadIdx.x;
	const long long stride = (long long)PARTS * NT;
	for (long long iv = first; iv < nv; iv += stride) {
		const float4 g = __ldg((const float4 *)grad + iv);
		acc += (double)g.x * g.x;
		acc += (double)g.y * g.y;
		acc += (double)g.z * g.z;
		acc += (double)g.w * g.w;
	}
	for (long long i = nv * 4 + first; i < n; i += stride) {
		const double g = __ldg(grad + i);
		acc += g * g;
	}
	const double s = dg_block_sum(acc);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

extern "C" __global__ void __launch_bounds__(NT)
dg_grad_clip(const double *__restrict__ part, int nparts, dg_adamw_ctl_t *__restrict__ ctl)
{
	double acc = 0.0;
	for (int i = threadIdx.x; i < nparts; i += NT)
		acc += part[i];
	const double sq = dg_block_sum(acc);
	if (threadIdx.x == 0) {
		// with the scaler on, the gradients are S times the true ones: S
		// is a power of two, so these divisions are exact
		const bool dyn = ctl->scaler != 0u;
		const float ls = dyn ? ctl->loss_scale : 1.0f;
		const double norm = dyn ? sqrt(sq) / (double)ls : sqrt(sq);
		float scale = 1.0f;
		if (ctl->clip > 0.0f) {
			const double s = (double)ctl->clip / (norm + 1e-6);
			scale = s < 1.0 ? (float)s : 1.0f;
		}
		const unsigned skip = isfinite(norm) ? 0u : 1u;
		ctl->sq = dyn ? sq / ((double)ls * (double)ls) : sq;
		ctl->norm = norm;
		ctl->scale = dyn ? __fdiv_rn(scale, ls) : scale;
		ctl->skip = skip;
		if (dyn) {	// dg_ref_loss_scale_update
			float nls = ls;
			unsigned good = ctl->good_steps;
			if (skip) {
				nls = __fmul_rn(ls, 0.5f);
				good = 0u;
			} else if (++good >= ctl->growth_interval) {
				const float up = __fmul_rn(ls, 2.0f);
				if (isfinite(up))
					nls = up;
				good = 0u;
			}
			ctl->loss_scale = nls;
			ctl->good_steps = good;
		}
	}
}
]]

function M.plan(spec)
  SPEC.one_of(spec, "op", { "adamw_update" })
  local p, err = TILES.threads_plan(spec, { "dg_adamw_update", "dg_grad_sumsq", "dg_grad_clip" }, "adamw.cu")
  if not p then return nil, err end
  if (p.tile.threads & (p.tile.threads - 1)) ~= 0 then
    return TILES.refuse(p.tile, false, "threads must be a power of two (the tree sums halve the block)")
  end
  return p
end

M.PARTS = PARTS

function M.render(spec, plan)
  local nt = plan.tile.threads
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "optim.lua", {
    "adamw_update: p, m, v (n) f32 updated in place from grad (n) f32 and the step's control block;",
    "the gradient norm's partial sums (sumsq) and its clip factor (clip).", "",
    fmt("dg_adamw_update(float *p, const float *grad, float *m, float *v, const dg_adamw_ctl_t *ctl, dg_adamw_ctl_t cv, unsigned short *copy, long long n, int decay)   any grid, %d threads", nt),
    fmt("dg_grad_sumsq(const float *grad, long long n, double *part)   grid %d, %d threads", PARTS, nt),
    fmt("dg_grad_clip(const double *part, int nparts, dg_adamw_ctl_t *ctl)   grid 1, %d threads", nt),
    "path: element-wise, 16-byte vectors grid-stride; fixed-order double sums.",
  }))
  w:line(DEV.helpers({ bf16 = true }))
  w:line(EMIT.subst(KERNELS, { NT = nt, PARTS = PARTS }))
  return w:text()
end

return M

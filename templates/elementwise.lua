--[[
elementwise.lua — the element-wise kernels over flat tensors (gate.lua,
step.lua, optim.lua): the loop and the vector loads and stores of f32 and
bf16.
]]
local M = {}

-- A kernel that walks n elements grid-stride, VE at a time (VE = 16 bytes
-- of its narrowest tensor: 4 f32, 8 bf16; a multiple of 4), then the last
-- n % VE one at a time. The op checks made every pointer 16-byte aligned
-- (dg_tensor_expect), so the vector loads need no run-time test. Loads are
-- plain (not __ldg): an in-place tensor is read and written by one kernel.
-- `subst` keys: ENTRY, PARAMS (the C parameter list), N (C of n), PRE
-- (lines before the loops), VEC (the body at vector iv), ONE (at element
-- i); the including text defines NT and VE and the helpers of VEC_IO.

M.VEC_IO = [[
// The VE elements of vector iv of p as floats, and back (bf16: rounded to
// nearest even once); element i alone.
template <int N>
__device__ __forceinline__ void dg_ld(const float *p, long long iv, float (&f)[N])
{
#pragma unroll
	for (int k = 0; k < N / 4; ++k) {
		const float4 v = ((const float4 *)p)[iv * (N / 4) + k];
		f[4 * k] = v.x, f[4 * k + 1] = v.y, f[4 * k + 2] = v.z, f[4 * k + 3] = v.w;
	}
}

template <int N>
__device__ __forceinline__ void dg_ld(const unsigned short *p, long long iv, float (&f)[N])
{
#pragma unroll
	for (int k = 0; k < N / 8; ++k) {
		const uint4 v = ((const uint4 *)p)[iv * (N / 8) + k];
		const unsigned u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
		for (int j = 0; j < 4; ++j) {
			f[8 * k + 2 * j] = __uint_as_float(u[j] << 16);
			f[8 * k + 2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
		}
	}
}

template <int N>
__device__ __forceinline__ void dg_st(float *p, long long iv, const float (&f)[N])
{
#pragma unroll
	for (int k = 0; k < N / 4; ++k)
		((float4 *)p)[iv * (N / 4) + k] = make_float4(f[4 * k], f[4 * k + 1], f[4 * k + 2], f[4 * k + 3]);
}

template <int N>
__device__ __forceinline__ void dg_st(unsigned short *p, long long iv, const float (&f)[N])
{
#pragma unroll
	for (int k = 0; k < N / 8; ++k) {
		unsigned u[4];
#pragma unroll
		for (int j = 0; j < 4; ++j)
			u[j] = (unsigned)dg_f32_to_bf16(f[8 * k + 2 * j]) |
			       ((unsigned)dg_f32_to_bf16(f[8 * k + 2 * j + 1]) << 16);
		((uint4 *)p)[iv * (N / 8) + k] = make_uint4(u[0], u[1], u[2], u[3]);
	}
}

__device__ __forceinline__ float dg_ld1(const float *p, long long i) { return p[i]; }
__device__ __forceinline__ float dg_ld1(const unsigned short *p, long long i) { return dg_bf16_to_f32(p[i]); }
__device__ __forceinline__ void dg_st1(float *p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void dg_st1(unsigned short *p, long long i, float v) { p[i] = dg_f32_to_bf16(v); }
]]

M.ELEMENTWISE = [[
extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(${PARAMS})
{
	const long long n = ${N};
	const long long nv = n / VE;			// whole vectors
	const long long first = (long long)blockIdx.x * NT + threadIdx.x;
	const long long stride = (long long)gridDim.x * NT;
${PRE}
	for (long long iv = first; iv < nv; iv += stride) {
${VEC}
	}
	for (long long i = nv * VE + first; i < n; i += stride) {	// the last n % VE
${ONE}
	}
}
]]

return M

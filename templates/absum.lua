--[[
absum.lua — the |x| sums behind the quantizers' per-tensor scales
(quantize.lua, qweight.lua): the reader of their f32 | bf16 source
(qrows.lua reads through it too), and the two entries that sum |x| in a
fixed order. tree_first gives the first step of a fixed tree sum over a
block (loss.lua's tree takes it too).
]]
local M = {}

local fmt = string.format

-- One pass of partial sums of |x| a block, then one block turns them into
-- the scale; both sum in a fixed order (deterministic). The including
-- kernel text defines NT, RED (tree_first), VE and dg_src / dg_src_vec /
-- dg_src_unpack (SRC_READER); `subst` keys: P (the input pointer's name),
-- ST (its C type), PREFIX (entry names), ACC (float | double: the
-- per-block sums), CAST ("" | "(double)"), SCALE_EXPR (C of `sum` and `n`).

-- The first step of the tree reduction of nt values: the largest power of
-- two below nt.
function M.tree_first(nt)
  local red = 1
  while red < nt do red = red * 2 end
  return red // 2
end

-- The reader of one source format (f32 | bf16) through pointer p: the
-- subst values VE, LOAD1, UNPACK, STORE_VEC (the codes q of vector iv)
-- and STORE_AT (the codes w of one vector at element offset off).
function M.src_vars(src, p)
  if src == "f32" then
    return { VE = 4, LOAD1 = fmt("__ldg(%s + i)", p),
             UNPACK = "\t\tf[j] = __uint_as_float(u[j]);",
             STORE_VEC = "\t\t\t*(unsigned *)(codes + 4 * iv) = q[0];",
             STORE_AT = "\t*(unsigned *)(codes + off) = w[0];" }
  end
  return { VE = 8, LOAD1 = fmt("dg_bf16_to_f32(__ldg(%s + i))", p),
           UNPACK = "\t\tf[2 * j] = __uint_as_float(u[j] << 16);\n" ..
                    "\t\tf[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);",
           STORE_VEC = "\t\t\t*(uint2 *)(codes + 8 * iv) = make_uint2(q[0], q[1]);",
           STORE_AT = "\t*(uint2 *)(codes + off) = make_uint2(w[0], w[1]);" }
end

M.SRC_READER = [[
// Element i of ${P} as a float.
__device__ __forceinline__ float dg_src(const ${ST} *${P}, long long i)
{
	return ${LOAD1};
}

// The VE elements of one 16-byte load v as floats.
__device__ __forceinline__ void dg_src_unpack(const uint4 &v, float (&f)[VE])
{
	const unsigned u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
	for (int j = 0; j < 4; ++j) {
${UNPACK}
	}
}

// The VE elements of vector iv of ${P} as floats.
__device__ __forceinline__ void dg_src_vec(const ${ST} *${P}, long long iv, float (&f)[VE])
{
	dg_src_unpack(__ldg((const uint4 *)${P} + iv), f);
}]]

M.ABSUM_SCALE = [[
// red[0] = Σ red[0..NT) by a fixed tree (the same order every launch).
template <typename F>
__device__ __forceinline__ void dg_tree_sum(F *red, int tid)
{
#pragma unroll
	for (int w = RED; w > 0; w >>= 1) {
		if (tid < w && tid + w < NT)
			red[tid] += red[tid + w];
		__syncthreads();
	}
}

extern "C" __global__ void __launch_bounds__(NT)
${PREFIX}_absum(const ${ST} *__restrict__ ${P}, long long n, ${ACC} *__restrict__ partials)
{
	__shared__ ${ACC} red[NT];
	const int tid = threadIdx.x;
	const long long first = (long long)blockIdx.x * NT + tid;
	const long long stride = (long long)gridDim.x * NT;
	${ACC} s = 0;
	long long done = 0;		// elements covered by the vector loop
	if (((unsigned long long)${P} & 15ull) == 0) {
		const long long nv = n / VE;
		for (long long iv = first; iv < nv; iv += stride) {
			float f[VE];
			dg_src_vec(${P}, iv, f);
#pragma unroll
			for (int j = 0; j < VE; ++j)
				s += ${CAST}fabsf(f[j]);
		}
		done = nv * VE;
	}
	for (long long i = done + first; i < n; i += stride)
		s += ${CAST}fabsf(dg_src(${P}, i));
	red[tid] = s;
	__syncthreads();
	dg_tree_sum(red, tid);
	if (tid == 0)
		partials[blockIdx.x] = red[0];
}

extern "C" __global__ void __launch_bounds__(NT)
${PREFIX}_scale(const ${ACC} *__restrict__ partials, int n_partials, long long n,
		float *__restrict__ scale)
{
	__shared__ double red[NT];
	const int tid = threadIdx.x;
	if (blockIdx.x != 0)
		return;			// one block does it all (<<<1, NT>>>)
	double s = 0.0;
	for (int i = tid; i < n_partials; i += NT)
		s += (double)partials[i];
	red[tid] = s;
	__syncthreads();
	dg_tree_sum(red, tid);
	if (tid == 0) {
		const double sum = red[0];
		*scale = sum == 0.0 ? 0.0f : (float)(${SCALE_EXPR});
	}
}]]

return M

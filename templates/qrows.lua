--[[
qrows.lua — the quantizers a scale a row: quantize_act ascale=token
(quantize.lua, max|x|) and quantize_weight wscale=channel (qweight.lua,
max|w| or Σ|w| in double) render their rows entries from here.

A row r is G segments of C contiguous elements at
((r / T · G + g) · T + r % T) · C, g = 0..G-1: a token (b, t) of a
(B, G, T, C) tensor over all G heads, or (G = T = 1) a row of C. Both
entries take the same arguments; with max they give the same bits (the
double sums' orders differ, each fixed):

  extern "C" __global__ void <prefix>_rows(const ST *x, long long rows,
      int G, int T, int C, float *scales, CT *codes)
    a block a row, grid-stride over rows: for long rows (the BDH xy token,
    4 × 8192 values).
  extern "C" __global__ void <prefix>_rows_warp(... the same ...)
    a warp a row, NT/32 rows a block, grid-stride over rows by warps: for
    short rows (the BDH x and a tokens, 256 values); rows of at most a
    vector a lane (G·C ≤ 32·VE on the vector path) WR (2) rows a warp at a
    time, all their loads first. The host (runtime/ops/quantize.c) picks
    the entry by G·C.

The plan of each, for P threads on a row (P = NT or 32):

  * Vector path, when C is a multiple of VE (16 bytes: 8 bf16 or 4 f32)
    and x is 16-byte, codes VE-byte aligned (checked at run time, uniform
    over the launch): vector j of the row (j = 0 .. G·C/VE - 1, segment
    j / (C/VE)) is read by thread j % P as one uint4. A thread's first K
    vectors (K = RV a block's thread, WV a warp's lane) are all loaded
    before the first is used and kept in registers for the code pass; a
    row longer than K·P vectors streams the rest and reads them again for
    the codes (from L2). The codes of a vector go out in one store (8
    bytes for bf16, 4 for f32).
  * Scalar path otherwise: element i of the row by thread i % P, read
    twice (the second from L2), one code a byte.
  * The reduction: each thread folds its elements in a fixed order (its
    vectors in turn, a vector's elements 0..VE-1); a warp combines its 32
    values by an xor butterfly (every lane ends with the same value, the
    same order every launch); a block's warps then go through shared
    memory and every thread folds the NW values in warp order. max is
    order-free anyway; the double sums of ternary / sign1 weights are
    deterministic for a given NT and entry (which the row length picks).
  * The scale from the reduced value (SCALE), then every code exactly as
    the CPU reference: a vector's codes by QUANT_VEC (the token
    quantizer's: a multiply with the row's reciprocal, exact by
    quantize.lua's argument; else QUANT a value: the weight rule), the
    scalar path's by QUANT (__fdiv_rn and dg_code rounding, or the weight
    rule).

  * The block entry's stage (sm_80 on, where the launch gives it RV·NT·16
    bytes of dynamic shared memory: the plan asks for them): the host
    launches only as many blocks as stay resident, each walks its rows,
    and while row r's reduction and codes run, row r + grid's first RV·NT
    vectors are already on their way into shared memory by cp.async
    (issued right after row r's fold has used its staged vectors). So a
    block's loads are in flight through its compute, not only between
    rows. A thread copies and reads back only its own vectors: its
    cp.async.wait_group is the only synchronization the stage needs.

RV = min(16, 4096 / NT): a 32768-value bf16 row is 16 uint4 a thread at
256 threads (64 registers), and a block keeps 64 KiB in flight (the stage
the same); the block entry is bounded to 128 registers a thread (min
blocks 512/NT), so two 256-thread blocks (and their 2 × 64 KiB stages)
share an SM: up to 128 KiB of loads in flight an SM. WV = VE (8 bf16, 4 f32): a warp
keeps rows of up to 2048 bf16 / 512 f32 values in registers (8 f32
vectors a lane make ptxas spill around the division's slow path).
]]
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local ABSUM = require("absum")
local fmt = string.format

local M = {}

local KERNELS = [[
constexpr int NT = ${NT};		// threads a block
constexpr int NW = NT / 32;		// warps a block
constexpr int MINB = ${MINB};		// _rows: blocks an SM at least (128 registers a thread at most)
constexpr int VE = ${VE};		// elements of one 16-byte load
constexpr int RV = ${RV};		// _rows: vectors a thread keeps in registers
constexpr int WV = ${WV};		// _rows_warp: vectors a lane keeps in registers
constexpr int WR = ${WR};		// _rows_warp: rows of a vector a lane at most taken at a time
${CONSTS}

${SRC_READER}

${QUANT_FN}

// Element offset of vector j of the row at base (segments seg apart, cv
// vectors a segment).
__device__ __forceinline__ long long dg_row_vec(long long base, long long seg, int cv, int j)
{
	const int g = (int)((unsigned)j / (unsigned)cv);
	return base + g * seg + (long long)(j - g * cv) * VE;
}

// Element offset of element i of the row (C elements a segment).
__device__ __forceinline__ long long dg_row_elem(long long base, long long seg, int C, int i)
{
	const int g = (int)((unsigned)i / (unsigned)C);
	return base + g * seg + (i - g * C);
}

// a folded with |v| of the VE elements of q, in element order.
__device__ __forceinline__ void dg_row_fold(${ACC} &a, const uint4 &q)
{
	float f[VE];
	dg_src_unpack(q, f);
#pragma unroll
	for (int e = 0; e < VE; ++e) {
		const ${ACC} v = fabsf(f[e]);
		a = ${COMBINE};
	}
}

${QUANT_VEC_FN}

// The VE codes of q at scale s (si: the row's ${SCALE_AUX_WHAT}) in one store at
// codes + off (four a word, code e in byte e % 4).
__device__ __forceinline__ void dg_row_put(${CT} *codes, long long off, const uint4 &q, float s, float2 si)
{
	float f[VE];
	dg_src_unpack(q, f);
	unsigned w[VE / 4];
	dg_quant_vec(f, s, si, w);
${STORE_AT}
}

// Vector path, pass 1 of thread p of P on a row of nv vectors: its fold of
// vectors p, p + P, ...; the first K stay in q for pass 2.
template <int P, int K>
__device__ __forceinline__ ${ACC} dg_row_part_vec(const ${ST} *__restrict__ x, long long base, long long seg,
						int cv, int nv, int p, uint4 (&q)[K])
{
	${ACC} a = 0;
#pragma unroll
	for (int k = 0; k < K; ++k)	// every load issued before the first use
		if (p + k * P < nv)
			q[k] = __ldg((const uint4 *)(x + dg_row_vec(base, seg, cv, p + k * P)));
#pragma unroll
	for (int k = 0; k < K; ++k)
		if (p + k * P < nv)
			dg_row_fold(a, q[k]);
	for (int j = p + K * P; j < nv; j += P)	// past the registers: read again in pass 2
		dg_row_fold(a, __ldg((const uint4 *)(x + dg_row_vec(base, seg, cv, j))));
	return a;
}

// Vector path, pass 2: the codes of the same vectors.
template <int P, int K>
__device__ __forceinline__ void dg_row_codes_vec(const ${ST} *__restrict__ x, long long base, long long seg,
						 int cv, int nv, int p, const uint4 (&q)[K], float s, float2 si,
						 ${CT} *__restrict__ codes)
{
#pragma unroll
	for (int k = 0; k < K; ++k)
		if (p + k * P < nv)
			dg_row_put(codes, dg_row_vec(base, seg, cv, p + k * P), q[k], s, si);
	for (int j = p + K * P; j < nv; j += P) {
		const long long off = dg_row_vec(base, seg, cv, j);
		dg_row_put(codes, off, __ldg((const uint4 *)(x + off)), s, si);
	}
}

// Scalar path, pass 1 of thread p of P on a row of n elements.
template <int P>
__device__ __forceinline__ ${ACC} dg_row_part_one(const ${ST} *__restrict__ x, long long base, long long seg,
						int C, int n, int p)
{
	${ACC} a = 0;
	for (int i = p; i < n; i += P) {
		const ${ACC} v = fabsf(dg_src(x, dg_row_elem(base, seg, C, i)));
		a = ${COMBINE};
	}
	return a;
}

// Scalar path, pass 2 (x read again).
template <int P>
__device__ __forceinline__ void dg_row_codes_one(const ${ST} *__restrict__ x, long long base, long long seg,
						 int C, int n, int p, float s, ${CT} *__restrict__ codes)
{
	for (int i = p; i < n; i += P) {
		const long long off = dg_row_elem(base, seg, C, i);
		codes[off] = (${CT})${QUANT}(dg_src(x, off), s);
	}
}

// The warp's 32 values combined by an xor butterfly: every lane ends with
// the same value (each pair is combined in both orders, and COMBINE is
// commutative), in the same order every launch.
__device__ __forceinline__ ${ACC} dg_row_warp(${ACC} a)
{
#pragma unroll
	for (int m = 16; m > 0; m >>= 1) {
		const ${ACC} v = __shfl_xor_sync(0xffffffffu, a, m);
		a = ${COMBINE};
	}
	return a;
}

// Whether the launch takes the vector path: C whole vectors (so every
// segment starts on one), x 16-byte and codes VE-byte aligned.
__device__ __forceinline__ bool dg_row_vec_ok(const ${ST} *x, int C, const ${CT} *codes)
{
	return C % VE == 0 && ((unsigned long long)x & 15ull) == 0 &&
	       ((unsigned long long)codes & (unsigned long long)(VE - 1)) == 0;
}

${STAGE_FNS}

// Element offset of row r's first element: token (b, t) = (r / T, r % T).
__device__ __forceinline__ long long dg_row_base(long long r, int G, int T, int C)
{
	const long long b = r / T;
	return (b * G * T + (r - b * T)) * C;
}

// A block a row.
extern "C" __global__ void __launch_bounds__(NT, MINB)
${PREFIX}_rows(const ${ST} *__restrict__ x, long long rows, int G, int T, int C,
	float *__restrict__ scales, ${CT} *__restrict__ codes)
{
	__shared__ ${ACC} red[NW];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const bool vec = dg_row_vec_ok(x, C, codes);
	const long long seg = (long long)T * C;	// from one segment of a row to the next
	const int cv = C / VE, nv = G * cv, n = G * C;
	const bool pre = vec && dg_stage_ok();	// the next row's vectors staged while this one's codes go out
	if (pre && blockIdx.x < rows)
		dg_row_stage(x, dg_row_base(blockIdx.x, G, T, C), seg, cv, nv, tid);
	for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
		const long long base = dg_row_base(r, G, T, C);
		uint4 q[RV];
		${ACC} a;
		if (pre) {
			a = dg_row_part_staged(x, base, seg, cv, nv, tid, q);
			dg_after(a);	// every staged vector read (a depends on them all) before the stage is refilled
			if (r + gridDim.x < rows)
				dg_row_stage(x, dg_row_base(r + gridDim.x, G, T, C), seg, cv, nv, tid);
		} else {
			a = vec ? dg_row_part_vec<NT, RV>(x, base, seg, cv, nv, tid, q)
				: dg_row_part_one<NT>(x, base, seg, C, n, tid);
		}
		a = dg_row_warp(a);
		if (lane == 0)
			red[warp] = a;
		__syncthreads();
		a = red[0];
#pragma unroll
		for (int w = 1; w < NW; ++w) {	// the warps in order: every thread gets the same value
			const ${ACC} v = red[w];
			a = ${COMBINE};
		}
		__syncthreads();	// red is rewritten by the next row
		const ${ACC} r0 = a;
		const float s = ${SCALE};
		const float2 si = ${SCALE_AUX};
		if (tid == 0)
			scales[r] = s;
		if (vec)
			dg_row_codes_vec<NT, RV>(x, base, seg, cv, nv, tid, q, s, si, codes);
		else
			dg_row_codes_one<NT>(x, base, seg, C, n, tid, s, codes);
	}
}

// A warp a row, NW rows a block.
extern "C" __global__ void __launch_bounds__(NT)
${PREFIX}_rows_warp(const ${ST} *__restrict__ x, long long rows, int G, int T, int C,
	float *__restrict__ scales, ${CT} *__restrict__ codes)
{
	const int lane = threadIdx.x & 31;
	const bool vec = dg_row_vec_ok(x, C, codes);
	const long long seg = (long long)T * C;
	const int cv = C / VE, nv = G * cv, n = G * C;
	const long long stride = (long long)gridDim.x * NW, wid = (long long)blockIdx.x * NW + (threadIdx.x >> 5);
	if (vec && nv <= 32) {
		// rows of a vector a lane at most (the BDH x and a tokens): WR
		// consecutive rows a warp at a time, every load first, then each
		// row as below (the same folds, so the same bits). The rows go
		// through one copy of the row's code (the loop not unrolled, the
		// next row's vector moved to the front of q), not one a row.
		for (long long rg = wid * WR; rg < rows; rg += stride * WR) {
			uint4 q[WR];
#pragma unroll
			for (int k = 0; k < WR; ++k)
				if (rg + k < rows && lane < nv)
					q[k] = __ldg((const uint4 *)(x + dg_row_vec(dg_row_base(rg + k, G, T, C), seg, cv, lane)));
#pragma unroll 1
			for (int k = 0; k < WR; ++k) {
				if (rg + k >= rows)
					break;
				const uint4 qk = q[0];
#pragma unroll
				for (int j = 0; j + 1 < WR; ++j)
					q[j] = q[j + 1];
				${ACC} a = 0;
				if (lane < nv)
					dg_row_fold(a, qk);
				const ${ACC} r0 = dg_row_warp(a);
				const float s = ${SCALE};
				const float2 si = ${SCALE_AUX};
				if (lane == 0)
					scales[rg + k] = s;
				if (lane < nv)
					dg_row_put(codes, dg_row_vec(dg_row_base(rg + k, G, T, C), seg, cv, lane), qk, s, si);
			}
		}
		return;
	}
	for (long long r = wid; r < rows; r += stride) {
		const long long base = dg_row_base(r, G, T, C);
		uint4 q[WV];
		const ${ACC} r0 = dg_row_warp(vec ? dg_row_part_vec<32, WV>(x, base, seg, cv, nv, lane, q)
					       : dg_row_part_one<32>(x, base, seg, C, n, lane));
		const float s = ${SCALE};
		const float2 si = ${SCALE_AUX};
		if (lane == 0)
			scales[r] = s;
		if (vec)
			dg_row_codes_vec<32, WV>(x, base, seg, cv, nv, lane, q, s, si, codes);
		else
			dg_row_codes_one<32>(x, base, seg, C, n, lane, s, codes);
	}
}
]]

-- The stage of the block entry (sm_80 on): the next row's first RV·NT
-- vectors, copied by cp.async into dynamic shared memory while this row's
-- reduction and codes run; thread p copies and later reads only its own
-- vectors j = p + k·NT, so its cp.async.wait_group alone makes them
-- visible (no barrier), and it refills them only after its fold has used
-- every one (dg_after: an empty asm that takes the fold's value).
local STAGE_FNS = [[
extern __shared__ uint4 dg_stage[];	// RV·NT vectors: the next row's first ones

// Whether the launch gave the stage its RV·NT vectors of shared memory.
__device__ __forceinline__ bool dg_stage_ok()
{
	unsigned dsm;
	asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsm));
	return dsm >= (unsigned)(RV * NT * 16);
}

// Thread p's copies of the row at base into the stage, one cp.async group.
__device__ __forceinline__ void dg_row_stage(const ${ST} *__restrict__ x, long long base, long long seg, int cv,
					     int nv, int p)
{
#pragma unroll
	for (int k = 0; k < RV; ++k)
		if (p + k * NT < nv)
			dg_cp16((unsigned)__cvta_generic_to_shared(dg_stage + p + k * NT),
				x + dg_row_vec(base, seg, cv, p + k * NT), 16);
	dg_cp_commit();
}

// Pass 1 from the stage: the row's first RV·NT vectors (thread p's in q),
// then the rest streamed as dg_row_part_vec streams them.
__device__ __forceinline__ ${ACC} dg_row_part_staged(const ${ST} *__restrict__ x, long long base, long long seg,
						   int cv, int nv, int p, uint4 (&q)[RV])
{
	dg_cp_wait<0>();
	${ACC} a = 0;
#pragma unroll
	for (int k = 0; k < RV; ++k)
		if (p + k * NT < nv)
			q[k] = dg_stage[p + k * NT];
#pragma unroll
	for (int k = 0; k < RV; ++k)
		if (p + k * NT < nv)
			dg_row_fold(a, q[k]);
	for (int j = p + RV * NT; j < nv; j += NT)
		dg_row_fold(a, __ldg((const uint4 *)(x + dg_row_vec(base, seg, cv, j))));
	return a;
}

__device__ __forceinline__ void dg_after(float a)
{
	asm volatile("" :: "f"(a) : "memory");
}

__device__ __forceinline__ void dg_after(double a)
{
	asm volatile("" :: "d"(a) : "memory");
}]]

-- Before sm_80 (no cp.async): no stage; the block entry reads x directly.
local STAGE_NONE = [[
__device__ __forceinline__ bool dg_stage_ok()
{
	return false;
}

__device__ __forceinline__ void dg_row_stage(const ${ST} *, long long, long long, int, int, int)
{
}

template <typename Q>
__device__ __forceinline__ ${ACC} dg_row_part_staged(const ${ST} *, long long, long long, int, int, int, Q &)
{
	return 0;
}

template <typename A>
__device__ __forceinline__ void dg_after(A)
{
}]]

-- Whether an arch has the stage (cp.async), and its bytes: RV·NT vectors.
function M.staged(spec)
  return (spec.arch or 0) >= 80
end

function M.stage_bytes(nt)
  return math.min(16, 4096 // nt) * nt * 16
end

-- The codes of a vector one value at a time through quant (the default
-- QUANT_VEC_FN: si unused).
local QUANT_VEC_ONE = [[
// The N codes of f at scale s, four a word (code e in byte e %% 4).
template <int N>
__device__ __forceinline__ void dg_quant_vec(const float (&f)[N], float s, float2 si, unsigned (&w)[N / 4])
{
	(void)si;
#pragma unroll
	for (int k = 0; k < N / 4; ++k)
		w[k] = 0u;
#pragma unroll
	for (int e = 0; e < N; ++e)
		w[e / 4] |= ((unsigned)%s(f[e], s) & 0xffu) << (8 * (e %% 4));
}]]

-- The entries, in the order the plan lists them.
function M.entries(prefix)
  return { prefix .. "_rows", prefix .. "_rows_warp" }
end

-- The plan: threads_plan (default t256) with both entries; the block
-- entry asks for its stage's shared memory where the arch has cp.async.
function M.plan(spec, prefix, program)
  local p, err = TILES.threads_plan(spec, M.entries(prefix), program)
  if not p then return p, err end
  if M.staged(spec) then p.entries[1].smem = M.stage_bytes(p.tile.threads) end
  return p
end

-- The rendered source. o: file (the calling template), head (banner lines
-- before the ABI), prefix, src (f32 | bf16), ct (C type of a code), acc
-- (float | double), combine (C of a and v), scale (C of r0 and C), quant
-- (the code function's name), quant_fn (its definition), consts (lines
-- of constants quant_fn uses).
function M.render(spec, plan, o)
  local nt = plan.tile.threads
  local v = ABSUM.src_vars(o.src, "x")
  v.NT, v.MINB, v.RV = nt, math.max(1, 512 // nt), math.min(16, 4096 // nt)
  v.WV = v.VE
  -- rows of a vector a lane a warp takes at a time (the host's grid,
  -- runtime/ops/quantize.c ROWS_WARP_AT_ONCE, assumes 2): 8 at a time
  -- made the BDH x tokens (4096 rows) 64 blocks, half the SMs, each warp
  -- through eight rows' codes in turn, 23.5 us for 2.2 MB on an H100;
  -- two at a time took the w8a8 step's twelve calls 0.36 -> 0.23 ms (H100,
  -- bench/results/step-train-h100-2026-12-06_qrows.json)
  v.WR = 2
  v.ST, v.CT, v.P, v.PREFIX = FM.formats[o.src].ctype, o.ct, "x", o.prefix
  v.ACC, v.COMBINE, v.SCALE, v.QUANT, v.QUANT_FN = o.acc, o.combine, o.scale, o.quant, o.quant_fn
  v.CONSTS = o.consts or ""
  -- a vector's codes: o.quant_vec_fn (given the row's si = o.scale_aux, a
  -- C expression of s), else one value at a time through o.quant
  v.QUANT_VEC_FN = o.quant_vec_fn or fmt(QUANT_VEC_ONE, o.quant)
  v.SCALE_AUX = o.scale_aux or "make_float2(0.0f, 0.0f)"
  v.SCALE_AUX_WHAT = o.scale_aux_what or "constants, unused here"
  v.SRC_READER = EMIT.subst(ABSUM.SRC_READER, v)
  local staged = M.staged(spec)
  v.STAGE_FNS = EMIT.subst(staged and STAGE_FNS or STAGE_NONE, v)
  local about = {}
  for _, l in ipairs(o.head) do about[#about + 1] = l end
  for _, l in ipairs({
    "",
    fmt("%s_rows(const %s *x, long long rows, int G, int T, int C, float *scales, %s *codes)", o.prefix, v.ST,
        o.ct),
    fmt("%s_rows_warp(... the same ...)", o.prefix),
    fmt("  any grid, %d threads: x (B, G, T, C), rows = B·T, row r = (b, t) over its G·C values;", nt),
    "  _rows a block a row (long rows), _rows_warp a warp a row (short rows; the host picks by G·C).",
    fmt("  Vector path when C %% %d == 0 and x, codes aligned: 16-byte loads, %d (_rows) or %d (_rows_warp)",
        v.VE, v.RV, v.WV),
    "  vectors a thread kept in registers between the reduction and the codes; else scalar, read twice.",
    "  The reduction: a fixed order a thread, an xor butterfly a warp, the warps in order (templates/qrows.lua).",
  }) do about[#about + 1] = l end
  local want = { code = true, cp_async = staged }
  if o.src == "bf16" then want.bf16 = true end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, o.file, about))
  w:line(DEV.helpers(want))
  w:line(EMIT.subst(KERNELS, v))
  return w:text()
end

return M

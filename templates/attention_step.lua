--[[
attention_step.lua — BDH's attention in its linear form, one token a row
(dg_ref_attention_step mirrors it): with no softmax the attention is linear
attention with Q = K = qr and V = v, so a row's next token reads and then
adds to a state S (N × D f32 a head) of every token before it:

  qr       = RoPE(xs) at the row's position t: pair p = (2p, 2p+1),
             ph = (t·freq[2p] mod 1)·2π, qr[2p] = x0·cos − x1·sin,
             qr[2p+1] = x1·cos + x0·sin
  out[e]   = Σ_k qr[k]·S[k, e]            (S before this token)
  S[k, e] += qr[k]·v[e]

Kernel ABI (XT: act's type, float (f32) | unsigned short (bf16)); T tokens a
row, consumed in order (token t at position pos[b] + t):
  extern "C" __global__ void dg_attention_step(const XT *xs, const float *pos,
      const float *freq, const XT *v, float *state, XT *out, int B)
    T = 1; grid (D/8, H, B), the plan's threads a block;
  extern "C" __global__ void dg_attention_window(const XT *xs, const float *pos,
      const float *freq, const XT *v, float *state, XT *out, int B, int T)
    T >= 1 (a prefill's window); grid (D/4, H, B), the plan's threads, the
    entry's dynamic shared memory (RW rows of 4 columns f32);
  xs (B, H, T, N); pos (B) f32 (each row's position before the window,
  exact integers below 2^24); freq (N) f32 (pair p's frequency at 2p and
  2p+1: dragon/model.h's RoPE, 1/θ^(2p/N)/2π); v (B, 1, T, D); state
  (B, H, N, D) f32, read and written, stored in groups of 8 columns: S[k, e]
  of (b, h) at ((b·H + h)·D/8 + e/8)·N·8 + k·8 + e%8, so a group's N rows
  of 32 bytes are contiguous; out (B, H, T, D). 16-byte aligned.

dg_attention_step: a block owns 8 columns (one group) of one (row, head):
its threads stride over the pairs, skip a pair whose two xs are 0 (a ReLU
output: most are, and their rows of S neither add to out nor change), and
read, add to and write back the 64 contiguous bytes of the pair's two rows
in the group; the block then sums its threads' partial outputs in a fixed
order (deterministic). With the rows of a head laid out row after row
(1 KiB a row at D 256, a block reading 32 bytes of each) a token took 47.8
us a layer on the H200 (ncu, the 25M model at batch 1: 27 MB at 0.56
TB/s, each 32-byte piece of a row a DRAM access of its own, made by 32
blocks at different times); in groups, the attention of a token's 6
layers went from 0.343 to 0.219-0.24 ms (bench/sample's breakdown, same
H200).

dg_attention_window: the same recurrence a token at a time over T tokens
without a trip to memory between them: a block owns 4 columns of one (row,
head, half a group), stages the first RW rows of its columns of S in
shared memory (N rows where they fit: 16 bytes a row), and for each token
walks the pairs as dg_attention_step does (the same thread a pair for all T tokens, so a row
is only ever touched by one thread), then sums the partial outputs in a
fixed order; rows past RW are read and written in memory as the step's.
The columns go back to memory once at the end. A column's arithmetic does
not depend on how many columns a block owns (a thread's pairs, its fmaf
order, the shuffles and the warps' order are the same), so at the same
threads a block T tokens of the window are T dg_attention_step calls bit
for bit: out and the state.

Sums in f32; bf16 values are read exactly and out is rounded to nearest
even once.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local TILES = require("tiles")
local DEV = require("device")
local fmt = string.format

local M = {}

local EC = 8 -- columns of S a block owns

local KERNEL = [[
constexpr int H = ${H};		// heads
constexpr int N = ${N};		// latent
constexpr int D = ${D};		// embd
constexpr int NT = ${NT};		// threads a block
constexpr int EC = ${EC};		// columns of S a block owns
constexpr int SG = 8;			// columns of S a group: the state is (B, H, D/SG, N, SG)
typedef ${XT} XT;		// xs, v, out (act)

__device__ __forceinline__ float dg_ld1(const float *p, long long i) { return p[i]; }
__device__ __forceinline__ float dg_ld1(const unsigned short *p, long long i) { return dg_bf16_to_f32(p[i]); }
__device__ __forceinline__ void dg_st1(float *p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void dg_st1(unsigned short *p, long long i, float v) { p[i] = dg_f32_to_bf16(v); }

// RoPE of pair (x0, x1) at position t with the pair's frequency fr.
__device__ __forceinline__ void dg_rope_pair(float t, float fr, float x0, float x1, float *q0, float *q1)
{
	const float two_pi = 6.28318530717958647692f;	// (float)(2π), the reference's
	float ph = __fmul_rn(t, fr);
	ph = __fmul_rn(__fsub_rn(ph, floorf(ph)), two_pi);
	const float c = cosf(ph), s = sinf(ph);
	*q0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
	*q1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

// The block's sum of each of a thread's NC values, in a fixed order: a
// warp's by an xor butterfly, then the warps in order; part (NT/32 rows of
// NC) is the warps' sums; thread j < NC gets column j's (the others 0).
// Both entries sum this way, so a column's bits do not depend on NC.
template <int NC>
__device__ __forceinline__ float dg_block_sum(const float (&acc)[NC], float (*part)[NC])
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
	for (int j = 0; j < NC; ++j) {
		float a = acc[j];
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			a += __shfl_xor_sync(0xffffffffu, a, o);
		if (lane == 0)
			part[warp][j] = a;
	}
	__syncthreads();
	float a = 0.0f;
	if (threadIdx.x < NC)
		for (int w = 0; w < NT / 32; ++w)
			a += part[w][threadIdx.x];
	return a;
}

// A thread's pairs p = threadIdx.x + i·NT (p < N/2), i ascending, in chunks
// of PC (their xs, frequencies and RoPE first) and batches of UB whose rows
// of S are all loaded before the first is used: the same fmaf chains in the
// same order at any PC and UB. Measured on the H200 (bench/sample, 25M,
// batch 1, the 6 layers' attention): PC 1, UB 1 — a pair's 4 loads of 16
// bytes issued together, pair after pair — 0.219-0.24 ms; PC 16, UB 4 (16
// loads in flight a thread) 0.386 ms. (Written as one loop over p, ptxas
// put the store of row 2p between the pair's loads.)
constexpr int PPT = (N / 2 + NT - 1) / NT;	// pairs a thread
constexpr int PC = 1;				// pairs a chunk
constexpr int UB = 1;				// pairs a batch of loads

__device__ __forceinline__ void dg_ld_pair(const float *x, int p, float *x0, float *x1)
{
	const float2 u = reinterpret_cast<const float2 *>(x)[p];
	*x0 = u.x;
	*x1 = u.y;
}
__device__ __forceinline__ void dg_ld_pair(const unsigned short *x, int p, float *x0, float *x1)
{
	const unsigned u = reinterpret_cast<const unsigned *>(x)[p];
	*x0 = __uint_as_float(u << 16);
	*x1 = __uint_as_float(u & 0xffff0000u);
}

// Row k of S from r (its EC columns, loaded before): acc += q·r, S[k] = r + q·v
// (the window's dg_window_row's arithmetic on 8 columns, in its order).
__device__ __forceinline__ void dg_step_loaded(float *__restrict__ S, int k, float q, const float *vv, float4 a,
					       float4 b, float *acc)
{
	acc[0] = fmaf(q, a.x, acc[0]); acc[1] = fmaf(q, a.y, acc[1]);
	acc[2] = fmaf(q, a.z, acc[2]); acc[3] = fmaf(q, a.w, acc[3]);
	acc[4] = fmaf(q, b.x, acc[4]); acc[5] = fmaf(q, b.y, acc[5]);
	acc[6] = fmaf(q, b.z, acc[6]); acc[7] = fmaf(q, b.w, acc[7]);
	a.x = fmaf(q, vv[0], a.x); a.y = fmaf(q, vv[1], a.y);
	a.z = fmaf(q, vv[2], a.z); a.w = fmaf(q, vv[3], a.w);
	b.x = fmaf(q, vv[4], b.x); b.y = fmaf(q, vv[5], b.y);
	b.z = fmaf(q, vv[6], b.z); b.w = fmaf(q, vv[7], b.w);
	float4 *r = reinterpret_cast<float4 *>(S + (long long)k * SG);
	r[0] = a;
	r[1] = b;
}

extern "C" __global__ void __launch_bounds__(NT)
dg_attention_step(const XT *__restrict__ xs, const float *__restrict__ pos, const float *__restrict__ freq,
		  const XT *__restrict__ v, float *__restrict__ state, XT *__restrict__ out, int B)
{
	static_assert(EC == 8, "dg_step_loaded turns 8 columns");
	const int e0 = blockIdx.x * EC, h = blockIdx.y, b = blockIdx.z;
	if (b >= B)
		return;
	const float t = pos[b];
	float vv[EC], acc[EC];
#pragma unroll
	for (int j = 0; j < EC; ++j) {
		vv[j] = dg_ld1(v, (long long)b * D + e0 + j);
		acc[j] = 0.0f;
	}
	const XT *x = xs + ((long long)b * H + h) * N;
	float *S = state + (((long long)b * H + h) * (D / SG) + blockIdx.x) * N * SG;	// the block's group
	for (int c0 = 0; c0 < PPT; c0 += PC) {
		// the chunk's xs and frequencies, then each live pair's RoPE
		float q0[PC], q1[PC], fr[PC];
		bool live[PC];
#pragma unroll
		for (int i = 0; i < PC; ++i) {
			const int p = threadIdx.x + (c0 + i) * NT;
			q0[i] = q1[i] = fr[i] = 0.0f;
			if (c0 + i < PPT && p < N / 2) {
				dg_ld_pair(x, p, &q0[i], &q1[i]);
				fr[i] = freq[2 * p];
			}
		}
#pragma unroll
		for (int i = 0; i < PC; ++i) {
			live[i] = !(q0[i] == 0.0f && q1[i] == 0.0f);	// qr 0: the rows add nothing and stay
			if (live[i])
				dg_rope_pair(t, fr[i], q0[i], q1[i], &q0[i], &q1[i]);
		}
#pragma unroll
		for (int i0 = 0; i0 < PC; i0 += UB) {
			float4 r[UB][4];
#pragma unroll
			for (int j = 0; j < UB; ++j) {
				const int i = i0 + j, p = threadIdx.x + (c0 + i) * NT;
				if (i < PC && live[i]) {
					const float4 *r0 = reinterpret_cast<const float4 *>(S + (long long)(2 * p) * SG);
					const float4 *r1 = reinterpret_cast<const float4 *>(S + (long long)(2 * p + 1) * SG);
					r[j][0] = r0[0];
					r[j][1] = r0[1];
					r[j][2] = r1[0];
					r[j][3] = r1[1];
				}
			}
#pragma unroll
			for (int j = 0; j < UB; ++j) {
				const int i = i0 + j, p = threadIdx.x + (c0 + i) * NT;
				if (i < PC && live[i]) {
					dg_step_loaded(S, 2 * p, q0[i], vv, r[j][0], r[j][1], acc);
					dg_step_loaded(S, 2 * p + 1, q1[i], vv, r[j][2], r[j][3], acc);
				}
			}
		}
	}
	__shared__ float part[NT / 32][EC];
	const float a = dg_block_sum<EC>(acc, part);
	if (threadIdx.x < EC)
		dg_st1(out, ((long long)b * H + h) * D + e0 + threadIdx.x, a);
}
// ---- dg_attention_window: T tokens a row (see the top) ----------------------
constexpr int EW = 4;			// columns of S a window block owns
constexpr int RW = ${RW};		// rows of S staged in shared memory

// Row k of the block's 4 columns: acc += q·S[k], S[k] += q·v (dg_step_loaded's
// order, on a float4 in shared memory or in S).
__device__ __forceinline__ void dg_window_row(float4 *r, float q, const float4 &vv, float4 &acc)
{
	float4 a = *r;
	acc.x = fmaf(q, a.x, acc.x); acc.y = fmaf(q, a.y, acc.y);
	acc.z = fmaf(q, a.z, acc.z); acc.w = fmaf(q, a.w, acc.w);
	a.x = fmaf(q, vv.x, a.x); a.y = fmaf(q, vv.y, a.y);
	a.z = fmaf(q, vv.z, a.z); a.w = fmaf(q, vv.w, a.w);
	*r = a;
}

extern "C" __global__ void __launch_bounds__(NT)
dg_attention_window(const XT *__restrict__ xs, const float *__restrict__ pos, const float *__restrict__ freq,
		    const XT *__restrict__ v, float *__restrict__ state, XT *__restrict__ out, int B, int T)
{
	extern __shared__ float4 dg_rows[];	// RW rows of the block's 4 columns
	__shared__ float part[2][NT / 32][EW];
	const int e0 = blockIdx.x * EW, h = blockIdx.y, b = blockIdx.z;
	if (b >= B)
		return;
	const long long bh = (long long)b * H + h;
	float *S = state + (bh * (D / SG) + e0 / SG) * N * SG + e0 % SG;	// its group, its half
	for (int k = threadIdx.x; k < RW; k += NT)
		dg_rows[k] = *reinterpret_cast<const float4 *>(S + (long long)k * SG);
	__syncthreads();
	const float t0 = pos[b];
	for (int tok = 0; tok < T; ++tok) {
		const float t = __fadd_rn(t0, (float)tok);	// exact below 2^24
		const long long vi = ((long long)b * T + tok) * D + e0;
		const float4 vv = make_float4(dg_ld1(v, vi), dg_ld1(v, vi + 1), dg_ld1(v, vi + 2), dg_ld1(v, vi + 3));
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		const XT *x = xs + (bh * T + tok) * N;
		for (int p = threadIdx.x; p < N / 2; p += NT) {
			const float x0 = dg_ld1(x, 2 * p), x1 = dg_ld1(x, 2 * p + 1);
			if (x0 == 0.0f && x1 == 0.0f)
				continue;	// qr 0: the rows add nothing and stay
			float q0, q1;
			dg_rope_pair(t, freq[2 * p], x0, x1, &q0, &q1);
			if (2 * p + 1 < RW) {
				dg_window_row(&dg_rows[2 * p], q0, vv, acc);
				dg_window_row(&dg_rows[2 * p + 1], q1, vv, acc);
			} else {
				dg_window_row(reinterpret_cast<float4 *>(S + (long long)(2 * p) * SG), q0, vv, acc);
				dg_window_row(reinterpret_cast<float4 *>(S + (long long)(2 * p + 1) * SG), q1, vv, acc);
			}
		}
		// dg_attention_step's fixed-order sum; part alternates by token, so a
		// token's writes never meet the previous token's reads
		const float accs[EW] = { acc.x, acc.y, acc.z, acc.w };
		const float a = dg_block_sum<EW>(accs, part[tok & 1]);
		if (threadIdx.x < EW)
			dg_st1(out, (bh * T + tok) * D + e0 + threadIdx.x, a);
	}
	__syncthreads();	// every thread's last updates of the staged rows
	for (int k = threadIdx.x; k < RW; k += NT)
		*reinterpret_cast<float4 *>(S + (long long)k * SG) = dg_rows[k];
}
]]

-- Rows of S a window block stages (16 bytes a row): N where they fit in
-- the shared memory the arch lets a block opt in to (less the static part
-- and a margin), else as many as do; even (a pair's two rows together).
local function window_rows(N, arch)
  local cap = arch >= 90 and 200 * 1024 or ((arch == 80 or arch == 87) and 150 * 1024)
              or (arch >= 80 and 90 * 1024) or 40 * 1024
  local rows = cap // 16
  rows = rows - rows % 2
  return math.min(N, rows)
end

function M.plan(spec)
  SPEC.one_of(spec, "op", { "attention_step" })
  local D = SPEC.int_field(spec, "embd", 1)
  local N = SPEC.int_field(spec, "latent", 2)
  SPEC.check(D % EC == 0, "spec.embd=%d: must be a multiple of %d (a block owns %d columns of the state)", D, EC, EC)
  SPEC.check(N % 2 == 0, "spec.latent=%d: must be even (RoPE's pairs)", N)
  local p, why = TILES.threads_plan(spec, { "dg_attention_step", "dg_attention_window" }, "attention_step.cu")
  if not p then
    return nil, why
  end
  p.window_rows = window_rows(N, SPEC.int_field(spec, "arch", 1))
  p.entries[2].smem = p.window_rows * 16
  return p
end

function M.render(spec, plan)
  SPEC.one_of(spec, "op", { "attention_step" })
  local H = SPEC.int_field(spec, "heads", 1)
  local N = SPEC.int_field(spec, "latent", 2)
  local D = SPEC.int_field(spec, "embd", 1)
  local act = SPEC.one_of(spec, "act", { "f32", "bf16" })
  local nt = plan.tile.threads
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "attention_step.lua", {
    fmt("attention_step: out (B, %d, T, %d) %s = qr·S, then S (B, %d, %d, %d) f32 += qrᵀ·v, a token at a time; qr = RoPE(xs) at each token's position.",
        H, D, act, H, N, D),
    "",
    fmt("dg_attention_step(xs, pos, freq, v, state, out, int B)   grid (%d, %d, B), %d threads", D // EC, H, nt),
    "path: a block owns 8 columns of a (row, head)'s state; pairs whose xs are 0 skipped; a fixed-order block sum.",
    fmt("dg_attention_window(xs, pos, freq, v, state, out, int B, int T)   grid (%d, %d, B), %d threads, %d bytes of dynamic shared memory",
        D // 4, H, nt, plan.window_rows * 16),
    fmt("path: T tokens a row in order, a block's 4 columns of the state's first %d rows in shared memory; T calls of dg_attention_step bit for bit.",
        plan.window_rows),
  }))
  w:line(DEV.helpers({ bf16 = true }))
  w:line(EMIT.subst(KERNEL, { H = H, N = N, D = D, NT = nt, EC = EC, RW = plan.window_rows,
                              XT = act == "bf16" and "unsigned short" or "float" }))
  return w:text()
end

return M

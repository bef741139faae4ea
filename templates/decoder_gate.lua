--[[
decoder_gate.lua — the decoder's input gradient with the gate's backward in
its epilogue (op decoder_gate_bwd; dg_ref_decoder_gate_bwd mirrors it):

  dxy[b,h,t,l] = Σ_d grad[b,0,t,d] · w[d, h·L + l]          (f32 sums)
  g            = keep(i) ? dxy·s : 0,  s = 1/(1 − p)
  dxs[i]       = g · ys[i]
  dys[i]       = ys[i] > 0 ? g · xs[i] : 0
  i = ((b·H + h)·T + t)·L + l; keep(i): the gate's dropout mask
  (templates/gate.lua, dragon/rng.h) drawn at elem0 + i, regenerated,
  never stored (elem0: the forward's, a data-parallel rank's row0·H·T·L).

It is decoder_grad_input followed by gate_bwd without dxy's round trip: at
the BDH shape (B·T 4096, H 4, L 8192, E 256) dxy is 134 M values a layer,
written and read back once more than the gate's own traffic, and the two
kernels took 600 + 400 us a layer on the H200 where the traffic floor of
this one (xs, ys in; dxs, dys out: 1.07 GB bf16) is about 250 us.

Kernel ABI (runtime/ops/gate.c launches it):
  extern "C" __global__ void dg_decoder_gate_bwd(const float *grad,
      const WT *w, const XT *xs, const XT *ys, GT *dxs, GT *dys, int B, int T,
      float p, unsigned long long seed, unsigned step, unsigned layer,
      const unsigned *step_at, unsigned long long elem0)
  step_at NULL, or a device word added to step (a captured step reads its
  step from its control block). elem0 added to every element's index
  before its draw, any value (one that is not whole Philox blocks of 4
  elements runs the warpgroup epilogue element by element; a rank's
  row0·H·T·L is whole blocks whenever L % 4 == 0).
  grid (ceil(L/BN), ceil(B·T/BM), H), the plan's threads and dynamic shared
  memory. grad (B,1,T,E) f32; w (E, H·L) weight f32 | bf16 (no scale: the
  low-bit recipes pass their bf16 copy); xs, ys (B,H,T,L) act f32 | bf16;
  dxs, dys (B,H,T,L) out f32 | bf16, neither aliasing an input. 16-byte
  aligned (whole allocations are).

Paths (M.plan):
  warpgroup tensor cores (sm_90a, weight bf16, E % 64 == 0; the default
    there): the bf16 GEMM of templates/wgmma_bf16.lua, A = grad rounded to
    bf16 as it is staged (K-major, plain loads: it is 4 MB, read from L2),
    B = w MN-major by cp.async, a ring of S stages; two warpgroups of
    64 x BN. The epilogue stages the f32 tile dxy in the ring's shared
    memory (rows of BN + 8 floats: the pair stores of a half-warp hit 32
    banks), then each thread takes 8 consecutive l of a row at a time:
    16-byte loads of xs and ys (4 such vectors in flight a thread), two
    Philox blocks of mask words, 16-byte stores of dxs and dys (bf16 by
    cvt.rn.bf16x2, a pair an instruction), a warp
    covering whole lines (bf16 pairs stored straight from the accumulators
    half-fill each 32-byte sector, measured slower in attention).
  fp32 FMA (any other arch or format): 64 x 64 tiles of 256 threads, 4 x 4
    outputs a thread, K steps of BK through shared memory; the gate per
    element.

Measured on the H200 at the BDH shape (p 0.1; tests/test_gpu_decoder_gate.c
bdh_shape_sampled, cold L2): 477 us a layer (2.25 TB/s of its traffic),
where decoder_grad_input and gate_bwd took 600 + 400. A block whose tile
is wholly inside runs its loads and epilogue without bounds checks (574 us
with them). The first version (bf16 by bit operations, the
mask packed into bits and out again) took 746 us and was ALU-bound (ncu:
220 M ALU instructions, the pipe 64% busy); with cvt.rn.bf16x2 and the mask
as predicates it issues 260 M warp instructions, 62 an element (Philox-10
is 10 of them), at 0.47 a cycle a scheduler: 16 warps an SM (128
registers, 97 KiB a block) leave it latency- and issue-bound at 1.9 TB/s.
Next: fewer instructions an element in the epilogue (its index and
branch overhead), and more warps an SM. Then ys made here instead of read:
where the step does not save ys (runtime/train/bdh_tape.c recompute_ys,
taken under a memory budget: 1.6 GB fewer at 25M, B 8, T 512), a separate
encoder_v projection makes it again before this kernel (a projection a
layer, 0.25 ms on the H200 today). The tile's ys is the same (rows,
columns) block of relu(aq · Ev[h]ᵀ · scales − thr): an int8 GEMM with
K = D = 256 (wgmma m64nNk32 s8, whose int32 accumulators sit as dxy's f32
ones do), staged as bf16 beside the dxy tile: about 70 us of tensor work
a layer in place of a 268 MB read, under this kernel's memory time, so
the budget's plan would cost nothing. (Two stages of ring, 65 KiB, keep
two blocks an SM with the ys tile's 32 KiB.) The bits to match are
lowrank_wgmma.lua's bf16 epilogue (its `epilogue`, with scales.lua):
ys = bf16(fmaxf(__fsub_rn(__fmul_rn((float)acc, __fmul_rn(sa[r], sw[h·L +
l])), thr_y), 0)), acc the exact int32 sum of aq's and Ev[h]'s codes, r
scales.lua x_row's row of the encoder_v input ((b·H + h)·T + t: in_heads
H). Its A (aq, (B,H,T,D) codes) and B (Ev[h], (N,D) codes) stage as
lowrank_wgmma's resident tiles do (no swizzle, K-major); the CPU
emulation runs both halves already (tests/test_emu_lowrank.c,
tests/test_emu_decoder_gate.c), so the fused kernel can be checked bit
for bit against the pair (encoder_v projection, then this kernel) before
it meets a GPU. It needs the op to take aq, sa, Ev, sw and thr_y in ys's
place (optable args, dragon/ops.h, the reference as that pair) and the
tape's DEC_GATE to read them where recompute_ys is set.

Arithmetic: products and sums f32 (wgmma: grad rounded to bf16 first, w
exact); g, g·ys and g·xs each rounded once (__fmul_rn), as gate_bwd; bf16
results rounded to nearest even once.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local EW = require("elementwise")
local WB = require("wgmma_bf16")
local PHILOX = require("gate").PHILOX
local fmt = string.format

local M = {}

local FLOATS = { "f32", "bf16" }

local function fields(spec)
  SPEC.one_of(spec, "op", { "decoder_gate_bwd" })
  local k = {}
  k.H = SPEC.int_field(spec, "heads", 1)
  k.E = SPEC.int_field(spec, "embd", 4)
  k.L = SPEC.int_field(spec, "latent", 4)
  k.arch = SPEC.int_field(spec, "arch", 1)
  k.arch_specific = spec.arch_specific == true
  k.wfmt = SPEC.one_of(spec, "weight", FLOATS)
  k.xfmt = SPEC.one_of(spec, "act", FLOATS)
  k.gfmt = SPEC.one_of(spec, "out", FLOATS)
  return k
end

local function wgmma_applies(k)
  return k.arch == 90 and k.arch_specific and k.wfmt == "bf16" and k.E % 64 == 0
end

-- wgmma tiles: BM/64 warpgroups (WN 1, WM 4 or 8, BM = 16·WM), BN 64 |
-- 128 | 256, BK 64, 2 to 4 stages. Default 128x128x64/8x1/3: K = E = 256
-- is four steps; 97 KiB of ring (the 68 KiB dxy tile fits in it), two
-- blocks an SM, so one block's memory-bound epilogue overlaps the other's
-- MMAs; 8192 blocks at the BDH shape.
local function wgmma_fits(k, t)
  return wgmma_applies(k) and WB.tile_ok(t, 2, 4)
end

-- The ring, or the staged dxy tile and its rows' bases (BM long longs).
local function wgmma_smem(t)
  return WB.smem_bytes(t, true, t.bm * 8)
end

local function default_tile(k)
  if wgmma_applies(k) then
    return { bm = 128, bn = 128, bk = 64, wm = 8, wn = 1, stages = 3, threads = 0 }
  end
  return { bm = 64, bn = 64, bk = 32, wm = 4, wn = 2, stages = 1, threads = 0 }
end

function M.plan(spec)
  local k = fields(spec)
  local t = TILES.tile_of(spec)
  local auto = TILES.tile_is_auto(t)
  if auto then t = default_tile(k) end
  local ok, err = TILES.gemm_tile_pow2(t, auto)
  if not ok then return nil, err end
  local p = { tile = t, arch_specific = false, name = "decoder_gate_bwd.cu" }
  if wgmma_fits(k, t) then
    local smem = wgmma_smem(t)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    p.path, p.arch_specific, p.smem_bytes = "wgmma bf16", true, smem
    p.entries = { { name = "dg_decoder_gate_bwd", threads = (t.bm // 64) * 128, smem = smem } }
    return p
  end
  if not (t.bm == 64 and t.bn == 64 and (t.bk == 16 or t.bk == 32) and t.wm * t.wn == 8 and t.stages == 1) then
    return TILES.refuse(t, auto, "the fp32 path runs 64x64x16|32 tiles of 8 warps (WM*WN = 8), one stage%s",
                    wgmma_applies(k) and "; the warpgroup path: WN 1, BM = 16*WM (64 or 128), BN 64|128|256, BK 64, 2-4 stages" or "")
  end
  p.path, p.smem_bytes = "fp32", 0
  p.entries = { { name = "dg_decoder_gate_bwd", threads = 256, smem = 0 } }
  return p
end

local HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int E = ${E};		// embd: the reduction
constexpr int L = ${L};		// latent: a head's columns
constexpr int HL = H * L;	// w's row length
typedef ${WT} WT;		// w: ${wfmt}
typedef ${XT} XT;		// xs, ys: ${xfmt}
typedef ${GT} GT;		// dxs, dys: ${gfmt}
]]

local GATE = [[
// The gate's backward of 8 consecutive elements of one row, whose draws
// are e0 .. e0+7 (the elements' index plus elem0; e0 % 4 == 0: two whole
// Philox blocks): dxy in d, xs and ys loaded; the results into gx (dxs)
// and d (dys).
__device__ __forceinline__ void dg_gate8(float (&d)[8], const float (&a)[8], const float (&b)[8], float (&gx)[8],
					 unsigned long long e0, unsigned thr, float s, unsigned long long seed,
					 unsigned step, unsigned layer)
{
	// the mask of dg_keep_bits<2>(e0 / 4, ...), word by word as predicates
	// (no packing into bits and out again)
	bool keep[8];
	if (thr == 0u) {
#pragma unroll
		for (int j = 0; j < 8; ++j)
			keep[j] = true;
	} else {
		const unsigned long long q = e0 / 4;
		const uint4 r0 = dg_philox((unsigned)q, (unsigned)(q >> 32), step, layer, (unsigned)seed,
					   (unsigned)(seed >> 32));
		const uint4 r1 = dg_philox((unsigned)(q + 1), (unsigned)((q + 1) >> 32), step, layer,
					   (unsigned)seed, (unsigned)(seed >> 32));
		keep[0] = r0.x >= thr, keep[1] = r0.y >= thr, keep[2] = r0.z >= thr, keep[3] = r0.w >= thr;
		keep[4] = r1.x >= thr, keep[5] = r1.y >= thr, keep[6] = r1.z >= thr, keep[7] = r1.w >= thr;
	}
#pragma unroll
	for (int j = 0; j < 8; ++j) {
		const float g = keep[j] ? __fmul_rn(d[j], s) : 0.0f;
		gx[j] = __fmul_rn(g, b[j]);
		d[j] = b[j] > 0.0f ? __fmul_rn(g, a[j]) : 0.0f;
	}
}

// 8 results at vector iv: f32 as two float4, bf16 as four cvt pairs.
__device__ __forceinline__ void dg_st8(float *p, long long iv, const float (&f)[8])
{
	dg_st(p, iv, f);
}

__device__ __forceinline__ void dg_st8(unsigned short *p, long long iv, const float (&f)[8])
{
	((uint4 *)p)[iv] = make_uint4(dg_bf16x2(f[0], f[1]), dg_bf16x2(f[2], f[3]), dg_bf16x2(f[4], f[5]),
				      dg_bf16x2(f[6], f[7]));
}

// One element, i (the rows that are not whole vectors), drawn at elem0 + i.
__device__ __forceinline__ void dg_gate1(float d, const XT *xs, const XT *ys, GT *dxs, GT *dys,
					 unsigned long long i, unsigned thr, float s, unsigned long long seed,
					 unsigned step, unsigned layer, unsigned long long elem0)
{
	const bool keep = dg_keep1(elem0 + i, thr, seed, step, layer);
	const float g = keep ? __fmul_rn(d, s) : 0.0f;
	const float y = dg_ld1(ys, (long long)i);
	dg_st1(dxs, (long long)i, __fmul_rn(g, y));
	dg_st1(dys, (long long)i, y > 0.0f ? __fmul_rn(g, dg_ld1(xs, (long long)i)) : 0.0f);
}
]]

local SIG = "const float *__restrict__ grad, const WT *__restrict__ w, const XT *__restrict__ xs, " ..
            "const XT *__restrict__ ys, GT *__restrict__ dxs, GT *__restrict__ dys, int B, int T, " ..
            "float p, unsigned long long seed, unsigned step, unsigned layer, " ..
            "const unsigned *__restrict__ step_at, unsigned long long elem0"

local PRE = [[
	if (step_at)
		step += *step_at;		// a captured step's, from its control block
	const unsigned thr = dg_drop_threshold(p);
	const float s = p > 0.0f ? __fdiv_rn(1.0f, __fsub_rn(1.0f, p)) : 1.0f;	// 1/(1 - p)
	const int M = B * T;			// rows (b, t)
	const int h = blockIdx.z;		// head
	const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;]]

local KERNEL_WG = [[
// ---- tile: BM/64 warpgroups along M, each 64 x BN; a ring of S stages
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};
constexpr int NT = (BM / 64) * 128;		// threads a block
constexpr int S = ${S}, P = S - 1;		// stages; K steps fetched ahead
constexpr int N = L;				// the GEMM's columns (a head's)
static_assert(BK == 64 && E % BK == 0, "whole 128-byte swizzle rows of K");
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
constexpr int SA = BM * BK / 8 / NT, SB = BN * BK / 8 / NT;	// 16-byte chunks a thread
static_assert(SA * NT == BM * BK / 8 && SB * NT == BN * BK / 8, "whole chunks a thread");
constexpr bool VEC = L % 8 == 0;		// rows of whole 8-element vectors
constexpr int BNP = BN + 8;			// the staged tile's row (floats)
constexpr int CH = BM * (BN / 8) / NT;		// epilogue vectors a thread
constexpr int BATCH = CH < 4 ? CH : 4;		// of them in flight
static_assert(CH % BATCH == 0, "whole batches");

extern "C" __global__ void __launch_bounds__(NT, ${MINB})
dg_decoder_gate_bwd(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
${PRE}
	const int nsteps = E / BK;
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;
	const unsigned short *wh = (const unsigned short *)w + (long long)h * L;	// head h's columns

	// Step st: A = grad rows m0.. (f32, K-major), rounded to bf16 as they
	// are staged (8 loads in flight a thread, then the shared stores);
	// B = w rows d = st·BK.. (E, H·L) of head h, MN-major, by cp.async.
	// (Measured: loading A a step ahead into registers, with an L2
	// prefetch of the epilogue's xs and ys, was slower, 599 us against
	// 574 at the BDH shape.)
	// A block whose tile lies wholly inside (every tile at the BDH shape)
	// runs the loads and the epilogue without their bounds checks.
	const bool full = m0 + BM <= M && n0 + BN <= L && VEC;
	// (FULL is a constant at each call: inlined, each call its own copy)
	auto load_t = [&](const bool FULL, int st) {
		const unsigned as = sbase + (st % S) * STAGE, bs = as + A_BYTES;
		float4 v[SA][2];
#pragma unroll
		for (int s2 = 0; s2 < SA; ++s2) {
			const int u = tid + s2 * NT, r = u >> 3, c = u & 7;
			if (FULL || m0 + r < M) {
				const float4 *src = (const float4 *)(grad + (long long)(m0 + r) * E + st * BK + 8 * c);
				v[s2][0] = __ldg(src);
				v[s2][1] = __ldg(src + 1);
			} else {
				v[s2][0] = v[s2][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			}
		}
#pragma unroll
		for (int s2 = 0; s2 < SA; ++s2) {
			const int u = tid + s2 * NT;
			const unsigned w0 = dg_bf16x2(v[s2][0].x, v[s2][0].y), w1 = dg_bf16x2(v[s2][0].z, v[s2][0].w);
			const unsigned w2 = dg_bf16x2(v[s2][1].x, v[s2][1].y), w3 = dg_bf16x2(v[s2][1].z, v[s2][1].w);
			asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
				     :: "r"(as + dg_wb_kmaj(u >> 3, u & 7)), "r"(w0), "r"(w1), "r"(w2), "r"(w3) : "memory");
		}
#pragma unroll
		for (int s2 = 0; s2 < SB; ++s2) {
			const int u = tid + s2 * NT, c = u & 7, kk = (u >> 3) & 63, gg = u >> 9;
			if (FULL)	// whole, 16-byte aligned chunks (L % 8 == 0)
				dg_cp16(bs + dg_wb_mnmaj(gg, kk, c), wh + (long long)(st * BK + kk) * HL + n0 + 64 * gg + 8 * c, 16);
			else
				dg_wb_stage(bs + dg_wb_mnmaj(gg, kk, c), wh, st * BK + kk, E, n0 + 64 * gg + 8 * c, N, HL);
		}
	};
	auto load = [&](int st) {
		if (full)
			load_t(true, st);
		else
			load_t(false, st);
	};

${MAINLOOP}
	__syncthreads();			// every warpgroup's MMAs read the ring

	// ---- epilogue 1: the f32 tile dxy into shared memory (pairs), and the
	// flat index of each row's first element (l = 0), once a row
	float *tile = (float *)(smem + (sbase - (unsigned)__cvta_generic_to_shared(smem)));
	long long *rowbase = (long long *)(tile + BM * BNP);	// -1: past M
${STAGE_ACC}
	for (int r = tid; r < BM; r += NT) {
		const int m = m0 + r, bb = m / T, t = m - bb * T;
		rowbase[r] = m < M ? (((long long)bb * H + h) * T + t) * L : -1;
	}
	__syncthreads();

	// ---- epilogue 2: the gate on 8 consecutive l of a row a thread at a
	// time (a warp: whole rows of BN), BATCH vectors' loads in flight
	auto epilogue = [&](const bool FULL) {
#pragma unroll 1
		for (int c0 = 0; c0 < CH; c0 += BATCH) {
			float a[BATCH][8], b[BATCH][8];
			unsigned long long i0[BATCH];		// the vector's first element
			bool ok[BATCH];
#pragma unroll
			for (int k = 0; k < BATCH; ++k) {
				const int u = tid + (c0 + k) * NT, r = u / (BN / 8), c = u % (BN / 8);
				const int l = n0 + 8 * c;
				const long long base = rowbase[r];
				ok[k] = FULL || (base >= 0 && l < L);
				i0[k] = (unsigned long long)(base + l);
				if (ok[k]) {
					dg_ld(xs, (long long)(i0[k] >> 3), a[k]);
					dg_ld(ys, (long long)(i0[k] >> 3), b[k]);
				}
			}
#pragma unroll
			for (int k = 0; k < BATCH; ++k) {
				if (!ok[k])
					continue;
				const int u = tid + (c0 + k) * NT, r = u / (BN / 8), c = u % (BN / 8);
				const float4 lo = *(const float4 *)(tile + r * BNP + 8 * c),
					     hi = *(const float4 *)(tile + r * BNP + 8 * c + 4);
				float d[8] = { lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w }, gx[8];
				dg_gate8(d, a[k], b[k], gx, i0[k] + elem0, thr, s, seed, step, layer);
				dg_st8(dxs, (long long)(i0[k] >> 3), gx);
				dg_st8(dys, (long long)(i0[k] >> 3), d);
			}
		}
	};
	// an elem0 that is not whole Philox blocks (uniform) would have a
	// vector straddle three: element by element then
	const bool whole = (elem0 & 3ull) == 0ull;
	if (full && whole) {
		epilogue(true);
	} else if (VEC && whole) {
		epilogue(false);
	} else {
		// rows that are not whole vectors, or an elem0 that is not whole
		// blocks: element by element
		for (int u = tid; u < BM * BN; u += NT) {
			const int r = u / BN, cc = u % BN, l = n0 + cc;
			const long long base = rowbase[r];
			if (base >= 0 && l < L)
				dg_gate1(tile[r * BNP + cc], xs, ys, dxs, dys, (unsigned long long)(base + l), thr, s,
					 seed, step, layer, elem0);
		}
	}
}
]]

local KERNEL_FP32 = [[
// ---- tile: 64 x 64 outputs, 256 threads of 4 x 4, K steps of BK
constexpr int BM = 64, BN = 64, BK = ${BK}, NT = 256;

__device__ __forceinline__ float dg_w_at(const float *w, long long i) { return __ldg(w + i); }
__device__ __forceinline__ float dg_w_at(const unsigned short *w, long long i) { return dg_bf16_to_f32(__ldg(w + i)); }

extern "C" __global__ void __launch_bounds__(NT)
dg_decoder_gate_bwd(${SIG})
{
	__shared__ float As[BK][BM + 1];	// grad, k-major (transposed in)
	__shared__ float Bs[BK][BN];		// w
	const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
${PRE}
	float acc[4][4];
#pragma unroll
	for (int i = 0; i < 4; ++i)
#pragma unroll
		for (int j = 0; j < 4; ++j)
			acc[i][j] = 0.0f;
#pragma unroll 1
	for (int k0 = 0; k0 < E; k0 += BK) {
		for (int u = tid; u < BM * BK; u += NT) {
			const int r = u / BK, kk = u % BK, m = m0 + r, d = k0 + kk;
			As[kk][r] = m < M && d < E ? __ldg(grad + (long long)m * E + d) : 0.0f;
		}
		for (int u = tid; u < BK * BN; u += NT) {
			const int kk = u / BN, c = u % BN, d = k0 + kk, l = n0 + c;
			Bs[kk][c] = d < E && l < L ? dg_w_at(w, (long long)d * HL + (long long)h * L + l) : 0.0f;
		}
		__syncthreads();
#pragma unroll 4
		for (int kk = 0; kk < BK; ++kk) {
			float ra[4], rb[4];
#pragma unroll
			for (int i = 0; i < 4; ++i) {
				ra[i] = As[kk][ty + 16 * i];
				rb[i] = Bs[kk][tx + 16 * i];
			}
#pragma unroll
			for (int i = 0; i < 4; ++i)
#pragma unroll
				for (int j = 0; j < 4; ++j)
					acc[i][j] = __fmaf_rn(ra[i], rb[j], acc[i][j]);
		}
		__syncthreads();
	}
#pragma unroll
	for (int i = 0; i < 4; ++i) {
		const int m = m0 + ty + 16 * i;
		if (m >= M)
			continue;
		const int bb = m / T, t = m - bb * T;
		const long long row = (((long long)bb * H + h) * T + t) * L;
#pragma unroll
		for (int j = 0; j < 4; ++j) {
			const int l = n0 + tx + 16 * j;
			if (l < L)
				dg_gate1(acc[i][j], xs, ys, dxs, dys, (unsigned long long)(row + l), thr, s, seed, step,
					 layer, elem0);
		}
	}
}
]]

function M.render(spec, plan)
  local k = fields(spec)
  local t = plan.tile
  local v = {
    H = k.H, E = k.E, L = k.L, wfmt = k.wfmt, xfmt = k.xfmt, gfmt = k.gfmt,
    WT = FM.formats[k.wfmt].ctype, XT = FM.formats[k.xfmt].ctype, GT = FM.formats[k.gfmt].ctype,
  }
  local about = {
    fmt("decoder_gate_bwd: dxy = grad (B,1,T,%d) f32 . w (%d,%d) %s per head; g = keep ? dxy/(1-p) : 0;",
        k.E, k.E, k.H * k.L, k.wfmt),
    fmt("  dxs = g*ys, dys = [ys > 0] g*xs (B,%d,T,%d) %s; xs, ys %s.", k.H, k.L, k.gfmt, k.xfmt),
    "",
    fmt("extern \"C\" __global__ void dg_decoder_gate_bwd(%s)", (EMIT.subst(SIG, {}):gsub("__restrict__ ", ""))),
    fmt("grid (ceil(%d/%d), ceil(B*T/%d), %d), block %d threads.", k.L, t.bn, t.bm, k.H, plan.entries[1].threads),
  }
  local w = EMIT.writer()
  if plan.path == "wgmma bf16" then
    local minb = (t.bm == 128 and t.bn <= 128) and 2 or 1
    about[#about + 1] = fmt("path: warpgroup tensor cores (wgmma m64n%dk16 bf16, f32 sums; sm_90a), %d warpgroups, a ring of %d stages",
                            t.bn, t.bm // 64, t.stages)
    about[#about + 1] = fmt("  (%d bytes of dynamic shared memory), __launch_bounds__ for %d blocks an SM; the epilogue staged.",
                            plan.smem_bytes, minb)
    w:line(EMIT.banner(spec, "decoder_gate.lua", about))
    w:line(DEV.helpers({ bf16 = true, bf16x2 = true, cp_async = true }))
    w:line(WB.helpers(t.bn, false, true))
    w:line(EMIT.subst(HEAD, v))
    w:line(EW.VEC_IO)
    w:line(PHILOX)
    w:line(GATE)
    w:line(EMIT.subst(KERNEL_WG, {
      BM = t.bm, BN = t.bn, BK = t.bk, S = t.stages, MINB = minb, SIG = SIG, PRE = PRE,
      MAINLOOP = EMIT.subst(WB.MAINLOOP, { A_KC = "true", A_KS = "32", B_KC = "false", B_KS = "2048" }),
      STAGE_ACC = EMIT.subst(WB.STAGE_ACC, { TILE = "tile", PITCH = "BNP" }),
    }))
    return w:text()
  end
  about[#about + 1] = fmt("path: fp32 FMA, 64x64 tiles, K steps of %d through shared memory; the gate per element.", t.bk)
  w:line(EMIT.banner(spec, "decoder_gate.lua", about))
  w:line(DEV.helpers({ bf16 = true, bf16x2 = true }))
  w:line(EMIT.subst(HEAD, v))
  w:line(EW.VEC_IO)
  w:line(PHILOX)
  w:line(GATE)
  w:line(EMIT.subst(KERNEL_FP32, { BK = t.bk, SIG = SIG, PRE = PRE }))
  return w:text()
end

return M

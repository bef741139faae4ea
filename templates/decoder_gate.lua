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
  before its draw, any value (one that is not whole Philox blocks of 8
  elements runs the warpgroup epilogue element by element; a rank's
  row0·H·T·L is whole blocks whenever L % 8 == 0).
  grid (ceil(B·T/BM), ceil(L/BN), H), the plan's threads and dynamic shared
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
    16-byte loads of xs and ys (4 such vectors in flight a thread), one
    Philox block of mask words (8 16-bit draws), 16-byte stores of dxs and dys (bf16 by
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
branch overhead), and more warps an SM.

decoder_gate_bwd_ys — the same with ys made in the tile instead of read
(dg_ref_decoder_gate_bwd_ys: lowrank_fwd's ys, then the above):

  ys[b,h,t,l] = relu(Σ_d aq[b,h,t,d]·ev[h,l,d] · sa[(b·H + h)·T + t]·sw[h·L + l]
                     − thr), rounded to src (bf16 | f32)

bit for bit what the encoder_v projection (lowrank_fwd, in_heads H) wrote:
a step that does not save ys (runtime/train/bdh_tape.c recompute_ys, the
plan under a memory budget: B·H·T·L src bytes a layer fewer, 1.6 GB at
25M, B 8, T 512) makes it here, not by a projection a layer (0.25 ms a
layer on the H200), and reads the layer's codes aq (B·H·T·D bytes) in
place of ys (B·H·T·L values). Kernel ABI:
  extern "C" __global__ void dg_decoder_gate_bwd_ys(const float *grad,
      const unsigned short *w, const XT *xs, const int *aq, const float *sa,
      const int *ev, const float *sw, GT *dxs, GT *dys, int B, int T,
      float p, unsigned long long seed, unsigned step, unsigned layer,
      const unsigned *step_at, unsigned long long elem0)
  aq (B,H,T,D) codes (act: int8 | uint8pos), sa its scales (ascale: a
  float a row (b·H + h)·T + t, or one); ev (H,L,D) int8 codes, sw its
  scales (wscale: a float a channel h·L + l, or one); the rest as above
  (w always bf16, xs src).
Paths: the warpgroup one's ring runs NI = D/KI integer steps first (KI
128 bytes of K a step, or 64 where D is not whole 128s; aq's rows and
ev's in no-swizzle core matrices, wgmma m64nNk32 s8 | u8.s8 into int32
sums), whose accumulators become ys (lowrank_wgmma.lua's epilogue
arithmetic: float(acc)·s, s = sa·sw rounded once, then relu(y − thr))
in a tile of its own beside the staged one (BM rows of BN + 8 values:
a half-warp's pair stores hit 32 banks), then dxy's bf16 steps on the
same ring; the epilogue reads ys from that tile. Default tile
128x128x64/8x1/2 (two stages: 104 KiB, two blocks an SM). The fp32 path
sums the codes in int32 through shared memory beside its float GEMM.
Checked on the CPU against the pair, bit for bit
(tests/test_emu_decoder_gate.c), and on the GPU likewise
(tests/test_gpu_decoder_gate.c, ys_made_in_the_tile_is_the_pair: passes
on an H100). Measured there at the BDH shape (p 0.1, cold L2): 737 us,
against 534-556 us for decoder_gate_bwd reading ys — slower than the
read, faster than the pair it replaces (a projection, about 250 us, then
the read): the model takes it only where ys is not saved (the 25M w8a8
step with ys made again: 23.49 ms against 22.40 saving it, the same
losses bit for bit, 1.55 GB less at its peak). ptxas: 128 registers, 16
bytes of spill. Next: the integer steps wait for their MMAs (wait_group
0) with one stage in flight; a third stage (then one block an SM) or
the integer operands by TMA, and ys's epilogue under dxy's first MMAs.

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
local SCL = require("scales")
local PHILOX = require("gate").PHILOX
local DGT = require("decoder_gate_tma")
local fmt = string.format

local M = {}

local FLOATS = { "f32", "bf16" }

local function fields(spec)
  SPEC.one_of(spec, "op", { "decoder_gate_bwd", "decoder_gate_bwd_ys" })
  local k = {}
  k.ys = spec.op == "decoder_gate_bwd_ys"
  k.H = SPEC.int_field(spec, "heads", 1)
  k.E = SPEC.int_field(spec, "embd", 4)
  k.L = SPEC.int_field(spec, "latent", 4)
  k.arch = SPEC.int_field(spec, "arch", 1)
  k.arch_specific = spec.arch_specific == true
  if k.ys then
    -- w the decoder's bf16 copy; xs and the ys made here in src; ys's
    -- projection: aq codes (act) · ev codes (weight), its scales and ReLU
    k.wfmt = "bf16"
    k.xfmt = SPEC.one_of(spec, "src", FLOATS)
    k.afmt = SPEC.one_of(spec, "act", { "int8", "uint8pos" })
    k.evfmt = SPEC.one_of(spec, "weight", { "int8" })
    k.thr = require("lowrank").relu_of(spec)
    k.sc = SCL.scale_kind(spec, FM.formats[k.afmt], FM.formats[k.evfmt])
  else
    k.wfmt = SPEC.one_of(spec, "weight", FLOATS)
    k.xfmt = SPEC.one_of(spec, "act", FLOATS)
  end
  k.gfmt = SPEC.one_of(spec, "out", FLOATS)
  k.entry = k.ys and "dg_decoder_gate_bwd_ys" or "dg_decoder_gate_bwd"
  return k
end

local function wgmma_applies(k)
  return k.arch == 90 and k.arch_specific and k.wfmt == "bf16" and k.E % 64 == 0
end

-- ys's integer steps: 128 bytes of K (a stage's bytes), or 64 where E is
-- not whole 128s.
local function ys_step(k)
  return k.E % 128 == 0 and 128 or 64
end

-- wgmma tiles: BM/64 warpgroups (WN 1, WM 4 or 8, BM = 16·WM), BN 64 |
-- 128 | 256, BK 64, 2 to 4 stages. Default 128x128x64/8x1/3: K = E = 256
-- is four steps; 97 KiB of ring (the 68 KiB dxy tile fits in it), two
-- blocks an SM, so one block's memory-bound epilogue overlaps the other's
-- MMAs; 8192 blocks at the BDH shape. ys made here: 2 stages (the ys
-- tile's 34 KiB beside the staged dxy tile's 69 keep two blocks an SM).
local function wgmma_fits(k, t)
  return wgmma_applies(k) and WB.tile_ok(t, 2, 4)
end

-- The ys tile made in the kernel: BM rows of BN + 8 values of src.
local function ys_tile_bytes(k, t)
  if not k.ys then return 0 end
  return t.bm * (t.bn + 8) * (k.xfmt == "bf16" and 2 or 4)
end

-- The ring, or the staged dxy tile and its rows' bases (BM long longs);
-- then the ys tile.
local function wgmma_smem(k, t)
  return WB.smem_bytes(t, true, t.bm * 8) + ys_tile_bytes(k, t)
end

local function default_tile(k)
  if wgmma_applies(k) then
    return { bm = 128, bn = 128, bk = 64, wm = 8, wn = 1, stages = k.ys and 2 or 3, threads = 0 }
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
  local p = { tile = t, arch_specific = false, name = (k.ys and "decoder_gate_bwd_ys" or "decoder_gate_bwd") .. ".cu" }
  if wgmma_applies(k) and DGT.applies(k, t) then
    -- the persistent form by TMA (templates/decoder_gate_tma.lua); its
    -- _cast entry makes the gradient's bf16 copy the maps read
    local smem = DGT.smem_bytes(t)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    p.path, p.arch_specific, p.smem_bytes = "wgmma tma persistent", true, smem
    p.entries = { { name = k.entry, threads = DGT.threads(t), smem = smem },
                  { name = k.entry .. "_cast", threads = 256, smem = 0 } }
    return p
  end
  if wgmma_fits(k, t) then
    local smem = wgmma_smem(k, t)
    ok, err = TILES.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    p.path, p.arch_specific, p.smem_bytes = k.ys and "wgmma s8 + bf16" or "wgmma bf16", true, smem
    p.entries = { { name = k.entry, threads = (t.bm // 64) * 128, smem = smem } }
    return p
  end
  if not (t.bm == 64 and t.bn == 64 and (t.bk == 16 or t.bk == 32) and t.wm * t.wn == 8 and t.stages == 1) then
    return TILES.refuse(t, auto, "the fp32 path runs 64x64x16|32 tiles of 8 warps (WM*WN = 8), one stage%s",
                    wgmma_applies(k) and "; the warpgroup path: WN 1, BM = 16*WM (64 or 128), BN 64|128|256, BK 64, 2-4 stages" ..
                      (k.ys and "" or "; its persistent form by TMA (bf16 act and out, latent % 8 == 0): BN 64|128, 5-8 stages as shared memory allows") or "")
  end
  p.path, p.smem_bytes = "fp32", 0
  p.entries = { { name = k.entry, threads = 256, smem = 0 } }
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
// The gate's backward of 8 consecutive elements of one row, keep their
// dropout bits: dxy in d, xs and ys loaded; the results into gx (dxs) and
// d (dys).
__device__ __forceinline__ void dg_gate8(float (&d)[8], const float (&a)[8], const float (&b)[8], float (&gx)[8],
					 unsigned keep, float s)
{
#pragma unroll
	for (int j = 0; j < 8; ++j) {
		const float g = (keep >> j) & 1u ? __fmul_rn(d[j], s) : 0.0f;
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

-- ys made here: dg_gate1 of a ys value.
local GATE_Y = [[
__device__ __forceinline__ void dg_gate1y(float d, const XT *xs, float y, GT *dxs, GT *dys,
					  unsigned long long i, unsigned thr, float s, unsigned long long seed,
					  unsigned step, unsigned layer, unsigned long long elem0)
{
	const bool keep = dg_keep1(elem0 + i, thr, seed, step, layer);
	const float g = keep ? __fmul_rn(d, s) : 0.0f;
	dg_st1(dxs, (long long)i, __fmul_rn(g, y));
	dg_st1(dys, (long long)i, y > 0.0f ? __fmul_rn(g, dg_ld1(xs, (long long)i)) : 0.0f);
}
]]

local SIG_TAIL = "GT *__restrict__ dxs, GT *__restrict__ dys, int B, int T, " ..
            "float p, unsigned long long seed, unsigned step, unsigned layer, " ..
            "const unsigned *__restrict__ step_at, unsigned long long elem0"
local SIG = "const float *__restrict__ grad, const WT *__restrict__ w, const XT *__restrict__ xs, " ..
            "const XT *__restrict__ ys, " .. SIG_TAIL
-- ys made here: the encoder_v projection's codes and scales in ys's place
local SIG_YS = "const float *__restrict__ grad, const WT *__restrict__ w, const XT *__restrict__ xs, " ..
            "const AT *__restrict__ aq, const float *__restrict__ sa, const VT *__restrict__ ev, " ..
            "const float *__restrict__ sw, " .. SIG_TAIL

local PRE = [[
	if (step_at)
		step += *step_at;		// a captured step's, from its control block
	const unsigned thr = dg_drop_threshold(p);
	const float s = p > 0.0f ? __fdiv_rn(1.0f, __fsub_rn(1.0f, p)) : 1.0f;	// 1/(1 - p)
	const int M = B * T;			// rows (b, t)
	const int h = blockIdx.z;		// head
	// the grid (row tiles, column tiles, H): the row tiles fastest, so the
	// blocks resident at once share w's columns (runtime/ops/gate.c)
	const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;]]

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
constexpr int NI = ${NI};			// the ring's integer steps before dxy's (ys made here)
${YS_CONSTS}
extern "C" __global__ void __launch_bounds__(NT, ${MINB})
${ENTRY}(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
${PRE}
	const int nsteps = NI + E / BK;		// the ring's run: NI integer steps, then dxy's
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
		const unsigned as = sbase + ((NI + st) % S) * STAGE, bs = as + A_BYTES;
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
${LOAD_I}	auto load = [&](int st) {
${LOAD_BODY}	};

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
			unsigned keep[BATCH];			// its dropout bits
			bool ok[BATCH];
#pragma unroll
			for (int k = 0; k < BATCH; ++k) {	// the vectors
				const int u = tid + (c0 + k) * NT, r = u / (BN / 8), c = u % (BN / 8);
				const int l = n0 + 8 * c;
				const long long base = rowbase[r];
				ok[k] = FULL || (base >= 0 && l < L);
				i0[k] = (unsigned long long)(base + l);
				keep[k] = 0xffu;
			}
			// their dropout bits (the draws of i0 + elem0, a multiple of 8:
			// one whole Philox block each), thr tested once for the batch so
			// that its chains are one block of code the scheduler interleaves
			if (thr != 0u) {
#pragma unroll
				for (int k = 0; k < BATCH; ++k)
					keep[k] = dg_keep8(dg_drop_block((i0[k] + elem0) >> 3, seed, step, layer), thr);
			}
#pragma unroll
			for (int k = 0; k < BATCH; ++k) {
				const int u = tid + (c0 + k) * NT, r = u / (BN / 8), c = u % (BN / 8);
				(void)r; (void)c;	// read by the ys-in-the-kernel form's YS_VEC
				if (ok[k]) {
					dg_ld(xs, (long long)(i0[k] >> 3), a[k]);
					${YS_VEC};
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
				dg_gate8(d, a[k], b[k], gx, keep[k], s);
				dg_st8(dxs, (long long)(i0[k] >> 3), gx);
				dg_st8(dys, (long long)(i0[k] >> 3), d);
			}
		}
	};
	// an elem0 that is not whole Philox blocks (uniform) would have a
	// vector straddle two: element by element then
	const bool whole = (elem0 & 7ull) == 0ull;
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
				${GATE1}(tile[r * BNP + cc], xs, ${YS_ONE}, dxs, dys, (unsigned long long)(base + l), thr,
					  s, seed, step, layer, elem0);
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
${ENTRY}(${SIG})
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
${YS_SUMS}#pragma unroll
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
				${GATE1}(acc[i][j], xs, ${YS_ONE}, dxs, dys, (unsigned long long)(row + l), thr, s, seed,
					  step, layer, elem0);
		}
	}
}
]]

-- ---- ys made in the kernel (op decoder_gate_bwd_ys) ------------------------
-- The encoder_v projection's ys of the tile, bit for bit what lowrank_fwd
-- wrote (templates/lowrank_wgmma.lua's epilogue: y = acc · s, s = sa·sw
-- rounded once, then relu(y − thr), rounded to src), from its int32 sums.

-- The scale of output (row's sa_r, column l) (scales.lua), and y of an
-- int32 sum `acc` (C expressions): relu(acc·s − thr), or acc·s.
local function ys_of(k, acc, sw_e)
  local y = fmt("__int2float_rn(%s)", acc)
  local s_e = SCL.scale_expr(k.sc, "sa_r", sw_e)
  if s_e == "s" then s_e = "sy" end -- (ys_scales: s is the dropout's here)
  if s_e then y = fmt("__fmul_rn(%s, %s)", y, s_e) end
  if k.thr then y = fmt("fmaxf(__fsub_rn(%s, %s), 0.0f)", y, EMIT.cfloat(k.thr)) end
  return y
end

-- This thread's row scale sa_r of row m (a token's: the x row (b·H + h)·T + t).
local function sa_row(k, m, ind)
  if not k.sc.sa_vec then return "" end
  return fmt("%sconst float sa_r = %s < M ? sa[%s] : 0.0f;\n", ind, m, SCL.x_row(k.H, m))
end

local function sw_col(k, l)
  if not k.sc.sw_vec then return "0.0f" end
  return fmt("(%s < L ? sw[(long long)h * L + %s] : 0.0f)", l, l)
end

local YS_CONSTS = [[
constexpr int KI = ${KI};				// bytes of K an integer step
constexpr int KCI = KI / 16, SBI = KCI * 128;	// its core matrices a row; 8 rows' bytes
static_assert(E % KI == 0 && BM * KI <= A_BYTES && BN * KI <= B_BYTES, "an integer step fits a stage");
constexpr int IA = BM * KCI / NT, IB = BN * KCI / NT;	// its 16-byte chunks a thread
static_assert(IA * NT == BM * KCI && IB * NT == BN * KCI, "whole chunks a thread");
constexpr int YP = BN + 8;			// the ys tile's row (values): pair stores hit 32 banks
constexpr int YS_OFF = ${YS_OFF};		// its bytes from the ring's base (after the staged tile)
typedef ${AB} AB;			// aq's codes (${afmt})
typedef signed char VB;			// ev's codes (int8)
]]

-- After sbase: the ys tile, the scales' constants, the integer steps' loads.
local YS_PRE = [[
	XT *const ytile = (XT *)(smem + (sbase - (unsigned)__cvta_generic_to_shared(smem)) + YS_OFF);
${SCALES}	// Integer step st (< NI): aq's rows (b, h, t) of the tile's rows (b, t)
	// and ev's rows n0.. of head h, K bytes KI·st .., in no-swizzle core
	// matrices (8 rows x 16 bytes; the next 8 rows SBI bytes on; a
	// quarter warp fills one), by cp.async; zeros past M and L.
	const unsigned char *aqb = (const unsigned char *)aq, *evb = (const unsigned char *)ev;
	auto load_i = [&](int st) {
		const unsigned as = sbase + (st % S) * STAGE, bs = as + A_BYTES;
#pragma unroll
		for (int s2 = 0; s2 < IA; ++s2) {
			const int u = tid + s2 * NT, r = (u & 7) | ((u / (8 * KCI)) << 3), kc = (u >> 3) % KCI, m = m0 + r;
			const void *src = aqb;
			int bytes = 0;
			if (m < M) {
				const int bb = m / T, t = m - bb * T;
				src = aqb + (((long long)bb * H + h) * T + t) * E + st * KI + kc * 16;
				bytes = 16;
			}
			dg_cp16(as + (r >> 3) * SBI + kc * 128 + (r & 7) * 16, src, bytes);
		}
#pragma unroll
		for (int s2 = 0; s2 < IB; ++s2) {
			const int u = tid + s2 * NT, pr = (u & 7) | ((u / (8 * KCI)) << 3), kc = (u >> 3) % KCI, n = n0 + pr;
			const bool in = n < L;
			dg_cp16(bs + (pr >> 3) * SBI + kc * 128 + (pr & 7) * 16,
				in ? (const void *)(evb + ((long long)h * L + n) * E + st * KI + kc * 16) : (const void *)evb,
				in ? 16 : 0);
		}
	};
]]

local YS_LOAD = [[
		if (full)
			load_t(true, st - NI);
		else
			load_t(false, st - NI);
]]

-- (ys: the ring's prologue and integer steps load any step; dxy's steps
-- only theirs, so the integer loads' state is dead there)
local YS_LOAD_ANY = [[
	auto load_any = [&](int st) {
		if (st < NI)
			load_i(st);
		else
			load(st);
	};
]]

local PLAIN_LOAD = [[
		if (full)
			load_t(true, st);
		else
			load_t(false, st);
]]

-- The ring's first NI steps: ys's int32 sums (wgmma k32 on the codes,
-- both K-major), then ys into its tile from the accumulators (register
-- 4j + i: row 16w + g (+8 for i >= 2), column 8j + 2q (+1 for odd i)).
local YS_LOOP = [[
	// ---- ys's sums first: the ring's NI integer steps
	int iacc[BN / 2];
#pragma unroll
	for (int i = 0; i < BN / 2; ++i)
		iacc[i] = 0;
#pragma unroll 1
	for (int i = 0; i < NI; ++i) {
		dg_cp_wait<P - 1>();		// this thread's copies of step i
		dg_fence_async_smem();
		__syncthreads();		// everyone's; and every MMA of step i-1 is done
		if (i + P < nsteps)
			load_any(i + P);	// into step i-1's stage
		dg_cp_commit();
		const unsigned as = sbase + (i % S) * STAGE + wg * 8 * SBI, bs = sbase + (i % S) * STAGE + A_BYTES;
		dg_wg_fence();
#pragma unroll
		for (int ks = 0; ks < KI / 32; ++ks)
			dg_wgmma(iacc, dg_wg_desc(as + ks * 256, SBI), dg_wg_desc(bs + ks * 256, SBI), 1);
		dg_wg_commit();
		dg_wg_wait<0>();
		dg_wg_pin(iacc);
	}
	// ys = the projection's bits, into the ys tile (read after the barriers
	// below): a column pair's weight scales once for both rows
	const int r0 = wg * 64 + (warp & 3) * 16 + g;
	float sa_rr[2];
#pragma unroll
	for (int hh = 0; hh < 2; ++hh) {
		const int m = m0 + r0 + 8 * hh;
${SA_ROW}		sa_rr[hh] = ${SA_R};
	}
#pragma unroll
	for (int j = 0; j < BN / 8; ++j) {
		const int c = 8 * j + 2 * q, l = n0 + c;
		const float sw0 = ${SW0}, sw1 = ${SW1};
#pragma unroll
		for (int hh = 0; hh < 2; ++hh) {
			const int r = r0 + 8 * hh;
			const float sa_r = sa_rr[hh];
			const float y0 = ${Y0}, y1 = ${Y1};
${STORE_PAIR}
		}
	}
]]

local FP32_SUMS = [[
	// ys's int32 sums: aq (rows (b, h, t) of the tile's (b, t)) · ev (head
	// h's rows), then ys as the projection wrote it (rounded to XT)
	__shared__ int Ai[BK][BM + 1];
	__shared__ int Bi[BK][BN];
	int iacc[4][4];
#pragma unroll
	for (int i = 0; i < 4; ++i)
#pragma unroll
		for (int j = 0; j < 4; ++j)
			iacc[i][j] = 0;
	const AB *aqb = (const AB *)aq;
	const VB *evb = (const VB *)ev;
#pragma unroll 1
	for (int k0 = 0; k0 < E; k0 += BK) {
		for (int u = tid; u < BM * BK; u += NT) {
			const int r = u / BK, kk = u % BK, m = m0 + r, d = k0 + kk;
			int v_ = 0;
			if (m < M && d < E) {
				const int bb = m / T, t = m - bb * T;
				v_ = (int)aqb[(((long long)bb * H + h) * T + t) * E + d];
			}
			Ai[kk][r] = v_;
		}
		for (int u = tid; u < BK * BN; u += NT) {
			const int kk = u / BN, c = u % BN, d = k0 + kk, l = n0 + c;
			Bi[kk][c] = d < E && l < L ? (int)evb[((long long)h * L + l) * E + d] : 0;
		}
		__syncthreads();
#pragma unroll 4
		for (int kk = 0; kk < BK; ++kk)
#pragma unroll
			for (int i = 0; i < 4; ++i)
#pragma unroll
				for (int j = 0; j < 4; ++j)
					iacc[i][j] += Ai[kk][ty + 16 * i] * Bi[kk][tx + 16 * j];
		__syncthreads();
	}
	float ysv[4][4];
#pragma unroll
	for (int i = 0; i < 4; ++i) {
		const int m = m0 + ty + 16 * i;
${SA_ROW}#pragma unroll
		for (int j = 0; j < 4; ++j) {
			const int l = n0 + tx + 16 * j;
			ysv[i][j] = dg_as_xt(${Y});
		}
	}
]]

-- A value rounded to XT and back (the ys the projection stored).
local AS_XT = [[
__device__ __forceinline__ float dg_as_xt(float y) { return ${EXPR}; }
]]

function M.render(spec, plan)
  local k = fields(spec)
  local t = plan.tile
  local v = {
    H = k.H, E = k.E, L = k.L, wfmt = k.wfmt, xfmt = k.xfmt, gfmt = k.gfmt,
    WT = FM.formats[k.wfmt].ctype, XT = FM.formats[k.xfmt].ctype, GT = FM.formats[k.gfmt].ctype,
  }
  local sig = k.ys and SIG_YS or SIG
  local about
  if k.ys then
    about = {
      fmt("decoder_gate_bwd_ys: ys = %s (B,%d,T,%d) %s, made in the tile from aq (B,%d,T,%d) %s and ev (%d,%d,%d) int8",
          k.thr and "relu(sa*sw * aq.ev^T - thr)" or "sa*sw * aq.ev^T", k.H, k.L, k.xfmt, k.H, k.E, k.afmt, k.H, k.L, k.E),
      fmt("  (ascale %s, wscale %s: lowrank_fwd's bits); dxy = grad (B,1,T,%d) f32 . w (%d,%d) bf16 per head;",
          k.sc.sa_vec and "token" or "tensor", k.sc.sw_vec and "channel" or "tensor", k.E, k.E, k.H * k.L),
      fmt("  g = keep ? dxy/(1-p) : 0; dxs = g*ys, dys = [ys > 0] g*xs (B,%d,T,%d) %s; xs %s.", k.H, k.L, k.gfmt, k.xfmt),
    }
  else
    about = {
      fmt("decoder_gate_bwd: dxy = grad (B,1,T,%d) f32 . w (%d,%d) %s per head; g = keep ? dxy/(1-p) : 0;",
          k.E, k.E, k.H * k.L, k.wfmt),
      fmt("  dxs = g*ys, dys = [ys > 0] g*xs (B,%d,T,%d) %s; xs, ys %s.", k.H, k.L, k.gfmt, k.xfmt),
    }
  end
  about[#about + 1] = ""
  about[#about + 1] = fmt("extern \"C\" __global__ void %s(%s)", k.entry, (EMIT.subst(sig, {}):gsub("__restrict__ ", "")))
  if plan.path ~= "wgmma tma persistent" then
    about[#about + 1] = fmt("grid (ceil(B*T/%d), ceil(%d/%d), %d), block %d threads.", t.bm, k.L, t.bn, k.H, plan.entries[1].threads)
  end
  local w = EMIT.writer()
  local head = EMIT.subst(HEAD, v)
  local sc = EMIT.writer()
  sc:indent(1)
  if k.ys then
    v.AT, v.VT = "int", "int"
    head = head .. "typedef int AT;			// aq: " .. k.afmt .. " codes, four a word\n" ..
           "typedef int VT;			// ev: int8 codes, four a word\n"
    for _, l in ipairs(SCL.scale_prologue(k.sc)) do sc:line((l:gsub("^const float s = ", "const float sy = "))) end
  end
  local ab = FM.out_types[k.afmt or "int8"].ctype
  if plan.path == "wgmma tma persistent" then
    about[#about + 1] = fmt("path: persistent, warp-specialized (templates/decoder_gate_tma.lua): wgmma m64n%dk16 bf16, f32 sums (sm_90a); %d consumer warpgroups, a producer warpgroup: a ring of %d stages by TMA (A the gradient's bf16 copy, B w MN-major), xs and ys in subtiles of %d columns by TMA into %d slots, dxs and dys stored from them by TMA.",
                            t.bn, t.bm // 64, t.stages, DGT.EC, DGT.eps(t))
    about[#about + 1] = fmt("grid (any, 1, 1), %d threads, %d bytes of dynamic shared memory; maps ma (grad's copy: E, T, B; boxes 64 x %d), mb (w: H*L, E, 1; 64 x 64), mx, my, md, me (xs, ys, dxs, dys: L, T, B*H; 32 x %d, the 64-byte swizzle).",
                            DGT.threads(t), plan.smem_bytes, t.bm, t.bm)
    about[#about + 1] = "dg_decoder_gate_bwd_cast(const float *grad, unsigned short *copy, long long n8): the copy, first."
    w:line(EMIT.banner(spec, "decoder_gate.lua", about))
    w:line(DGT.render(t, EMIT.subst(HEAD, v), sig, PHILOX))
    return w:text()
  end
  if plan.path ~= "fp32" then
    local minb = (t.bm == 128 and t.bn <= 128) and 2 or 1
    local mma = k.ys and fmt("wgmma m64n%dk32 %s.s8 int32 sums for ys, then m64n%dk16 bf16 f32 sums for dxy",
                             t.bn, FM.formats[k.afmt].unsigned and "u8" or "s8", t.bn)
                      or fmt("wgmma m64n%dk16 bf16, f32 sums", t.bn)
    about[#about + 1] = fmt("path: warpgroup tensor cores (%s; sm_90a), %d warpgroups, a ring of %d stages", mma, t.bm // 64, t.stages)
    about[#about + 1] = fmt("  (%d bytes of dynamic shared memory), __launch_bounds__ for %d blocks an SM; the epilogue staged%s.",
                            plan.smem_bytes, minb, k.ys and ", ys in a tile of its own" or "")
    w:line(EMIT.banner(spec, "decoder_gate.lua", about))
    w:line(DEV.helpers({ bf16 = true, bf16x2 = true, cp_async = true }))
    w:line(WB.helpers(t.bn, false, true))
    if k.ys then w:line(require("wgmma").helpers(t.bn, FM.formats[k.afmt].unsigned, false, true)) end
    w:line(head)
    w:line(EW.VEC_IO)
    w:line(PHILOX)
    w:line(GATE)
    if k.ys then w:line(GATE_Y) end
    local mm = { A_KC = "true", A_KS = "32", B_KC = "false", B_KS = "2048" }
    local vars = {
      BM = t.bm, BN = t.bn, BK = t.bk, S = t.stages, MINB = minb, SIG = sig, PRE = PRE, ENTRY = k.entry,
      NI = k.ys and k.E // ys_step(k) or 0, YS_CONSTS = "", LOAD_I = "", LOAD_BODY = PLAIN_LOAD,
      MAINLOOP = EMIT.subst(WB.MAINLOOP, mm),
      STAGE_ACC = EMIT.subst(WB.STAGE_ACC, { TILE = "tile", PITCH = "BNP" }),
      YS_VEC = "dg_ld(ys, (long long)(i0[k] >> 3), b[k])", YS_ONE = "ys", GATE1 = "dg_gate1",
    }
    if k.ys then
      local pair = k.xfmt == "bf16" and "\t\t\t*(unsigned *)(ytile + r * YP + c) = dg_bf16x2(y0, y1);"
                                     or "\t\t\t*(float2 *)(ytile + r * YP + c) = make_float2(y0, y1);"
      mm.I0 = "NI"
      vars.YS_CONSTS = EMIT.subst(YS_CONSTS, { YS_OFF = WB.ring_bytes(t, true, t.bm * 8), AB = ab, afmt = k.afmt,
                                               KI = ys_step(k) })
      vars.LOAD_I = EMIT.subst(YS_PRE, { SCALES = sc:text() })
      vars.LOAD_BODY = YS_LOAD
      vars.MAINLOOP = YS_LOAD_ANY .. WB.MAINLOOP_PROLOGUE:gsub("load%(s%)", "load_any(s)") .. EMIT.subst(YS_LOOP, {
        SA_ROW = sa_row(k, "m", "\t\t"), SA_R = k.sc.sa_vec and "sa_r" or "0.0f", STORE_PAIR = pair,
        SW0 = sw_col(k, "l"), SW1 = sw_col(k, "(l + 1)"),
        Y0 = ys_of(k, "iacc[4 * j + 2 * hh]", "sw0"), Y1 = ys_of(k, "iacc[4 * j + 2 * hh + 1]", "sw1"),
      }) .. WB.MAINLOOP_ACC .. EMIT.subst(WB.MAINLOOP_STEPS, mm)
      vars.YS_VEC = "dg_ld(ytile + r * YP, c, b[k])"
      vars.YS_ONE, vars.GATE1 = "dg_ld1(ytile, r * YP + cc)", "dg_gate1y"
    end
    w:line(EMIT.subst(KERNEL_WG, vars))
    return w:text()
  end
  about[#about + 1] = fmt("path: fp32 FMA, 64x64 tiles, K steps of %d through shared memory; the gate per element%s.", t.bk,
                          k.ys and "; ys's int32 sums likewise" or "")
  w:line(EMIT.banner(spec, "decoder_gate.lua", about))
  w:line(DEV.helpers({ bf16 = true, bf16x2 = true }))
  w:line(head)
  w:line(EW.VEC_IO)
  w:line(PHILOX)
  w:line(GATE)
  if k.ys then w:line(GATE_Y) end
  local vars = { BK = t.bk, SIG = sig, PRE = PRE, ENTRY = k.entry, YS_SUMS = "", YS_ONE = "ys", GATE1 = "dg_gate1" }
  if k.ys then
    w:line(EMIT.subst(AS_XT, { EXPR = k.xfmt == "bf16" and "dg_bf16_to_f32(dg_f32_to_bf16(y))" or "y" }))
    w:line(fmt("typedef %s AB;			// aq's codes (%s)\ntypedef signed char VB;			// ev's codes (int8)", ab, k.afmt))
    vars.YS_SUMS = sc:text() .. EMIT.subst(FP32_SUMS, { SA_ROW = sa_row(k, "m", "\t\t"), Y = ys_of(k, "iacc[i][j]", sw_col(k, "l")) })
    vars.YS_ONE, vars.GATE1 = "ysv[i][j]", "dg_gate1y"
  end
  w:line(EMIT.subst(KERNEL_FP32, vars))
  return w:text()
end

return M

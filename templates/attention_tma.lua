--[[
attention_tma.lua — the sm_90a warp-specialized path of the attention
GEMMs whose operands are RoPE(xs) already (rope=pre: attention_scores and
attention_grad_xs; templates/attention.lua plans it, holds the math, the
ABI and the epilogues' arithmetic):

  a producer warpgroup (the last) fills a ring of S stages; the consumer
  warpgroups (BM/64 of them, 64 rows of the tile each) run wgmma
  m64nBNk16 bf16 with f32 sums on each stage as soon as it is full, and
  free it as soon as their MMAs on it completed. Two mbarriers a stage:
  full (the bytes landed) and empty (every consumer thread is done with
  it), so loads of later stages overlap the MMAs of earlier ones and no
  block-wide barrier sits in the K loop.

Loads: every operand by TMA (cp.async.bulk.tensor, a tensor map a kernel
parameter, the 128-byte swizzle of templates/wgmma_bf16.lua, zeros past
the edges) issued by one producer thread; the stage's full barrier
completes on the bytes (expect_tx). attention_scores' operands are RoPE(xs)
along L (rows of L bf16, L % 8 == 0); attention_grad_xs's A is C = dS + dSᵀ
(rows of T bf16: a tensor map needs rows of a multiple of 16 bytes, so the
runtime takes this path for grad_xs only at T % 8 == 0 and the cp.async
ring of templates/attention_wgmma.lua at other T), its B RoPE(xs) N-major.

ABI: the op's (templates/attention.lua) followed by two tensor maps,
  ..., int B, int T, const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb
made by the runtime (runtime/ops/attention.c):
  attention_scores: ma, mb over RoPE(xs) (L, T, B·H): boxes 64 x BM, 64 x BN
                    (K-major rows of T)
  attention_grad_xs: ma over C (T, T, B·H): boxes 64 x BM (K-major rows of
                     T); mb over RoPE(xs): boxes 64 x 64 (64 of L by 64
                     rows of T: MN-major).

Epilogues: attention.lua's pair stores, or (epi=mask) attention_wgmma.lua's
staged one through the ring, synchronized among the consumers alone (named
barrier 1: the producer has left); the persistent form with bf16 dxs takes
its epilogue's operands by TMA instead (M.tma_epi: three maps more after
mb, md over dxs, mx over mask_xs, mr over the RoPE table).

The persistent form (attention_grad_xs, a ring of 4 stages, BN 128 or 64:
M.persistent_ok, KERNEL_P) runs the same loads, MMAs and epilogues over a
grid of (the SMs' blocks, 1, 1): each block walks tiles it = blockIdx.x,
+= gridDim.x, m fastest; its producer and consumers count the block's K
steps over all its tiles, so a stage's phase runs on from tile to tile;
the staged f32 tile lies after the ring's barriers, so the producer fills
the ring with the next tile while the consumers run the epilogue. With
rope=load (M.applies_load) its B operand is xs itself: warps 1 to 3 of the
producer warpgroup turn each stage's boxes by the table (TURN) and arrive
on a third barrier a stage (ready), which the consumers wait for.
]]
local EMIT = require("emit")
local DEV = require("device")
local EW = require("elementwise")
local fmt = string.format

local M = {}

-- The path serves attention_scores and attention_grad_xs with rope=pre on
-- sm_90a (attention.lua's wgmma_op) when L allows a tensor map (rows of a
-- multiple of 16 bytes); tiles: wgmma_bf16.lua's (BN 64, 128 or 256: 32 to
-- 128 accumulators a thread) with 5 to 8 stages. (grad_xs's first form took
-- A by the producers' cp.async with cp.async.mbarrier.arrive.noinc and hung
-- on the H200; A is a tensor map now, as scores' operands are.)
M.OPS = { attention_scores = true, attention_grad_xs = true }

function M.applies(k)
  return k.rope_pre and k.L % 8 == 0 and M.OPS[k.op] == true
end

-- A ring of 5 to 8 stages (deeper than the cp.async ring's 3 or 4) names
-- this path: until the GPU suite has passed on it, the default tile stays
-- on the cp.async ring and this path is taken only when a tile (a tuning
-- record, or an explicit spec) asks for it.
function M.tile_ok(t)
  return require("wgmma_bf16").tile_ok(t, 5, 8)
end

-- The cluster a kernel of tile t runs in (CX blocks along N, CY along M)
-- or nil: attention_grad_xs at 128 x 128 with 6 stages runs 2 x 2
-- (wgmma_bf16.lua's cluster ring: the blocks of a cluster row share C's
-- rows, those of a column RoPE(xs)'s, so each block loads half of A and
-- half of B from L2). A block's loads are cut along the rows of A (64
-- each, the runtime's map of C has boxes of BM / CX rows) and the 64-wide
-- boxes of B. Measured on the H200 (B 8, H 4, T 512, L 8192, epi=mask,
-- test_gpu_attention warp_specialized_grad_xs): 1184 us at 6 stages and
-- 1198 at 5 in the cluster against 688-694 for the block's own ring (3, 5
-- or 7 stages). Halving the L2 reads does not pay here: K = T = 512 is 8
-- steps a tile, so a tile is mostly its ring's fill and its epilogue, and
-- a cluster waits for its slowest block at both ends. Hence not the
-- default: the form for a persistent kernel, whose blocks would stream
-- tile after tile through the ring (the fill paid once, the epilogue
-- under the next tile's loads).
function M.cluster(op, t)
  if op == "attention_grad_xs" and t.bm == 128 and t.bn == 128 and t.stages == 6 then
    return 2, 2
  end
end

-- The persistent form (tile of 4 stages, attention_grad_xs): a grid of as
-- many blocks as the SMs hold (runtime/ops/attention.c), each walking
-- tiles m fastest (the tiles of one column of RoPE(xs) back to back, so
-- its boxes are read from L2 by the next ones), its producer filling the
-- ring with the next tile's steps while the consumers run the epilogue
-- (the f32 tile staged in a region of its own beside the ring, not in
-- it). Why: at K = T = 512 a tile is 8 steps, and the non-persistent
-- kernel pays the ring's fill and an epilogue that nothing overlaps on
-- every tile (attention.lua's measurements above). A ring of 4 stages is
-- what fits beside the 128 x 128 staged tile (128 KiB + 68 KiB).
-- Measured and not taken (H100, BDH shape, epi=mask, test_gpu_attention
-- warp_specialized_grad_xs): the consumers asking L2 for the next tile's
-- rows of dxs, mask_xs and the RoPE table (cp.async.bulk.prefetch.L2, a
-- row a thread, as they start a tile) so the epilogue would read them
-- from L2: 902.6 us against 757.6 without (the model's attention bwd 5.26
-- -> 6.21 ms): the prefetched bytes compete with the ring's loads for HBM
-- and L2 instead of filling idle time.
-- BN 64 or 128 (at BN 256 a ring of 4 stages is the cp.async ring's, as
-- for every other op: the staged tile would not fit beside it).
function M.persistent_ok(k, t)
  return k.op == "attention_grad_xs" and t.bn <= 128 and require("wgmma_bf16").tile_ok(t, 4, 4)
end

-- The persistent form also takes rope=load (KERNEL_P's turners: RoPE on
-- the stages, no RoPE(xs) in memory) for bf16 on sm_90a where rows of L
-- are a tensor map's.
function M.applies_load(k)
  return k.op == "attention_grad_xs" and not k.rope_pre and k.arch == 90 and k.arch_specific and k.act == "bf16" and
         k.L % 8 == 0
end

-- Its dynamic shared memory: the ring, its 3·S mbarriers, the staged tile
-- (epi=mask with f32 dxs: BM rows of BN + 8 floats, 1 KiB aligned) or the
-- epilogue's slots and their barriers (tepi: M.tma_epi), and 1 KiB for the
-- alignment of the atoms.
function M.persistent_smem(t, staged, tepi)
  local ring = t.stages * (t.bm + t.bn) * t.bk * 2 + 24 * t.stages
  if tepi then
    ring = (ring + 1023) // 1024 * 1024 + M.EPS * M.eslot(t) + 16 * M.EPS
  elseif staged then ring = (ring + 1023) // 1024 * 1024 + t.bm * (t.bn + 8) * 4 end
  return ring + 1024
end

-- The epilogue's operands by TMA (M.tma_epi: the persistent form, epi=mask,
-- dxs and mask_xs bf16): the producer thread, after a tile's K steps, loads
-- the tile's epilogue inputs in subtiles of BM rows by EC = 32 columns into
-- a ring of EPS = 3 slots (full / empty mbarriers of their own): the RoPE
-- table's 32 floats a row (128-byte rows, the 128-byte swizzle), dxs's and
-- mask_xs's 32 bf16 (64-byte rows, the 64-byte swizzle). The consumers take
-- each subtile from the accumulators' own layout (a thread's pairs: no f32
-- tile staged), write dxs's new bf16 pairs into its slot in place, and one
-- thread stores the slot by TMA. Why: the staged epilogue's global loads
-- were half the kernel's stall samples (ncu, H100, the w8a8 step: long
-- scoreboard 50%, bench/results/ncu-h100-2026-12-07.json); here they are in
-- flight while the tile's MMAs run, and a subtile's wait is on bytes
-- already landed. Measured on an H100 (the w8a8 step, the same losses bit
-- for bit, bench/results/step-train-h100-2026-12-07_tma_epi.json): the
-- attention backward 4.55 -> 3.77 ms at 25M, 10.23 -> 8.75 at 1B.
M.EPS, M.EC = 3, 32
function M.eslot(t) return (t.bm * M.EC * 8 + 1023) // 1024 * 1024 end
function M.tma_epi(k, t)
  return k.epi_mask and M.persistent_ok(k, t) and k.out == "bf16" and k.act == "bf16"
end

-- Dynamic shared memory and threads a block: wgmma_bf16.lua's
-- warp-specialized form's.
M.smem_bytes = require("wgmma_bf16").ws_smem_bytes
M.threads = require("wgmma_bf16").ws_threads

local HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int E = ${E};		// embd (D)
constexpr int L = ${L};		// latent (N)
typedef ${XT} XT;		// the act format's storage
typedef ${AT} AT;		// A operand storage (bf16)
typedef ${BT} BT;		// B operand storage (bf16)
typedef ${OT} OT;		// output storage

// ---- tile: BM/64 consumer warpgroups along M, each 64 x BN; a producer
// warpgroup; a ring of S stages
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};
constexpr int NT = (BM / 64) * 128;		// consumer threads
constexpr int S = ${S};
constexpr bool A_KC = ${A_KC}, B_KC = ${B_KC};	// K-major (else M / N-major)
static_assert(BK == 64, "one 128-byte swizzle row of K a step");
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
]]

-- The producer's loads of step i into stage s, by op: A then B.
local LOADS = {
  attention_scores = [[
				const int k0 = (kt_begin + i) * BK;
				dg_tma_load(as, &ma, full, k0, m0, z);
				dg_tma_load(bs, &mb, full, k0, n0, z);]],
  attention_grad_xs = [[
				const int k0 = (kt_begin + i) * BK;
				dg_tma_load(as, &ma, full, k0, m0, z);	// C rows m0.., columns k0..
#pragma unroll
				for (int g = 0; g < BN / 64; ++g)	// 64 of L by 64 rows of T a box
					dg_tma_load(bs + 8192 * g, &mb, full, n0 + 64 * g, k0, z);]],
}

-- The same in a cluster (M.cluster): this block's rows of A to its
-- cluster row, its boxes of B to its cluster column.
local LOADS_CLUSTER = {
  attention_grad_xs = [[
				const int k0 = (kt_begin + i) * BK;
				dg_tma_load_mc(as + crx * (A_BYTES / CX), &ma, full, k0, m0 + crx * (BM / CX), z, mrow);
#pragma unroll
				for (int g = 0; g < BN / 64 / CY; ++g) {
					const int gb = cry * (BN / 64 / CY) + g;
					dg_tma_load_mc(bs + 8192 * gb, &mb, full, n0 + 64 * gb, k0, z, mcol);
				}]],
}

local KERNEL = [[
extern "C" __global__ void __launch_bounds__(NTB, 1)${CLUSTER_ATTR}
${ENTRY}(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, z = blockIdx.z;
	(void)B;
${GEO}
	(void)pa; (void)pb; (void)ra; (void)rb; (void)a_hs; (void)b_hs; (void)LDA; (void)LDB; (void)NH; (void)ma; (void)mb;
	if (skip) {
${SKIP}
		return;
	}
	const int nsteps = kt_end > kt_begin ? kt_end - kt_begin : 0;
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;${CLUSTER_PRE}
${MAINLOOP}

${EPILOGUE}
}
]]

-- The persistent form's kernel (M.persistent_ok): grid (n, 1, 1), tile
-- it = blockIdx.x, += gridDim.x over (T / BM) x (L / BN) x B·H, m fastest,
-- then the heads of a group of 8 (z), then n, then the group: the epilogue
-- reads the RoPE table's rows of its tile (64 KiB at 128 x 128, twice a
-- bf16 operand's), which the heads of a group read at once instead of a
-- whole head's sweep of the table (16.8 MB at BDH) apart (H100, the w8a8
-- step: attention backward 5.24 -> 4.93 ms, step 22.39 -> 22.11);
-- step g counts the block's K steps over all its tiles, so the ring's
-- stage g % S and phase (g / S) & 1 run on from tile to tile. The
-- consumers release each stage once their MMAs on it are done (the last
-- of a tile after the tile's wait), so the producer fills the next tile's
-- stages while they run the epilogue.
local KERNEL_P = [[
extern "C" __global__ void __launch_bounds__(NTB, 1)
${ENTRY}(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	(void)g;
	(void)q;
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;
	// full[S], empty[S], then (rope=load) ready[S]: the stage turned
	const unsigned bars = sbase + (unsigned)(S * STAGE);
	// the staged f32 tile (epi=mask), after the barriers
	const unsigned ebase = (bars + 24u * S + 1023u) & ~1023u;
	(void)ebase;${EPI_BARS}
	const int tiles_m = (T + BM - 1) / BM, tiles_n = (L + BN - 1) / BN;
	const long long tiles = (long long)tiles_m * tiles_n * B * H;
	// the walk takes the heads in groups of ZG: the RoPE table's rows of a
	// column of tiles are read by a group's heads together, and their C
	// stays in L2 across the group's columns
	constexpr int ZG = 8;
${READY_INIT}${EPI_INIT}
${RING_START}
			long long gs = 0;	// the block's steps so far${EPI_COUNT}
${TILE_BEGIN}
				for (int i = 0; i < nsteps; ++i, ++gs) {
					const int s = (int)(gs % S);
					const unsigned full = bars + 8 * s, as = sbase + s * STAGE, bs = as + A_BYTES;
					// the stage's previous use released by every consumer
					dg_mbar_wait(bars + 8 * (S + s), (unsigned)((gs / S) & 1) ^ 1u);
					dg_mbar_expect_tx(full, TX);
${LOADS}
				}${EPI_LOADS}
			}
		}${TURN}
		return;
	}

	// ---- the consumers: warpgroup wg, rows wg·64 .. +63 of each tile
	if constexpr (REG_MOVE)
		dg_reg_alloc<REG_C>();
	long long gs = 0;${EPI_COUNT}
${TILE_BEGIN}
		float acc[BN / 2];
#pragma unroll
		for (int i = 0; i < BN / 2; ++i)
			acc[i] = 0.0f;
		for (int i = 0; i < nsteps; ++i, ++gs) {
			const int s = (int)(gs % S);
			dg_mbar_wait(${STAGE_BAR}, (unsigned)((gs / S) & 1));
			const unsigned as = sbase + s * STAGE + wg * 8192, bs = sbase + s * STAGE + A_BYTES;
			dg_wg_fence();
#pragma unroll
			for (int ks = 0; ks < BK / 16; ++ks)
				${MMA_STEP}
			dg_wg_commit();
			// the step before's MMAs done: its stage is free
			dg_wg_wait<1>();
			dg_wb_pin(acc);
			if (i > 0)
				dg_mbar_arrive(bars + 8 * (S + (int)((gs - 1) % S)));
		}
		dg_wg_wait<0>();
		dg_wb_pin(acc);
		if (nsteps > 0)	// the tile's last stage: the producer fills it with the next tile's
			dg_mbar_arrive(bars + 8 * (S + (int)((gs - 1) % S)));

${EPILOGUE}
	}${CONSUMER_END}
}
]]

-- A block's walk over its tiles (it, m0, n0, z, the op's geometry, nsteps
-- in scope; the loop's brace left open): the producer's, the turners' and
-- the consumers' the same walk.
local TILE_BEGIN = [[
	for (long long it = blockIdx.x; it < tiles; it += gridDim.x) {
		// m fastest, then the heads of a group of ZG, then n, then the group
		const int m0 = (int)(it % tiles_m) * BM;
		const long long rest = it / tiles_m, zg = rest / ((long long)ZG * tiles_n);
		const int gsz = (int)min((long long)ZG, (long long)B * H - zg * ZG);
		const int within = (int)(rest - zg * ZG * tiles_n);
		const int z = (int)(zg * ZG) + within % gsz, n0 = within / gsz * BN;
${GEO}
		(void)pa; (void)pb; (void)ra; (void)rb; (void)a_hs; (void)b_hs; (void)LDA; (void)LDB; (void)NH; (void)M; (void)N; (void)skip; (void)po;${PM_VOID}
		const int nsteps = kt_end > kt_begin ? kt_end - kt_begin : 0;]]

-- rope=load: the producer warpgroup's warps 1 to 3 turn each stage's B
-- boxes (RoPE(xs)'s rows j = k0.., MN-major, 64 of L a box) by the table
-- in place once its bytes landed (full), rotating each pair as rope_fwd
-- does (templates/rope.lua: each product and the sum rounded once, then
-- bf16), so the consumers' MMAs read what rope=pre's would: the same sums
-- bit for bit, and no RoPE(xs) in memory. Their generic stores are made
-- visible to the tensor cores (fence.proxy.async) before they arrive on
-- ready[s], which the consumers wait for instead of full[s].
local TURN = [[
 else if (tid >= NT + 32) {	// warps 1 to 3: the turners
			long long gs = 0;
			const int u0 = tid - (NT + 32);
			unsigned char *const sm = smem + (sbase - (unsigned)__cvta_generic_to_shared(smem));
${TILE_BEGIN}
				for (int i = 0; i < nsteps; ++i, ++gs) {
					const int s = (int)(gs % S), k0 = (kt_begin + i) * BK;
					dg_mbar_wait(bars + 8 * s, (unsigned)((gs / S) & 1));
					unsigned char *const bp = sm + s * STAGE + A_BYTES;
					// 16-byte chunks: box gb, its row kk (token k0 + kk), chunk c (8 of L)
					for (int u = u0; u < BN / 64 * 512; u += 96) {
						const int gb = u >> 9, kk = (u >> 3) & 63, c = u & 7;
						const int j = k0 + kk, n = n0 + 64 * gb + 8 * c;
						if (j >= T || n >= L)
							continue;	// the map's zeros
						uint4 *const p = (uint4 *)(bp + dg_wb_mnmaj(gb, kk, c));
						const float4 *const tb = (const float4 *)(rope + (long long)j * L + n);
						const float4 t0 = __ldg(tb), t1 = __ldg(tb + 1);
						const uint4 v = *p;
						*p = make_uint4(dg_turn(v.x, t0.x, t0.y), dg_turn(v.y, t0.z, t0.w),
								dg_turn(v.z, t1.x, t1.y), dg_turn(v.w, t1.z, t1.w));
					}
					dg_fence_async_smem();
					dg_mbar_arrive(bars + 8 * (2 * S + s));
				}
			}
		}]]

-- The epilogue by TMA (M.tma_epi): its constants and helpers, the barriers,
-- the producer's loads after a tile's steps, the consumers' subtiles.
local TEPI_HEAD = [[
// ---- the epilogue's operands by TMA: subtiles of BM rows x EC columns in
// EPS slots, each the RoPE table's EC floats a row (128-byte swizzle), then
// dxs's and mask_xs's EC bf16 a row (64-byte swizzle)
constexpr int EC = ${EC}, EPS = ${EPS};
constexpr unsigned ER_BYTES = BM * EC * 4, ED_BYTES = BM * EC * 2;
constexpr unsigned ESLOT = (ER_BYTES + 2 * ED_BYTES + 1023) / 1024 * 1024;
constexpr unsigned ETX = ER_BYTES + 2 * ED_BYTES;	// bytes a subtile's boxes bring
static_assert(BN % EC == 0 && EC * 4 == 128, "a subtile's table rows are one 128-byte swizzle row");

// (dxs's and mask_xs's rows of 64 bytes: the 64-byte swizzle, dg_swz64;
// the stores: wgmma_bf16.lua's TMA_STORE_HELPERS)
]]

local TEPI_BARS = [[

	// the epilogue's slots (EPS of ESLOT bytes) at ebase, then their
	// full[EPS] (the producer's expect_tx and the bytes) and empty[EPS]
	// (the thread that stored the slot, once the store has read it)
	const unsigned ebars = ebase + EPS * ESLOT;]]

local TEPI_INIT = [[

	if (tid == 0)
		for (int s = 0; s < EPS; ++s) {
			dg_mbar_init(ebars + 8 * s, 1);
			dg_mbar_init(ebars + 8 * (EPS + s), 1);
		}]]

local TEPI_LOADS = [[

				// the tile's epilogue inputs, a subtile of EC columns a slot
				for (int e = 0; e < BN / EC; ++e, ++ge) {
					const int s = (int)(ge % EPS);
					const unsigned eb = ebase + s * ESLOT, ef = ebars + 8 * s;
					dg_mbar_wait(ebars + 8 * (EPS + s), (unsigned)((ge / EPS) & 1) ^ 1u);
					dg_mbar_expect_tx(ef, ETX);
					dg_tma_load(eb, &mr, ef, n0 + EC * e, m0, 0);
					dg_tma_load(eb + ER_BYTES, &md, ef, n0 + EC * e, m0, z);
					dg_tma_load(eb + ER_BYTES + ED_BYTES, &mx, ef, n0 + EC * e, m0, z);
				}]]

-- The consumers' epilogue: each subtile's pairs from the accumulators (a
-- thread's rows g and g + 8 of its warp's 16, columns 8j + 2q and the next),
-- RoPEᵀ by the slot's table, added to dxs and masked by mask_xs as the
-- staged epilogue does (the same roundings), the bf16 pair written over
-- dxs's in the slot; then the consumers' barrier, and thread 0 stores the
-- slot (TMA clips rows past T and columns past L) and frees the slot of the
-- subtile before once its store has read it.
local TEPI_EPILOGUE = [[
	// ---- epilogue (epi=mask): the tile's subtiles from the slots
	{
		unsigned char *const sm = smem + (ebase - (unsigned)__cvta_generic_to_shared(smem));
#pragma unroll
		for (int e = 0; e < BN / EC; ++e, ++ge) {
			const int s = (int)(ge % EPS);
			unsigned char *const sl = sm + s * ESLOT;
			dg_mbar_wait(ebars + 8 * s, (unsigned)((ge / EPS) & 1));
#pragma unroll
			for (int hr = 0; hr < 2; ++hr) {
				const int r = wg * 64 + (warp & 3) * 16 + g + 8 * hr;
#pragma unroll
				for (int jj = 0; jj < EC / 8; ++jj) {
					const int j = e * (EC / 8) + jj, c = 8 * jj + 2 * q;
					const float v0 = acc[4 * j + 2 * hr], v1 = acc[4 * j + 2 * hr + 1];
					// the table's row r: 128 bytes, the 128-byte swizzle (dg_wb_kmaj's atoms)
					const float2 cs = *(const float2 *)(sl + dg_wb_kmaj(r, c >> 2) + 4 * (c & 3));
					OT *const dp = (OT *)(sl + ER_BYTES + dg_swz64(r * 64 + 2 * c));
					float2 d = dg_ld2(dp);
					const float2 x = dg_ld2((const XT *)((const unsigned char *)dp + ED_BYTES));
					dg_mask_turn(d.x, d.y, x.x, x.y, cs, v0, v1);
					dg_store2(dp, d.x, d.y);
				}
			}
			dg_fence_async_smem();	// the pairs written, seen by the store
			dg_consumers_sync();
			if (tid == 0) {
				dg_tma_store(&md, ebase + s * ESLOT + ER_BYTES, n0 + EC * e, m0, z);
				dg_bulk_commit();
				dg_bulk_wait_read<1>();	// the subtile before's store has read its slot
				if (ge > 0)
					dg_mbar_arrive(ebars + 8 * (EPS + (int)((ge - 1) % EPS)));
			}
		}
	}]]

local TEPI_END = [[

	if (tid == 0)
		dg_bulk_wait_all();	// the last stores done before the block's shared memory goes]]


function M.render(spec, plan, k, sh)
  local WB = require("wgmma_bf16")
  local o, t = k.o, plan.tile
  local of = sh.operand_fmt(k, o.ot)
  local v = {
    H = k.H, E = k.E, L = k.L, XT = sh.CTYPE[k.act], AT = sh.CTYPE.bf16, BT = sh.CTYPE.bf16, OT = sh.CTYPE[of],
    BM = t.bm, BN = t.bn, BK = t.bk, S = t.stages, A_KC = tostring(o.a_kc), B_KC = tostring(o.b_kc),
  }
  local entry = "dg_" .. k.op
  local sig, geo, store = sh.op_text(k)
  sig = sig .. ", const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb"
  local ring = WB.ring_bytes(t, k.epi_mask)
  local persistent = M.persistent_ok(k, t)
  local tepi = M.tma_epi(k, t)
  if tepi then
    sig = sig .. ", const __grid_constant__ dg_tmap md, const __grid_constant__ dg_tmap mx, const __grid_constant__ dg_tmap mr"
  end
  local cx, cy = M.cluster(k.op, t)
  local about = {
    fmt("%s: heads %d, embd %d, latent %d, act %s (templates/attention.lua: the math, the ABI).",
        k.op, k.H, k.E, k.L, k.act),
    "",
    fmt("%s(%s)", entry, (sig:gsub("__restrict__ ", ""))),
    persistent and
      fmt("grid (any, 1, 1): a block walks the tiles (ceil(T/%d) x ceil(%s/%d) x %s: m fastest, then 8 heads, then n); %d threads, %d bytes of dynamic shared memory.",
          t.bm, o.n, t.bn, o.gz, M.threads(t), plan.entries[1].smem) or
      fmt("grid (ceil(%s/%d), ceil(T/%d), %s), %d threads, %d bytes of dynamic shared memory.",
          o.n, t.bn, t.bm, o.gz, M.threads(t), plan.entries[1].smem),
    fmt("path: warp-specialized wgmma m64n%dk16 bf16, f32 sums (sm_90a): %d consumer warpgroups, a producer warpgroup, a ring of %d stages with full/empty mbarriers; A %s by %s, B %s by TMA; rope=pre.",
        t.bn, t.bm // 64, t.stages, o.a_kc and "K-major" or "M-major", "TMA",
        o.b_kc and "K-major" or "N-major"),
  }
  if persistent then
    about[#about + 1] = "persistent: the producer fills the ring with the next tile's steps while the consumers run the epilogue (its staged tile beside the ring)."
  end
  if tepi then
    about[#about + 1] = fmt("epi=mask: dxs (bf16) = (dxs + grad_xs)·[mask_xs > 0] in place, from the accumulators: the RoPE table's, dxs's and mask_xs's subtiles of %d columns by TMA into %d slots (maps md over dxs, mx over mask_xs: (L, T, B·H), boxes %d x BM, the 64-byte swizzle; mr over the table: (L, T, 1) f32, boxes %d x BM, the 128-byte swizzle), dxs's subtile stored back by TMA.",
                            M.EC, M.EPS, M.EC, M.EC)
  elseif k.epi_mask then
    about[#about + 1] = fmt("epi=mask: dxs (%s) = (dxs + grad_xs)·[mask_xs > 0] in place, the f32 tile staged through shared memory, 8 columns a thread.", of)
  end
  if cx then
    about[#about + 1] = fmt("cluster %d x %d (__cluster_dims__): A's rows shared along x, B's columns along y by TMA multicast; the grid a multiple of it, the map of A boxes of 64 x %d.",
                            cx, cy, t.bm // cx)
  end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "attention.lua", about))
  w:line(DEV.helpers({ bf16 = true, cp_async = true }))
  w:line(WB.helpers(t.bn, not o.a_kc, not o.b_kc))
  w:line(EMIT.subst(HEAD, v))
  w:line(WB.WS_HEAD)
  w:line(WB.WS_HELPERS)
  if cx then
    w:line(fmt("constexpr int CX = %d, CY = %d;\t// the cluster's blocks along N and M", cx, cy))
    w:line(WB.CLUSTER_HELPERS)
  end
  w:line(sh.out_helpers(of))
  if tepi then
    w:line(EW.VEC_IO)
    w:line(sh.MASK_PAIR)
    w:line(WB.TMA_STORE_HELPERS)
    w:line(EMIT.subst(TEPI_HEAD, { EC = M.EC, EPS = M.EPS }))
  elseif k.epi_mask then
    w:line(EW.VEC_IO)
    w:line(sh.MASK_PAIR)
    w:line(require("attention_wgmma").MASK_CHUNK)
  end
  w:line()
  local epi
  if tepi then
    epi = TEPI_EPILOGUE
  elseif k.epi_mask and persistent then
    -- in the region beside the ring; its first barrier also keeps a tile's
    -- stores out of the tile before's reads
    epi = require("attention_wgmma").EPI_STAGED:gsub("__syncthreads%(%);", "dg_consumers_sync();")
      :gsub("%(sbase %- ", "(ebase - ")
  elseif k.epi_mask then
    epi = require("attention_wgmma").EPI_STAGED:gsub("__syncthreads%(%);", "dg_consumers_sync();")
  else
    epi = "\t// ---- epilogue: the accumulator pairs (rows g, g+8 of the warp's 16)\n" .. store .. "\n" ..
      EMIT.subst(WB.PAIRS, { MLIM = "M",
        PAIR = "\t\t\t\tstore_pair(m, n, acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]);" })
  end
  if persistent then
    local rl = not k.rope_pre	-- rope=load: the turners
    if rl then w:line(require("rope").TURN_BF16X2) end
    local walk = EMIT.subst(TILE_BEGIN, { GEO = geo, PM_VOID = k.epi_mask and " (void)pm;" or "" })
    w:line(EMIT.subst(KERNEL_P, { ENTRY = entry, SIG = sig, EPILOGUE = epi, LOADS = LOADS[k.op],
      TILE_BEGIN = walk,
      EPI_BARS = tepi and TEPI_BARS or "", EPI_INIT = tepi and TEPI_INIT or "",
      EPI_COUNT = tepi and "\n\tlong long ge = 0;\t// the block's epilogue subtiles so far" or "",
      EPI_LOADS = tepi and TEPI_LOADS or "", CONSUMER_END = tepi and TEPI_END or "",
      RING_START = EMIT.subst(WB.RING_START, { EMPTY_COUNT = "NT", INIT_SYNC = "__syncthreads();" }),
      READY_INIT = rl and "\tif (tid == 0)\n\t\tfor (int s = 0; s < S; ++s)\n\t\t\tdg_mbar_init(bars + 8 * (2 * S + s), 96);" or "",
      TURN = rl and EMIT.subst(TURN, { TILE_BEGIN = walk }) or "",
      STAGE_BAR = rl and "bars + 8 * (2 * S + s)" or "bars + 8 * s",
      MMA_STEP = fmt("dg_wb_mma(acc, dg_wb_desc<%s>(as + ks * %s), dg_wb_desc<%s>(bs + ks * %s), 1);", "A_KC",
                     o.a_kc and "32" or "2048", "B_KC", o.b_kc and "32" or "2048") }))
    return w:text()
  end
  local keys = { LOADS = cx and LOADS_CLUSTER[k.op] or LOADS[k.op], RING_BYTES = tostring(ring),
                A_KC = "A_KC", B_KC = "B_KC",
                A_KS = o.a_kc and "32" or "2048", B_KS = o.b_kc and "32" or "2048" }
  if cx then
    for n, val in pairs(WB.CLUSTER_KEYS) do keys[n] = val end
  end
  w:line(EMIT.subst(KERNEL, { ENTRY = entry, SIG = sig, GEO = geo, SKIP = o.skip or "", EPILOGUE = epi,
    CLUSTER_ATTR = cx and " __cluster_dims__(CX, CY, 1)" or "", CLUSTER_PRE = cx and "\n" .. WB.CLUSTER_PRE or "",
    MAINLOOP = WB.ws_loop(keys) }))
  return w:text()
end

return M

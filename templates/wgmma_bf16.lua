--[[
wgmma_bf16.lua — the pieces of a bf16 GEMM on Hopper's warpgroup tensor
cores (wgmma.mma_async, sm_90a) with f32 sums, for operands that stream
from global memory by cp.async (templates/attention.lua's sm_90a path).

  C[m, n] = Σ_k A[m, k] · B[n, k]

A warpgroup (4 consecutive warps) issues
`wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16`: 64 rows of A × N rows
of B × 16 elements of K, asynchronously; both operands are read from
shared memory through 64-bit matrix descriptors, each either K-major (a
row of 16-byte chunks runs along K) or MN-major (the chunks run along M or
N: the instruction's "transpose" immediate, which 16-bit types allow).

Shared-memory layout: the 128-byte swizzle (descriptor layout type 1), a
K step of 64 (BK 64). The unit is a 1024-byte atom of 8 rows of 128 bytes,
1024-byte aligned; the 16-byte chunk c of row j is stored at chunk c ^ j
(the hardware undoes it from the address bits), so that both the stores
that fill a row and the tensor cores' reads are free of bank conflicts
(PTX ISA, "Canonical Layouts", T = 8 elements:
  K-major  ((8,m),(T,2k)):((8T,SBO),(1,T)): a row is one M / N index, its
           128 bytes the step's 64 k; row r at (r/8)·1024 + (r%8)·128;
           SBO 1024, no LBO; the k16 step s starts 32·s bytes in;
  MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): a row is one k, its 128
           bytes 64 consecutive M / N; k row at (k/8)·1024 + (k%8)·128 of
           its 64-wide group, groups LBO = 8192 apart (64 rows of K);
           SBO 1024; the k16 step s starts 2048·s bytes in.)
So a warpgroup's 64 rows of A start 8192 bytes in, in both majors.

Staging: a thread's unit is one 16-byte chunk; 8 consecutive threads read
one 128-byte line of global memory (a whole line a request) and fill one
128-byte row of an atom. Whole, aligned chunks are one cp.async of 16
bytes (zero-filled past the tensor's rows); a chunk that crosses the edge
of its row, or a row that is not 16-byte aligned, is assembled from guarded
element loads and one 16-byte shared store (the rare ragged shapes).
dg_wb_stage finds a row at base + row·ld; dg_wb_stage_row takes the row's
pointer from its caller (operands whose rows are not affine in the row
index: templates/grad_wgmma.lua's (b, t) rows).

Accumulators (m64nN, f32), as the integer path's (templates/wgmma.lua):
thread t of the warpgroup, warp w = t/32 % 4, lane = 4g + q, register 4j+i:
  i = 0: (16w + g, 8j + 2q)  i = 1: (16w + g, 8j + 2q + 1)
  i = 2: (16w + g + 8, 8j + 2q)  i = 3: (16w + g + 8, 8j + 2q + 1).

Ordering: each thread's cp.async copies are waited for (wait_group) and
made visible to the async proxy (fence.proxy.async) before the barrier
that precedes the wgmma reading them; wgmma.fence precedes each step's
first wgmma; a stage is refilled only after every warpgroup's wgmma that
read it completed (wait_group 1 after each step, then the next step's
barrier); accumulators are pinned after each wait.
]]
local EMIT = require("emit")
local fmt = string.format

local M = {}

-- A tile of this GEMM: BM/64 warpgroups of 4 warps along M (WM 4 or 8,
-- WN 1, BM = 16·WM), one m64nBNk16 instruction a warpgroup and k16 step,
-- BN 64 | 128 | 256, BK 64 (one 128-byte swizzle row of K), a ring of lo
-- to hi stages.
function M.tile_ok(t, lo, hi)
  return t.wn == 1 and (t.wm == 4 or t.wm == 8) and t.bm == 16 * t.wm and
         (t.bn == 64 or t.bn == 128 or t.bn == 256) and t.bk == 64 and t.stages >= lo and t.stages <= hi
end

-- Dynamic shared memory of a kernel of tile t: the ring of S stages of A
-- and B, or (staged: an epilogue that writes the f32 tile into the ring
-- once the MMAs are done, BM rows of BN + 8 floats, and `extra` bytes
-- after it) whichever is larger, and 1 KiB for the atoms' alignment.
function M.ring_bytes(t, staged, extra)
  local ring = t.stages * (t.bm + t.bn) * t.bk * 2
  if staged then ring = math.max(ring, t.bm * (t.bn + 8) * 4 + (extra or 0)) end
  return ring
end

function M.smem_bytes(t, staged, extra)
  return M.ring_bytes(t, staged, extra) + 1024
end

-- The warp-specialized form (WS_MAINLOOP, below): a tile of 5 to 8 stages
-- names it (a cp.async ring takes 3 or 4); its block is the tile's warps
-- and a producer warpgroup; its dynamic shared memory the ring (or the
-- staged tile), the 2·S mbarriers after it and 1 KiB for the alignment.
function M.ws_tile(t)
  return t.stages >= 5
end

function M.ws_threads(t)
  return t.wm * t.wn * 32 + 128
end

function M.ws_smem_bytes(t, staged, extra)
  return M.smem_bytes(t, staged, extra) + 16 * t.stages
end

local MMA_FN = [[
// d (+)= A · B over one k16 step: 64 x ${N} f32; A ${AM}, B ${BM};
// scale_d 0: d = A·B, else d += A·B.
__device__ __forceinline__ void ${NAME}(float (&d)[${NR}], unsigned long long da, unsigned long long db,
					  int scale_d)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %${PS}, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n${N}k16.f32.bf16.bf16 "
		     "{${REGS}}, %${PA}, %${PB}, p, 1, 1, ${TA}, ${TB};\n}\n"
		     : ${OUTS}
		     : "l"(da), "l"(db), "r"(scale_d));
}
]]

-- The MMA function `name` of an N-wide instruction (N a multiple of 8,
-- 8..256) with A MN-major (a_mn) or K-major, B likewise: helpers' dg_wb_mma,
-- and, in a kernel whose GEMMs read other layouts, each of those beside it
-- (ws_loop's MMA key names the one its loop issues).
function M.mma_fn(name, n, a_mn, b_mn)
  local nr = n // 2
  local regs, outs = {}, {}
  for i = 0, nr - 1 do
    regs[#regs + 1] = "%" .. i
    outs[#outs + 1] = fmt("\"+f\"(d[%d])", i)
  end
  return EMIT.subst(MMA_FN, { NAME = name, N = n, NR = nr, REGS = table.concat(regs, ", "),
    OUTS = table.concat(outs, ", "), PA = nr, PB = nr + 1, PS = nr + 2, TA = a_mn and 1 or 0,
    TB = b_mn and 1 or 0, AM = a_mn and "MN-major" or "K-major", BM = b_mn and "MN-major" or "K-major" })
end

-- The C helpers for an N-wide instruction (N a multiple of 8, 8..256) with
-- A MN-major (a_mn) or K-major, B likewise.
function M.helpers(n, a_mn, b_mn)
  local nr = n // 2
  return EMIT.subst([[
// ---- bf16 warpgroup tensor-core helpers (templates/wgmma_bf16.lua) ---------
// The descriptor of a 128-byte-swizzled tile (layout type 1, bits 62-63).
// K-major: SBO 1024 (the next 8 rows), LBO unused (1); MN-major: LBO 8192
// (the next 64 of M / N), SBO 1024 (the next 8 of K).
template <bool KMAJ>
__device__ __forceinline__ unsigned long long dg_wb_desc(unsigned saddr)
{
	constexpr unsigned long long lbo = KMAJ ? 1u : (8192u >> 4), sbo = 1024u >> 4;
	return (unsigned long long)((saddr & 0x3ffffu) >> 4) | (lbo << 16) | (sbo << 32) | (1ull << 62);
}

// Byte offsets in a tile of chunk c (8 bf16) — K-major: of row r (M / N),
// K elements 8c..8c+7; MN-major: of K row k, M / N elements 64g+8c..+7.
// A 1024-byte atom is 8 rows of 128 bytes; chunk c of row j sits at
// c ^ j (the hardware's 128-byte swizzle).
__device__ __forceinline__ unsigned dg_wb_kmaj(int r, int c)
{
	return (unsigned)((r >> 3) * 1024 + (r & 7) * 128 + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ unsigned dg_wb_mnmaj(int g, int k, int c)
{
	return (unsigned)(g * 8192 + (k >> 3) * 1024 + (k & 7) * 128 + ((c ^ (k & 7)) << 4));
}

${SYNC}${MMA_FN}
// Keeps the compiler from moving accesses of the accumulators across a
// wgmma wait.
__device__ __forceinline__ void dg_wb_pin(float (&d)[${NR}])
{
#pragma unroll
	for (int i = 0; i < ${NR}; ++i)
		asm volatile("" : "+f"(d[i]) :: "memory");
}

// One 16-byte chunk: elements col .. col+7 of the bf16 row at rowp
// (nullptr: a row outside the tensor) of length cols into shared address
// dst; zeros outside. `any` is any valid global address (the zero fill's
// source). Whole aligned chunks by cp.async, the rest by element loads.
__device__ __forceinline__ void dg_wb_stage_row(unsigned dst, const unsigned short *rowp, const void *any,
						int col, int cols)
{
	if (rowp == nullptr || col >= cols) {
		dg_cp16(dst, any, 0);
		return;
	}
	const unsigned short *p = rowp + col;
	if (col + 8 <= cols && ((unsigned long long)p & 15u) == 0) {
		dg_cp16(dst, p, 16);
		return;
	}
	unsigned w[4] = { 0u, 0u, 0u, 0u };
#pragma unroll
	for (int e = 0; e < 8; ++e)
		if (col + e < cols)
			w[e / 2] |= (unsigned)__ldg(p + e) << (16 * (e & 1));
	asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
		     :: "r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
}
// The same for row `row` of a row-major operand (rows x cols, row length
// ld) at base. (Written out rather than as dg_wb_stage_row of the row's
// pointer: that form compiles to other code, not yet measured.)
__device__ __forceinline__ void dg_wb_stage(unsigned dst, const unsigned short *base, int row, int rows,
					    int col, int cols, int ld)
{
	if (row >= rows || col >= cols) {
		dg_cp16(dst, base, 0);
		return;
	}
	const unsigned short *p = base + (long long)row * ld + col;
	if (col + 8 <= cols && ((unsigned long long)p & 15u) == 0) {
		dg_cp16(dst, p, 16);
		return;
	}
	unsigned w[4] = { 0u, 0u, 0u, 0u };
#pragma unroll
	for (int e = 0; e < 8; ++e)
		if (col + e < cols)
			w[e / 2] |= (unsigned)__ldg(p + e) << (16 * (e & 1));
	asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
		     :: "r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
}
]], { NR = nr, MMA_FN = M.mma_fn("dg_wb_mma", n, a_mn, b_mn), SYNC = require("wgmma").SYNC })
end

-- The main loop over the kernel's K steps (its `load(st)` lambda fills a
-- stage; nsteps, sbase, wg, S, P, STAGE, A_BYTES, BK, BN in scope), leaving
-- the sums in acc[BN / 2]. subst keys: A_KC, B_KC (C++ bools: K-major) and
-- A_KS, B_KS (bytes a k16 step: 32 K-major, 2048 MN-major). In three
-- pieces for a kernel whose ring runs other steps first (templates/
-- decoder_gate.lua's integer ones): the accumulators, the prologue's
-- loads (steps 0 .. P-1 of the ring's run), and the bf16 steps from ${I0}.
M.MAINLOOP_ACC = [[
	float acc[BN / 2];
#pragma unroll
	for (int i = 0; i < BN / 2; ++i)
		acc[i] = 0.0f;
]]
M.MAINLOOP_PROLOGUE = [[
	// ---- pipeline: P = S-1 steps fetched ahead. A step's MMAs are waited
	// for (wait_group 0) before the next barrier, so after it the stage of
	// step i-1 is free for step i+P; the other block an SM keeps the tensor
	// cores busy across a block's barrier.
#pragma unroll 1
	for (int s = 0; s < P; ++s) {
		if (s < nsteps)
			load(s);
		dg_cp_commit();
	}
]]
M.MAINLOOP_STEPS = [[
#pragma unroll 1
	for (int i = ${I0}; i < nsteps; ++i) {
		dg_cp_wait<P - 1>();		// this thread's copies of step i
		dg_fence_async_smem();
		__syncthreads();		// everyone's; and every MMA of step i-1 is done
		if (i + P < nsteps)
			load(i + P);		// into step i-1's stage
		dg_cp_commit();
		// this warpgroup's 64 rows of A: 8 K-major atoms, or one 64-wide M group
		const unsigned as = sbase + (i % S) * STAGE + wg * 8192, bs = sbase + (i % S) * STAGE + A_BYTES;
		dg_wg_fence();
#pragma unroll
		for (int ks = 0; ks < BK / 16; ++ks)
			dg_wb_mma(acc, dg_wb_desc<${A_KC}>(as + ks * ${A_KS}), dg_wb_desc<${B_KC}>(bs + ks * ${B_KS}), 1);
		dg_wg_commit();
		dg_wg_wait<0>();
		dg_wb_pin(acc);
	}
	dg_cp_wait<0>();
]]
M.MAINLOOP = M.MAINLOOP_ACC .. M.MAINLOOP_PROLOGUE .. M.MAINLOOP_STEPS:gsub("%${I0}", "0")

-- ---- the warp-specialized form (templates/attention_tma.lua's, and
-- templates/grad_wgmma.lua's for the lowrank grads) ----------------------
-- A producer warpgroup (the block's last) fills a ring of S stages by TMA:
-- one thread waits for a stage to be free (its empty mbarrier), announces
-- its bytes (expect_tx on the full mbarrier) and issues the step's boxes
-- (${LOADS}); the consumer warpgroups (NCW = BM/64 of them) wait for a
-- stage to be full, run their wgmma on it, and free it once those MMAs
-- completed (wait_group 1 after the next step's: one step's MMAs in flight
-- across the wait). No block-wide barrier in the K loop, so the loads of
-- later stages overlap the MMAs of earlier ones in one block.

-- The constants of the form (after the tile's BM, BN, NT, A_BYTES, B_BYTES):
-- threads a block, the bytes a stage's TMA brings (the full boxes: zeros
-- past the edges count), and the register budget. A launch gives every
-- thread 64 Ki / NTB registers (a multiple of 8; one block an SM); where
-- BN 256's 128 accumulators need more, setmaxnreg moves them from the
-- producer to the consumers, never more than the producer gives back (or
-- setmaxnreg.inc would wait forever).
M.WS_HEAD = [[
constexpr int NCW = BM / 64;			// consumer warpgroups
constexpr int NTB = NT + 128;			// threads a block: and the producer warpgroup
constexpr unsigned TX = A_BYTES + B_BYTES;	// bytes a stage's boxes bring
constexpr int REG_L = 65536 / NTB / 8 * 8;
constexpr bool REG_MOVE = BN > 128 && REG_L < 232;
constexpr int REG_P = 40;
constexpr int REG_C0 = REG_L + (REG_L - REG_P) * 128 / NT / 8 * 8;
constexpr int REG_C = REG_C0 > 240 ? 240 : REG_C0;
]]

M.WS_HELPERS = [[
// ---- TMA, mbarriers, register budget (templates/wgmma_bf16.lua) -----------
struct __align__(64) dg_tmap {
	unsigned long long opaque[16];	// the driver's CUtensorMap
};

__device__ __forceinline__ void dg_mbar_init(unsigned bar, unsigned count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void dg_mbar_expect_tx(unsigned bar, unsigned bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void dg_mbar_arrive(unsigned bar)
{
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}

// Waits until the barrier's phase of this parity completed.
__device__ __forceinline__ void dg_mbar_wait(unsigned bar, unsigned parity)
{
	asm volatile("{\n.reg .pred p;\nDG_WAIT_%=:\n"
		     "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
		     "@!p bra DG_WAIT_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}

// Box (c0, c1, c2) of the rank-3 map into shared dst, completing on bar.
__device__ __forceinline__ void dg_tma_load(unsigned dst, const dg_tmap *map, unsigned bar, int c0, int c1,
					    int c2)
{
	asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     " [%0], [%1, {%3, %4, %5}], [%2];\n"
		     :: "r"(dst), "l"((unsigned long long)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

template <int R>
__device__ __forceinline__ void dg_reg_alloc()
{
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R));
}

template <int R>
__device__ __forceinline__ void dg_reg_dealloc()
{
	asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R));
}

// The consumers alone (named barrier 1; the producer warpgroup has left).
__device__ __forceinline__ void dg_consumers_sync()
{
	asm volatile("bar.sync 1, %0;\n" :: "n"(NT) : "memory");
}
]]

-- Stores by TMA from shared memory (an epilogue's boxes: attention_tma.lua's
-- and decoder_gate_tma.lua's) and the 64-byte swizzle of 64-byte rows.
M.TMA_STORE_HELPERS = [[
// ---- bulk tensor stores, the 64-byte swizzle (templates/wgmma_bf16.lua) ----
// The 64-byte swizzle (the 16-byte chunk, bits 4-5, xor bits 7-8 of the
// offset in a 512-byte aligned box).
__device__ __forceinline__ unsigned dg_swz64(unsigned o) { return o ^ (((o >> 7) & 3u) << 4); }

// Box (c0, c1, c2) of shared src into the rank-3 map's tensor (the bulk
// group of this thread; nothing past the tensor's edges is written).
__device__ __forceinline__ void dg_tma_store(const dg_tmap *map, unsigned src, int c0, int c1, int c2)
{
	asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n"
		     :: "l"((unsigned long long)map), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

__device__ __forceinline__ void dg_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// This thread's bulk groups but the newest N done reading shared memory.
template <int N>
__device__ __forceinline__ void dg_bulk_wait_read()
{
	asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}

// This thread's bulk groups all complete (their writes performed).
__device__ __forceinline__ void dg_bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
]]

-- ---- a cluster's ring (CX x CY blocks, __cluster_dims__) ----------------
-- The blocks of a cluster row (the same m0) share A, those of a cluster
-- column (the same n0) share B: each block's producer loads its share of
-- a stage (BM / CX rows of A, BN / CY columns of B) once from L2 and
-- multicasts it to every block of its row or column, so a stage's bytes
-- land in each block from CX + CY - 1 producers and a stage may be
-- refilled only when the consumers of all those blocks are done with it:
-- every consumer warp releases a stage (one lane, after the warpgroup's
-- MMAs on it completed) on the empty barrier of each block that writes
-- into it (its cluster row and column), so an empty barrier counts
-- (CX + CY - 1) · NT / 32 arrivals. The barriers are made before any
-- block of the cluster issues a load (the cluster's barrier after their
-- init), and a block leaves only when its producer has seen every stage
-- it wrote released (no arrival is then still on its way to a block that
-- has left). The kernel defines crx, cry (its place in the cluster) and
-- dg_release (CLUSTER_PRE) before the loop.
M.CLUSTER_HELPERS = [[
// ---- a cluster's pieces (templates/wgmma_bf16.lua) --------------------------
__device__ __forceinline__ unsigned dg_cluster_x()
{
	unsigned v;
	asm volatile("mov.u32 %0, %%cluster_ctaid.x;\n" : "=r"(v));
	return v;
}

__device__ __forceinline__ unsigned dg_cluster_y()
{
	unsigned v;
	asm volatile("mov.u32 %0, %%cluster_ctaid.y;\n" : "=r"(v));
	return v;
}

// Every thread of every block of the cluster (the barriers' init visible).
__device__ __forceinline__ void dg_cluster_sync()
{
	asm volatile("barrier.cluster.arrive.release.aligned;\n"
		     "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Arrives on the mbarrier at shared address bar in block `cta` of the cluster.
__device__ __forceinline__ void dg_mbar_arrive_at(unsigned bar, unsigned cta)
{
	asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
		     "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n"
		     :: "r"(bar), "r"(cta) : "memory");
}

// dg_mbar_wait at the cluster's scope (arrivals from other blocks).
__device__ __forceinline__ void dg_mbar_wait_cluster(unsigned bar, unsigned parity)
{
	asm volatile("{\n.reg .pred p;\nDG_WAITC_%=:\n"
		     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
		     "@!p bra DG_WAITC_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}

// dg_tma_load into the same shared address of every block in mask (bits:
// the blocks' ranks in the cluster), completing on each one's barrier bar.
__device__ __forceinline__ void dg_tma_load_mc(unsigned dst, const dg_tmap *map, unsigned bar, int c0, int c1,
					       int c2, unsigned short mask)
{
	asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
		     " [%0], [%1, {%3, %4, %5}], [%2], %6;\n"
		     :: "r"(dst), "l"((unsigned long long)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
		     : "memory");
}
]]

-- In the kernel before the loop: the block's place in its cluster, the
-- masks of its cluster row (A's blocks) and column (B's), and dg_release.
M.CLUSTER_PRE = [[
	const unsigned crx = dg_cluster_x(), cry = dg_cluster_y();
	const unsigned short mrow = (unsigned short)(((1u << CX) - 1u) << (CX * cry));
	unsigned short mcol = 0;
#pragma unroll
	for (int y = 0; y < CY; ++y)
		mcol |= (unsigned short)(1u << (crx + CX * y));
	(void)mrow;
	(void)mcol;
	// a consumer warp's release of a stage: on the empty barrier of every
	// block that writes into it (its cluster row and column, itself once)
	auto dg_release = [&](unsigned bar) {
		__syncwarp();
		if (lane == 0) {
#pragma unroll
			for (int x = 0; x < CX; ++x)
				dg_mbar_arrive_at(bar, x + CX * cry);
#pragma unroll
			for (int y = 0; y < CY; ++y)
				if (y != (int)cry)
					dg_mbar_arrive_at(bar, crx + CX * y);
		}
	};]]

-- ws_loop's keys for a cluster's ring.
M.CLUSTER_KEYS = {
  EMPTY_COUNT = "(CX + CY - 1) * (NT / 32)",
  INIT_SYNC = "dg_cluster_sync();",
  EMPTY_WAIT = "dg_mbar_wait_cluster",
  RELEASE = "dg_release",
  PRODUCER_TAIL = [[

			// every stage this block wrote released by every block it wrote into
			for (int i = nsteps > S ? nsteps - S : 0; i < nsteps; ++i)
				dg_mbar_wait_cluster(bars + 8 * (S + i % S), (i / S) & 1);]],
  CONSUMER_TAIL = [[

	if (nsteps > 0)	// the last stage too: the producers wait for it before they leave
		dg_release(bars + 8 * (S + (nsteps - 1) % S));]],
}

-- The ring's barriers made (RING_INIT: bars, S, tid in scope; full[S] of
-- ${FULL_COUNT} arrivals, empty[S] of ${EMPTY_COUNT}; then ${INIT_SYNC});
-- RING_START: with full[S] of one arrival, and the producer warpgroup
-- entered down to its one issuing thread (tid NT), whose loop follows:
-- every warp-specialized kernel's start, persistent or not (ws_loop's,
-- decoder.lua's, attention_tma.lua's KERNEL_P).
M.RING_INIT = [[
	if (tid == 0) {
		for (int s = 0; s < S; ++s) {
			dg_mbar_init(bars + 8 * s, ${FULL_COUNT});
			dg_mbar_init(bars + 8 * (S + s), ${EMPTY_COUNT});
		}
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	${INIT_SYNC}]]

M.RING_START = M.RING_INIT:gsub("%${FULL_COUNT}", "1") .. [[


	if (wg == NCW) {	// ---- the producer warpgroup: one thread issues every load
		if constexpr (REG_MOVE)
			dg_reg_dealloc<REG_P>();
		if (tid == NT) {]]

-- The pipeline over nsteps K steps (sbase, tid, wg, S, STAGE, A_BYTES, BK,
-- BN in scope): the mbarriers after ${RING_BYTES} of ring, the producer's
-- loop (${LOADS}: step i's boxes into as / bs, completing on full), and
-- the consumers' loop, which leaves the sums in acc[BN / 2]; the producer
-- warpgroup has returned after it (the epilogue synchronizes the consumers
-- with dg_consumers_sync). subst keys as MAINLOOP's, and through M.ws_loop
-- MMA (the MMA function, dg_wb_mma unless named), or MMA_STEP (the whole
-- statement of a k16 step ks of step i: a kernel whose steps differ in
-- their operands' layouts chooses there), and STEP_BEGIN (code run by the
-- consumers once step i's stage is full, before its MMAs: acc holds the
-- sums of the steps before, some perhaps in flight).
M.WS_MAINLOOP = [[
	// the barriers after the ring: full[S] (one arrival, the producer's
	// expect_tx, and the bytes), then empty[S] (every consumer thread)
	const unsigned bars = sbase + (unsigned)(${RING_BYTES});
${RING_START}
			for (int i = 0; i < nsteps; ++i) {
				const int s = i % S;
				const unsigned full = bars + 8 * s, as = sbase + s * STAGE, bs = as + A_BYTES;
				(void)as;
				(void)bs;
				// the stage's previous use (step i - S) released by every consumer
				${EMPTY_WAIT}(bars + 8 * (S + s), ((i / S) & 1) ^ 1);
				dg_mbar_expect_tx(full, TX);
${LOADS}
			}${PRODUCER_TAIL}
		}
		return;
	}

${CONSUMERS}${CONSUMER_TAIL}
]]

-- The consumers of the form (bars, sbase, tid, wg, S, STAGE, A_BYTES, BK,
-- BN, nsteps in scope; consumers_text puts the pieces together): each
-- waits for a stage to be full, runs its MMAs, and frees the stage of the
-- step before once those completed; leaves the sums in acc[BN / 2]. Keys
-- MMA_STEP, STEP_BEGIN and RELEASE as WS_MAINLOOP's.
M.WS_CONSUMERS_HEAD = [[
	// ---- the consumers: warpgroup wg, rows wg·64 .. +63 of the tile
	if constexpr (REG_MOVE)
		dg_reg_alloc<REG_C>();
	float acc[BN / 2];
#pragma unroll
	for (int i = 0; i < BN / 2; ++i)
		acc[i] = 0.0f;
]]

-- One loop of it, over steps [${FROM}, ${TO}).
M.WS_CONSUMER_LOOP = [[
	for (int i = ${FROM}; i < ${TO}; ++i) {
		const int s = i % S;
		dg_mbar_wait(bars + 8 * s, (i / S) & 1);${STEP_BEGIN}
		const unsigned as = sbase + s * STAGE + wg * 8192, bs = sbase + s * STAGE + A_BYTES;
		dg_wg_fence();
#pragma unroll
		for (int ks = 0; ks < BK / 16; ++ks)
			${MMA_STEP}
		dg_wg_commit();
		// step i-1's MMAs done: its stage is free
		dg_wg_wait<1>();
		dg_wb_pin(acc);
		if (i > 0)
			${RELEASE}(bars + 8 * (S + (i - 1) % S));
	}
]]

M.WS_CONSUMERS_TAIL = [[
	dg_wg_wait<0>();
	dg_wb_pin(acc);]]

-- The accumulators into a staged f32 tile at ${TILE} (a float *), rows
-- ${PITCH} floats apart (BN + 8: a half-warp's pair stores hit 32 banks),
-- for an epilogue that reads the tile back by rows; the callers stage it
-- in the ring once every warpgroup's MMAs are done with it.
M.STAGE_ACC = [[
#pragma unroll
	for (int hr = 0; hr < 2; ++hr) {
		const int r = wg * 64 + (warp & 3) * 16 + g + 8 * hr;
#pragma unroll
		for (int j = 0; j < BN / 8; ++j)
			*(float2 *)(${TILE} + r * ${PITCH} + 8 * j + 2 * q) = make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]);
	}]]

-- The accumulators as the output pairs they are (m, n and n + 1, n even;
-- the register layout in the banner): ${PAIR} runs for each pair inside
-- ${MLIM} rows and N columns, with acc[4 * j + 2 * hr] and the next
-- register its two values.
M.PAIRS = [[
#pragma unroll
	for (int hr = 0; hr < 2; ++hr) {
		const int m = m0 + wg * 64 + (warp & 3) * 16 + g + 8 * hr;
		if (m >= ${MLIM})
			continue;
#pragma unroll
		for (int j = 0; j < BN / 8; ++j) {
			const int n = n0 + 8 * j + 2 * q;
			if (n < N) {
${PAIR}
			}
		}
	}]]

-- The consumers' keys filled in (MMA_STEP: the MMA function's call on the
-- A_KC / B_KC descriptors; STEP_BEGIN: none; RELEASE: an arrive).
local function consumer_keys(keys)
  local k = {}
  for n, v in pairs(keys) do k[n] = v end
  k.MMA_STEP = k.MMA_STEP or fmt("%s(acc, dg_wb_desc<%s>(as + ks * %s), dg_wb_desc<%s>(bs + ks * %s), 1);",
                                 k.MMA or "dg_wb_mma", k.A_KC, k.A_KS, k.B_KC, k.B_KS)
  k.MMA = nil
  k.STEP_BEGIN = k.STEP_BEGIN or ""
  k.RELEASE = k.RELEASE or "dg_mbar_arrive"
  return k
end

-- The consumers' text with keys k: one loop over every step, or with
-- k.SPLIT (a step index in scope) and k.MMA_STEP2 two, steps [0, SPLIT) by
-- MMA_STEP and [SPLIT, nsteps) by MMA_STEP2. A kernel whose steps take two
-- wgmma forms (operands of other majors) must not choose between them by a
-- branch inside one loop: ptxas then serializes every wgmma of the kernel
-- (C7520, "compiler-inserted WG.AR in divergent path"), each waiting for
-- the one before.
local function consumers_text(k)
  local function loop(from, to, step)
    return EMIT.subst(M.WS_CONSUMER_LOOP, { FROM = from, TO = to, MMA_STEP = step, STEP_BEGIN = k.STEP_BEGIN,
                                            RELEASE = k.RELEASE })
  end
  local loops = k.SPLIT and loop("0", k.SPLIT, k.MMA_STEP) .. loop(k.SPLIT, "nsteps", k.MMA_STEP2)
                or loop("0", "nsteps", k.MMA_STEP)
  return M.WS_CONSUMERS_HEAD .. loops .. M.WS_CONSUMERS_TAIL
end

-- The consumers with keys (consumer_keys' defaults), for a kernel whose
-- producers are its own.
function M.ws_consumers(keys)
  return consumers_text(consumer_keys(keys))
end

-- WS_MAINLOOP with keys (consumer_keys' defaults).
function M.ws_loop(keys)
  local k = consumer_keys(keys)
  -- a cluster's loop (M.CLUSTER_KEYS) or the block's own
  k.EMPTY_COUNT = k.EMPTY_COUNT or "NT"
  k.INIT_SYNC = k.INIT_SYNC or "__syncthreads();"
  k.EMPTY_WAIT = k.EMPTY_WAIT or "dg_mbar_wait"
  k.PRODUCER_TAIL = k.PRODUCER_TAIL or ""
  k.CONSUMER_TAIL = k.CONSUMER_TAIL or ""
  k.RING_START = EMIT.subst(M.RING_START, { EMPTY_COUNT = k.EMPTY_COUNT, INIT_SYNC = k.INIT_SYNC })
  k.CONSUMERS = consumers_text(k)
  return EMIT.subst(M.WS_MAINLOOP, k)
end

return M

--[[
lowrank_wgmma.lua — the sm_90a path of lowrank_fwd: warpgroup tensor cores
(templates/wgmma.lua), the whole reduction (E) resident in shared memory,
and an epilogue that spends one FMA an output and stores straight from the
accumulators (templates/lowrank.lua documents the ABI and picks the path).

Operands: integer codes (wgmma m64nNk32 s8 / u8 × s8, exact int32 sums), or
bf16 activations × bf16 weights (wgmma m64nNk16 f32.bf16.bf16, f32 sums;
y = acc, no scales, as the SIMT fp32 path: floats carry none). Shared
memory holds bytes in the same no-swizzle core matrices either way (8 rows
× 16 bytes: 16 codes or 8 bf16 of K), so a row is RB = E·ES bytes (ES 1 or
2), and an instruction's K step is 32 bytes (256 bytes of the tile) for
both; only the element count a step (32 codes, 16 bf16) differs.

Block: BM/64 warpgroups (BM rows of x, 64 a warpgroup) × BN latent columns.
Work units are (head, m-tile) rows of tiles split into contiguous runs of
n-tiles (as many runs as the grid allows); a unit loads its x rows (A,
BM × RB bytes) once and walks its n-tiles. The weight rows (B, BN × RB) are
triple-buffered and the accumulators double-buffered: while tile j's
epilogue runs, tile j+1's wgmma run on the other accumulator set, and tile
j+2's weights are fetched (ternary / sign1: into registers, then decoded to
s8) into the buffer tile j-1 read. One barrier a tile. One schedule
(PIPE_SYNC below) for every operand type: a step issues tile j+1's MMAs
and tile j+2's weight loads first, runs tile j's epilogue under both, and
waits for everything at the step's end — nothing pending across the
loop's back edge, so ptxas keeps the MMAs asynchronous.

The codes had a schedule of their own until the bf16 one replaced it: it
waited for tile j's MMAs (wait_group 1) just before tile j's epilogue, so
tile j+1's group stayed pending across the loop's back edge while the
other accumulator set was read. ptxas serializes every wgmma of such a
kernel (info C7514: each one waits for the previous), for every
projection spec of the integer presets (w8a8: int8 weights × int8 codes;
bitnet: ternary weights × int8 codes) at every warpgroup tile but
256x128, whose two accumulator sets do not fit 128 registers a thread
(serialized for that, C7511; M.fits refuses it now). The codes now take
the bf16 path's schedule unchanged, the packed weights (ternary, sign1)
split into a fetch to registers before the epilogue and the decode into
shared memory after it; the epilogue, the ABI and the grid (as many
blocks as an SM holds × the SMs, persistent: runtime/ops/lowrank.c) are
as before.

Shared memory: RB·(BM + 3·BN) bytes, dynamic. At BDH (E = 256): codes
80 KiB at 128x64 (two blocks an SM), bf16 160 KiB at 128x64 (one block an
SM; the op layer sizes the grid from the blocks an SM: runtime/ops/
lowrank.c).

Column order: B row p of the shared tile holds weight row n0 + col(p),
  p = 8j + 2q + r  →  col(p) = 64·(j / 8) + 16·q + 2·(j % 8) + r,
so that lane q of each quad holds 16 consecutive output columns
(64a + 16q .. +15) of its rows g and g + 8 for each a < BN/64: one 16-byte
store of int8 codes (two of bf16, four of f32) with no shuffle and no
shared-memory staging.

Codes out: u = sat(fmaf(acc, a1, b1)), then fmaf(u, R, 1.5·2^23 + lo)
rounds to the integer code (dragon/ref.h, device.lua dg_code_t): two FMAs
on the FP32 pipe, the float's low byte is the code; the accumulator becomes
a float exactly by the 1.5·2^23 trick too (|acc| < 2^22, checked
at render time from E and the formats' largest codes; otherwise I2F).
bf16 operands: the accumulator is the float (a1, b1 from s = 1).

The f32 accumulators of m64nNk16 bf16 are laid out as the s32 ones of
m64nNk32 (templates/wgmma.lua: register 4j + i of thread 4g + q of warp w
holds row 16w + g (+8 for i >= 2), column 8j + 2q (+1 for odd i)), so the
column order and the epilogue's registers are the same for both.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local DEV = require("device")
local SCL = require("scales")
local fmt = string.format

local M = {}

-- The operands the path takes: "s8" (integer codes × codes), "bf16" (bf16
-- act × bf16 weight), else nil.
function M.operands(k)
  if FM.formats[k.act].code and FM.formats[k.weight].code then return "s8" end
  if k.act == "bf16" and k.weight == "bf16" then return "bf16" end
  return nil
end

-- Bytes an element of either operand in shared memory (ES): 2 for bf16,
-- 1 for a code.
local function elem_bytes(k)
  return M.operands(k) == "bf16" and 2 or 1
end

-- Dynamic shared memory of tile t: the x tile and three weight tiles, the
-- whole E, RB = E·ES bytes a row.
function M.smem(k, t)
  return k.E * elem_bytes(k) * (t.bm + 3 * t.bn)
end

-- The path applies (templates/lowrank.lua M.plan asks): lowrank_fwd,
-- sm_90a, integer × integer or bf16 × bf16, warps WM x 1 in whole
-- warpgroups with 64 rows each (BM = 16·WM), BN 64 or 128, stages 2 (the
-- weight tile is always triple-buffered), E a multiple of 64 for codes
-- (128 for sign1) or of 16 for bf16 (whole 32-byte K steps), L a multiple
-- of 16 (a lane's 16 columns are stored whole), and the shared memory
-- (M.smem) within 227 KiB, and BM·BN at most 128·128: both accumulator
-- sets are BN registers a thread, and at 512 threads (BM 256) the file
-- gives a thread 128, which BN 128 fills by itself (ptxas spills and
-- serializes the MMAs, info C7511 / C7512). t: the tile.
function M.fits(k, t)
  local ops = M.operands(k)
  if not (k.arch == 90 and k.arch_specific and k.op == "lowrank_fwd" and ops) then return false end
  local ediv = ops == "bf16" and 16 or (k.weight == "sign1" and 128 or 64)
  return t.wn == 1 and t.wm % 4 == 0 and t.wm <= 16 and t.bm == 16 * t.wm and (t.bn == 64 or t.bn == 128) and
    t.bm * t.bn <= 128 * 128 and t.stages == 2 and k.E % ediv == 0 and k.L % 16 == 0 and
    M.smem(k, t) <= 227 * 1024
end

-- The K-streaming form (stages >= 3): for an E whose resident tiles do not
-- fit (codes past E 704 at 128x64, bf16 past E 352), or as a tuned
-- choice. Int8 and bf16 weights (cp.async straight into the stages;
-- ternary and sign1 keep the resident form or fall back), warps WM x 1 in
-- one or two warpgroups (BM 64 or 128), BN 64 or 128 (or 256 at BM 128),
-- a stage BK elements of K (BK·ES bytes a row: 64 or 128), E a multiple of
-- BK, L of 16, 3 to 8 stages within 227 KiB.
function M.stream_fits(k, t)
  local ops = M.operands(k)
  if not (k.arch == 90 and k.arch_specific and k.op == "lowrank_fwd" and ops) then return false end
  if not (k.weight == "int8" or k.weight == "bf16") then return false end
  local kb = t.bk * elem_bytes(k)
  if M.ws_form(k, t) then return false end
  return t.wn == 1 and (t.wm == 4 or t.wm == 8) and t.bm == 16 * t.wm and
    (t.bn == 64 or t.bn == 128 or (t.bn == 256 and t.bm == 128)) and (kb == 64 or kb == 128) and
    k.E % t.bk == 0 and k.L % 16 == 0 and t.stages >= 3 and t.stages <= 8 and
    M.stream_smem(k, t) <= 227 * 1024
end

-- Dynamic shared memory of the K-streaming form: S stages of the x and
-- weight tiles' BK-element slices.
function M.stream_smem(k, t)
  return t.stages * (t.bm + t.bn) * t.bk * elem_bytes(k)
end

-- The warp-specialized form (stages >= 5 and BK·ES = 128 bytes: one
-- 128-byte swizzle row of K a stage): a producer warpgroup loads x's and
-- the weights' slices by TMA into a ring of S stages guarded by
-- mbarriers, two consumer warpgroups run the MMAs and the epilogue
-- (KERNEL_WSP): both on each tile at BM 128, each its own tiles in turn
-- at BM 64 (ping-pong). Int8 and bf16 weights, BM 64 or 128, BN 64 or 128 (the
-- tile's 4-stage stream twin serves a T that is no multiple of 64:
-- runtime/ops/lowrank.c), L a multiple of BN and of 64 (whole 64-column
-- groups of a head, each loaded in dg_bcol's order by one box of a rank-5
-- map: four copies a stage at 128x128 where they were eighteen, which
-- had the producer's issue as slow as the MMAs at 1B), E of the slice,
-- within 227 KiB with the 2·S barriers, the scales' two slots and 1 KiB
-- of alignment. Scales a channel or a token are put into a slot a tile
-- ahead by the producer warpgroup's warp 1, so the epilogue reads them
-- from shared memory (at 25M their L2 latency in the epilogue was a
-- quarter of the consumers' stalls).
-- Checked in the CPU emulation (tests/test_emu_lowrank.c, bit for bit on
-- codes) and on the GPU (tests/test_gpu_forward.c gpu_lowrank_ws: every
-- out format, E 1280 and 256; the w8a8 step's losses bit for bit those of
-- the kernels before). The default where it fits, 128x128x128/8x1/6 for
-- codes and 128x128x64/8x1/6 for bf16 (lowrank.lua default_tile has the
-- figures); the ping-pong tiles lost to both.
function M.ws_form(k, t)
  return t.stages >= 5 and t.bk * elem_bytes(k) == 128
end

function M.ws_smem(t)
  return t.stages * (t.bm + t.bn) * 128 + 16 * t.stages + 32 + 8 * (t.bm + t.bn) + 1024
end

function M.ws_fits(k, t)
  local ops = M.operands(k)
  if not (k.arch == 90 and k.arch_specific and k.op == "lowrank_fwd" and ops) then return false end
  if not (k.weight == "int8" or k.weight == "bf16") then return false end
  return M.ws_form(k, t) and t.wn == 1 and (t.wm == 4 or t.wm == 8) and t.bm == 16 * t.wm and
    (t.bn == 64 or t.bn == 128) and t.stages <= 8 and k.E % t.bk == 0 and k.L % t.bn == 0 and
    k.L % 64 == 0 and M.ws_smem(t) <= 227 * 1024
end

-- The epilogue's output rows of a tile (m0, h) and its stores (n0, the
-- format's ${EPI}), the same in both forms.
local OUT_ROWS = [[
	// This thread's two output rows (g and g + 8 of its warp's 16) of the tile.
	${OT} *orow[2];${QR_DECL}
#pragma unroll
	for (int hh = 0; hh < 2; ++hh) {
		const int m = m0 + wg * 64 + (warp & 3) * 16 + g + 8 * hh;
		orow[hh] = nullptr;
		if (m < M) {
			const int b = m / T, t = m - b * T;
			orow[hh] = out + ((long long)(b * H + h) * T + t) * L + 16 * q;${QR_ROWS}
		}
	}
]]
-- epi=rope: qr's rows beside out's (the same offsets) and the table's row t
local QR_DECL = [[

	unsigned short *qrow[2];	// epi=rope: qr's rows, and the table's row t
	const float *rrow[2];]]
local QR_ROWS = [[

			qrow[hh] = qr + ((long long)(b * H + h) * T + t) * L + 16 * q;
			rrow[hh] = rope + (long long)t * L + 16 * q;]]
local STORES = [[
#pragma unroll
		for (int hh = 0; hh < 2; ++hh) {
			if (orow[hh]) {
#pragma unroll
				for (int a = 0; a < BN / 64; ++a) {
					if (n0 + 64 * a + 16 * q < L) {
						${OT} *orp = orow[hh] + n0;${QR_PTRS}
${EPI}
					}
				}
			}
		}]]

-- Both forms' kernels open alike: the weight rows' column order, the
-- entry, the thread's place, the tile counts.
local OPENING = [[
// Weight row of shared B row p (see the column order above).
__device__ __forceinline__ int dg_bcol(int p)
{
	const int j = p >> 3, q = (p >> 1) & 3, r = p & 1;
	return ((j >> 3) << 6) + (q << 4) + ((j & 7) << 1) + r;
}

extern "C" __global__ void __launch_bounds__(${BOUNDS})
${SIGNATURE}
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	const int M = B * T;
	const unsigned char *xb __attribute__((unused)) = (const unsigned char *)x;	// (the warp-specialized
	const unsigned char *wb __attribute__((unused)) = (const unsigned char *)w;	// form: by its maps)
	const int NTN = (L + BN - 1) / BN, NTM = (M + BM - 1) / BM;]]

-- The walk of the stream and warp-specialized forms: the block's tiles
-- blockIdx.x + i·gridDim.x (i < mine), m fastest, then n, then the head.
local TILE_WALK = [[
	const long long ntiles = (long long)H * NTM * NTN;
	const long long mine = blockIdx.x < ntiles ? (ntiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
	auto tile_at = [&](long long i, int &h, int &m0, int &n0) {
		const long long tl = blockIdx.x + i * gridDim.x;
		const int mt = (int)(tl % NTM);
		const long long r_ = tl / NTM;
		n0 = (int)(r_ % NTN) * BN;
		h = (int)(r_ / NTN);
		m0 = mt * BM;
	};]]

local KERNEL = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// output heads
constexpr int HIN = ${HIN};		// input heads
constexpr int E = ${E};		// the reduction: resident in shared memory
constexpr int L = ${L};		// latent width per head
constexpr int WROW = ${WROW};		// bytes a weight row in its storage
constexpr int BM = ${BM}, BN = ${BN};	// block tile
constexpr int NWG = BM / 64;		// warpgroups, 64 rows each
constexpr int NT = NWG * 128;		// threads
constexpr int ES = ${ES};		// bytes an element in shared memory (${ELEM})
constexpr int RB = E * ES;		// bytes a row of x or w in shared memory
constexpr int KCH = RB / 16;		// 16-byte K chunks (core matrices) a row
constexpr int KSTEPS = KCH / 2;		// wgmma K steps: 32 bytes (two core matrices) each
constexpr int SBO = KCH * 128;		// bytes between 8-row core-matrix groups
constexpr int A_BYTES = BM * RB, B_BYTES = BN * RB;	// x tile, one of three weight tiles

${OPENING}
	// Work units: (head, m-tile) rows split into nch contiguous runs of
	// n-tiles, so a unit's x rows (A) are loaded once; units stride the grid.
	const int rows = H * NTM;
	const int nch = gridDim.x > (unsigned)rows ? (int)(gridDim.x / rows) : 1;
	const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
${SCALES}
	float absum = 0.0f;
	${ACC_T} acc0[BN / 2], acc1[BN / 2];	// ${ACC_WHAT}
#pragma unroll
	for (int i = 0; i < BN / 2; ++i) {
		acc0[i] = 0;
		acc1[i] = 0;
	}

#pragma unroll 1
	for (long long unit = blockIdx.x; unit < (long long)rows * nch; unit += gridDim.x) {
	const int row = (int)(unit / nch), ch = (int)(unit % nch);
	const int h = row / NTM, m0 = (row - h * NTM) * BM;
	const int j0 = (int)((long long)ch * NTN / nch), cnt = (int)((long long)(ch + 1) * NTN / nch) - j0;
	if (cnt <= 0)
		continue;
	// The units of one run start at staggered n-tiles, so that the blocks do
	// not all read the same weight rows (the same L2 lines) at once: step j
	// of the unit is n-tile ntile_of(j).
	const int rot = (int)((long long)row * cnt / rows);
	auto ntile_of = [&](int j) -> int {
		const int r_ = j + rot;
		return j0 + (r_ >= cnt ? r_ - cnt : r_);
	};
	// A: BM x-rows of RB bytes by 16-byte cp.async, zero past M. Chunk u is
	// (row u%8 of core group u/(8·KCH), chunk (u/8)%KCH): a quarter warp
	// writes 8 rows of one core matrix, 128 contiguous bytes.
#pragma unroll 4
	for (int u = tid; u < BM * KCH; u += NT) {
		const int r = (u & 7) | ((u / (8 * KCH)) << 3), kc = (u >> 3) % KCH;
		const int m = m0 + r;
		const void *src = xb;
		int bytes = 0;
		if (m < M) {
			const int b = m / T, t = m - b * T;
			src = xb + ((long long)(b * HIN + ${HIN_H}) * T + t) * RB + kc * 16;
			bytes = 16;
		}
		dg_cp16(smem + (r >> 3) * SBO + kc * 128 + (r & 7) * 16, src, bytes);
	}
${OUT_ROWS}${SA_ROWS}	// B: BN weight rows of n-tile j (col order dg_bcol) into buffer bf.
	// Unit u is (row u%8 of core group u/(8·UPR), unit (u/8)%UPR).
${LOAD_B}
	auto mma = [&](${ACC_T} (&acc)[BN / 2], int bf) {
		const unsigned a_addr = sbase + wg * 8 * SBO;	// this warpgroup's 64 rows
		const unsigned b_addr = sbase + A_BYTES + bf * B_BYTES;
		dg_wg_fence();
#pragma unroll
		for (int ks = 0; ks < KSTEPS; ++ks)
			dg_wgmma(acc, dg_wg_desc(a_addr + ks * 256, SBO), dg_wg_desc(b_addr + ks * 256, SBO), ks);
		dg_wg_commit();
	};
	auto epilogue = [&](${ACC_T} (&acc)[BN / 2], int j) {
		const int n0 = ntile_of(j) * BN;
${STORES}
	};
${PIPE}	__syncthreads();	// the next unit overwrites A and the buffers
	}
${ABSUM}
}
]]

--[[
The K-streaming form. Tiles (head, m-tile, n-tile), m fastest (the blocks
at work share the weight rows of a few n-tiles, read from DRAM once; x is
small beside the weights), are dealt to the blocks with a stride of the
grid (runtime/ops/lowrank.c: as many blocks as an SM holds × the SMs).
A block's tiles and their KT = E/BK K slices make one flat run of steps;
the ring of S stages keeps S-2 steps of cp.async in flight across tile
boundaries (the decoder's schedule, templates/decoder.lua KERNEL_WG: a
stage is refilled two steps after the MMAs that read it were issued, one
wgmma group left pending a step). A tile's last step waits for its MMAs
and runs the resident form's epilogue from the accumulators while the
next tile's first slices are in flight; two blocks an SM (BN <= 128) keep
the tensor cores busy across it. Shared memory: the resident form's
no-swizzle core matrices, KCH = BK·ES/16 of them a row a stage, weight
rows in the column order dg_bcol.
]]
local KERNEL_STREAM = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// output heads
constexpr int HIN = ${HIN};		// input heads
constexpr int E = ${E};		// the reduction, streamed in slices of BK
constexpr int L = ${L};		// latent width per head
constexpr int WROW = ${WROW};		// bytes a weight row in its storage
constexpr int BM = ${BM}, BN = ${BN};	// block tile
constexpr int NWG = BM / 64;		// warpgroups, 64 rows each
constexpr int NT = NWG * 128;		// threads
constexpr int ES = ${ES};		// bytes an element (${ELEM})
constexpr int RB = E * ES;		// bytes a row of x or w
constexpr int KB = ${KB};		// bytes of a row a stage (BK elements)
constexpr int KT = RB / KB;		// stages of K a tile
constexpr int KCH = KB / 16;		// 16-byte K chunks (core matrices) a row a stage
constexpr int KSTEPS = KCH / 2;		// wgmma K steps a stage: 32 bytes each
constexpr int SBO = KCH * 128;		// bytes between 8-row core-matrix groups
constexpr int S = ${S};			// stages; S - 2 K slices in flight
constexpr int A_BYTES = BM * KB, B_BYTES = BN * KB, STAGE = A_BYTES + B_BYTES;
constexpr int SA = BM * KCH / NT;	// x chunks a thread a stage
constexpr int SB = (BN * KCH + NT - 1) / NT;	// weight chunks a thread a stage
static_assert(SA * NT == BM * KCH, "whole x chunks a thread");

${OPENING}
${TILE_WALK}
	const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
${SCALES}
	float absum = 0.0f;
	${ACC_T} acc[BN / 2];	// ${ACC_WHAT}
	// step st of the block's run is slice st % KT of its tile st / KT
	const long long nsteps = mine * KT;
	// The loading side: the tile whose slices are being fetched and this
	// thread's source rows in it (nullptr: zeros past M or L), found once a tile.
	long long ld_tile = -1;
	const unsigned char *a_src[SA];
	const unsigned char *b_src[SB];
	auto issue = [&](long long st) {
		const long long i = st / KT;
		const int kt = (int)(st - i * KT);
		if (i != ld_tile) {
			ld_tile = i;
			int h, m0, n0;
			tile_at(i, h, m0, n0);
#pragma unroll
			for (int s2 = 0; s2 < SA; ++s2) {
				const int u = tid + s2 * NT;
				const int r = (u & 7) | ((u / (8 * KCH)) << 3), kc = (u >> 3) % KCH;
				const int m = m0 + r;
				a_src[s2] = nullptr;
				if (m < M) {
					const int b = m / T, t = m - b * T;
					a_src[s2] = xb + ((long long)(b * HIN + ${HIN_H}) * T + t) * RB + kc * 16;
				}
			}
#pragma unroll
			for (int s2 = 0; s2 < SB; ++s2) {
				const int u = tid + s2 * NT;
				const int p = (u & 7) | ((u / (8 * KCH)) << 3), kc = (u >> 3) % KCH;
				const int n = n0 + dg_bcol(p);
				b_src[s2] = (u < BN * KCH && n < L) ? wb + ((long long)h * L + n) * WROW + kc * 16 : nullptr;
			}
		}
		unsigned char *base = smem + (int)(st % S) * STAGE;
		const long long ko = (long long)kt * KB;
#pragma unroll
		for (int s2 = 0; s2 < SA; ++s2) {
			const int u = tid + s2 * NT;
			const int r = (u & 7) | ((u / (8 * KCH)) << 3), kc = (u >> 3) % KCH;
			dg_cp16(base + (r >> 3) * SBO + kc * 128 + (r & 7) * 16,
				a_src[s2] ? (const void *)(a_src[s2] + ko) : (const void *)xb, a_src[s2] ? 16 : 0);
		}
#pragma unroll
		for (int s2 = 0; s2 < SB; ++s2) {
			const int u = tid + s2 * NT;
			if (u < BN * KCH) {
				const int p = (u & 7) | ((u / (8 * KCH)) << 3), kc = (u >> 3) % KCH;
				dg_cp16(base + A_BYTES + (p >> 3) * SBO + kc * 128 + (p & 7) * 16,
					b_src[s2] ? (const void *)(b_src[s2] + ko) : (const void *)wb, b_src[s2] ? 16 : 0);
			}
		}
	};
	// The epilogue of tile i from the accumulators (the resident form's).
	auto epilogue = [&](long long i) {
		int h, m0, n0;
		tile_at(i, h, m0, n0);
${OUT_ROWS_IN}${SA_ROWS}${STORES}
	};

	// ---- the run: S - 2 slices in flight; a stage is refilled two steps
	// after the MMAs that read it were issued (wait_group 1 a step)
#pragma unroll 1
	for (int st = 0; st < S - 2; ++st) {
		if (st < nsteps)
			issue(st);
		dg_cp_commit();
	}
	long long st = 0;	// the run's step
#pragma unroll 1
	for (long long i = 0; i < mine; ++i) {
#pragma unroll 1
		for (int kt = 0; kt < KT; ++kt, ++st) {
			dg_cp_wait<S - 3>();	// this thread's copies of step st have landed
			dg_fence_async_smem();
			__syncthreads();	// everyone's; every warpgroup's MMAs of step st-2 are done
			if (st + S - 2 < nsteps)
				issue(st + S - 2);	// into step st-2's stage
			dg_cp_commit();
			const unsigned a_addr = sbase + (int)(st % S) * STAGE + wg * 8 * SBO;	// this warpgroup's 64 rows
			const unsigned b_addr = sbase + (int)(st % S) * STAGE + A_BYTES;
			dg_wg_fence();
#pragma unroll
			for (int ks = 0; ks < KSTEPS; ++ks)
				dg_wgmma(acc, dg_wg_desc(a_addr + ks * 256, SBO), dg_wg_desc(b_addr + ks * 256, SBO),
					 (kt > 0 || ks > 0) ? 1 : 0);
			dg_wg_commit();
			dg_wg_wait<1>();
		}
		dg_wg_wait<0>();	// the tile's sums are complete once its MMAs are
		dg_wg_pin(acc);
		epilogue(i);
	}
	dg_cp_wait<0>();
${ABSUM}
}
]]

-- The 16 values of (row half hh, column group a), in column order: the
-- accumulator registers 4·(8a + j) + 2·hh + r for j = 0..7, r = 0..1.
local function acc_ref(i)
  return fmt("acc[4 * (8 * a + %d) + 2 * hh + %d]", i // 2, i % 2)
end

-- The epilogue's statements for one (row half hh, column group a): y of the
-- 16 accumulators, then the stores. magic: the 1.5·2^23 int → float trick
-- applies; fsum: the accumulators are f32 sums (bf16 operands) already.
local function epilogue(k, magic, fsum, sw_at)
  local w = EMIT.writer()
  w:indent(7)
  local out_code = k.out == "int8" or k.out == "uint8pos"
  local sc = k.sc
  if sc.sw_vec then
    w:line("float sw_g[16];	// the weight's scale of each of the 16 columns (per channel)")
    w:line("#pragma unroll")
    w:line("for (int i = 0; i < 16; ++i)")
    w:linef("\tsw_g[i] = %s;", sw_at or "sw[(long long)h * L + n0 + 64 * a + 16 * q + i]")
  end
  local function s_of(i) return SCL.scale_expr(sc, "sa_r[hh]", fmt("sw_g[%d]", i)) end
  local tofloat = fsum and "%s" or (magic and "(__int_as_float(%s + 0x4b400000) - 12582912.0f)" or "__int2float_rn(%s)")
  -- y before the ReLU: acc · s, or (float × float, no scale) acc itself
  local function scaled(i)
    local s_e = s_of(i)
    if not s_e then return fmt(tofloat, acc_ref(i)) end
    return fmt("__fmul_rn(%s, %s)", fmt(tofloat, acc_ref(i)), s_e)
  end
  -- y after the ReLU: max(y − thr, 0); at thr 0 the subtraction is left
  -- out, being y itself bit for bit (y − +0 rounds to y for every y, −0
  -- and NaN included), one instruction an output less
  local function relu(y)
    if not k.thr then return y end
    if k.thr == 0 and 1 / k.thr > 0 then return fmt("fmaxf(%s, 0.0f)", y) end
    return fmt("fmaxf(__fsub_rn(%s, %s), 0.0f)", y, EMIT.cfloat(k.thr))
  end
  if out_code then
    w:line("unsigned cw[16];	// 1.5·2^23 + code: the low byte is the code (dg_code_t)")
    for i = 0, 15 do
      local f = fmt(tofloat, acc_ref(i))
      w:linef("cw[%d] = __float_as_uint(dg_code_t(%s, a1, b1, CR, CLOM));", i, f)
    end
    w:line("uint4 o;")
    local comp = { "x", "y", "z", "w" }
    for j = 0, 3 do
      w:linef("o.%s = __byte_perm(__byte_perm(cw[%d], cw[%d], 0x0040), __byte_perm(cw[%d], cw[%d], 0x0040), 0x5410);",
              comp[j + 1], 4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3)
    end
    w:line("*(uint4 *)(orp + 64 * a) = o;")
    w:line("if (out_absum) {	// Σ|y| of y = relu(acc·s − thr), as the float outputs compute it")
    for i = 0, 15 do
      local y = relu(scaled(i))
      w:linef("\tabsum += fabsf(%s);", y)
    end
    w:line("}")
  else
    w:line("float y[16];")
    for i = 0, 15 do
      local y = relu(scaled(i))
      w:linef("y[%d] = %s;", i, y)
      w:linef("absum += fabsf(y[%d]);", i)
    end
    if k.out == "f32" then
      for j = 0, 3 do
        w:linef("*(float4 *)(orp + 64 * a + %d) = make_float4(y[%d], y[%d], y[%d], y[%d]);",
                4 * j, 4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3)
      end
    else
      -- after the ReLU no value is NaN, so cvt.rn.bf16x2 (dg_bf16x2) rounds
      -- each pair exactly as dg_f32_to_bf16 does, in one instruction where
      -- the bit operations take about sixteen; without it a NaN keeps its
      -- payload by dg_f32_to_bf16 (dg_pack2's branch to it spilled here).
      -- w8a8 step's twelve projections 3.07 -> 2.93 ms on an H100
      -- (bench/results/step-train-h100-2026-12-06_cvt_pack.json)
      for j = 0, 1 do
        local p = {}
        for i = 0, 3 do
          if k.thr then
            p[#p + 1] = fmt("dg_bf16x2(y[%d], y[%d])", 8 * j + 2 * i, 8 * j + 2 * i + 1)
          else
            p[#p + 1] = fmt("(unsigned)dg_f32_to_bf16(y[%d]) | ((unsigned)dg_f32_to_bf16(y[%d]) << 16)",
                            8 * j + 2 * i, 8 * j + 2 * i + 1)
          end
        end
        if k.rope then
          -- epi=rope: the stored bf16 pairs turned by the table's (cos,
          -- sin) of their columns, as rope_fwd turns out's (dg_turn)
          w:line("{")
          w:linef("\tconst uint4 o_ = make_uint4(%s);", table.concat(p, ",\n\t\t\t\t\t\t\t\t"))
          w:linef("\t*(uint4 *)(orp + 64 * a + %d) = o_;", 8 * j)
          w:linef("\tconst float4 r0_ = __ldg((const float4 *)(rtp + 64 * a + %d)), r1_ = __ldg((const float4 *)(rtp + 64 * a + %d));",
                  8 * j, 8 * j + 4)
          w:linef("\t*(uint4 *)(qrp + 64 * a + %d) = make_uint4(dg_turn(o_.x, r0_.x, r0_.y), dg_turn(o_.y, r0_.z, r0_.w),", 8 * j)
          w:line("\t\t\t\t\t\t\t   dg_turn(o_.z, r1_.x, r1_.y), dg_turn(o_.w, r1_.z, r1_.w));")
          w:line("}")
        else
          w:linef("*(uint4 *)(orp + 64 * a + %d) = make_uint4(%s);", 8 * j, table.concat(p, ",\n\t\t\t\t\t\t\t\t"))
        end
      end
    end
  end
  return w:text()
end

local function load_b(k)
  local w = EMIT.writer()
  w:indent(1)
  if k.weight == "int8" or k.weight == "bf16" then
    -- int8 (one byte a code) and bf16 (8 a chunk) rows as they are stored:
    -- 16-byte cp.async straight into the core matrices
    w:line([[
auto b_fetch = [&](int j) { (void)j; };
auto b_put = [&](int j, int bf) {
	unsigned char *dst = smem + A_BYTES + bf * B_BYTES;
	const int n0 = ntile_of(j) * BN;
#pragma unroll 4
	for (int u = tid; u < BN * KCH; u += NT) {
		const int p = (u & 7) | ((u / (8 * KCH)) << 3), kc = (u >> 3) % KCH;
		const int n = n0 + dg_bcol(p);
		const bool in = n < L;
		dg_cp16(dst + (p >> 3) * SBO + kc * 128 + (p & 7) * 16,
			in ? (const void *)(wb + ((long long)h * L + n) * WROW + kc * 16) : (const void *)wb, in ? 16 : 0);
	}
};]])
    return w:text()
  end
  -- packed: this thread's 16-byte units fetched to registers ahead, decoded later
  local dec = require("wgmma").unit_decoder(k.weight)
  w:line(EMIT.subst([[
constexpr int UCODES = ${UCODES};		// codes a B load unit (16 bytes of storage)
constexpr int UPR = E / UCODES;			// B units a row
constexpr int NUB = (BN * UPR + NT - 1) / NT;	// B units a thread
uint4 rb[NUB];	// packed weight units of the next tile, in flight
auto b_fetch = [&](int j) {
	const int n0 = ntile_of(j) * BN;
#pragma unroll
	for (int s = 0; s < NUB; ++s) {
		const int u = tid + s * NT;
		rb[s] = make_uint4(0u, 0u, 0u, 0u);
		if (u < BN * UPR) {
			const int p = (u & 7) | ((u / (8 * UPR)) << 3), c = (u >> 3) % UPR;
			const int n = n0 + dg_bcol(p);
			if (n < L)
				rb[s] = __ldg((const uint4 *)(wb + ((long long)h * L + n) * WROW + c * 16));
		}
	}
};
auto b_put = [&](int j, int bf) {
	(void)j;
	unsigned char *dst = smem + A_BYTES + bf * B_BYTES;
#pragma unroll
	for (int s = 0; s < NUB; ++s) {
		const int u = tid + s * NT;
		if (u < BN * UPR) {
			const int p = (u & 7) | ((u / (8 * UPR)) << 3), c = (u >> 3) % UPR;
			unsigned char *o = dst + (p >> 3) * SBO + c * (UCODES / 16) * 128 + (p & 7) * 16;
${DEC}
		}
	}
};]], { DEC = dec, UCODES = k.weight == "ternary" and 64 or 128 }))
  return w:text()
end

-- The schedule (every operand type): a step issues tile j+1's MMAs, then
-- the load of tile j+2's weights, runs tile j's epilogue (its sums
-- complete since the last step's end) under both, and ends with
-- wait_group 0 (tile j+1's sums), the copies' wait and one barrier. No
-- group is pending across a step, so ptxas keeps the MMAs asynchronous (a
-- group pending across the loop's back edge while the other accumulator
-- set is read, as an earlier schedule of the codes had it, makes ptxas
-- serialize every wgmma of the kernel: info C7514). Weights: cp.async
-- (int8, bf16) are issued before the epilogue (PUT_EARLY); packed ones
-- (ternary, sign1) are fetched to registers before it and decoded into
-- shared memory after it (PUT_LATE), so the global loads' latency hides
-- under the epilogue either way. Buffers: tile j+1's MMAs read (j+1)%3;
-- tile j+2's weights go to (j+2)%3, whose last reader, tile j-1, every
-- warpgroup waited for before the previous step's barrier; the barrier at
-- a step's end makes tile j+2's weights visible to the next step's MMAs.
-- The prologue loads tiles 0 and 1 and waits for tile 0's sums.
local PIPE_SYNC = [[
	b_fetch(0);
	b_put(0, 0);
	if (cnt > 1) {
		b_fetch(1);
		b_put(1, 1);
	}
	dg_cp_commit();
	dg_cp_wait<0>();
	dg_fence_async_smem();
	__syncthreads();
	mma(acc0, 0);
	dg_wg_wait<0>();
	dg_wg_pin(acc0);
	// Tile j: its sums are done in acc(j%2), tile j+1's weights are in
	// buffer (j+1)%3.
#pragma unroll 1
	for (int j = 0; j < cnt; j += 2) {
${STEP0}
		if (j + 1 >= cnt)
			break;
${STEP1}
	}
]]

local STEP_SYNC = [[
		{
			const int jj = j + ${P};
			if (jj + 1 < cnt)
				mma(${ACCB}, (jj + 1) % 3);	// the next tile's MMAs run under this one's epilogue
			if (jj + 2 < cnt) {
				b_fetch(jj + 2);	// and so do the weights after it
${PUT_EARLY}			}
			epilogue(${ACCA}, jj);
${PUT_LATE}			dg_wg_wait<0>();
			dg_wg_pin(${ACCB});
			if (jj + 2 < cnt) {
				dg_cp_wait<0>();
				dg_fence_async_smem();
				__syncthreads();	// tile jj+2's weights visible; every tile-jj+1 MMA done
			}
		}]]


--[[
The warp-specialized form (M.ws_fits). The tiles are the stream form's
(head, m-tile, n-tile), m fastest, dealt with a stride of the grid, and a
block's tiles and their KT = E/KE slices make one flat run of steps. The
block's last warpgroup is the producer: one thread waits for a stage's
empty barrier, arms its full barrier with the stage's bytes and loads it
by TMA with the 128-byte swizzle — x's BM rows in boxes of 64 rows of one
(b, input head) (the map ma over x (E, T, B·HIN)), the BN weight rows in
boxes of 8 rows, one 1024-byte swizzle atom each, taken in the column
order dg_bcol (the map mb over w (E, 16, H·L/16): a box of 2 x 4 rows at
rows 16·c2 + c1 is rows c1, c1+1 of 4 groups of 16, which is B rows
8j .. 8j+7 of dg_bcol for c1 = 2·(j % 8)) — so the epilogue stores 16
contiguous columns a lane as the other forms do. The consumers wait on a
stage's full barrier, run its four wgmma K steps (32 bytes each, on the
swizzle's descriptors), keep one step's MMAs in flight across the next
wait, and free a stage on its empty barrier (every thread of the
warpgroups that read it) once the MMAs that read it completed. A tile's
last step waits for its sums and runs the epilogue while the producer
already loads the next tile's slices (up to S of them). At BM 128 both
consumer warpgroups work on each tile (64 rows each) and the tensor cores
wait out the epilogue; at BM 64 they take the block's tiles in turn
(ping-pong: warpgroup w the tiles w, w + 2, ...), the stages of a tile
being consumed by its warpgroup alone, so one warpgroup's epilogue runs
under the other's MMAs. Needs T % 64 == 0 (a box's 64 rows within one b);
the runtime takes the tile's 4-stage stream twin at another T.
]]
local KERNEL_WSP = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// output heads
constexpr int HIN = ${HIN};		// input heads
constexpr int E = ${E};		// the reduction, streamed in 128-byte slices
constexpr int L = ${L};		// latent width per head
constexpr int BM = ${BM}, BN = ${BN};	// tile
// BM 128: two consumer warpgroups share each tile (64 rows each); BM 64:
// two consumer warpgroups take the block's tiles in turn (ping-pong), so
// one's epilogue runs under the other's MMAs
constexpr bool PP = BM == 64;
constexpr int NT = 256;			// consumer threads: two warpgroups
constexpr int ES = ${ES};		// bytes an element (${ELEM})
constexpr int KE = 128 / ES;		// elements of a row a stage: one 128-byte swizzle row
constexpr int KT = E / KE;		// stages of K a tile
constexpr int S = ${S};			// stages
constexpr int A_BYTES = BM * 128, B_BYTES = BN * 128, STAGE = A_BYTES + B_BYTES;
constexpr bool SCV = ${SCV};		// scales a channel or a token: staged in shared memory a tile
static_assert(E % KE == 0 && L % BN == 0 && L % 64 == 0 && BN % 64 == 0, "whole slices; whole 64-column groups");
${WS_HEAD}
${WS_HELPERS}
${SW_DESC}
// The ping-pong turn between the two consumer warpgroups (named barriers
// 2 and 3 of NT threads): warpgroup w waits on barrier 2 + w for the other
// one's arrival there.
__device__ __forceinline__ void dg_pp_turn_wait(int w)
{
	if (w == 0)
		asm volatile("bar.sync 2, %0;\n" :: "n"(NT) : "memory");
	else
		asm volatile("bar.sync 3, %0;\n" :: "n"(NT) : "memory");
}

__device__ __forceinline__ void dg_pp_turn_give(int w)
{
	if (w == 0)
		asm volatile("bar.arrive 3, %0;\n" :: "n"(NT) : "memory");
	else
		asm volatile("bar.arrive 2, %0;\n" :: "n"(NT) : "memory");
}

// Box (c0 .. c4) of the rank-5 map into shared dst, completing on bar: the
// weights' map gathers a group of 64 rows in dg_bcol's order in one box.
__device__ __forceinline__ void dg_tma_load5(unsigned dst, const dg_tmap *map, unsigned bar, int c0, int c1, int c2,
					     int c3, int c4)
{
	asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
		     :: "r"(dst), "l"((unsigned long long)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
		     : "memory");
}
${OPENING}
${TILE_WALK}
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more);
	// the barriers after the ring: full[S] (the producer's expect_tx and the
	// bytes), then empty[S] (every consumer thread); then the scales' two
	// slots (a tile's BN weight scales, then its BM act scales, where they
	// vary: SCV), their full[2] (the loader warp's 32 arrivals) and
	// empty[2] (the tile's consumers) before them
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;
	const unsigned bars = sbase + S * STAGE;
	const unsigned scbar = bars + 16 * S;
	float *const scs0 = (float *)(smem + (scbar + 32u - (unsigned)__cvta_generic_to_shared(smem)));
	(void)scs0;
	if (SCV && tid == 0) {
		for (int z = 0; z < 2; ++z) {
			dg_mbar_init(scbar + 8 * z, 32);
			dg_mbar_init(scbar + 16 + 8 * z, PP ? 128 : NT);
		}
	}
${RING_START}
			int i = 0;	// the block's step, over all its tiles
#pragma unroll 1
			for (long long it = 0; it < mine; ++it) {
				int h, m0, n0;
				tile_at(it, h, m0, n0);
				const int c6 = (h * L + n0) / 64;	// the tile's first group of 64 weight rows
#pragma unroll 1
				for (int kt = 0; kt < KT; ++kt, ++i) {
					const int s = i % S;
					const unsigned full = bars + 8 * s, as = sbase + s * STAGE, bs = as + A_BYTES;
					// the stage's previous use (step i - S) released by every consumer
					dg_mbar_wait(bars + 8 * (S + s), ((i / S) & 1) ^ 1);
					dg_mbar_expect_tx(full, TX);
#pragma unroll
					for (int gg = 0; gg < BM / 64; ++gg) {	// rows m0 + 64gg ..: one b's (past M: zeros)
						const int m = m0 + 64 * gg, b = m / T, t = m - b * T;
						dg_tma_load(as + 8192 * gg, &ma, full, kt * KE, t, b * HIN + ${HIN_H});
					}
#pragma unroll
					for (int j = 0; j < BN / 64; ++j)	// B rows 64j ..: a group of 64 in dg_bcol's order
						dg_tma_load5(bs + 8192 * j, &mb, full, kt * KE, 0, 0, 0, c6 + j);
				}
			}
		} else if (SCV && tid >= NT + 32 && tid < NT + 64) {
			// ---- the scales' loader (the producer warpgroup's warp 1): tile
			// it's scales into slot it % 2, once the tile two before has
			// left it, ahead of the epilogue that reads them
#pragma unroll 1
			for (long long it = 0; it < mine; ++it) {
				const int z = (int)(it & 1);
				dg_mbar_wait(scbar + 16 + 8 * z, (unsigned)(((it >> 1) & 1) ^ 1));
				int h, m0, n0;
				tile_at(it, h, m0, n0);
				float *const sc = scs0 + z * (BN + BM);
				(void)sc;
${SC_LOAD}
				dg_mbar_arrive(scbar + 8 * z);
			}
		}
		return;
	}

	// ---- the consumers: warpgroup wg, rows wg·64 .. +63 of each tile
	// (ping-pong: all 64 rows of every other tile)
	if constexpr (REG_MOVE)
		dg_reg_alloc<REG_C>();
	const int wr = PP ? 0 : wg;		// the warpgroup's 64 rows of its tiles
${SCALES}
	float absum = 0.0f;
	${ACC_T} acc[BN / 2];	// ${ACC_WHAT}
	// The epilogue of tile i from the accumulators (the other forms'), its
	// varying scales read from the tile's slot (SCV)
	auto epilogue = [&](long long i) {
		int h, m0, n0;
		tile_at(i, h, m0, n0);
		const float *const sc = scs0 + (int)(i & 1) * (BN + BM);
		(void)sc;
${OUT_ROWS_IN}${SA_ROWS}${STORES}
	};
#pragma unroll 1
	for (long long it = PP ? wg : 0; it < mine; it += PP ? 2 : 1) {
		int i = (int)(it * KT);	// the tile's first step of the block's run
		// ping-pong: a tile's K loop starts once the other warpgroup has
		// waited for every stage of the tile before (its named barrier),
		// so each stage's phase this one waits for is its next: a stage's
		// full barrier tells phases apart by parity only, and with KT >= S
		// a step KT ahead is two phases on
		if (PP && it > 0)
			dg_pp_turn_wait(wg);
#pragma unroll 1
		for (int kt = 0; kt < KT; ++kt, ++i) {
			const int s = i % S;
			dg_mbar_wait(bars + 8 * s, (i / S) & 1);
			const unsigned as = sbase + s * STAGE + wr * 8192, bs = sbase + s * STAGE + A_BYTES;
			dg_wg_fence();
#pragma unroll
			for (int ks = 0; ks < 4; ++ks)
				dg_wgmma(acc, dg_sw_desc(as + 32 * ks), dg_sw_desc(bs + 32 * ks), (kt > 0 || ks > 0) ? 1 : 0);
			dg_wg_commit();
			// step i-1's MMAs done: its stage is free (a step of this tile)
			dg_wg_wait<1>();
			dg_wg_pin(acc);
			if (kt > 0)
				dg_mbar_arrive(bars + 8 * (S + (i - 1) % S));
		}
		if (PP && it + 1 < mine)	// the next tile's warpgroup may start its K loop
			dg_pp_turn_give(wg);
		dg_wg_wait<0>();	// the tile's sums are complete once its MMAs are
		dg_wg_pin(acc);
		dg_mbar_arrive(bars + 8 * (S + (i - 1) % S));	// the tile's last step
		if constexpr (SCV)
			dg_mbar_wait(scbar + 8 * (int)(it & 1), (unsigned)((it >> 1) & 1));
		epilogue(it);
		if constexpr (SCV)	// the slot is free for tile it + 2
			dg_mbar_arrive(scbar + 16 + 8 * (int)(it & 1));
	}
${ABSUM}
}
]]

function M.render(spec, k)
  local WG = require("wgmma")
  local MMA = require("mma")
  local fa, fw = FM.formats[k.act], FM.formats[k.weight]
  local nt = k.threads
  local smem = k.smem -- lowrank.lua M.plan: the x tile and three weight tiles, whole E
  local qa = k.act == "uint8pos" and 255 or (k.act == "int4" and 7 or 127)
  local qw = k.weight == "int8" and 127 or 1
  local magic = k.E * qa * qw < (1 << 22)
  local out_code = k.out == "int8" or k.out == "uint8pos"
  local bf = M.operands(k) == "bf16" -- bf16 × bf16: f32 sums, no scales
  if bf then magic = false end
  local wdiv = FM.i8x4_words(k.weight)
  local sc = EMIT.writer()
  sc:indent(1)
  for _, l in ipairs(SCL.scale_prologue(k.sc)) do sc:line(l) end
  local sa_rows = ""
  if k.sc.sa_vec then
    sa_rows = EMIT.subst([[
	float sa_r[2];	// the act's scale of this thread's two rows (per token)
#pragma unroll
	for (int hh = 0; hh < 2; ++hh) {
		const int m = m0 + wg * 64 + (warp & 3) * 16 + g + 8 * hh;
		sa_r[hh] = m < M ? sa[${XROW}] : 0.0f;
	}
]], { XROW = SCL.x_row(k.HIN, "m") })
  end
  if out_code then
    SPEC.check(not k.sc.vec, "lowrank_wgmma.lua: output codes need per-tensor input scales")
    sc:line("const float so_v = *so;")
    sc:line("const float so_r = so_v > 0.0f ? __frcp_rn(so_v) : 0.0f;")
    -- integer × integer: s = sa·sw (SCL.scale_prologue); float × float: 1
    for _, l in ipairs(SCL.code_consts(k.out, k.thr and EMIT.cfloat(k.thr), SCL.scale_expr(k.sc) or "1.0f")) do
      sc:line(l)
    end
  end
  local ab = EMIT.writer()
  ab:indent(1)
  ab:line([[
// Σ|y| of the block: warp shuffles, then the warps in order, one atomic.
if (out_absum) {
#pragma unroll
	for (int o_ = 16; o_ > 0; o_ >>= 1)
		absum += __shfl_xor_sync(0xffffffffu, absum, o_);
	__syncthreads();	// the shared buffers are no longer read
	float *red = (float *)smem;
	if (lane == 0)
		red[warp] = absum;
	__syncthreads();
	if (tid == 0) {
		float sum = 0.0f;
		for (int i = 0; i < NT / 32; ++i)
			sum += red[i];
		atomicAdd(out_absum, sum);
	}
}]])
  -- tile j+2's weights: cp.async straight to shared memory before the
  -- epilogue (int8, bf16), or registers fetched before it and decoded
  -- after it (ternary, sign1)
  local cp_weights = k.weight == "int8" or k.weight == "bf16"
  local put = "b_put(jj + 2, (jj + 2) % 3);"
  local put_early = cp_weights and fmt("\t\t\t\t%s\n\t\t\t\tdg_cp_commit();\n", put) or ""
  local put_late = cp_weights and "" or
    fmt("\t\t\tif (jj + 2 < cnt)\n\t\t\t\t%s\t// decoded under tile jj+1's MMAs\n", put)
  local ws = M.ws_form(k, k)
  local stream = k.stages >= 3 and not ws
  -- two blocks an SM when both accumulator sets (BN registers) and the
  -- rest fit 65536 / (2·NT) registers and the shared memory fits (the
  -- stream form: BN up to 128, its accumulators one set)
  local minb = (nt <= 256 and k.bn <= (stream and 128 or 64) and 2 * (smem + 1024) <= 227 * 1024) and 2 or 1
  local es = elem_bytes(k)
  SPEC.check(not k.rope or k.out == "bf16", "lowrank_wgmma.lua: epi=rope needs out=bf16")
  local out_rows = EMIT.subst(OUT_ROWS, { OT = FM.out_types[k.out].ctype, QR_DECL = k.rope and QR_DECL or "",
                                          QR_ROWS = k.rope and QR_ROWS or "" })
  local vars = {
    H = k.H, HIN = k.HIN, E = k.E, L = k.L, WROW = bf and 2 * k.E or k.E // wdiv,
    KB = k.bk * es, S = k.stages,
    ES = es, ELEM = bf and "bf16" or "one code a byte",
    ACC_T = bf and "float" or "int", ACC_WHAT = bf and "f32 sums" or "exact int32 sums",
    BM = k.bm, BN = k.bn,
    HIN_H = k.HIN == 1 and "0" or "h",
    SCALES = sc:text(), SA_ROWS = sa_rows,
    OT = FM.out_types[k.out].ctype,
    LOAD_B = load_b(k),
    PIPE = EMIT.subst(PIPE_SYNC, {
      STEP0 = EMIT.subst(STEP_SYNC, { P = 0, ACCA = "acc0", ACCB = "acc1", PUT_EARLY = put_early,
                                      PUT_LATE = put_late }),
      STEP1 = EMIT.subst(STEP_SYNC, { P = 1, ACCA = "acc1", ACCB = "acc0", PUT_EARLY = put_early,
                                      PUT_LATE = put_late }),
    }),
    OPENING = EMIT.subst(OPENING, { BOUNDS = fmt("NT, %d", minb), SIGNATURE = k.signature(fa.ctype, fw.ctype) }),
    TILE_WALK = TILE_WALK,
    OUT_ROWS = out_rows,
    OUT_ROWS_IN = EMIT.indent(out_rows, 1),
    -- the warp-specialized form reads a tile's weight scales from its slot
    STORES = EMIT.subst(STORES, { OT = FM.out_types[k.out].ctype,
                                  QR_PTRS = k.rope and "\n\t\t\t\t\t\tunsigned short *qrp = qrow[hh] + n0;\n\t\t\t\t\t\tconst float *rtp = rrow[hh] + n0;" or "",
                                  EPI = epilogue(k, magic, bf, ws and "sc[64 * a + 16 * q + i]" or nil) }),
    ABSUM = ab:text(),
  }
  if ws then
    -- the producer warpgroup has left: the consumers' named barrier for
    -- the block's Σ|y| (the ring is free by then: every load consumed)
    vars.ABSUM = vars.ABSUM:gsub("__syncthreads%(%)", "dg_consumers_sync()")
    local sig = k.signature(fa.ctype, fw.ctype):gsub("%)$",
      ",\n\t       const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb)")
    vars.OPENING = EMIT.subst(OPENING, { BOUNDS = "NTB, 1", SIGNATURE = sig })
    local WB = require("wgmma_bf16")
    -- two consumer warpgroups at BM 64 too (ping-pong)
    vars.WS_HEAD = WB.WS_HEAD:gsub("constexpr int NCW = BM / 64;", "constexpr int NCW = NT / 128;")
    assert(vars.WS_HEAD:find("NCW = NT / 128", 1, true), "lowrank_wgmma.lua: WS_HEAD's NCW")
    vars.WS_HELPERS = WB.WS_HELPERS
    vars.SW_DESC = WG.SW_DESC
    vars.RING_START = EMIT.subst(WB.RING_START, { EMPTY_COUNT = "(PP ? 128 : NT)", INIT_SYNC = "__syncthreads();" })
    -- a consumer's rows of its tile: wr (0 in ping-pong) for wg
    vars.OUT_ROWS_IN = vars.OUT_ROWS_IN:gsub("m0 %+ wg %* 64", "m0 + wr * 64")
    -- the varying scales: the loader warp puts a tile's into its slot (sc:
    -- BN weight scales, then BM act scales, zeros past M), the epilogue
    -- reads them there instead of from global memory (ncu at 25M: a
    -- quarter of the consumers' stall samples were the L2 latency of the
    -- sixteen weight-scale loads a column group)
    vars.SCV = (k.sc.sw_vec or k.sc.sa_vec) and "true" or "false"
    local ld = EMIT.writer()
    ld:indent(4)
    if k.sc.sw_vec then
      ld:line("for (int c = lane; c < BN; c += 32)")
      ld:line("\tsc[c] = sw[(long long)h * L + n0 + c];")
    end
    if k.sc.sa_vec then
      ld:line("for (int r = lane; r < BM; r += 32) {")
      ld:line("\tconst int m = m0 + r;")
      ld:linef("\tsc[BN + r] = m < M ? sa[%s] : 0.0f;", SCL.x_row(k.HIN, "m"))
      ld:line("}")
      vars.SA_ROWS = [[
	float sa_r[2];	// the act's scale of this thread's two rows (per token), from the tile's slot
#pragma unroll
	for (int hh = 0; hh < 2; ++hh)
		sa_r[hh] = sc[BN + wr * 64 + (warp & 3) * 16 + g + 8 * hh];
]]
    end
    vars.SC_LOAD = ld:text()
  end
  local path, conv
  if bf then
    path = fmt("bf16 × bf16 on warpgroup tensor cores (sm_90a): wgmma m64n%dk16 f32.bf16.bf16, f32 sums; "
               .. "%s", k.bn, ws and "TMA operands, warp-specialized" or
               ("cp.async operands" .. (stream and ", K streamed" or ", the next weight tile fetched under the epilogue")))
    conv = "f32 accumulators, y = acc (float operands carry no scale)"
  else
    path = fmt("integer × integer on warpgroup tensor cores (sm_90a): wgmma m64n%dk32 %s.s8, exact int32 sums; %s",
               k.bn, fa.unsigned and "u8" or "s8",
               ws and "TMA operands, warp-specialized" or
               (((k.weight == "int8") and "cp.async operands" or (k.weight .. " weights decoded to s8 in shared memory"))
               .. (stream and ", K streamed" or "")))
    conv = magic and "accumulators to float by the 1.5·2^23 trick (|acc| < 2^22)" or "accumulators to float by I2F"
  end
  local about
  if ws then
    about = k.about(path, nt, fmt("dynamic shared memory %d bytes (a ring of %d stages of 128-byte K slices of "
      .. "the x and weight tiles, their mbarriers); a TMA producer warpgroup and %d consumer warpgroups; tiles "
      .. "dealt with a stride of the grid, m fastest, their slices one run; two tensor maps follow T (T %% 64 "
      .. "== 0); %s; epilogue straight from the accumulators, 16-byte stores.",
      smem, k.stages, k.bm // 64, conv))
  elseif stream then
    about = k.about(path, nt, fmt("dynamic shared memory %d bytes (%d stages of %d-byte K slices of the x and "
      .. "weight tiles, %d in flight); tiles dealt with a stride of the grid, m fastest, their slices one run; "
      .. "%s; epilogue straight from the accumulators, 16-byte stores.",
      smem, k.stages, k.bk * es, k.stages - 2, conv))
  else
    about = k.about(path, nt, fmt("dynamic shared memory %d bytes (x tile + three weight tiles, whole E); "
      .. "contiguous tile runs a block; %s; epilogue straight from the accumulators, 16-byte stores.",
      smem, conv))
  end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "lowrank.lua", about))
  w:line(DEV.helpers({ bf16 = (k.out == "bf16") or nil, bf16x2 = (k.out == "bf16" and k.thr) and true or nil,
                     sign1 = (k.weight == "sign1") or nil,
                     code = (k.out == "int8" or k.out == "uint8pos") or nil }))
  w:line(MMA.helpers({ decode = false }, fa.unsigned))
  w:line(WG.helpers(k.bn, fa.unsigned, bf))
  if k.weight == "ternary" then w:line(WG.decoders) end
  if k.rope then w:line(require("rope").TURN_BF16X2) end
  w:line(EMIT.subst(ws and KERNEL_WSP or (stream and KERNEL_STREAM or KERNEL), vars))
  return w:text()
end

return M

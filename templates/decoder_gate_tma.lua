--[[
decoder_gate_tma.lua — decoder_gate_bwd's persistent, warp-specialized form
on sm_90a (templates/decoder_gate.lua holds the op, its math and the other
paths; M.applies says when this one serves):

  dxy = grad · w (head h's columns), g = keep ? dxy·s : 0,
  dxs = g·ys, dys = ys > 0 ? g·xs : 0         (bf16 xs, ys, dxs, dys)

Why: the ring form stages the f32 tile dxy and then loads xs and ys with
plain 16-byte loads, 4 vectors in flight a thread; its blocks wait on those
loads (the epilogue is the kernel: K = D is 4 steps at the BDH shape), and
the gradient is read in f32 and rounded to bf16 by the threads on every tile.
Here every byte moves by TMA and nothing waits for it:

  a producer warpgroup: its thread 0 fills a ring of S stages with A (the
    gradient's bf16 copy, made by this module's _cast entry before the
    kernel: the same rounding as the ring form's staging, so the same sums)
    and B (w MN-major, BN/64 boxes of 64 x 64), full / empty mbarriers a
    stage; its warp 1's thread 0 loads the epilogue's operands, subtiles of
    BM rows x EC = 32 columns of xs and ys (64-byte rows, the 64-byte
    swizzle), into EPS slots with full / empty mbarriers of their own;
  the consumer warpgroups (BM/64 of them, 64 rows each): wgmma m64nBNk16 on
    each stage, then for each subtile the gate from the accumulators' own
    layout (no f32 tile staged), dxs's and dys's bf16 pairs written over
    xs's and ys's in the slot, and thread 0 stores both boxes by TMA (rows
    past T and columns past L clipped) and frees the subtile before's slot
    once its stores have read it.

Tiles: (b, t0) row tiles of BM tokens of one sequence (ceil(T/BM) a
sequence, so a box never straddles two), heads, column tiles of BN; a
block walks it = blockIdx.x, += gridDim.x, the row tiles fastest, so the
blocks resident at once read the same columns of w (from L2: at 1B the
weight is 0.7 GB a layer). The stage and slot counters run on from tile to
tile, so the producer fills the next tile's stages and slots while the
consumers run an epilogue.

The dropout's bits: a Philox block is 8 consecutive l of one row, which the
accumulators spread over a quad (2 columns a thread). For a subtile a quad
holds 8 blocks (2 rows x 4 column octets); each of its threads draws two
and the quad exchanges their 8-bit masks by two shuffles, so each block is
drawn once. elem0 not whole blocks (a caller's odd offset): each element
drawn by itself (dg_keep1), the same bits.

Kernel ABI: decoder_gate_bwd's (the grad, xs, ys, dxs and dys pointers
unread: the maps carry them) followed by six maps,
  ..., const __grid_constant__ dg_tmap ma, mb, mx, my, md, me
  ma: grad's bf16 copy (E, T, B), boxes 64 x BM (the 128-byte swizzle)
  mb: w (H·L, E, 1), boxes 64 x 64 (MN-major)
  mx, my, md, me: xs, ys, dxs, dys (L, T, B·H), boxes 32 x BM (64-byte)
  grid (any, 1, 1), the plan's threads (BM/64 + 1 warpgroups) and shared
  memory. And the cast:
  dg_decoder_gate_bwd_cast(const float *grad, unsigned short *copy, long long n8)
  (B·T·E / 8 chunks of 8, grid-stride).

Arithmetic: decoder_gate.lua's warpgroup path's, step for step (the same
MMAs in the same order on the same bf16 operands, the gate's roundings):
the same bits as the ring form.

Where it stands: checked on the CPU (tests/test_emu_decoder_gate.c
persistent_tma_form_is_the_ring_form: byte for byte against the ring
form, 3 blocks walking ragged shapes; shown to fail with the quad's masks
unswapped, with dys stored over dxs and with a slot read before its bytes
landed) and on an H100 (tests/test_gpu_decoder_gate.c
persistent_form_is_the_ring_form: the same bytes as the ring form; the
GPU model suite with it). The model's default (gpu_model.c gate_tma;
DRAGON_GATE_TMA=0 the ring form). Measured on an H100 80GB HBM3 at the
BDH shape (B 8, T 512, H 4, E 256, L 8192, p 0.1): 457.8 us against the
ring form's 575.3 (2.35 TB/s of xs, ys, dxs and dys: ncu 72% of DRAM's
peak); the w8a8 step 18.72 -> 18.01 ms (the node 3.38 -> 2.80), 1B 117.1
-> 113.0 ms (16.0 -> 11.5). What is left to the floor is the traffic
itself (1.07 GB a layer, about 320 us on that H100).
]]
local EMIT = require("emit")
local DEV = require("device")
local WB = require("wgmma_bf16")
local fmt = string.format

local M = {}

M.EC = 32

function M.eslot(t) return t.bm * M.EC * 2 * 2 end

-- The ring and its 2·S barriers, to the slots' 1 KiB alignment.
local function ring_bytes(t)
  return (t.stages * (t.bm + t.bn) * t.bk * 2 + 16 * t.stages + 1023) // 1024 * 1024
end

-- Epilogue slots: as many as fit beside the ring (at most 4).
function M.eps(t)
  local n = (232448 - 1024 - ring_bytes(t) - 64) // M.eslot(t)
  return n > 4 and 4 or n
end

-- The form serves decoder_gate_bwd (ys read) with bf16 xs, ys, dxs and dys,
-- rows of L a tensor map's (L % 8 == 0), on the warpgroup path's arch and
-- weight, at a tile of 5 to 8 stages (wgmma_bf16.lua's warp-specialized
-- convention) with BN 64 or 128 and at least 2 slots beside the ring.
function M.applies(k, t)
  return not k.ys and k.xfmt == "bf16" and k.gfmt == "bf16" and k.L % 8 == 0 and WB.tile_ok(t, 5, 8) and
         t.bn <= 128 and M.eps(t) >= 2
end

function M.smem_bytes(t)
  return ring_bytes(t) + M.eps(t) * M.eslot(t) + 16 * M.eps(t) + 1024
end

function M.threads(t) return (t.bm // 64) * 128 + 128 end

local CONSTS = [[
// ---- tile: BM/64 consumer warpgroups along M, each 64 x BN; a producer
// warpgroup; a ring of S stages; EPS epilogue slots
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};
constexpr int NT = (BM / 64) * 128;		// consumer threads
constexpr int S = ${S};
static_assert(BK == 64 && E % BK == 0, "one 128-byte swizzle row of K a step");
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
constexpr int KT = E / BK;			// K steps a tile
constexpr int EC = ${EC}, EPS = ${EPS};		// a subtile's columns; slots
constexpr unsigned ESUB = BM * EC * 2;		// a subtile's box of one tensor (64-byte rows)
constexpr unsigned ESLOT = 2 * ESUB;		// xs's box, then ys's
static_assert(BN % EC == 0 && EC * 2 == 64, "a subtile's rows are one 64-byte swizzle row");
]]

local KERNEL = [[
// The gate's backward of one pair (columns c, c + 1 of a row): d the dxy
// sums, keep its two dropout bits, xy the slot's xs and ys pairs (bf16),
// overwritten by dxs's and dys's (decoder_gate.lua dg_gate8's roundings).
__device__ __forceinline__ void dg_gate_pair(float d0, float d1, unsigned keep, float s, unsigned &xw, unsigned &yw)
{
	const float x0 = __uint_as_float(xw << 16), x1 = __uint_as_float(xw & 0xffff0000u);
	const float y0 = __uint_as_float(yw << 16), y1 = __uint_as_float(yw & 0xffff0000u);
	const float g0 = keep & 1u ? __fmul_rn(d0, s) : 0.0f, g1 = keep & 2u ? __fmul_rn(d1, s) : 0.0f;
	xw = dg_bf16x2(__fmul_rn(g0, y0), __fmul_rn(g1, y1));
	yw = dg_bf16x2(y0 > 0.0f ? __fmul_rn(g0, x0) : 0.0f, y1 > 0.0f ? __fmul_rn(g1, x1) : 0.0f);
}

${CAST}
extern "C" __global__ void __launch_bounds__(NTB, 1)
dg_decoder_gate_bwd(${SIG})
{
	extern __shared__ __align__(128) unsigned char smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
	const int g = lane >> 2, q = lane & 3;
	(void)grad; (void)w; (void)xs; (void)ys; (void)dxs; (void)dys;
	if (step_at)
		step += *step_at;		// a captured step's, from its control block
	const unsigned thr = dg_drop_threshold(p);
	const float s = p > 0.0f ? __fdiv_rn(1.0f, __fsub_rn(1.0f, p)) : 1.0f;	// 1/(1 - p)
	// the swizzle atoms are 1024-byte aligned (the plan asks 1 KiB more)
	const unsigned sbase = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;
	// full[S], empty[S] after the ring; the slots after them (1 KiB
	// aligned), then efull[EPS] (the loader's expect_tx and the bytes) and
	// eempty[EPS] (the thread that stored the slot, once its stores read it)
	const unsigned bars = sbase + (unsigned)(S * STAGE);
	const unsigned ebase = (bars + 16u * S + 1023u) & ~1023u, ebars = ebase + EPS * ESLOT;
	const int tiles_t = (T + BM - 1) / BM, tiles_n = (L + BN - 1) / BN;
	const int tiles_m = B * tiles_t;
	const long long tiles = (long long)tiles_m * tiles_n * H;
	if (tid == 0)
		for (int e = 0; e < EPS; ++e) {
			dg_mbar_init(ebars + 8 * e, 1);
			dg_mbar_init(ebars + 8 * (EPS + e), 1);
		}
${RING_START}
			long long gs = 0;	// the block's K steps so far
			for (long long it = blockIdx.x; it < tiles; it += gridDim.x) {
${TILE4}
				for (int i = 0; i < KT; ++i, ++gs) {
					const int st = (int)(gs % S);
					const unsigned full = bars + 8 * st, as = sbase + st * STAGE, bs = as + A_BYTES;
					dg_mbar_wait(bars + 8 * (S + st), (unsigned)((gs / S) & 1) ^ 1u);	// released
					dg_mbar_expect_tx(full, TX);
					dg_tma_load(as, &ma, full, i * BK, t0, b);	// grad's rows t0.., K i·BK..
#pragma unroll
					for (int gb = 0; gb < BN / 64; ++gb)	// w's rows i·BK.., 64 columns a box
						dg_tma_load(bs + 8192 * gb, &mb, full, h * L + n0 + 64 * gb, i * BK, 0);
				}
			}
		} else if (tid == NT + 32) {	// the epilogue's loader
			long long ge = 0;	// the block's subtiles so far
			for (long long it = blockIdx.x; it < tiles; it += gridDim.x) {
${TILE4}
				for (int e = 0; e < BN / EC; ++e, ++ge) {
					const int sl = (int)(ge % EPS);
					const unsigned eb = ebase + sl * ESLOT, ef = ebars + 8 * sl;
					dg_mbar_wait(ebars + 8 * (EPS + sl), (unsigned)((ge / EPS) & 1) ^ 1u);
					dg_mbar_expect_tx(ef, ESLOT);
					dg_tma_load(eb, &mx, ef, n0 + EC * e, t0, b * H + h);
					dg_tma_load(eb + ESUB, &my, ef, n0 + EC * e, t0, b * H + h);
				}
			}
		}
		return;
	}

	// ---- the consumers: warpgroup wg, rows wg·64 .. +63 of each tile
	unsigned char *const sm = smem + (ebase - (unsigned)__cvta_generic_to_shared(smem));
	const int r0 = wg * 64 + (warp & 3) * 16 + g;	// this thread's rows r0, r0 + 8
	const bool whole = (elem0 & 7ull) == 0ull;	// the Philox blocks are octets of l
	long long gs = 0, ge = 0;
	for (long long it = blockIdx.x; it < tiles; it += gridDim.x) {
${TILE2}
		float acc[BN / 2];
#pragma unroll
		for (int i = 0; i < BN / 2; ++i)
			acc[i] = 0.0f;
		for (int i = 0; i < KT; ++i, ++gs) {
			const int st = (int)(gs % S);
			dg_mbar_wait(bars + 8 * st, (unsigned)((gs / S) & 1));
			const unsigned as = sbase + st * STAGE + wg * 8192, bs = sbase + st * STAGE + A_BYTES;
			dg_wg_fence();
#pragma unroll
			for (int ks = 0; ks < BK / 16; ++ks)
				dg_wb_mma(acc, dg_wb_desc<true>(as + ks * 32), dg_wb_desc<false>(bs + ks * 2048), 1);
			dg_wg_commit();
			dg_wg_wait<1>();	// the step before's MMAs done: its stage is free
			dg_wb_pin(acc);
			if (i > 0)
				dg_mbar_arrive(bars + 8 * (S + (int)((gs - 1) % S)));
		}
		dg_wg_wait<0>();
		dg_wb_pin(acc);
		dg_mbar_arrive(bars + 8 * (S + (int)((gs - 1) % S)));	// the tile's last stage

		// this thread's rows' first elements (l = 0) in the (B, H, T, L)
		// tensors, elem0 added: the dropout's counters
		unsigned long long row_i[2];
#pragma unroll
		for (int hr = 0; hr < 2; ++hr)
			row_i[hr] = (((unsigned long long)(b * H + h) * T + (unsigned long long)(t0 + r0 + 8 * hr)) * L) + elem0;
#pragma unroll
		for (int e = 0; e < BN / EC; ++e, ++ge) {
			const int sl = (int)(ge % EPS);
			unsigned char *const xsl = sm + sl * ESLOT;
			// the quad's 8 Philox blocks of this subtile (rows r0 + 8·hr,
			// octets jj): this thread draws blocks 2q, 2q + 1 (hr = q / 2,
			// jj = 2·(q % 2) + u) and the quad swaps the masks, so that
			// w01[hr] byte jj is block (hr, jj)'s
			unsigned w01[2] = { 0xffffffffu, 0xffffffffu };
			if (thr != 0u && whole) {
				unsigned mine = 0u;
				const unsigned long long rq = q >> 1 ? row_i[1] : row_i[0];	// row q / 2's
#pragma unroll
				for (int u = 0; u < 2; ++u) {
					const int jj = 2 * (q & 1) + u;
					const unsigned long long blk = (rq + (unsigned long long)(n0 + EC * e + 8 * jj)) >> 3;
					mine |= dg_keep8(dg_drop_block(blk, seed, step, layer), thr) << (8 * u);
				}
				const unsigned other = __shfl_xor_sync(0xffffffffu, mine, 1);
				const unsigned pair = q & 1 ? other | (mine << 16) : mine | (other << 16);	// row q / 2's
				const unsigned far = __shfl_xor_sync(0xffffffffu, pair, 2);
				w01[0] = q >> 1 ? far : pair;
				w01[1] = q >> 1 ? pair : far;
			}
			dg_mbar_wait(ebars + 8 * sl, (unsigned)((ge / EPS) & 1));
#pragma unroll
			for (int hr = 0; hr < 2; ++hr) {
				const int r = r0 + 8 * hr;
#pragma unroll
				for (int jj = 0; jj < EC / 8; ++jj) {
					const int j = e * (EC / 8) + jj, c = 8 * jj + 2 * q;
					unsigned keep = (w01[hr] >> (8 * jj + 2 * q)) & 3u;
					if (thr != 0u && !whole) {
						const unsigned long long i0 = row_i[hr] - elem0 + (unsigned long long)(n0 + EC * e + c);
						keep = (unsigned)dg_keep1(elem0 + i0, thr, seed, step, layer) |
						       ((unsigned)dg_keep1(elem0 + i0 + 1, thr, seed, step, layer) << 1);
					}
					unsigned *const xp = (unsigned *)(xsl + dg_swz64(r * 64 + 2 * c));
					unsigned *const yp = (unsigned *)(xsl + ESUB + dg_swz64(r * 64 + 2 * c));
					unsigned xw = *xp, yw = *yp;
					dg_gate_pair(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1], keep, s, xw, yw);
					*xp = xw;
					*yp = yw;
				}
			}
			dg_fence_async_smem();	// the pairs written, seen by the stores
			dg_consumers_sync();
			if (tid == 0) {
				const unsigned eb = ebase + sl * ESLOT;
				dg_tma_store(&md, eb, n0 + EC * e, t0, b * H + h);
				dg_tma_store(&me, eb + ESUB, n0 + EC * e, t0, b * H + h);
				dg_bulk_commit();
				dg_bulk_wait_read<1>();	// the subtile before's stores have read its slot
				if (ge > 0)
					dg_mbar_arrive(ebars + 8 * (EPS + (int)((ge - 1) % EPS)));
			}
		}
	}
	if (tid == 0)
		dg_bulk_wait_all();	// the last stores done before the block's shared memory goes
}
]]

-- A tile's place (it in scope): the row tile fastest, then the column
-- tile, then the head.
local TILE = [[
const int mt = (int)(it % tiles_m), nt = (int)((it / tiles_m) % tiles_n);
const int h = (int)(it / ((long long)tiles_m * tiles_n));
const int b = mt / tiles_t, t0 = (mt - b * tiles_t) * BM, n0 = nt * BN;]]

-- The source: the decoder_gate.lua head (specialization constants and
-- types) and the gate's helpers are the caller's (head); SIG the op's
-- signature without the maps.
function M.render(t, head, sig, philox)
  local w = EMIT.writer()
  w:line(DEV.helpers({ bf16 = true, bf16x2 = true, cp_async = true }))
  w:line(WB.helpers(t.bn, false, true))
  w:line(head)
  w:line(EMIT.subst(CONSTS, { BM = t.bm, BN = t.bn, BK = t.bk, S = t.stages, EC = M.EC, EPS = M.eps(t) }))
  w:line(WB.WS_HEAD)
  w:line(WB.WS_HELPERS)
  w:line(WB.TMA_STORE_HELPERS)
  w:line(philox)
  w:line(EMIT.subst(KERNEL, {
    SIG = sig .. ", const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb, " ..
          "const __grid_constant__ dg_tmap mx, const __grid_constant__ dg_tmap my, " ..
          "const __grid_constant__ dg_tmap md, const __grid_constant__ dg_tmap me",
    RING_START = EMIT.subst(WB.RING_START, { EMPTY_COUNT = "NT", INIT_SYNC = "__syncthreads();" }),
    TILE2 = EMIT.indent(TILE, 2), TILE4 = EMIT.indent(TILE, 4),
    CAST = require("grad_wgmma").cast_entry("dg_decoder_gate_bwd"),
  }))
  return w:text()
end

return M

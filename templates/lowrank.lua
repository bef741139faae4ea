--[[
lowrank.lua — the low-rank projection of BDH, forward, and its ReLU mask:

  lowrank_fwd  out[b,h,t,l] = relu(s · Σ_e x[b,hin(h),t,e] · w[h,l,e] − thr)
  relu_mask    grad_out[b,h,t,l] = (s · Σ_e x·w − thr) > 0 ? grad[b,h,t,l] : 0
               (y computed exactly as the forward does, so the mask is the
               forward's ReLU mask bit for bit)
  hin(h) = Hin==1 ? 0 : h

Kernel ABI (dragon/ref.h mirrors it in dg_ref_lowrank_fwd / dg_ref_relu_mask;
runtime/ops/ops_forward.c launches it):

  extern "C" __global__ void dg_lowrank_fwd(const XT *x, const WT *w,
      const float *sa, const float *sw, OT *out, const float *so,
      float *out_absum, int B, int T)
  extern "C" __global__ void dg_relu_mask(const XT *x, const WT *w,
      const float *sa, const float *sw, const float *grad, float *grad_out,
      int B, int T)

  grid: any number of blocks (1-D): blocks walk the ceil(B*T/bm) ·
  ceil(L/bn) · H tiles (n fastest, then m, then head) with a stride of the
  grid. block: the launch info's threads (wm*wn*32); dynamic shared memory:
  the launch info's smem (tensor-core path; 0 on the others, whose shared
  memory is static). Row m = b*T + t of head h's GEMM (M = B*T rows, N = L
  cols, K = E) reads x row ((b*Hin + hin(h))*T + t) and writes out row
  ((b*H + h)*T + t).
    x    (B, Hin, T, E): f32 | bf16 (unsigned short) | i8x4 int words
         (B, Hin, T, E/4) for int8, int4 and uint8pos (uint8pos lanes unsigned)
    w    (H, L, E): f32 | bf16 | int8 i8x4 (H, L, E/4) | ternary unsigned
         (H, L, E/16) | sign1 unsigned (H, L, E/32)
    sa, sw, so  device pointers to one float each (act, weight, out scale),
         read once; only those the formats need are read (others may be NULL)
    out  (B, H, T, L): float | unsigned short (bf16) | signed char (int8
         codes) | unsigned char (uint8pos codes)
    out_absum  NULL, or a float that receives += Σ|y| over the block's
         outputs (post-ReLU, pre-quantize), one atomicAdd per block and tile
    grad, grad_out  (B, H, T, L) f32; they may alias (no __restrict__: each
         element is read, then written, by one thread)
  x, w, out, grad, grad_out must be 16-byte aligned (whole allocations are);
  B*T < 2^30 (int row arithmetic).

Paths (which one a spec takes: M.plan)
  warpgroup tensor cores (templates/lowrank_wgmma.lua, lowrank_fwd on
    sm_90a, a warpgroup tile): integer codes (wgmma s8, exact int32 sums)
    or bf16 act × bf16 weight (wgmma bf16, f32 sums, y = acc); the whole E
    resident in shared memory, the epilogue stores from the accumulators.
    relu_mask never takes it: a bf16 mask recomputes y on the fp32 path,
    so where y is within rounding of thr it may differ from the wgmma
    forward's ReLU (float sums in another order), as it may from the
    reference's; integer masks stay bit for bit.
  tensor cores (templates/mma.lua): act and weight integer codes, sm_80+,
    BK % 32 == 0 (so E % 32 == 0), warp tile whole 16x8 fragments.
    mma.sync m16n8k32 s8.s8 (u8.s8 for uint8pos acts, never wrapped),
    exact int32 sums; cp.async multi-stage pipeline; ternary / sign1 decoded
    to s8 rows in shared memory. Epilogue pairs staged through shared memory
    (stride padded against bank conflicts), then 16-byte (or the largest
    that divides L) coalesced stores. The fast path: BDH's default tile.
  dp4a (SIMT): integer × integer otherwise (odd tiles, E % 32 != 0, older
    archs): codes staged into shared memory as i8x4 bytes (ternary and sign1
    decoded on the way), exact int32 sums through dp4a (s32.s32, or u32.s32
    for uint8pos activations).
  fp32 (SIMT): any float operand: each operand converted to f32 while
    staging, fp32 FMA accumulation, y = acc · (*sa if act is integer, *sw
    if weight is, else 1).
  Integer paths: y = __fmul_rn((float)acc, __fmul_rn(*sa, *sw)).
  Epilogue (every path): y = __fsub_rn(y, thr); y = y > 0 ? y : 0 (only with
  ReLU), then f32 | bf16 (round half to even) | int8 clamp(rint(y · (1/so)),
  ±127) | uint8pos clamp(rint(y · (1/so)), 0, 255), code 0 when so <= 0. No
  contraction into FMA in the epilogue (__fmul_rn, __fsub_rn, __fmul_rn by __frcp_rn(so)), so
  integer paths match the reference bit for bit. relu_mask keeps
  __fsub_rn(y, thr) > 0 as its mask.

SIMT tile: block bm × bn, K step bk, wm × wn warps; a warp's 32 lanes are 4
rows × 8 cols, a thread owns TM = bm/wm/4 rows (strided by 4) by TN =
bn/wn/8 cols (strided by 8). stages = 1: one shared buffer (load, sync,
compute, sync); stages >= 2: two buffers, the next K step's global loads in
flight (in registers) while the current one is computed. Shared memory:
min(stages, 2)·(bm + bn)·bk·P bytes (P = 1 codes, 4 floats), static (48 KiB
at most), reused by the epilogue to stage the output tile when it fits.
]]
local C = require("common")
local fmt = string.format

local M = {}

local ACTS = { "f32", "bf16", "int8", "int4", "uint8pos" }
local WEIGHTS = { "f32", "bf16", "int8", "ternary", "sign1" }
local OUTS = { "f32", "bf16", "int8", "uint8pos" }

-- Largest power of two <= 4 that divides n (words a global load).
local function load_words(n)
  local nw = 4
  while nw > 1 and n % nw ~= 0 do nw = nw // 2 end
  return nw
end

-- The statements that decode the registers `r` (an array expression of nw
-- words, one staging unit at unit index `ku` of tile row `row`) of format
-- `f` and store them into the shared tile `buf` as chunks (dg_stc).
local function stage_body(f, int_path, nw)
  local v = { nw = nw }
  if int_path then
    if f == "ternary" then
      return C.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i)	// a word: 16 codes = one chunk
	dg_stc(buf, row, ku * ${nw} + i,
		make_uint4(dg_tern4(r[i] & 0xffu), dg_tern4((r[i] >> 8) & 0xffu),
			   dg_tern4((r[i] >> 16) & 0xffu), dg_tern4(r[i] >> 24)));]], v)
    elseif f == "sign1" then
      return C.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i) {	// a word: 32 codes = two chunks
	dg_stc(buf, row, (ku * ${nw} + i) * 2,
		make_uint4(dg_sign4(r[i] & 15u), dg_sign4((r[i] >> 4) & 15u),
			   dg_sign4((r[i] >> 8) & 15u), dg_sign4((r[i] >> 12) & 15u)));
	dg_stc(buf, row, (ku * ${nw} + i) * 2 + 1,
		make_uint4(dg_sign4((r[i] >> 16) & 15u), dg_sign4((r[i] >> 20) & 15u),
			   dg_sign4((r[i] >> 24) & 15u), dg_sign4(r[i] >> 28)));
}]], v)
    else
      -- i8x4 codes are copied as they are: nw words = 4·nw codes = one
      -- chunk (chunks are min(16, bk) bytes on this path)
      local val = ({ [4] = "make_uint4(r[0], r[1], r[2], r[3])", [2] = "make_uint2(r[0], r[1])",
                     [1] = "r[0]" })[nw]
      return fmt("dg_stc(buf, row, ku, %s);	// %d codes as they are", val, 4 * nw)
    end
  end
  -- float path: chunks of four f32
  if f == "f32" then
    C.check(nw == 4, "internal: f32 staging unit of %d words", nw)
    return "dg_stc(buf, row, ku, make_uint4(r[0], r[1], r[2], r[3]));	// 4 floats as they are"
  elseif f == "bf16" then
    C.check(nw % 2 == 0, "internal: bf16 staging unit of %d words", nw)
    return C.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; i += 2)	// two words: 4 bf16 = one chunk (bf16 → f32 is << 16)
	dg_stc(buf, row, (ku * ${nw} + i) / 2,
		make_uint4(r[i] << 16, r[i] & 0xffff0000u, r[i + 1] << 16, r[i + 1] & 0xffff0000u));]], v)
  elseif f == "ternary" then
    return C.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i) {	// a word: 16 codes = four chunks
#pragma unroll
	for (int c = 0; c < 4; ++c) {
		const unsigned q = (r[i] >> (8 * c)) & 0xffu;
		dg_stc(buf, row, (ku * ${nw} + i) * 4 + c,
			make_float4(dg_tern1f(q & 3u), dg_tern1f((q >> 2) & 3u),
				    dg_tern1f((q >> 4) & 3u), dg_tern1f(q >> 6)));
	}
}]], v)
  elseif f == "sign1" then
    return C.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i) {	// a word: 32 codes = eight chunks
#pragma unroll
	for (int c = 0; c < 8; ++c) {
		const unsigned q = (r[i] >> (4 * c)) & 15u;
		dg_stc(buf, row, (ku * ${nw} + i) * 8 + c,
			make_float4(dg_sign1f(q & 1u), dg_sign1f(q & 2u),
				    dg_sign1f(q & 4u), dg_sign1f(q & 8u)));
	}
}]], v)
  else -- i8x4 codes → floats, a word = one chunk
    v.lane = C.formats[f].unsigned and "dg_u8f" or "dg_s8f"
    return C.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i)	// a word: 4 codes = one chunk
	dg_stc(buf, row, ku * ${nw} + i,
		make_float4(${lane}(r[i], 0), ${lane}(r[i], 1), ${lane}(r[i], 2), ${lane}(r[i], 3)));]], v)
  end
end

-- The stage bodies name the unit's registers r[...]; point them at `arr`.
local function regs(text, arr)
  return (text:gsub("%f[%w_]r%[", arr .. "["))
end

-- Indents every line of `text` by `n` tabs.
local function indent(text, n)
  local pad = string.rep("\t", n)
  return (text:gsub("([^\n]+)", pad .. "%1"))
end

-- The staging statements at the store loop's depth, under `cond` if any.
local function guarded(text, cond)
  if cond then
    return "\t\t\tif (" .. cond .. ") {\n" .. indent(text, 4) .. "\n\t\t\t}"
  end
  return indent(text, 3)
end

local function relu_of(spec)
  local r = spec.relu
  if r == false or r == nil then return nil end
  C.check(type(r) == "number", "spec.relu=%s: must be false or a number (the threshold)", tostring(r))
  C.check(r == r and r ~= math.huge and r ~= -math.huge, "spec.relu=%s: the threshold must be finite", tostring(r))
  return r
end

local KERNEL = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// output heads (grid z)
constexpr int HIN = ${HIN};		// input heads: 1 = one x shared by every head, else H
constexpr int E = ${E};		// reduction length (embd): the K of the GEMM
constexpr int L = ${L};		// latent width: the N of each head's GEMM

// ---- tile ------------------------------------------------------------------
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};	// block tile, K step (elements)
constexpr int WM = ${WM}, WN = ${WN};		// warps a block: WM rows x WN cols
constexpr int NT = WM * WN * 32;		// threads a block
constexpr int NWARP = WM * WN;
constexpr int TM = BM / WM / 4;		// rows a thread: lr + 4i of its warp's rows
constexpr int TN = BN / WN / 8;		// cols a thread: lc + 8j of its warp's cols
constexpr int KT = E / BK;			// K steps
constexpr int NBUF = ${NBUF};			// shared buffers (2: double-buffered)

// ---- shared memory: each buffer holds the A tile (BM rows of x) then the B
// tile (BN rows of w); a row is BK ${elems} in chunks of CB bytes.
constexpr int CE = ${CE};			// elements a chunk
constexpr int CB = ${CB};			// bytes a chunk
constexpr int CH = BK / CE;			// chunks a row
constexpr int ROWB = CH * CB;			// bytes a row
constexpr int A_BYTES = BM * ROWB;
constexpr int B_BYTES = BN * ROWB;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int SMEM_BYTES = NBUF * STAGE_BYTES;	// ${SMEM} bytes

// Chunk c of row `row` is stored at chunk c ^ ((row / SW_R) % SW_C): a quarter
// warp reads rows lc + 8j (lc = 0..7) of the B tile at once (a 16-byte chunk
// each), and the XOR spreads those eight reads over all 32 banks without
// padding. (Chunks under 16 bytes: consecutive rows are already conflict-free.)
constexpr int SW_R = ${SW_R}, SW_C = ${SW_C};

__device__ __forceinline__ int dg_key(int row)
{
	return (row / SW_R) % SW_C;
}

// Byte offset of chunk c of row `row` in a tile.
__device__ __forceinline__ int dg_off(int row, int c)
{
	return row * ROWB + (c ^ dg_key(row)) * CB;
}

template <typename V>
__device__ __forceinline__ void dg_stc(unsigned char *buf, int row, int c, V v)
{
	*(V *)(buf + dg_off(row, c)) = v;
}

// ---- global → shared staging: units of NW_* consecutive words of one row --
constexpr int EPW_A = ${EPW_A};		// x elements a 32-bit word
constexpr int NW_A = ${NW_A};			// words a unit
constexpr int UA = BK / (EPW_A * NW_A);	// units a tile row
constexpr int SA = (BM * UA + NT - 1) / NT;	// units a thread
constexpr int EPW_B = ${EPW_B};		// w elements a 32-bit word
constexpr int NW_B = ${NW_B};
constexpr int UB = BK / (EPW_B * NW_B);
constexpr int SB = (BN * UB + NT - 1) / NT;

${LOADERS}${OUTSTAGE}
// ---- kernel ----------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(NT)
${SIGNATURE}
{
	__shared__ __align__(16) unsigned char smem[SMEM_BYTES];
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5;
	const int lr = lane >> 3, lc = lane & 7;	// lane's row / col in its warp
	const int wr = warp / WN, wc = warp % WN;	// warp's row / col in the block
	const int M = B * T;
	const unsigned *xw = (const unsigned *)x;	// x as 32-bit words
	const unsigned *ww = (const unsigned *)w;	// w as 32-bit words
	// Blocks walk the tiles (n fastest, then m, then head) with a stride of
	// the grid, so any grid size is correct.
	const int NTN = (L + BN - 1) / BN, NTM = (M + BM - 1) / BM;
	const long long ntile = (long long)NTN * NTM * H;
#pragma unroll 1
	for (long long tile = blockIdx.x; tile < ntile; tile += gridDim.x) {
	const int n0 = (int)(tile % NTN) * BN;
	const int m0 = (int)((tile / NTN) % NTM) * BM;
	const int h = (int)(tile / ((long long)NTN * NTM));

	// Staging slots: unit u = tid + s*NT is (row u / U*, unit u % U*) of the
	// tile; *_src[s] is its first word at k = 0, or null past M / L (zeros).
	const unsigned *a_src[SA];
	const unsigned *b_src[SB];
#pragma unroll
	for (int s = 0; s < SA; ++s) {
		const int u = tid + s * NT, row = u / UA, ku = u % UA;
		const int m = m0 + row;
		a_src[s] = nullptr;
		if (${A_GUARD}m < M) {
			const int b = m / T, t = m - b * T;
			a_src[s] = xw + ((long long)(b * HIN + ${HIN_H}) * T + t) * (E / EPW_A) + ku * NW_A;
		}
	}
#pragma unroll
	for (int s = 0; s < SB; ++s) {
		const int u = tid + s * NT, row = u / UB, ku = u % UB;
		const int n = n0 + row;
		b_src[s] = nullptr;
		if (${B_GUARD}n < L)
			b_src[s] = ww + ((long long)h * L + n) * (E / EPW_B) + ku * NW_B;
	}

	unsigned ra[SA][NW_A], rb[SB][NW_B];	// one K step of staging, in flight
	auto load_step = [&](int kt) {
#pragma unroll
		for (int s = 0; s < SA; ++s)
			dg_ld(ra[s], a_src[s], kt * (BK / EPW_A));
#pragma unroll
		for (int s = 0; s < SB; ++s)
			dg_ld(rb[s], b_src[s], kt * (BK / EPW_B));
	};
	auto store_step = [&](unsigned char *stage) {
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT, row = u / UA, ku = u % UA;
			unsigned char *buf = stage;
${STAGE_A}
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, row = u / UB, ku = u % UB;
			unsigned char *buf = stage + A_BYTES;
${STAGE_B}
		}
	};

	// This thread's rows of the A tile and cols (rows) of the B tile: byte
	// offset of the row and its chunk key.
	int a_row[TM], a_key[TM], b_row[TN], b_key[TN];
#pragma unroll
	for (int i = 0; i < TM; ++i) {
		const int row = wr * (BM / WM) + lr + 4 * i;
		a_row[i] = row * ROWB;
		a_key[i] = dg_key(row);
	}
#pragma unroll
	for (int j = 0; j < TN; ++j) {
		const int row = wc * (BN / WN) + lc + 8 * j;
		b_row[j] = row * ROWB;
		b_key[j] = dg_key(row);
	}

${COMPUTE}

${MAINLOOP}

${EPILOGUE}
	__syncthreads();	// the next tile restages the shared buffers
	}
}
]]

-- Loader: `dg_ld(r, p, off)` reads NW words at p + off (16, 8 or 4 bytes),
-- or zeros when p is null.
local function loaders(nws)
  local w = C.writer()
  w:line("// NW words of one staging unit (one 16/8/4-byte load), zeros for a null row.")
  local seen = {}
  for _, nw in ipairs(nws) do
    if not seen[nw] then
      seen[nw] = true
      w:linef("__device__ __forceinline__ void dg_ld(unsigned (&r)[%d], const unsigned *p, int off)", nw)
      w:line("{")
      w:line("\tif (p) {")
      if nw == 4 then
        w:line("\t\tconst uint4 v = __ldg((const uint4 *)(p + off));")
        w:line("\t\tr[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;")
      elseif nw == 2 then
        w:line("\t\tconst uint2 v = __ldg((const uint2 *)(p + off));")
        w:line("\t\tr[0] = v.x; r[1] = v.y;")
      else
        w:line("\t\tr[0] = __ldg(p + off);")
      end
      w:line("\t} else {")
      w:linef("#pragma unroll\n\t\tfor (int i = 0; i < %d; ++i)\n\t\t\tr[i] = 0u;", nw)
      w:line("\t}")
      w:line("}")
      w:line()
    end
  end
  return w:text()
end

local function compute_text(int_path, act, cb)
  local v = {}
  if int_path then
    v.dp = C.formats[act].unsigned and "dg_dp4a_us" or "dg_dp4a_ss"
    v.VT = ({ [16] = "uint4", [8] = "uint2", [4] = "unsigned" })[cb]
    local comps = cb == 4 and { "" } or ({ ".x", ".y", ".z", ".w" })
    local lines = {}
    for k = 1, cb // 4 do
      lines[#lines + 1] = fmt("\t\t\t\t\tacc[i][j] = %s(a%s, b[j]%s, acc[i][j]);", v.dp, comps[k], comps[k])
    end
    v.DP = table.concat(lines, "\n")
    return C.subst([[
	// Integer sums, exact: acc += Σ x·w four codes at a time.
	int acc[TM][TN];
#pragma unroll
	for (int i = 0; i < TM; ++i)
#pragma unroll
		for (int j = 0; j < TN; ++j)
			acc[i][j] = 0;
	auto compute_step = [&](const unsigned char *stage) {
		const unsigned char *as = stage, *bs = stage + A_BYTES;
		// One chunk (CE codes of K) at a time: the TN B chunks stay in
		// registers, the A chunks stream through. Not unrolled over chunks, so
		// the compiler does not hoist every chunk's loads (register pressure).
#pragma unroll 1
		for (int c = 0; c < CH; ++c) {
			${VT} b[TN];
#pragma unroll
			for (int j = 0; j < TN; ++j)
				b[j] = *(const ${VT} *)(bs + b_row[j] + (c ^ b_key[j]) * CB);
#pragma unroll
			for (int i = 0; i < TM; ++i) {
				const ${VT} a = *(const ${VT} *)(as + a_row[i] + (c ^ a_key[i]) * CB);
#pragma unroll
				for (int j = 0; j < TN; ++j) {
${DP}
				}
			}
		}
	};]], v)
  end
  return [[
	// fp32 sums (FMA), e ascending within a thread.
	float acc[TM][TN];
#pragma unroll
	for (int i = 0; i < TM; ++i)
#pragma unroll
		for (int j = 0; j < TN; ++j)
			acc[i][j] = 0.0f;
	auto compute_step = [&](const unsigned char *stage) {
		const unsigned char *as = stage, *bs = stage + A_BYTES;
		// One 16-byte chunk (4 floats of K) at a time, as in the integer path.
#pragma unroll 1
		for (int c = 0; c < CH; ++c) {
			float4 b[TN];
#pragma unroll
			for (int j = 0; j < TN; ++j)
				b[j] = *(const float4 *)(bs + b_row[j] + (c ^ b_key[j]) * CB);
#pragma unroll
			for (int i = 0; i < TM; ++i) {
				const float4 a = *(const float4 *)(as + a_row[i] + (c ^ a_key[i]) * CB);
#pragma unroll
				for (int j = 0; j < TN; ++j) {
					acc[i][j] = fmaf(a.x, b[j].x, acc[i][j]);
					acc[i][j] = fmaf(a.y, b[j].y, acc[i][j]);
					acc[i][j] = fmaf(a.z, b[j].z, acc[i][j]);
					acc[i][j] = fmaf(a.w, b[j].w, acc[i][j]);
				}
			}
		}
	};]]
end

local MAIN_2 = [[
	// Double-buffered: step kt+1's global loads are issued before step kt is
	// computed and land in the other buffer after it; one barrier a step.
	load_step(0);
	store_step(smem);
	__syncthreads();
#pragma unroll 1
	for (int kt = 0; kt < KT; ++kt) {
		if (kt + 1 < KT)
			load_step(kt + 1);
		compute_step(smem + (kt & 1) * STAGE_BYTES);
		if (kt + 1 < KT)
			store_step(smem + ((kt + 1) & 1) * STAGE_BYTES);
		__syncthreads();
	}]]

local MAIN_1 = [[
	// Single buffer: load, barrier, compute, barrier.
#pragma unroll 1
	for (int kt = 0; kt < KT; ++kt) {
		load_step(kt);
		store_step(smem);
		__syncthreads();
		compute_step(smem);
		__syncthreads();
	}]]

local VEC_TYPES = { [16] = "uint4", [8] = "uint2", [4] = "unsigned", [2] = "unsigned short", [1] = "unsigned char" }

local function epilogue_text(p)
  local w = C.writer()
  w:indent(1)
  w:line("// ---- epilogue: scale, ReLU, convert; the shared buffers are free now.")
  local sc = p.sc
  for _, l in ipairs(C.scale_prologue(sc)) do w:line(l) end
  if not sc.any then w:line("// float × float: y = acc") end
  if p.out_code then
    w:line("const float so_v = *so;			// out scale: codes rint(y · (1/so))")
    w:line("const float so_r = so_v > 0.0f ? __frcp_rn(so_v) : 0.0f;	// one IEEE reciprocal, not a division an element")
    C.check(not sc.vec, "lowrank.lua: output codes need per-tensor input scales")
    for _, l in ipairs(C.code_consts(p.out, p.thr, C.scale_expr(sc) or "1.0f")) do
      w:line(l)
    end
  end
  if not p.mask then
    w:line("float absum = 0.0f;			// Σ|y| of this thread's valid outputs")
  end
  w:line("int o_row[TM];")
  w:line("#pragma unroll")
  w:line("for (int i = 0; i < TM; ++i)")
  w:line("\to_row[i] = wr * (BM / WM) + lr + 4 * i;")
  w:line("int o_col[TN];")
  w:line("#pragma unroll")
  w:line("for (int j = 0; j < TN; ++j)")
  w:line("\to_col[j] = wc * (BN / WN) + lc + 8 * j;")
  if sc.sa_vec then
    w:line("float sa_r[TM];		// the act's scale of each row (per token)")
    w:line("#pragma unroll")
    w:line("for (int i = 0; i < TM; ++i) {")
    w:line("\tconst int m = m0 + o_row[i];")
    w:linef("\tsa_r[i] = m < M ? sa[%s] : 0.0f;", C.x_row(p.HIN, "m"))
    w:line("}")
  end
  if sc.sw_vec then
    w:line("float sw_c[TN];		// the weight's scale of each column (per channel)")
    w:line("#pragma unroll")
    w:line("for (int j = 0; j < TN; ++j) {")
    w:line("\tconst int n = n0 + o_col[j];")
    w:line("\tsw_c[j] = n < L ? sw[h * L + n] : 0.0f;")
    w:line("}")
  end
  if p.staged then
    w:linef("%s *ot = (%s *)smem;	// the output tile, BM x BN, cols XOR-swizzled by row", p.OT, p.OT)
  else
    w:line("long long o_off[TM];	// out offset of each row (-1: past M)")
    w:line("#pragma unroll")
    w:line("for (int i = 0; i < TM; ++i) {")
    w:line("\tconst int m = m0 + o_row[i];")
    w:line("\tconst int b = m / T, t = m - b * T;")
    w:line("\to_off[i] = m < M ? ((long long)(b * H + h) * T + t) * L : -1;")
    w:line("}")
  end
  w:line("#pragma unroll")
  w:line("for (int i = 0; i < TM; ++i) {")
  w:line("#pragma unroll")
  w:line("\tfor (int j = 0; j < TN; ++j) {")
  w:indent(2)
  if p.int_path then
    w:line("const float accf = __int2float_rn(acc[i][j]);")
  else
    w:line("const float accf = acc[i][j];")
  end
  if sc.any then
    w:linef("float y = __fmul_rn(accf, %s);", C.scale_expr(sc, "sa_r[i]", "sw_c[j]"))
  else
    w:line("float y = accf;")
  end
  if p.mask then
    -- relu_mask: the forward's y - thr, bit for bit; its sign is the mask
    w:linef("y = __fsub_rn(y, %s);	// the forward's relu(y - thr) is > 0 here", p.thr)
    w:line("if (m0 + o_row[i] < M && n0 + o_col[j] < L) {")
    w:line("\tconst long long o = o_off[i] + n0 + o_col[j];")
    w:line("\tgrad_out[o] = y > 0.0f ? grad[o] : 0.0f;")
    w:line("}")
    w:indent(-2)
    w:line("\t}")
    w:line("}")
    return w:text()
  end
  if p.thr then
    w:linef("y = __fsub_rn(y, %s);	// relu(y - thr)", p.thr)
    w:line("y = y > 0.0f ? y : 0.0f;")
  end
  w:line("const bool ok = m0 + o_row[i] < M && n0 + o_col[j] < L;")
  w:line("if (ok)")
  w:line("\tabsum += fabsf(y);")
  local conv
  if p.out == "f32" then
    conv = "y"
  elseif p.out == "bf16" then
    conv = "dg_f32_to_bf16(y)"
  else
    -- codes: two FMAs from the sum (dragon/ref.h, dg_code_t)
    w:line("const int cv = __float_as_int(dg_code_t(accf, a1, b1, CR, CLOM)) - 0x4b400000;")
    conv = p.out == "int8" and "(signed char)cv" or "(unsigned char)cv"
  end
  w:linef("const %s v = %s;", p.OT, conv)
  if p.staged then
    w:line("ot[o_row[i] * BN + dg_ocol(o_row[i], o_col[j])] = v;")
  else
    w:line("if (ok)")
    w:line("\tout[o_off[i] + n0 + o_col[j]] = v;")
  end
  w:indent(-2)
  w:line("\t}")
  w:line("}")
  if p.staged then
    w:line(C.subst([[
// Coalesced stores of the staged tile: VE elements (${VB} bytes) a store, a
// row's vectors consecutive across threads. L % VE == 0, so a vector is
// wholly inside or wholly past the last column.
__syncthreads();
#pragma unroll
for (int v = tid; v < BM * (BN / VE); v += NT) {
	const int r = v / (BN / VE), c = (v - r * (BN / VE)) * VE;
	const int m = m0 + r, n = n0 + c;
	if (m < M && n < L) {
		const int b = m / T, t = m - b * T;
		*(${VT} *)(out + ((long long)(b * H + h) * T + t) * L + n) =
			*(const ${VT} *)(ot + r * BN + dg_ocol(r, c));
	}
}]], { VB = p.VB, VT = VEC_TYPES[p.VB] }))
  end
  w:line([[
// Σ|y| of the block: warp shuffles, then the warps in order, one atomic.
if (out_absum) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		absum += __shfl_xor_sync(0xffffffffu, absum, o);
	float *red = (float *)smem;
	__syncthreads();	// every read of the shared buffers is done
	if (lane == 0)
		red[warp] = absum;
	__syncthreads();
	if (tid == 0) {
		float sum = 0.0f;
		for (int i = 0; i < NWARP; ++i)
			sum += red[i];
		atomicAdd(out_absum, sum);
	}
}]])
  return w:text()
end

-- The SIMT kernel: dp4a (integer × integer) or fp32 FMA (any float operand).
local function render_simt(spec, k)
  local H, HIN, E, L = k.H, k.HIN, k.E, k.L
  local act, weight, out, thr = k.act, k.weight, k.out, k.thr
  local bm, bn, bk, wm, wn, stages = k.bm, k.bn, k.bk, k.wm, k.wn, k.stages
  local mask = k.mask

  local fa, fw = C.formats[act], C.formats[weight]
  local int_path = fa.code and fw.code
  local P = int_path and 1 or 4  -- shared bytes an element
  -- Shared tiles are rows of chunks: 16 bytes (16 codes or 4 floats), or the
  -- whole row when an integer row is shorter (bk 4 or 8).
  local CB = int_path and math.min(16, bk) or 16 -- bytes a chunk
  local CE = CB // P                              -- elements a chunk

  -- plan checked the tile (M.plan): warp grids, BK against E and the
  -- packed words, the static shared memory
  local nbuf = math.min(stages, 2)
  local smem = k.smem

  local ch = bk // CE
  local sw_r, sw_c = 1, 1
  if C.is_pow2(ch) then
    sw_c = math.min(ch, 8)
    sw_r = math.max(1, 8 // ch)
  end

  local nt = wm * wn * 32
  local nw_a = load_words(bk // fa.epw)
  local nw_b = load_words(bk // fw.epw)
  local ua, ub = bk // (fa.epw * nw_a), bk // (fw.epw * nw_b)
  local a_guard = (bm * ua) % nt ~= 0 and "u < BM * UA && " or ""
  local b_guard = (bn * ub) % nt ~= 0 and "u < BN * UB && " or ""

  local ot = C.out_types[mask and "f32" or out]
  local osz = ot.size
  local staged = not mask and bm * bn * osz <= smem
  local vb = 16
  while (L * osz) % vb ~= 0 or (bn * osz) % vb ~= 0 do vb = vb // 2 end
  -- Output staging swizzle: element (r, c) at column c ^ osw(r), osw(r) =
  -- ((r / OSW_R) % OSW_C) · (32 / osz): a row is RB 32-byte groups, and the
  -- warp's 4 lane rows must land in 4 different groups of a 128-byte line.
  local osw_r, osw_c = 1, 1
  local rb = (bn * osz) // 32
  if (bn * osz) % 32 == 0 and C.is_pow2(rb) then
    osw_c = math.min(rb, 4)
    osw_r = math.max(1, 4 // rb)
  end

  local helpers = { code = (not mask and (out == "int8" or out == "uint8pos")) or nil,
                    bf16 = (not mask and out == "bf16") or nil }
  if int_path then
    helpers.dp4a = true
    if weight == "ternary" then helpers.ternary = true end
    if weight == "sign1" then helpers.sign1 = true end
  else
    if weight == "ternary" then helpers.ternary = true end
    if weight == "sign1" then helpers.sign1 = true end
    if fa.code or fw.code then helpers.i8x4f = true end
  end

  local p = {
    int_path = int_path, act_code = fa.code, w_code = fw.code, sc = k.sc, HIN = HIN,
    out = out, OT = ot.ctype, staged = staged, VB = vb, mask = mask,
    out_code = not mask and (out == "int8" or out == "uint8pos"),
    thr = thr and C.cfloat(thr) or nil,
  }

  local vars = {
    H = H, HIN = HIN, E = E, L = L,
    BM = bm, BN = bn, BK = bk, WM = wm, WN = wn, NBUF = nbuf,
    elems = int_path and "codes of one byte" or "floats",
    CE = CE, CB = CB, SMEM = smem, SW_R = sw_r, SW_C = sw_c,
    EPW_A = fa.epw, NW_A = nw_a, EPW_B = fw.epw, NW_B = nw_b,
    LOADERS = loaders({ nw_a, nw_b }),
    XT = fa.ctype, WT = fw.ctype, OT = ot.ctype,
    SIGNATURE = k.signature(fa.ctype, fw.ctype),
    A_GUARD = a_guard, B_GUARD = b_guard,
    HIN_H = HIN == 1 and "0" or "h",
    STAGE_A = guarded(regs(stage_body(act, int_path, nw_a), "ra[s]"), a_guard ~= "" and "u < BM * UA"),
    STAGE_B = guarded(regs(stage_body(weight, int_path, nw_b), "rb[s]"), b_guard ~= "" and "u < BN * UB"),
    COMPUTE = compute_text(int_path, act, CB),
    MAINLOOP = nbuf == 2 and MAIN_2 or MAIN_1,
    EPILOGUE = epilogue_text(p),
  }

  local path
  if int_path then
    path = fmt("integer × integer: dp4a.%s, exact int32 sums", fa.unsigned and "u32.s32" or "s32.s32")
  else
    path = "float: operands converted to f32 while staging, fp32 FMA sums"
  end
  local about = k.about(path, nt, fmt("shared memory %d bytes (static); epilogue %s.", smem,
    mask and "direct stores of grad · mask" or
    (staged and fmt("staged through shared memory, %d-byte stores", vb) or "direct stores")))

  vars.OUTSTAGE = ""
  if staged then
    vars.OUTSTAGE = C.subst([[
// ---- output staging: the BM x BN tile in shared memory, element (r, c) at
// column dg_ocol(r, c), so the 4 lane rows of a warp write 4 different
// 32-byte bank groups; VE elements a global store.
constexpr int OSW_R = ${OSW_R}, OSW_C = ${OSW_C};
constexpr int VE = ${VE};

__device__ __forceinline__ int dg_ocol(int r, int c)
{
	return c ^ ((r / OSW_R) % OSW_C) * ${GROUP};
}
]], { OSW_R = osw_r, OSW_C = osw_c, VE = vb // osz, GROUP = 32 // osz })
  end

  local w = C.writer()
  w:line(C.banner(spec, "lowrank.lua", about))
  w:line(C.helpers(helpers))
  w:line(C.subst(KERNEL, vars))
  return w:text()
end

--[[
Which path a spec takes (M.plan decides; render follows it):
  wgmma (sm_90a) lowrank_fwd, act and weight integer codes, arch sm_90a, a
                 warpgroup tile (templates/lowrank_wgmma.lua M.fits): the
                 whole E resident, one FMA an output, stores from registers;
  wgmma bf16     the same kernel for bf16 act × bf16 weight (E % 16 == 0,
  (sm_90a)       L % 16 == 0, E·2·(BM + 3·BN) within 227 KiB); other shapes
                 fall back to fp32 (the auto tile) or are refused (a
                 warpgroup tile the SIMT rules refuse);
  tensor cores   act and weight integer codes, BK a multiple of 32 (so
                 E % 32 == 0), the warp tile (BM/WM x BN/WN) whole 16x8
                 fragments: mma.sync s8 (u8 for uint8pos acts) — the fast path;
  dp4a (SIMT)    integer × integer otherwise (small or odd tiles, E % 32 != 0,
                 arch below sm_80);
  fp32 (SIMT)    any float operand.
]]

-- The spec's fields as the plan and the renderers read them.
local function fields(spec)
  C.check(spec.op == "lowrank_fwd" or spec.op == "relu_mask",
          "lowrank.lua renders ops lowrank_fwd and relu_mask, not %s", tostring(spec.op))
  local k = { op = spec.op, mask = spec.op == "relu_mask" }
  k.H = C.int_field(spec, "heads", 1)
  k.HIN = C.int_field(spec, "in_heads", 1)
  k.E = C.int_field(spec, "embd", 1)
  k.L = C.int_field(spec, "latent", 1)
  k.act = C.one_of(spec, "act", ACTS)
  k.weight = C.one_of(spec, "weight", WEIGHTS)
  k.out = k.mask and "f32" or C.one_of(spec, "out", OUTS)
  k.thr = relu_of(spec)
  k.arch = C.int_field(spec, "arch", 1)
  k.arch_specific = spec.arch_specific == true
  k.entry = k.mask and "dg_relu_mask" or "dg_lowrank_fwd"
  k.sc = C.scale_kind(spec, C.formats[k.act], C.formats[k.weight])
  return k
end

-- The heuristic default tile (from sweeps on the H200, bench/kernels
-- --tile and `dragon-gen tune`, BDH shape, M = 4096):
--   wgmma (sm_90a) 128x64/8x1/2: two warpgroups of 64 rows, E resident,
--     64 latent columns a tile, two blocks an SM — 122 us int8 out;
--     256x64/16x1/2 125, 128x128/8x1/2 142, 64x64/4x1/2 205;
--   wgmma bf16 (sm_90a) the same 128x64/8x1/2 (not yet timed): 160 KiB of
--     shared memory at E = 256, one block an SM (256x64 fits too, 224 KiB;
--     128x128 does not);
--   tensor cores 128x128x64/2x4/4 (64x32 warp tiles, 2 blocks an SM): 277
--     us int8 out; 4x2 warps 312, 64x128 329, 64x64 389, 128x64 334, 64x256
--     349; K = embd in 4 steps at BDH (the whole K in flight);
--   SIMT (dp4a / fp32): 64x64 blocks of 2x2 warps (128 threads, 32
--     outputs a thread); BK the largest step up to 64 (codes) or 32
--     (floats) that divides E and whole storage words, double-buffered.
local function default_tile(k)
  local fa, fw = C.formats[k.act], C.formats[k.weight]
  local ints = fa.code and fw.code
  local LW = require("lowrank_wgmma")
  if LW.operands(k) and k.op == "lowrank_fwd" and k.arch == 90 and k.arch_specific then
    -- the K step is unused there (the whole E is resident): the largest of
    -- 64, 32, 16 that divides E, so that the plan's BK checks pass
    local bk = 64
    while k.E % bk ~= 0 and bk > 16 do bk = bk // 2 end
    local t = { bm = 128, bn = 64, bk = bk, wm = 8, wn = 1, stages = 2, threads = 0 }
    if LW.fits(k, t) then return t end
  end
  if ints and k.arch >= 80 and k.E % 32 == 0 then
    return { bm = 128, bn = 128, bk = k.E % 64 == 0 and 64 or 32, wm = 2, wn = 4, stages = 4, threads = 0 }
  end
  local cpw = math.max(4, C.codes_per_word(k.act), C.codes_per_word(k.weight))
  local bk = ints and 64 or 32
  while k.E % bk ~= 0 and bk > cpw do bk = bk // 2 end
  return { bm = 64, bn = 64, bk = bk, wm = 2, wn = 2, stages = 2, threads = 0 }
end

local function plan_of(k, t, path, arch_specific, threads, smem, dyn)
  k.bm, k.bn, k.bk, k.wm, k.wn, k.stages = t.bm, t.bn, t.bk, t.wm, t.wn, t.stages
  return { tile = t, path = path, arch_specific = arch_specific, name = k.op .. ".cu",
           smem_bytes = smem,
           entries = { { name = k.entry, threads = threads, smem = dyn and smem or 0 } } }
end

function M.plan(spec)
  local k = fields(spec)
  local t = C.tile_of(spec)
  local auto = C.tile_is_auto(t)
  if auto then t = default_tile(k) end
  local ok, err = C.gemm_tile_pow2(t, auto)
  if not ok then return nil, err end
  local cpw = math.max(C.codes_per_word(k.weight), C.codes_per_word(k.act))
  if t.bk % cpw ~= 0 then
    return C.refuse(t, auto, "BK must be a multiple of %d (weight=%s act=%s pack that many codes a word)",
                    cpw, k.weight, k.act)
  end
  ok, err = C.bk_divides(t, auto, k.E, "embd")
  if not ok then return nil, err end
  local fa, fw = C.formats[k.act], C.formats[k.weight]
  local ints = fa.code and fw.code
  local LW = require("lowrank_wgmma")
  if LW.fits(k, t) then
    return plan_of(k, t, LW.operands(k) == "bf16" and "wgmma bf16" or "wgmma", true, t.bm // 64 * 128,
                   LW.smem(k, t), true)
  end
  ok, err = C.warps_ok(t, auto)
  if ok then ok, err = C.simt_warp_tile(t, auto) end
  if ok then ok, err = C.stages_ok(t, auto, 1, 4) end
  if not ok then return nil, err end
  local nt = t.wm * t.wn * 32
  local MMA = require("mma")
  if ints and MMA.fits(k.arch, t.bm, t.bn, t.bk, t.wm, t.wn) then
    -- registers a thread: the int32 accumulators plus the A fragments of
    -- one K chunk (two rows of KC/4 bytes an m16 tile)
    local acc = (t.bm // t.wm) * (t.bn // t.wn) // 32
    local afrag = (t.bm // t.wm // 16) * 2 * (t.bk % 64 == 0 and 4 or 2)
    if acc + afrag > 128 then
      return C.refuse(t, auto, "the tensor-core path needs %d accumulator and %d fragment registers a thread; at most 128 (more warps or a smaller tile)",
                      acc, afrag)
    end
    -- the pipeline, and the output tile staged in the same buffer
    local mp = MMA.plan(t.bm, t.bn, t.bk, t.wm, t.wn, t.stages, k.weight)
    local osz = k.mask and 1 or C.out_types[k.out].size
    local smem = math.max(mp.pipe, t.bm * (t.bn * osz + math.max(16, 8 * osz)), 4 * t.wm * t.wn)
    ok, err = C.smem_fits(t, auto, smem, k.arch, false)
    if not ok then return nil, err end
    return plan_of(k, t, "mma.sync", false, nt, smem, true)
  end
  local smem = math.min(t.stages, 2) * (t.bm + t.bn) * t.bk * (ints and 1 or 4)
  ok, err = C.smem_fits(t, auto, smem, k.arch, true)
  if not ok then return nil, err end
  return plan_of(k, t, ints and "dp4a" or "fp32", false, nt, smem, false)
end

function M.render(spec, plan)
  local k = fields(spec)
  local t = plan.tile
  k.bm, k.bn, k.bk, k.wm, k.wn, k.stages = t.bm, t.bn, t.bk, t.wm, t.wn, t.stages
  k.smem = plan.smem_bytes
  k.threads = plan.entries[1].threads

  local ot = C.out_types[k.out].ctype
  k.signature = function(xt, wt)
    if k.mask then
      return fmt("dg_relu_mask(const %s *__restrict__ x, const %s *__restrict__ w,\n"
        .. "\t     const float *__restrict__ sa, const float *__restrict__ sw,\n"
        .. "\t     const float *grad, float *grad_out, int B, int T)", xt, wt)
    end
    return fmt("dg_lowrank_fwd(const %s *__restrict__ x, const %s *__restrict__ w,\n"
      .. "\t       const float *__restrict__ sa, const float *__restrict__ sw,\n"
      .. "\t       %s *__restrict__ out, const float *__restrict__ so,\n"
      .. "\t       float *__restrict__ out_absum, int B, int T)", xt, wt, ot)
  end
  k.about = function(path, nt, extra)
    local fa, fw = C.formats[k.act], C.formats[k.weight]
    local t = {}
    if k.mask then
      t[#t + 1] = "relu_mask: grad_out[b,h,t,l] = (s · Σ_e x[b,hin(h),t,e] · w[h,l,e] − thr) > 0 ? grad : 0"
      t[#t + 1] = ""
      t[#t + 1] = fmt("extern \"C\" __global__ void dg_relu_mask(const %s *x, const %s *w,", fa.ctype, fw.ctype)
      t[#t + 1] = "    const float *sa, const float *sw, const float *grad, float *grad_out, int B, int T)"
    else
      t[#t + 1] = "lowrank_fwd: out[b,h,t,l] = " .. (k.thr and "relu(" or "") ..
        "s · Σ_e x[b,hin(h),t,e] · w[h,l,e]" .. (k.thr and " − thr)" or "")
      t[#t + 1] = ""
      t[#t + 1] = fmt("extern \"C\" __global__ void dg_lowrank_fwd(const %s *x, const %s *w,", fa.ctype, fw.ctype)
      t[#t + 1] = fmt("    const float *sa, const float *sw, %s *out, const float *so, float *out_absum,", ot)
      t[#t + 1] = "    int B, int T)"
    end
    t[#t + 1] = fmt("grid: any number of blocks (they stride over the ceil(B*T/%d)·ceil(%d/%d)·%d tiles);",
                    k.bm, k.L, k.bn, k.H)
    t[#t + 1] = fmt("block %d threads; x, w, out (grad, grad_out) 16-byte aligned.", nt)
    t[#t + 1] = fmt("x (B, %d, T, %d) %s; w (%d, %d, %d) %s; %s (B, %d, T, %d) %s.", k.HIN, k.E, k.act,
                    k.H, k.L, k.E, k.weight, k.mask and "grad, grad_out" or "out", k.H, k.L,
                    k.mask and "f32" or k.out)
    t[#t + 1] = "path: " .. path .. "."
    t[#t + 1] = extra
    return t
  end

  if plan.path == "wgmma" or plan.path == "wgmma bf16" then
    return require("lowrank_wgmma").render(spec, k)
  elseif plan.path == "mma.sync" then
    return require("lowrank_mma").render(spec, k)
  end
  return render_simt(spec, k)
end

return M

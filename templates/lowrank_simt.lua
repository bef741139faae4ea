--[[
lowrank_simt.lua — the SIMT paths of lowrank_fwd and relu_mask
(templates/lowrank.lua picks them with M.plan and calls M.render with the
spec's fields; the ABI and the epilogue's arithmetic are lowrank.lua's):
dp4a (integer × integer, codes staged into shared memory as i8x4 bytes,
ternary and sign1 decoded on the way) and fp32 FMA (any float operand,
each operand converted to f32 while staging).

SIMT tile: block bm × bn, K step bk, wm × wn warps; a warp's 32 lanes are 4
rows × 8 cols, a thread owns TM = bm/wm/4 rows (strided by 4) by TN =
bn/wn/8 cols (strided by 8). stages = 1: one shared buffer (load, sync,
compute, sync); stages >= 2: two buffers, the next K step's global loads in
flight (in registers) while the current one is computed. Shared memory:
min(stages, 2)·(bm + bn)·bk·P bytes (P = 1 codes, 4 floats), static (48 KiB
at most), reused by the epilogue to stage the output tile when it fits.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local SCL = require("scales")
local fmt = string.format

local M = {}

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
      v.q = FM.quad(FM.i8x4_of_word(f, "r[i]"), 1, ",\n\t\t\t   ")
      return EMIT.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i)	// a word: 16 codes = one chunk
	dg_stc(buf, row, ku * ${nw} + i,
		make_uint4(${q}));]], v)
    elseif f == "sign1" then
      local t = FM.i8x4_of_word(f, "r[i]")
      v.q0, v.q1 = FM.quad(t, 1, ",\n\t\t\t   "), FM.quad(t, 5, ",\n\t\t\t   ")
      return EMIT.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i) {	// a word: 32 codes = two chunks
	dg_stc(buf, row, (ku * ${nw} + i) * 2,
		make_uint4(${q0}));
	dg_stc(buf, row, (ku * ${nw} + i) * 2 + 1,
		make_uint4(${q1}));
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
    SPEC.check(nw == 4, "internal: f32 staging unit of %d words", nw)
    return "dg_stc(buf, row, ku, make_uint4(r[0], r[1], r[2], r[3]));	// 4 floats as they are"
  elseif f == "bf16" then
    SPEC.check(nw % 2 == 0, "internal: bf16 staging unit of %d words", nw)
    return EMIT.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; i += 2)	// two words: 4 bf16 = one chunk (bf16 → f32 is << 16)
	dg_stc(buf, row, (ku * ${nw} + i) / 2,
		make_uint4(r[i] << 16, r[i] & 0xffff0000u, r[i + 1] << 16, r[i + 1] & 0xffff0000u));]], v)
  elseif f == "ternary" then
    v.q = FM.quad(FM.floats_of_unit(f, "q"), 1, ",\n\t\t\t\t    ")
    return EMIT.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i) {	// a word: 16 codes = four chunks
#pragma unroll
	for (int c = 0; c < 4; ++c) {
		const unsigned q = (r[i] >> (8 * c)) & 0xffu;
		dg_stc(buf, row, (ku * ${nw} + i) * 4 + c,
			make_float4(${q}));
	}
}]], v)
  elseif f == "sign1" then
    v.q = FM.quad(FM.floats_of_unit(f, "q"), 1, ",\n\t\t\t\t    ")
    return EMIT.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i) {	// a word: 32 codes = eight chunks
#pragma unroll
	for (int c = 0; c < 8; ++c) {
		const unsigned q = (r[i] >> (4 * c)) & 15u;
		dg_stc(buf, row, (ku * ${nw} + i) * 8 + c,
			make_float4(${q}));
	}
}]], v)
  else -- i8x4 codes → floats, a word = one chunk
    v.q = FM.quad(FM.floats_of_unit(f, "r[i]"))
    return EMIT.subst([[
#pragma unroll
for (int i = 0; i < ${nw}; ++i)	// a word: 4 codes = one chunk
	dg_stc(buf, row, ku * ${nw} + i,
		make_float4(${q}));]], v)
  end
end

-- The stage bodies name the unit's registers r[...]; point them at `arr`.
local function regs(text, arr)
  return (text:gsub("%f[%w_]r%[", arr .. "["))
end

local indent = EMIT.indent

-- The staging statements at the store loop's depth, under `cond` if any.
local function guarded(text, cond)
  if cond then
    return "\t\t\tif (" .. cond .. ") {\n" .. indent(text, 4) .. "\n\t\t\t}"
  end
  return indent(text, 3)
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
  local w = EMIT.writer()
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
    v.dp = FM.formats[act].unsigned and "dg_dp4a_us" or "dg_dp4a_ss"
    v.VT = ({ [16] = "uint4", [8] = "uint2", [4] = "unsigned" })[cb]
    local comps = cb == 4 and { "" } or ({ ".x", ".y", ".z", ".w" })
    local lines = {}
    for k = 1, cb // 4 do
      lines[#lines + 1] = fmt("\t\t\t\t\tacc[i][j] = %s(a%s, b[j]%s, acc[i][j]);", v.dp, comps[k], comps[k])
    end
    v.DP = table.concat(lines, "\n")
    return EMIT.subst([[
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
  local w = EMIT.writer()
  w:indent(1)
  w:line("// ---- epilogue: scale, ReLU, convert; the shared buffers are free now.")
  local sc = p.sc
  for _, l in ipairs(SCL.scale_prologue(sc)) do w:line(l) end
  if not sc.any then w:line("// float × float: y = acc") end
  if p.out_code then
    w:line("const float so_v = *so;			// out scale: codes rint(y · (1/so))")
    w:line("const float so_r = so_v > 0.0f ? __frcp_rn(so_v) : 0.0f;	// one IEEE reciprocal, not a division an element")
    SPEC.check(not sc.vec, "lowrank.lua: output codes need per-tensor input scales")
    for _, l in ipairs(SCL.code_consts(p.out, p.thr, SCL.scale_expr(sc) or "1.0f")) do
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
    w:linef("\tsa_r[i] = m < M ? sa[%s] : 0.0f;", SCL.x_row(p.HIN, "m"))
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
    w:linef("float y = __fmul_rn(accf, %s);", SCL.scale_expr(sc, "sa_r[i]", "sw_c[j]"))
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
    w:line(EMIT.subst([[
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
function M.render(spec, k)
  local H, HIN, E, L = k.H, k.HIN, k.E, k.L
  local act, weight, out, thr = k.act, k.weight, k.out, k.thr
  local bm, bn, bk, wm, wn, stages = k.bm, k.bn, k.bk, k.wm, k.wn, k.stages
  local mask = k.mask

  local fa, fw = FM.formats[act], FM.formats[weight]
  local int_path = fa.code and fw.code
  local P = int_path and 1 or 4  -- shared bytes an element
  -- Shared tiles are rows of chunks: 16 bytes (16 codes or 4 floats), or the
  -- whole row when an integer row is shorter (bk 4 or 8).
  local CB = int_path and math.min(16, bk) or 16 -- bytes a chunk
  local CE = CB // P                              -- elements a chunk

  -- lowrank.lua M.plan checked the tile: warp grids, BK against E and the
  -- packed words, the static shared memory
  local nbuf = math.min(stages, 2)
  local smem = k.smem

  local ch = bk // CE
  local sw_r, sw_c = 1, 1
  if TILES.is_pow2(ch) then
    sw_c = math.min(ch, 8)
    sw_r = math.max(1, 8 // ch)
  end

  local nt = wm * wn * 32
  local nw_a = load_words(bk // fa.epw)
  local nw_b = load_words(bk // fw.epw)
  local ua, ub = bk // (fa.epw * nw_a), bk // (fw.epw * nw_b)
  local a_guard = (bm * ua) % nt ~= 0 and "u < BM * UA && " or ""
  local b_guard = (bn * ub) % nt ~= 0 and "u < BN * UB && " or ""

  local ot = FM.out_types[mask and "f32" or out]
  local osz = ot.size
  local staged = not mask and bm * bn * osz <= smem
  local vb = 16
  while (L * osz) % vb ~= 0 or (bn * osz) % vb ~= 0 do vb = vb // 2 end
  -- Output staging swizzle: element (r, c) at column c ^ osw(r), osw(r) =
  -- ((r / OSW_R) % OSW_C) · (32 / osz): a row is RB 32-byte groups, and the
  -- warp's 4 lane rows must land in 4 different groups of a 128-byte line.
  local osw_r, osw_c = 1, 1
  local rb = (bn * osz) // 32
  if (bn * osz) % 32 == 0 and TILES.is_pow2(rb) then
    osw_c = math.min(rb, 4)
    osw_r = math.max(1, 4 // rb)
  end

  local helpers = { code = (not mask and (out == "int8" or out == "uint8pos")) or nil,
                    bf16 = (not mask and out == "bf16") or nil }
  FM.decoders(weight, helpers)
  if int_path then
    helpers.dp4a = true
  elseif fa.code or fw.code then
    helpers.i8x4f = true -- the lanes of an i8x4 operand as floats
  end

  local p = {
    int_path = int_path, act_code = fa.code, w_code = fw.code, sc = k.sc, HIN = HIN,
    out = out, OT = ot.ctype, staged = staged, VB = vb, mask = mask,
    out_code = not mask and (out == "int8" or out == "uint8pos"),
    thr = thr and EMIT.cfloat(thr) or nil,
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
    vars.OUTSTAGE = EMIT.subst([[
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

  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "lowrank.lua", about))
  w:line(DEV.helpers(helpers))
  w:line(EMIT.subst(KERNEL, vars))
  return w:text()
end

return M

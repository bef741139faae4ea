--[[
grad_simt.lua — the fp32 SIMT path of the four gradient GEMMs
(templates/grad.lua picks it with M.plan where neither tensor-core path
runs: sm < 80, or a tile they cannot take; the ABI, the grids and the
splits are grad.lua's, the per-op addressing grad_ops.lua's).

SIMT path: fp32 FMA on a block tile. The gradient is a float (a bf16 one
widened exactly as it is loaded), so an exact integer path (dp4a) does not
apply; the integer operand's codes
are decoded to floats exactly (|code| <= 255) while they are staged into
shared memory, and its scale multiplies the f32 sum once at the end.
Shared tiles are k-major —
As[k][m], Bs[k][n] — so the inner loop reads a column of A and a row of B
per k:
  * A (the f32 gradient) is K-major in the grad_input ops (a row of grad
    is contiguous along the reduction): 16-byte loads along k, transposed
    into As whose rows are padded by one float, so the scattered stores do
    not collide in a bank. In the grad_weight ops A is M-major (contiguous
    along l or d): 16-byte loads land as 16-byte stores, no transpose.
  * B (weight or activation, any storage format) is N-major in all four
    ops: one unit (4 values, or one ternary / sign1 word) a thread, decoded
    to floats and stored as float4s along the row.
  * a warp's 32 lanes are 4 rows × 8 cols of its tile; a thread owns
    TM = bm/wm/4 rows (strided by 4) by TN = bn/wn/8 cols (strided by 8), so
    each k reads 4 distinct A words and 8 consecutive B words a warp
    (broadcasts, no conflicts), and stores write 8 consecutive floats a row.
  * stages >= 2: two shared buffers, the next K step's global loads in
    flight in registers while the current one is computed (one barrier a
    step) — when two buffers fit in 48 KiB of static shared memory; a tile
    that fits only once runs single-buffered.
]]
local EMIT = require("emit")
local FM = require("formats")
local DEV = require("device")
local GOPS = require("grad_ops")
local fmt = string.format

local M = {}

-- ---- the B operand: decode units of one storage format -----------------------

-- How one staging unit of format f is loaded and decoded: EU values along n,
-- NWB raw 32-bit words in flight, the load statement (fills r[] from the
-- word pointer p at element n) and the decode statement (writes EU floats at
-- bd, 16-byte aligned, from r[]).
local function b_unit(f, bn)
  local F = FM.formats[f]
  if f == "f32" then
    return { EU = 4, NWB = 4,
      load = "const uint4 v = __ldg((const uint4 *)(p + n));\n" ..
             "r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;",
      decode = "*(float4 *)bd = make_float4(__uint_as_float(r[0]), __uint_as_float(r[1]),\n" ..
               "\t\t\t\t  __uint_as_float(r[2]), __uint_as_float(r[3]));" }
  elseif f == "bf16" then
    return { EU = 4, NWB = 2,
      load = "const uint2 v = __ldg((const uint2 *)(p + n / 2));\n" ..
             "r[0] = v.x; r[1] = v.y;",
      decode = "*(float4 *)bd = make_float4(__uint_as_float(r[0] << 16), __uint_as_float(r[0] & 0xffff0000u),\n" ..
               "\t\t\t\t  __uint_as_float(r[1] << 16), __uint_as_float(r[1] & 0xffff0000u));" }
  elseif f == "ternary" then
    return { EU = 16, NWB = 1,
      load = "r[0] = __ldg(p + n / 16);",
      decode = fmt([[
#pragma unroll
for (int c = 0; c < 4; ++c) {	// 16 codes = four float4
	const unsigned q = (r[0] >> (8 * c)) & 0xffu;
	*(float4 *)(bd + 4 * c) = make_float4(%s);
}]], FM.quad(FM.floats_of_unit(f, "q"), 1, ",\n\t\t\t\t\t       ")) }
  elseif f == "sign1" then
    -- bn 16: a unit is half a word (the shift picks the half)
    local eu = math.min(32, bn)
    return { EU = eu, NWB = 1,
      load = "r[0] = __ldg(p + n / 32) >> (n % 32);",
      decode = fmt([[
#pragma unroll
for (int c = 0; c < %d; ++c) {	// %d codes = %d float4
	const unsigned q = (r[0] >> (4 * c)) & 15u;
	*(float4 *)(bd + 4 * c) = make_float4(%s);
}]], eu // 4, eu, eu // 4, FM.quad(FM.floats_of_unit(f, "q"), 1, ",\n\t\t\t\t\t       ")) }
  else -- i8x4 codes: int8, int4, uint8pos
    return { EU = 4, NWB = 1,
      load = "r[0] = __ldg(p + n / 4);",
      decode = fmt("*(float4 *)bd = make_float4(%s);", FM.quad(FM.floats_of_unit(f, "r[0]"))) }
  end
end

-- Values a B staging unit of format f holds along n (grad.lua M.plan: BN
-- must be a multiple).
function M.unit_eu(f, bn)
  return b_unit(f, bn).EU
end

local indent = EMIT.indent

-- ---- the kernel ---------------------------------------------------------------

local HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int HIN = ${HIN};		// input heads of the projection: 1 or H
constexpr int E = ${E};		// embd
constexpr int L = ${L};		// latent width per head
typedef ${GT} GT;		// the gradient read (grad): ${gfmt}
typedef ${OT} OT;		// decoder_grad_input's grad_y: ${ofmt}

// Four consecutive values of A (16-byte aligned f32, 8-byte aligned bf16,
// widened exactly) as floats.
__device__ __forceinline__ float4 dg_a4(const float *p)
{
	return __ldg((const float4 *)p);
}

__device__ __forceinline__ float4 dg_a4(const unsigned short *p)
{
	const uint2 u = __ldg((const uint2 *)p);
	return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
			   __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// ---- tile ------------------------------------------------------------------
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};	// block tile, K step
constexpr int WM = ${WM}, WN = ${WN};		// warps a block: WM rows x WN cols
constexpr int NT = WM * WN * 32;		// threads a block
constexpr int TM = BM / WM / 4;		// rows a thread: lr + 4i of its warp's rows
constexpr int TN = BN / WN / 8;		// cols a thread: lc + 8j of its warp's cols
constexpr int NBUF = ${NBUF};			// shared buffers (2: double-buffered)

// ---- shared memory (floats): As[k][m] at k*PA + m, then Bs[k][n] at
// A_FL + k*BN + n, a buffer each stage.
constexpr int PA = ${PA};		// A row pitch: ${PA_WHY}
constexpr int A_FL = BK * PA;
constexpr int B_FL = BK * BN;
constexpr int STAGE_FL = A_FL + B_FL;
constexpr int SMEM_FL = NBUF * STAGE_FL;	// ${SMEM} bytes

// ---- staging: A in float4 units, B in units of EU_B values (${bfmt})
constexpr int UA = ${UA};			// A units a tile row (${UA_WHY})
constexpr int A_UNITS = ${A_UNITS};
constexpr int SA = (A_UNITS + NT - 1) / NT;	// A units a thread
constexpr int EPW_B = ${EPW_B};		// B values a 32-bit storage word
constexpr int EU_B = ${EU_B};		// B values a unit
constexpr int NWB = ${NWB};			// raw words a B unit
constexpr int UB = BN / EU_B;			// B units a tile row
constexpr int SB = (BK * UB + NT - 1) / NT;	// B units a thread
]]

local KERNEL = [=[
extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(${SIG})
{
	__shared__ __align__(16) float smem[SMEM_FL];
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5;
	const int lr = lane >> 3, lc = lane & 7;	// lane's row / col in its warp
	const int wr = warp / WN, wc = warp % WN;	// warp's row / col in the block
	const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
${PROLOGUE}
	const unsigned *bw = (const unsigned *)${BNAME};	// B as 32-bit words

	float ra[SA][4];		// one K step of staging, in flight
	unsigned rb[SB][NWB];
	bool rbv[SB];		// B unit inside K and N (else it stores zeros)
${RBS_DECL}
	auto load_step = [&](int kt) {
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
${LOAD_A}
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, kk = u / UB, n = n0 + (u % UB) * EU_B;
			const int k = kt * BK + kk;
			rbv[s] = ${B_GUARD}${K_GUARD_B}n < N;
${RBS_LOAD}
#pragma unroll
			for (int i = 0; i < NWB; ++i)
				rb[s][i] = 0u;
			if (rbv[s]) {
				const unsigned *p = dg_b_row(bw, k, ${ZH}, T);
				unsigned (&r)[NWB] = rb[s];
${LOAD_B}
			}
		}
	};
	auto store_step = [&](float *stage) {
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
${STORE_A}
		}
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, kk = u / UB, nu = u % UB;
			if (${B_GUARD_S}true) {
				float *bd = stage + A_FL + kk * BN + nu * EU_B;	// Bs[kk][nu·EU_B ..]
				const unsigned (&r)[NWB] = rb[s];
				if (rbv[s]) {
${DECODE_B}
${RBS_APPLY}
				} else {
#pragma unroll
					for (int c = 0; c < EU_B / 4; ++c)
						*(float4 *)(bd + 4 * c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
				}
			}
		}
	};

	int a_off[TM], b_off[TN];	// this thread's rows of As / cols of Bs
#pragma unroll
	for (int i = 0; i < TM; ++i)
		a_off[i] = wr * (BM / WM) + lr + 4 * i;
#pragma unroll
	for (int j = 0; j < TN; ++j)
		b_off[j] = wc * (BN / WN) + lc + 8 * j;

	// fp32 sums (FMA), k ascending within a thread.
	float acc[TM][TN];
#pragma unroll
	for (int i = 0; i < TM; ++i)
#pragma unroll
		for (int j = 0; j < TN; ++j)
			acc[i][j] = 0.0f;
	auto compute_step = [&](const float *stage) {
		const float *as = stage, *bs = stage + A_FL;
#pragma unroll 4
		for (int k = 0; k < BK; ++k) {
			float a[TM], b[TN];
#pragma unroll
			for (int i = 0; i < TM; ++i)
				a[i] = as[k * PA + a_off[i]];
#pragma unroll
			for (int j = 0; j < TN; ++j)
				b[j] = bs[k * BN + b_off[j]];
#pragma unroll
			for (int i = 0; i < TM; ++i)
#pragma unroll
				for (int j = 0; j < TN; ++j)
					acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
		}
	};

${MAINLOOP}

${EPILOGUE}
}
]=]

-- K-major A (grad_input ops): unit u = (row u / UA, float4 u % UA along k).
local LOAD_A_KMAJOR = [[
			const int row = u / UA, kq = u % UA, m = m0 + row;
			float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (${A_GUARD}m < M)
				v = dg_a4(dg_a_row(grad, m, kt, z, T) + 4 * kq);
			ra[s][0] = v.x; ra[s][1] = v.y; ra[s][2] = v.z; ra[s][3] = v.w;]]

-- Transposed into As[k][m]: with the pitch BM + 1, store c of a warp's lanes
-- (UA k-quads of 32/UA rows) lands in distinct banks.
local STORE_A_KMAJOR = [[
			const int row = u / UA, kq = u % UA;
			if (${A_GUARD}true) {
#pragma unroll
				for (int c = 0; c < 4; ++c)
					stage[(4 * kq + c) * PA + row] = ra[s][c];
			}]]

-- M-major A (grad_weight ops): unit u = (k row u / UA, float4 u % UA along m).
local LOAD_A_MMAJOR = [[
			const int kk = u / UA, m = m0 + (u % UA) * 4, k = kt * BK + kk;
			float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (${A_GUARD}k < K && m < MM)	// MM % 4 == 0: a float4 is wholly in or out
				v = dg_a4(dg_a_col(grad, k, h, T) + m);
			ra[s][0] = v.x; ra[s][1] = v.y; ra[s][2] = v.z; ra[s][3] = v.w;]]

local STORE_A_MMAJOR = [[
			const int kk = u / UA, mq = u % UA;
			if (${A_GUARD}true)
				*(float4 *)(stage + kk * PA + 4 * mq) = make_float4(ra[s][0], ra[s][1], ra[s][2], ra[s][3]);]]

local MAIN_2 = [[
	// Double-buffered: step i+1's global loads are issued before step i is
	// computed and land in the other buffer after it; one barrier a step.
	if (k_begin < k_end) {
		load_step(k_begin);
		store_step(smem);
		__syncthreads();
#pragma unroll 1
		for (int kt = k_begin; kt < k_end; ++kt) {
			const int i = kt - k_begin;
			if (kt + 1 < k_end)
				load_step(kt + 1);
			compute_step(smem + (i & 1) * STAGE_FL);
			if (kt + 1 < k_end)
				store_step(smem + ((i + 1) & 1) * STAGE_FL);
			__syncthreads();
		}
	}]]

local MAIN_1 = [[
	// Single buffer: load, barrier, compute, barrier.
#pragma unroll 1
	for (int kt = k_begin; kt < k_end; ++kt) {
		load_step(kt);
		store_step(smem);
		__syncthreads();
		compute_step(smem);
		__syncthreads();
	}]]

local EPI_INPUT = [[
	// ---- epilogue: ${SCALE_WHY}
${SCALE_LOAD}
#pragma unroll
	for (int i = 0; i < TM; ++i) {
		const int m = m0 + a_off[i];
		if (m >= M)
			continue;
#pragma unroll
		for (int j = 0; j < TN; ++j) {
			const int n = n0 + b_off[j];
			if (n < N)
				${OUT}[dg_out(m, n, z, T)] = ${CONV}(${SCALED});
		}
	}]]

local EPI_WEIGHT = [[
	// ---- epilogue: splits == 1: grad_w (+)= ${SCALED_DESC}; else the raw sum
	// into partial p (dst + p·NW), summed by the reduce entry.
${SCALE_LOAD}
	float *out = splits == 1 ? dst : dst + (long long)sp * NW;
#pragma unroll
	for (int i = 0; i < TM; ++i) {
		const int m = m0 + a_off[i];
		if (m >= MM)
			continue;
#pragma unroll
		for (int j = 0; j < TN; ++j) {
			const int n = n0 + b_off[j];
			if (n >= N)
				continue;
			const long long o = dg_out(m, n, h, T);
			if (splits != 1)
				out[o] = acc[i][j];
			else
				out[o] = accumulate ? __fadd_rn(out[o], ${SCALED}) : ${SCALED};
		}
	}]]

-- Writes the SIMT kernel into w: `c` holds what grad.lua's render worked
-- out (spec, op, its OPS entry o, formats, shape, tile, banner lines) and
-- the plan's buffers (nbuf) and shared memory (smem).
function M.render(c, w)
  local o, op, entry, bfmt, F = c.o, c.op, c.entry, c.bfmt, c.F
  local H, HIN, E, L = c.H, c.HIN, c.E, c.L
  local bm, bn, bk, wm, wn = c.bm, c.bn, c.bk, c.wm, c.wn
  local u = b_unit(bfmt, bn)
  local pa = o.a_kmajor and bm + 1 or bm
  local nbuf, smem = c.nbuf, c.smem
  local nt = wm * wn * 32
  local ua = o.a_kmajor and bk // 4 or bm // 4
  local a_units = o.a_kmajor and bm * ua or bk * ua
  local a_guard = a_units % nt ~= 0 and "u < A_UNITS && " or ""
  local ub = bn // u.EU
  local b_guard = (bk * ub) % nt ~= 0 and "u < BK * UB && " or ""

  local ctype = F.ctype
  local is_code = F.code and not c.vec -- a vector scale is applied to B, not the sum
  local v = {
    H = H, HIN = HIN, E = E, L = L,
    BM = bm, BN = bn, BK = bk, WM = wm, WN = wn, NBUF = nbuf,
    PA = pa, PA_WHY = o.a_kmajor and "BM + 1 (A is transposed in; the pad spreads its stores over the banks)"
                                 or "BM (A lands as it is, float4 stores)",
    SMEM = smem, bfmt = bfmt, GT = c.GT, OT = c.OT, gfmt = c.gfmt, ofmt = c.ofmt,
    UA = ua, UA_WHY = o.a_kmajor and "float4s along k" or "float4s along m", A_UNITS = a_units,
    EPW_B = F.epw, EU_B = u.EU, NWB = u.NWB,
  }

  local kv = {
    ENTRY = entry, BT = ctype, BNAME = o.w_operand and "w" or (op == "lowrank_grad_weight" and "x" or "y"),
    A_GUARD = a_guard, B_GUARD = b_guard, B_GUARD_S = b_guard,
    HIN_H = HIN == 1 and "0" or "h",
  }
  kv.SIG = EMIT.subst(o.sig, kv)
  local scale_name = o.scale
  local scale_load = is_code and fmt("\tconst float s = *%s;		// the %s's scale", scale_name,
                                     o.w_operand and "weight" or "activation")
                             or "\t// float operand: no scale"
  local scaled = is_code and "__fmul_rn(acc[i][j], s)" or "acc[i][j]"
  if o.split then
    -- lowrank_grad_input: split K (grad_ops.lua M.GI_SPLIT, all paths)
    kv.PROLOGUE = GOPS.GI_SPLIT.PROLOGUE
    kv.ZH = "z"
    kv.K_GUARD_B = ""
    kv.LOAD_A = EMIT.subst(LOAD_A_KMAJOR, kv)
    kv.STORE_A = EMIT.subst(STORE_A_KMAJOR, kv)
    kv.EPILOGUE = EMIT.subst(EPI_INPUT, {
      SCALE_WHY = GOPS.GI_SPLIT.why(is_code),
      SCALE_LOAD = is_code and GOPS.GI_SPLIT.SCALE_LOAD or scale_load, OUT = "out", SCALED = scaled,
      CONV = "" })
  elseif o.a_kmajor then
    kv.PROLOGUE = "\tconst int M = B * T;\t\t\t// output rows (b, t)\n" ..
                  "\tconst int z = blockIdx.z;\t\t// head" ..
                  "\n\tconst int k_begin = 0, k_end = KT;"
    kv.ZH = "z"
    kv.K_GUARD_B = ""
    kv.LOAD_A = EMIT.subst(LOAD_A_KMAJOR, kv)
    kv.STORE_A = EMIT.subst(STORE_A_KMAJOR, kv)
    kv.EPILOGUE = EMIT.subst(EPI_INPUT, {
      SCALE_WHY = is_code and fmt("%s = %s · Σ (the integer operand's scale, once)", o.out_name, scale_name)
                          or fmt("%s = Σ", o.out_name),
      SCALE_LOAD = scale_load, OUT = o.out_name, SCALED = scaled,
      CONV = c.ofmt == "bf16" and "dg_f32_to_bf16" or "" })
  else
    kv.PROLOGUE = "\tconst int K = B * T;\t\t\t// the reduction (b, t)\n" ..
                  "\tconst int h = blockIdx.z % H, sp = blockIdx.z / H;	// head, split\n" ..
                  "\tconst int kt_all = (K + BK - 1) / BK;\n" ..
                  "\tconst int k_begin = min(sp * kt_per_split, kt_all);\n" ..
                  "\tconst int k_end = min(k_begin + kt_per_split, kt_all);	// empty: writes zeros"
    kv.ZH = "h"
    kv.K_GUARD_B = "k < K && "
    kv.LOAD_A = EMIT.subst(LOAD_A_MMAJOR, kv)
    kv.STORE_A = EMIT.subst(STORE_A_MMAJOR, kv)
    kv.EPILOGUE = EMIT.subst(EPI_WEIGHT, {
      SCALED_DESC = is_code and "sa · Σ" or "Σ",
      SCALE_LOAD = scale_load, SCALED = scaled })
  end
  kv.LOAD_B = indent(u.load, 4)
  kv.DECODE_B = indent(u.decode, 5)
  kv.RBS_DECL, kv.RBS_LOAD, kv.RBS_APPLY = "", "", ""
  if c.vec then
    kv.RBS_DECL = "\tfloat rbs[SB];\t\t// the scale of each unit's B row (per " ..
                  (o.w_operand and "channel" or "token") .. ")"
    kv.RBS_LOAD = fmt("\t\t\trbs[s] = rbv[s] ? dg_b_scale(%s, k, %s, T) : 0.0f;", o.scale, kv.ZH)
    kv.RBS_APPLY = "#pragma unroll\n\t\t\t\t\tfor (int c = 0; c < EU_B; ++c)\t// B(k, n) · s_k, rounded once\n" ..
                   "\t\t\t\t\t\tbd[c] = __fmul_rn(bd[c], rbs[s]);"
    kv.EPILOGUE = "\t(void)" .. o.scale .. ";\t// the scales went into B as it was staged\n" .. kv.EPILOGUE
  end
  kv.MAINLOOP = nbuf == 2 and MAIN_2 or MAIN_1

  local helpers = {}
  if c.ofmt == "bf16" then helpers.bf16 = true end
  FM.decoders(bfmt, helpers, true)

  local about = c.about
  about[#about + 1] = fmt("path: fp32 FMA, %s operand decoded to f32 while staged; shared memory %d bytes, %s.",
                          bfmt, smem, nbuf == 2 and "double-buffered" or "single buffer")

  w:line(EMIT.banner(c.spec, "grad.lua", about))
  w:line(DEV.helpers(helpers))
  w:line(EMIT.subst(HEAD, v))
  w:line(EMIT.subst(o.text, { HIN_H = kv.HIN_H }))
  w:line(EMIT.subst(KERNEL, kv))
end

return M

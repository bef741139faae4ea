--[[
lowrank_mma.lua — the tensor-core path of lowrank_fwd and relu_mask
(templates/lowrank.lua documents the ABI and picks the path; the GEMM
pieces are templates/mma.lua): per tile, the cp.async pipeline and
mma.sync m16n8k32 GEMM, then the epilogue — scale, threshold, ReLU, convert
— staged through shared memory as pairs and written with coalesced vectors
(relu_mask: the mask bytes staged, then grad · mask four floats at a time).

render(spec, k): k is lowrank.lua's parsed spec (fields, tile, signature and
about builders); returns source, entries, program name, launch info.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local DEV = require("device")
local SCL = require("scales")
local fmt = string.format

local M = {}

local VEC_TYPES = { [16] = "uint4", [8] = "uint2", [4] = "unsigned", [2] = "unsigned short", [1] = "unsigned char" }


local KERNEL_MMA = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// output heads
constexpr int HIN = ${HIN};		// input heads: 1 = one x shared by every head, else H
constexpr int E = ${E};		// reduction length (embd): the K of the GEMM
constexpr int L = ${L};		// latent width: the N of each head's GEMM
constexpr int WROW = ${WROW};		// bytes a weight row (E codes in its storage)
constexpr int WDIV = ${WDIV};		// codes a weight storage byte
${CONSTANTS}
// ---- epilogue staging: BM rows of OS bytes (OSZ-byte elements); the pad puts
// the 8 rows a warp writes at once in different banks.
constexpr int OSZ = ${OSZ}, OS = BN * OSZ + ${OPAD};
constexpr int VE = ${VE};			// elements a global store (${VB} bytes)
constexpr int SMEM_BYTES = ${SMEM};	// dynamic: max(pipeline, staging)

// ---- kernel ----------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(NT, ${MINB})
${SIGNATURE}
{
	extern __shared__ __align__(16) unsigned char smem[];
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5;
	const int M = B * T;
	const unsigned char *xb = (const unsigned char *)x;	// i8x4 codes as bytes
	const unsigned char *wb = (const unsigned char *)w;	// weight storage as bytes
	const void *a_zf = x, *b_zf = w;	// valid addresses for zero-fill copies
	(void)b_zf;
	// Blocks walk the tiles (m fastest, then n, then head) with a stride of
	// the grid, so any grid size is correct; the blocks at once share the
	// weight rows of few n-tiles through L2 (at D 1280, H 16, N 16384 a
	// head's are 21 MB, read from HBM once rather than once an m-tile).
	const int NTN = (L + BN - 1) / BN, NTM = (M + BM - 1) / BM;
	const long long ntile = (long long)NTN * NTM * H;
#pragma unroll 1
	for (long long tile = blockIdx.x; tile < ntile; tile += gridDim.x) {
	const int m0 = (int)(tile % NTM) * BM;
	const int n0 = (int)((tile / NTM) % NTN) * BN;
	const int h = (int)(tile / ((long long)NTN * NTM));
	// A row r: x row (b, hin(h), t) of m = m0 + r; B row r: w row (h, n0 + r).
	auto a_row = [&](int row) -> const unsigned char * {
		const int m = m0 + row;
		if (m >= M)
			return nullptr;
		const int b = m / T, t = m - b * T;
		return xb + ((long long)(b * HIN + ${HIN_H}) * T + t) * E;
	};
	auto a_koff = [&](int kt) -> long long { return (long long)kt * BK; };
	auto b_row = [&](int row) -> const unsigned char * {
		const int n = n0 + row;
		return n < L ? wb + ((long long)h * L + n) * WROW : nullptr;
	};
	auto b_koff = [&](int kt) -> long long { return (long long)kt * (BK / WDIV); };
	const int kt0 = 0, nkt = KT;
${GEMM}
${EPILOGUE}
	__syncthreads();	// the next tile's copies overwrite the shared buffers
	}
}
]]

-- The epilogue of the tensor-core path: each lane holds C pairs (row, 2q),
-- (row, 2q+1) of its fragments; they are converted and staged as pairs, then
-- written (or, for relu_mask, applied to grad) with coalesced vectors.
local function mma_epilogue(k, vb)
  local w = EMIT.writer()
  w:indent(1)
  w:line("// ---- epilogue: scale, ReLU, convert; the pipeline buffers are free now.")
  local sc = k.sc
  for _, l in ipairs(SCL.scale_prologue(sc)) do w:line(l) end
  if sc.sa_vec then
    w:line("float sa_r[MT][2];		// the act's scale of each fragment row (per token)")
    w:line("#pragma unroll")
    w:line("for (int mt = 0; mt < MT; ++mt)")
    w:line("#pragma unroll")
    w:line("\tfor (int hh = 0; hh < 2; ++hh) {")
    w:line("\t\tconst int m = m0 + wr * WTM + mt * 16 + g + 8 * hh;")
    w:linef("\t\tsa_r[mt][hh] = m < M ? sa[%s] : 0.0f;", SCL.x_row(k.HIN, "m"))
    w:line("\t}")
  end
  if sc.sw_vec then
    w:line("float sw_c[NT8][2];		// the weight's scale of each fragment column (per channel)")
    w:line("#pragma unroll")
    w:line("for (int nt = 0; nt < NT8; ++nt) {")
    w:line("\tconst int n = n0 + wc * WTN + nt * 8 + 2 * q;	// L is even: n + 1 < L with n")
    w:line("\tsw_c[nt][0] = n < L ? sw[h * L + n] : 0.0f;")
    w:line("\tsw_c[nt][1] = n < L ? sw[h * L + n + 1] : 0.0f;")
    w:line("}")
  end
  local out_code = not k.mask and (k.out == "int8" or k.out == "uint8pos")
  if out_code then
    SPEC.check(not sc.vec, "lowrank_mma.lua: output codes need per-tensor input scales")
    w:line("const float so_v = *so;			// out scale: codes rint(y · (1/so))")
    w:line("const float so_r = so_v > 0.0f ? __frcp_rn(so_v) : 0.0f;	// one IEEE reciprocal, not a division an element")
    for _, l in ipairs(SCL.code_consts(k.out, k.thr and EMIT.cfloat(k.thr), "s")) do
      w:line(l)
    end
  end
  if not k.mask then
    w:line("float absum = 0.0f;			// Σ|y| of this thread's valid outputs")
  end
  w:line("unsigned char *ot = smem;		// the staged tile, BM rows of OS bytes")
  w:line(EMIT.subst([[
#pragma unroll
for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
	for (int nt = 0; nt < NT8; ++nt) {
#pragma unroll
		for (int hh = 0; hh < 2; ++hh) {
			const int r = wr * WTM + mt * 16 + g + 8 * hh;	// c0/c1: row g, c2/c3: g + 8
			const int c = wc * WTN + nt * 8 + 2 * q;
			float y0 = __fmul_rn(__int2float_rn(acc[mt][nt][2 * hh]), ${S0});
			float y1 = __fmul_rn(__int2float_rn(acc[mt][nt][2 * hh + 1]), ${S1});]],
    { S0 = SCL.scale_expr(sc, "sa_r[mt][hh]", "sw_c[nt][0]"), S1 = SCL.scale_expr(sc, "sa_r[mt][hh]", "sw_c[nt][1]") }))
  w:indent(3)
  local thr = k.thr and EMIT.cfloat(k.thr)
  if k.mask then
    w:linef("y0 = __fsub_rn(y0, %s);	// the forward's relu(y - thr) is > 0 here", thr)
    w:linef("y1 = __fsub_rn(y1, %s);", thr)
    w:line("*(unsigned short *)(ot + r * OS + c) = (unsigned short)((y0 > 0.0f ? 1u : 0u) | (y1 > 0.0f ? 0x100u : 0u));")
  else
    if thr then
      w:linef("y0 = __fsub_rn(y0, %s);	// relu(y - thr)", thr)
      w:linef("y1 = __fsub_rn(y1, %s);", thr)
      w:line("y0 = y0 > 0.0f ? y0 : 0.0f;")
      w:line("y1 = y1 > 0.0f ? y1 : 0.0f;")
    end
    w:line("if (m0 + r < M && n0 + c < L) {	// L is even: c + 1 is inside too")
    w:line("\tabsum += fabsf(y0);")
    w:line("\tabsum += fabsf(y1);")
    w:line("}")
    if k.out == "f32" then
      w:line("*(float2 *)(ot + r * OS + c * 4) = make_float2(y0, y1);")
    elseif k.out == "bf16" then
      w:line("*(unsigned *)(ot + r * OS + c * 2) = (unsigned)dg_f32_to_bf16(y0) | ((unsigned)dg_f32_to_bf16(y1) << 16);")
    else
      local lo, hi = "-127", "127"
      if k.out == "uint8pos" then lo, hi = "0", "255" end
      -- two FMAs from the sum (dragon/ref.h, dg_code_t)
      w:line("const int c0 = __float_as_int(dg_code_t(__int2float_rn(acc[mt][nt][2 * hh]), a1, b1, CR, CLOM)) - 0x4b400000;")
      w:line("const int c1 = __float_as_int(dg_code_t(__int2float_rn(acc[mt][nt][2 * hh + 1]), a1, b1, CR, CLOM)) - 0x4b400000;")
      w:line("*(unsigned short *)(ot + r * OS + c) = (unsigned short)((c0 & 0xff) | ((c1 & 0xff) << 8));")
    end
  end
  w:indent(-3)
  w:line([[
		}
	}
}
__syncthreads();]])
  if k.mask then
    w:line([[
// grad_out = grad · mask, four floats a thread (L % 4 == 0: a vector is wholly
// inside or past the last column). grad and grad_out may alias: each vector
// is read, then written, by one thread.
#pragma unroll 1
for (int v = tid; v < BM * (BN / 4); v += NT) {
	const int r = v / (BN / 4), c = (v - r * (BN / 4)) * 4;
	const int m = m0 + r, n = n0 + c;
	if (m < M && n < L) {
		const int b = m / T, t = m - b * T;
		const long long o = ((long long)(b * H + h) * T + t) * L + n;
		const unsigned mk = *(const unsigned *)(ot + r * OS + c);
		const float4 gv = *(const float4 *)(grad + o);
		*(float4 *)(grad_out + o) = make_float4((mk & 0xffu) ? gv.x : 0.0f, (mk & 0xff00u) ? gv.y : 0.0f,
						      (mk & 0xff0000u) ? gv.z : 0.0f, (mk >> 24) ? gv.w : 0.0f);
	}
}]])
    return w:text()
  end
  w:line(EMIT.subst([[
// Coalesced stores of the staged tile, VE elements a store (L % VE == 0: a
// vector is wholly inside or past the last column).
#pragma unroll 1
for (int v = tid; v < BM * (BN / VE); v += NT) {
	const int r = v / (BN / VE), c = (v - r * (BN / VE)) * VE;
	const int m = m0 + r, n = n0 + c;
	if (m < M && n < L) {
		const int b = m / T, t = m - b * T;
		*(${VT} *)(out + ((long long)(b * H + h) * T + t) * L + n) =
			*(const ${VT} *)(ot + r * OS + c * OSZ);
	}
}
// Σ|y| of the block: warp shuffles, then the warps in order, one atomic.
if (out_absum) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		absum += __shfl_xor_sync(0xffffffffu, absum, o);
	float *red = (float *)smem;
	__syncthreads();	// every read of the staged tile is done
	if (lane == 0)
		red[warp] = absum;
	__syncthreads();
	if (tid == 0) {
		float sum = 0.0f;
		for (int i = 0; i < NWARP; ++i)
			sum += red[i];
		atomicAdd(out_absum, sum);
	}
}]], { VT = VEC_TYPES[vb] }))
  return w:text()
end

function M.render(spec, k)
  local MMA = require("mma")
  local fa, fw = FM.formats[k.act], FM.formats[k.weight]
  local p = MMA.plan(k.bm, k.bn, k.bk, k.wm, k.wn, k.stages, k.weight)
  local osz = k.mask and 1 or FM.out_types[k.out].size
  local opad = math.max(16, 8 * osz)
  local smem = k.smem -- lowrank.lua M.plan: the pipeline, the staged output tile
  local vb = 16
  while (k.L * osz) % vb ~= 0 or (k.bn * osz) % vb ~= 0 do vb = vb // 2 end
  local wdiv = FM.i8x4_words(k.weight)

  local helpers = FM.decoders(k.weight, {
    code = (not k.mask and (k.out == "int8" or k.out == "uint8pos")) or nil,
    bf16 = (not k.mask and k.out == "bf16") or nil,
  })
  local vars = {
    H = k.H, HIN = k.HIN, E = k.E, L = k.L, WROW = k.E // wdiv, WDIV = wdiv,
    CONSTANTS = MMA.constants(p, k.E),
    OSZ = osz, OPAD = opad, VE = vb // osz, VB = vb, SMEM = smem,
    -- two blocks an SM when their shared memory fits (227 KiB) and 256
    -- threads or fewer: one block's epilogue and prologue then overlap the
    -- other's math (registers capped at 65536 / (2·NT))
    MINB = (p.nt <= 256 and 2 * (smem + 1024) <= 227 * 1024) and 2 or 1,
    SIGNATURE = k.signature(fa.ctype, fw.ctype),
    HIN_H = k.HIN == 1 and "0" or "h",
    GEMM = MMA.gemm(p),
    EPILOGUE = mma_epilogue(k, vb),
  }
  local path = fmt("integer × integer on tensor cores: mma.sync m16n8k32 %s.s8, exact int32 sums; %s",
                   FM.mma_type(k.act),
                   p.decode and (k.weight .. " weights decoded to s8 in shared memory") or "cp.async operands")
  local about = k.about(path, p.nt, fmt("dynamic shared memory %d bytes (%d-stage pipeline, row stride %d); "
    .. "epilogue staged through shared memory, %d-byte stores.", smem, p.stages, p.rs, k.mask and 16 or vb))
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "lowrank.lua", about))
  w:line(DEV.helpers(helpers))
  w:line(MMA.helpers(p, fa.unsigned))
  w:line(EMIT.subst(KERNEL_MMA, vars))
  return w:text()
end

return M

--[[
qweight.lua — weight quantize and the ternary / sign1 storage packers
(dg_ref_quantize_weight, dg_ref_pack_ternary / _sign1 and
dg_ref_unpack_ternary / _sign1 mirror them).

op quantize_weight (weight int8 | ternary | sign1, src f32 | bf16), three
launches, like quantize_act:

  extern "C" __global__ void dg_quantize_weight_absum(const ST *w,
      long long n, double *partials)
    any grid G, `threads` a block; grid-stride over w; partials[blockIdx.x]
    = Σ|w| of the block's elements. Each thread sums in double in a fixed
    order, the block by a fixed tree, so the partials are deterministic for
    a fixed G, and (double sums of floats) the scale is the reference's
    float except when the exact sum lies within ~1e-15 relative of a float
    rounding boundary.
  extern "C" __global__ void dg_quantize_weight_scale(const double *partials,
      int n_partials, long long n, float *scale)
    <<<1, threads>>>: Σ partials in double in a fixed order;
    int8: *scale = (float)(2·sum / (n·127)); ternary, sign1: (float)(sum / n);
    0 when the sum is 0 — the reference's expressions.
  extern "C" __global__ void dg_quantize_weight_apply(const ST *w,
      long long n, const float *scale, signed char *codes)
    any grid; one code a byte:
      int8     s == 0 ? 0 : clamp(__float2int_rn(__fdiv_rn(w, s)), ±127)
      ternary  |w| < s ? 0 : sign(w)          (NaN → 0)
      sign1    w >= 0 ? +1 : -1               (NaN → -1)

  A scale an output channel (wscale=channel) is one launch instead, of
  dg_quantize_weight_rows (a block a row) or dg_quantize_weight_rows_warp
  (a warp a row), rendered by templates/qrows.lua: int8 max|w_row|/127,
  ternary and sign1 mean|w_row| (summed in double in a fixed order), the
  codes as above.

op pack_ternary / pack_sign1 (embd = K, the row length packed; tile t<N>),
two entries each; rows are contiguous and K is a multiple of the codes a
word holds, so packing the flat sequence is packing every row:

  extern "C" __global__ void dg_pack_ternary(const signed char *codes,
      unsigned *words, long long rows)
    word i = codes 16i..16i+15, code j at bits 2j..2j+1: 00 = 0, 01 = +1,
    11 = -1 (any code other than ±1 packs as 0; the reference refuses them).
  extern "C" __global__ void dg_unpack_ternary(const unsigned *words,
      int *codes, long long rows)
    the inverse, one byte a code (i8x4 words); the unused pair 10 decodes
    as 0 (the reference refuses it with DG_ERR_CORRUPT).
  extern "C" __global__ void dg_pack_sign1(const signed char *codes,
      unsigned *words, long long rows)
    word i = codes 32i..32i+31, bit j set where code j is +1 (anything else
    packs as -1).
  extern "C" __global__ void dg_unpack_sign1(const unsigned *words,
      int *codes, long long rows)
    the inverse: +1 / -1 bytes.
  Any grid; one thread a word, grid-stride: the codes side moves 16 or 32
  contiguous bytes a thread (uint4 loads / stores), the words side one
  32-bit word a thread, so both are coalesced. codes and words must be
  16-byte aligned (whole allocations are).
]]
local SPEC = require("spec")
local EMIT = require("emit")
local FM = require("formats")
local TILES = require("tiles")
local DEV = require("device")
local ABSUM = require("absum")
local R = require("qrows")
local fmt = string.format

local M = {}

-- ---- quantize_weight ---------------------------------------------------------

local QUANT = [[
constexpr int NT = ${NT};		// threads a block
constexpr int RED = ${RED};		// first step of the tree reduction (a power of two)
constexpr int VE = ${VE};		// elements of one 16-byte load

${SRC_READER}

${WCODE_FN}

${ABSUM_SCALE}

extern "C" __global__ void __launch_bounds__(NT)
dg_quantize_weight_apply(const ${ST} *__restrict__ w, long long n, const float *__restrict__ scale,
			 signed char *__restrict__ codes)
{
	const float s = *scale;
	const long long first = (long long)blockIdx.x * NT + threadIdx.x;
	const long long stride = (long long)gridDim.x * NT;
	long long done = 0;
	if (((unsigned long long)w & 15ull) == 0 && ((unsigned long long)codes & (VE - 1)) == 0) {
		const long long nv = n / VE;
		for (long long iv = first; iv < nv; iv += stride) {
			float f[VE];
			dg_src_vec(w, iv, f);
			unsigned q[VE / 4];	// VE codes, four a word, code j in byte j % 4
#pragma unroll
			for (int k = 0; k < VE / 4; ++k)
				q[k] = 0u;
#pragma unroll
			for (int j = 0; j < VE; ++j)
				q[j / 4] |= ((unsigned)dg_wcode(f[j], s) & 0xffu) << (8 * (j % 4));
${STORE_VEC}
		}
		done = nv * VE;
	}
	for (long long i = done + first; i < n; i += stride)
		codes[i] = (signed char)dg_wcode(dg_src(w, i), s);
}
]]

-- The code of one value (both paths).
local WCODE_FN = [[
// The code of one value with scale s (${weight}).
__device__ __forceinline__ int dg_wcode(float v, float s)
{
${CODE}
}]]

local CODES = {
  int8 = "\treturn s == 0.0f ? 0 : dg_code(__fdiv_rn(v, s), -127, 127);",
  ternary = "\treturn fabsf(v) < s ? 0 : (v > 0.0f) - (v < 0.0f);	// NaN: 0",
  sign1 = "\treturn v >= 0.0f ? 1 : -1;	// NaN: -1",
}

local SCALES = {
  int8 = "2.0 * sum / ((double)n * 127.0)",
  ternary = "sum / (double)n",
  sign1 = "sum / (double)n",
}

-- Per channel (wscale=channel): one launch (templates/qrows.lua), a row
-- of the last dimension; int8 s = max|w_row|/127, ternary and sign1
-- s = mean|w_row| (summed in double).
local ROW_SCALES = {
  int8 = { ACC = "float", COMBINE = "fmaxf(a, v)", SCALE = "__fdiv_rn(r0, 127.0f)", what = "max|w_row|/127" },
  ternary = { ACC = "double", COMBINE = "a + v", SCALE = "(float)(r0 / (double)C)", what = "mean|w_row|" },
  sign1 = { ACC = "double", COMBINE = "a + v", SCALE = "(float)(r0 / (double)C)", what = "mean|w_row|" },
}

local function render_quantize(spec, plan)
  local nt = plan.tile.threads
  local src = SPEC.one_of(spec, "src", { "f32", "bf16" })
  local weight = SPEC.one_of(spec, "weight", { "int8", "ternary", "sign1" })
  local v = ABSUM.src_vars(src, "w")
  v.NT, v.RED, v.weight, v.ST = nt, ABSUM.tree_first(nt), weight, FM.formats[src].ctype
  v.CODE, v.SCALE_EXPR = CODES[weight], SCALES[weight]
  v.P, v.PREFIX, v.ACC, v.CAST = "w", "dg_quantize_weight", "double", "(double)"
  v.SRC_READER = EMIT.subst(ABSUM.SRC_READER, v)
  v.WCODE_FN = EMIT.subst(WCODE_FN, v)
  if spec.wscale == "channel" then
    local rs = ROW_SCALES[weight]
    return R.render(spec, plan, {
      file = "qweight.lua", prefix = "dg_quantize_weight", src = src, ct = "signed char", acc = rs.ACC,
      combine = rs.COMBINE, scale = rs.SCALE, quant = "dg_wcode", quant_fn = v.WCODE_FN,
      head = { fmt("quantize_weight: %s → %s codes (one signed byte a code), a scale an output channel: %s.", src,
                   weight, rs.what),
               "w (rows, C): G = T = 1, a row of the last dimension; the sums in double." },
    })
  end
  v.ABSUM_SCALE = EMIT.subst(ABSUM.ABSUM_SCALE, v)
  local about = {
    fmt("quantize_weight: %s → %s codes (one signed byte a code) and scale %s.", src, weight,
        weight == "int8" and "2·mean|w|/127" or "mean|w|"),
    "",
    fmt("dg_quantize_weight_absum(const %s *w, long long n, double *partials)   any grid, %d threads", v.ST, nt),
    "dg_quantize_weight_scale(const double *partials, int n_partials, long long n, float *scale)   <<<1, "
      .. nt .. ">>>",
    fmt("dg_quantize_weight_apply(const %s *w, long long n, const float *scale, signed char *codes)   any grid",
        v.ST),
  }
  local want = { code = true }
  if src == "bf16" then want.bf16 = true end
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "qweight.lua", about))
  w:line(DEV.helpers(want))
  w:line(EMIT.subst(QUANT, v))
  return w:text()
end

-- ---- pack_ternary / pack_sign1 ------------------------------------------------

local PACK_TERNARY = [[
constexpr int K = ${K};		// codes a row (a multiple of 16)
constexpr int NT = ${NT};		// threads a block

// 2-bit field of one code: +1 → 01, -1 → 11, anything else → 00.
__device__ __forceinline__ unsigned dg_tbits(unsigned byte)
{
	return byte == 0x01u ? 1u : (byte == 0xffu ? 3u : 0u);
}

extern "C" __global__ void __launch_bounds__(NT)
dg_pack_ternary(const signed char *__restrict__ codes, unsigned *__restrict__ words, long long rows)
{
	const long long nw = rows * (K / 16);	// words in all
	for (long long i = (long long)blockIdx.x * NT + threadIdx.x; i < nw; i += (long long)gridDim.x * NT) {
		const uint4 v = __ldg((const uint4 *)codes + i);	// codes 16i .. 16i+15
		const unsigned u[4] = { v.x, v.y, v.z, v.w };
		unsigned r = 0u;
#pragma unroll
		for (int j = 0; j < 16; ++j)
			r |= dg_tbits((u[j / 4] >> (8 * (j % 4))) & 0xffu) << (2 * j);
		words[i] = r;
	}
}

extern "C" __global__ void __launch_bounds__(NT)
dg_unpack_ternary(const unsigned *__restrict__ words, int *__restrict__ codes, long long rows)
{
	const long long nw = rows * (K / 16);
	for (long long i = (long long)blockIdx.x * NT + threadIdx.x; i < nw; i += (long long)gridDim.x * NT) {
		const unsigned r = __ldg(words + i);
		// dg_tern4: the four codes of one byte → an i8x4 word
		((uint4 *)codes)[i] = make_uint4(${Q});
	}
}
]]

local PACK_SIGN1 = [[
constexpr int K = ${K};		// codes a row (a multiple of 32)
constexpr int NT = ${NT};		// threads a block

extern "C" __global__ void __launch_bounds__(NT)
dg_pack_sign1(const signed char *__restrict__ codes, unsigned *__restrict__ words, long long rows)
{
	const long long nw = rows * (K / 32);	// words in all
	for (long long i = (long long)blockIdx.x * NT + threadIdx.x; i < nw; i += (long long)gridDim.x * NT) {
		const uint4 v0 = __ldg((const uint4 *)codes + 2 * i);	// codes 32i .. 32i+15
		const uint4 v1 = __ldg((const uint4 *)codes + 2 * i + 1);	// codes 32i+16 .. 32i+31
		const unsigned u[8] = { v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w };
		unsigned r = 0u;
#pragma unroll
		for (int j = 0; j < 32; ++j)
			r |= (((u[j / 4] >> (8 * (j % 4))) & 0xffu) == 0x01u ? 1u : 0u) << j;
		words[i] = r;
	}
}

extern "C" __global__ void __launch_bounds__(NT)
dg_unpack_sign1(const unsigned *__restrict__ words, int *__restrict__ codes, long long rows)
{
	const long long nw = rows * (K / 32);
	for (long long i = (long long)blockIdx.x * NT + threadIdx.x; i < nw; i += (long long)gridDim.x * NT) {
		const unsigned r = __ldg(words + i);
		// dg_sign4: the four codes of one nibble → an i8x4 word
		((uint4 *)codes)[2 * i] = make_uint4(${Q0});
		((uint4 *)codes)[2 * i + 1] = make_uint4(${Q1});
	}
}
]]

local function render_pack(spec, nt)
  local op = spec.op
  local K = SPEC.int_field(spec, "embd", 1)
  local per = op == "pack_ternary" and 16 or 32
  local what = op == "pack_ternary" and "ternary" or "sign1"
  local about = {
    fmt("%s: codes (rows, %d) int8 ↔ words (rows, %d) %s (%d codes a word).", op, K, K // per, what, per),
    "",
    fmt("dg_pack_%s(const signed char *codes, unsigned *words, long long rows)   any grid, %d threads",
        what, nt),
    fmt("dg_unpack_%s(const unsigned *words, int *codes, long long rows)   any grid, %d threads", what, nt),
  }
  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "qweight.lua", about))
  w:line(DEV.helpers({ [what] = true }))
  -- the unpack's i8x4 words of a storage word r (formats.lua)
  local q = FM.i8x4_of_word(what, "r")
  w:line(EMIT.subst(op == "pack_ternary" and PACK_TERNARY or PACK_SIGN1, { K = K, NT = nt,
    Q = FM.quad(q, 1, ",\n\t\t\t\t\t\t "),
    Q0 = what == "sign1" and FM.quad(q, 1, ",\n\t\t\t\t\t\t     ") or nil,
    Q1 = what == "sign1" and FM.quad(q, 5, ",\n\t\t\t\t\t\t\t ") or nil }))
  return w:text()
end

function M.plan(spec)
  local op = SPEC.one_of(spec, "op", { "quantize_weight", "pack_ternary", "pack_sign1" })
  if op == "quantize_weight" and spec.wscale == "channel" then
    return R.plan(spec, "dg_quantize_weight", "quantize_weight.cu")
  end
  if op == "quantize_weight" then
    return TILES.threads_plan(spec, { "dg_quantize_weight_absum", "dg_quantize_weight_scale",
                                  "dg_quantize_weight_apply" }, "quantize_weight.cu")
  end
  local what = op == "pack_ternary" and "ternary" or "sign1"
  return TILES.threads_plan(spec, { "dg_pack_" .. what, "dg_unpack_" .. what }, op .. ".cu")
end

function M.render(spec, plan)
  if spec.op == "quantize_weight" then
    return render_quantize(spec, plan)
  end
  return render_pack(spec, plan.tile.threads)
end

return M

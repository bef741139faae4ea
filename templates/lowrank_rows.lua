--[[
lowrank_rows.lua — lowrank_fwd for a few rows (B·T <= 8: decoding a token,
a small batch of them): the entry dg_lowrank_fwd_rows, appended to the
module of any lowrank_fwd path whose spec it serves (M.applies), with the
same arguments and the same op as dg_lowrank_fwd (templates/lowrank.lua's
ABI; runtime/ops/lowrank.c launches it where B·T <= DG_LOWRANK_ROWS).

Why: at one row a GEMM tile of 64 to 256 rows stages the weights through
shared memory for one useful row, and the whole call is the H·L·E weight
bytes read once (2 MB for a 25M model's bf16 projection: ~0.5 us at the
HBM's rate, where the tile paths took ~16 us). Here warps walk the output
columns; LPC lanes share a column, each reading 16-byte chunks of its
weight row (RUC columns' loads in flight a lane), x's rows held in
registers (loaded once, again only where the head of x changes), a dot
product a chunk (fmaf on floats, dp4a on codes), the column's sum by
warp shuffles, then the tile paths' epilogue: y = acc · scale (integer
sums exact, so integer outputs equal the reference's bit for bit; float
sums in another order than the tile paths', within rounding), − thr,
ReLU, f32 | bf16 | codes, Σ|y| by one atomic a warp.

Serves: op lowrank_fwd, float × float (act f32 | bf16, weight f32 | bf16)
or codes × codes (act int8 | int4 | uint8pos, weight int8 | ternary |
sign1, decoded to i8x4 words for dp4a); a weight row whole 16-byte chunks
(E a multiple of 4, 8, 16, 64, 128 for f32, bf16, int8, ternary, sign1);
codes out only with tensor scales (as the SIMT path); a row of x at a
lane's chunks in at most 64 registers (E <= 2048 for float x, 8192 for
codes). Not served (the tile path runs at every row count): relu_mask,
float × codes, longer rows.

Measured (H200, bench/sample, the same binary with and without the entry):
a bf16 token 0.554 -> 0.476 ms, w8a8 0.60 -> 0.52 (docs/benchmarks.md,
"Sampling from the state"). Ternary and sign1 weights are checked in the
CPU emulation (tests/test_emu_lowrank.c) and on an H100
(tests/test_gpu_forward.c gpu_lowrank/weight_*, 2026-12-07); bitnet's
token is not yet timed with them.

Rows: the kernel is templated on MR, the rows a pass (1, 2, 4 or 8, the
smallest that holds B·T, capped so that x's registers stay under 64 a
lane); more rows than MR make passes, each reading the weights again.
]]
local EMIT = require("emit")
local FM = require("formats")
local DEV = require("device")
local SCL = require("scales")
local fmt = string.format

local M = {}

M.ENTRY = "dg_lowrank_fwd_rows"
M.THREADS = 256

-- The shape constants: chunk, lanes a column, columns in flight, rows a pass.
function M.geometry(k)
  local g = {}
  g.xb = FM.formats[k.act].code and 1 or FM.formats[k.act].size -- x bytes an element (codes one a byte)
  g.floats = not FM.formats[k.act].code
  g.CE = 4 * FM.formats[k.weight].epw -- elements a 16-byte weight chunk
  g.NCH = k.E // g.CE               -- chunks a weight row
  g.LPC = 32
  while g.LPC > 1 and g.LPC > g.NCH do g.LPC = g.LPC // 2 end
  g.CPL = (g.NCH + g.LPC - 1) // g.LPC
  g.RUC = math.max(1, 4 // g.CPL)
  g.XB = g.CE * g.xb                -- x bytes a chunk: 8 to 128
  g.XR = g.floats and g.CE or g.CE // 4 -- registers of x a chunk a row (floats, or i8x4 words)
  g.MRMAX = 8
  while g.MRMAX > 1 and g.MRMAX * g.CPL * g.XR > 64 do g.MRMAX = g.MRMAX // 2 end
  return g
end

-- Whether the entry serves spec fields k (lowrank.lua's fields).
function M.applies(k)
  if k.op ~= "lowrank_fwd" then return false end
  local fa, fw = FM.formats[k.act], FM.formats[k.weight]
  local floats = not fa.code and not fw.code
  local codes = fa.code and fw.code
  if not (floats or codes) then return false end
  if k.E % (4 * fw.epw) ~= 0 then return false end -- whole 16-byte chunks of a weight row
  if (k.out == "int8" or k.out == "uint8pos") and k.sc.vec then return false end
  -- one row of x at a lane's chunks in registers: at most 64 (E up to 2048
  -- in f32 or bf16, 8192 in codes; past that the tile path runs)
  local g = M.geometry(k)
  return g.CPL * g.XR <= 64
end

local KERNEL = [[

// ---- dg_lowrank_fwd_rows ----------------------------------------------------
// lowrank_fwd for B·T <= 8 rows (templates/lowrank_rows.lua): warps over the
// output columns, LPC lanes a column reading its weight row in 16-byte
// chunks, x's rows in registers, the column's sum by shuffles, the same
// epilogue as dg_lowrank_fwd. Grid: any number of blocks of NT threads
// (warps stride over the column groups); no shared memory.
${HELPERS}
namespace dg_rows {
constexpr int H = ${H}, HIN = ${HIN}, E = ${E}, L = ${L};
constexpr int CE = ${CE};		// elements a 16-byte weight chunk
constexpr int NCH = ${NCH};		// chunks a weight row
static_assert(NCH * CE == E, "whole 16-byte chunks a weight row");
constexpr int LPC = ${LPC};		// lanes a column
constexpr int CPL = ${CPL};		// chunks a lane: lic + LPC·j
constexpr int CPW = 32 / LPC;		// columns a warp at once
constexpr int RUC = ${RUC};		// such column sets in flight
constexpr int CW = CPW * RUC;		// columns a warp's group
constexpr int GPH = (L + CW - 1) / CW;	// groups a head
constexpr int NT = ${NT}, NW = NT / 32;
constexpr int XR = ${XR};		// x registers a chunk a row

${XLOAD}

${DOT}

template <int MR>
__device__ __forceinline__ void run(const unsigned char *__restrict__ x, const uint4 *__restrict__ w,
				    const float *__restrict__ sa, const float *__restrict__ sw,
				    ${OT} *__restrict__ out, const float *__restrict__ so,
				    float *__restrict__ out_absum, int B, int T)
{
	const int lane = threadIdx.x & 31, lic = lane % LPC, cg = lane / LPC;
	const int M = B * T;
	const long long gw = (long long)blockIdx.x * NW + (threadIdx.x >> 5);
	const long long nwarps = (long long)gridDim.x * NW;
${PROLOGUE}
	float absum = 0.0f;		// Σ|y| of this lane's outputs
#pragma unroll 1
	for (int r0 = 0; r0 < M; r0 += MR) {
		${XT} xr[MR][CPL][XR];	// rows r0.. of x at this lane's chunks
		int xh = -1;		// the head of x in xr
#pragma unroll 1
		for (long long gi = gw; gi < (long long)H * GPH; gi += nwarps) {
			const int h = (int)(gi / GPH), l0 = (int)(gi % GPH) * CW;
			const int hx = HIN == 1 ? 0 : h;
			if (hx != xh) {
				xh = hx;
#pragma unroll
				for (int r = 0; r < MR; ++r) {
					const int m = r0 + r;
					const int b = m / T, t = m - b * T;
					const unsigned char *row = x + ((long long)(b * HIN + hx) * T + t) * (E * ${XBYTES});
#pragma unroll
					for (int j = 0; j < CPL; ++j) {
						const int c = lic + LPC * j;
						dg_xload(xr[r][j], row + c * ${XCB}, m < M && c < NCH);
					}
				}
			}
			uint4 wv[RUC][CPL];
#pragma unroll
			for (int u = 0; u < RUC; ++u) {
				const int l = l0 + u * CPW + cg;
#pragma unroll
				for (int j = 0; j < CPL; ++j) {
					const int c = lic + LPC * j;
					wv[u][j] = l < L && c < NCH ? __ldg(w + ((long long)h * L + l) * NCH + c)
								    : make_uint4(0u, 0u, 0u, 0u);
				}
			}
			${ACC} acc[RUC][MR];
#pragma unroll
			for (int u = 0; u < RUC; ++u)
#pragma unroll
				for (int r = 0; r < MR; ++r) {
					${ACC} a = 0;
#pragma unroll
					for (int j = 0; j < CPL; ++j)
						a = dg_dot(xr[r][j], wv[u][j], a);
					acc[u][r] = a;
				}
			// the column's sum: its LPC lanes' partial sums (an aligned group)
#pragma unroll
			for (int u = 0; u < RUC; ++u)
#pragma unroll
				for (int r = 0; r < MR; ++r)
#pragma unroll
					for (int o = LPC / 2; o > 0; o >>= 1)
						acc[u][r] += __shfl_xor_sync(0xffffffffu, acc[u][r], o);
			// the epilogue: output (u, r) by lane (u·MR + r) % LPC of the group
#pragma unroll
			for (int u = 0; u < RUC; ++u) {
				const int l = l0 + u * CPW + cg;
#pragma unroll
				for (int r = 0; r < MR; ++r) {
					const int m = r0 + r;
					if ((u * MR + r) % LPC != lic || l >= L || m >= M)
						continue;
					const int b = m / T, t = m - b * T;
${EPILOGUE}
				}
			}
		}
	}
	// Σ|y|: the warp's lanes, one atomic a warp
	if (out_absum) {
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			absum += __shfl_xor_sync(0xffffffffu, absum, o);
		if (lane == 0 && absum != 0.0f)
			atomicAdd(out_absum, absum);
	}
}
} // namespace dg_rows

extern "C" __global__ void __launch_bounds__(${NT})
${SIGNATURE}
{
	const int M = B * T;
	(void)M;			// (a dispatch of one row count does not read it)
	const unsigned char *xb = (const unsigned char *)x;
	const uint4 *wq = (const uint4 *)w;
${DISPATCH}
}
]]

-- dg_xload: one chunk of x (XB bytes) into XR registers (floats, or words).
local function xload(g, act)
  if not g.floats then
    return [[
__device__ __forceinline__ void dg_xload(unsigned (&r)[XR], const unsigned char *p, bool ok)
{
#pragma unroll
	for (int i = 0; i < XR / 4; ++i) {
		const uint4 v = ok ? __ldg((const uint4 *)p + i) : make_uint4(0u, 0u, 0u, 0u);
		r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
	}
}]]
  end
  if act == "f32" then
    -- CE floats: 4 (one uint4) or 8 (two)
    return [[
__device__ __forceinline__ void dg_xload(float (&r)[XR], const unsigned char *p, bool ok)
{
#pragma unroll
	for (int i = 0; i < XR / 4; ++i) {
		const float4 v = ok ? __ldg((const float4 *)p + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
	}
}]]
  end
  -- bf16: CE of them, 8 bytes (4) or 16 (8), each to f32 (<< 16)
  local load = g.CE == 4
    and "const uint2 v = ok ? __ldg((const uint2 *)p) : make_uint2(0u, 0u);\n\tconst unsigned q[2] = { v.x, v.y };"
    or "const uint4 v = ok ? __ldg((const uint4 *)p) : make_uint4(0u, 0u, 0u, 0u);\n\tconst unsigned q[4] = { v.x, v.y, v.z, v.w };"
  return EMIT.subst([[
__device__ __forceinline__ void dg_xload(float (&r)[XR], const unsigned char *p, bool ok)
{
	${LOAD}
#pragma unroll
	for (int i = 0; i < XR / 2; ++i) {
		r[2 * i] = __uint_as_float(q[i] << 16);
		r[2 * i + 1] = __uint_as_float(q[i] & 0xffff0000u);
	}
}]], { LOAD = load })
end

-- dg_dot: a += the chunk's x · w, e ascending (fmaf) or four dp4a.
local function dot(g, k)
  if not g.floats and k.weight ~= "int8" then
    -- ternary (16 codes a word, a byte of four decoded at a time) or sign1
    -- (32 a word, a nibble of four): i8x4 words against x's
    local dp = FM.formats[k.act].unsigned and "dg_dp4a_us" or "dg_dp4a_ss"
    local per, dec = 4, "dg_tern4((q[i] >> (8 * j)) & 0xffu)"
    if k.weight == "sign1" then per, dec = 8, "dg_sign4((q[i] >> (4 * j)) & 15u)" end
    return EMIT.subst([[
__device__ __forceinline__ int dg_dot(const unsigned (&x)[XR], uint4 w, int a)
{
	const unsigned q[4] = { w.x, w.y, w.z, w.w };
#pragma unroll
	for (int i = 0; i < 4; ++i)
#pragma unroll
		for (int j = 0; j < ${PER}; ++j)
			a = ${DP}(x[${PER} * i + j], ${DEC}, a);
	return a;
}]], { DP = dp, PER = per, DEC = dec })
  end
  if not g.floats then
    local dp = FM.formats[k.act].unsigned and "dg_dp4a_us" or "dg_dp4a_ss"
    return EMIT.subst([[
__device__ __forceinline__ int dg_dot(const unsigned (&x)[XR], uint4 w, int a)
{
	a = ${DP}(x[0], w.x, a);
	a = ${DP}(x[1], w.y, a);
	a = ${DP}(x[2], w.z, a);
	return ${DP}(x[3], w.w, a);
}]], { DP = dp })
  end
  if k.weight == "f32" then
    return [[
__device__ __forceinline__ float dg_dot(const float (&x)[XR], uint4 w, float a)
{
	a = fmaf(x[0], __uint_as_float(w.x), a);
	a = fmaf(x[1], __uint_as_float(w.y), a);
	a = fmaf(x[2], __uint_as_float(w.z), a);
	return fmaf(x[3], __uint_as_float(w.w), a);
}]]
  end
  return [[
__device__ __forceinline__ float dg_dot(const float (&x)[XR], uint4 w, float a)
{
	const unsigned q[4] = { w.x, w.y, w.z, w.w };
#pragma unroll
	for (int i = 0; i < 4; ++i) {
		a = fmaf(x[2 * i], __uint_as_float(q[i] << 16), a);
		a = fmaf(x[2 * i + 1], __uint_as_float(q[i] & 0xffff0000u), a);
	}
	return a;
}]]
end

-- The epilogue of output (m = r0 + r, column l of head h): lowrank.lua's.
local function epilogue(k, g)
  local sc = k.sc
  local t = {}
  local function line(s, ...) t[#t + 1] = "\t\t\t\t\t" .. fmt(s, ...) end
  local code = k.out == "int8" or k.out == "uint8pos"
  line(g.floats and "const float accf = acc[u][r];" or "const float accf = __int2float_rn(acc[u][r]);")
  local s = SCL.scale_expr(sc, fmt("sa[%s]", SCL.x_row(k.HIN, "m")), "sw[h * L + l]")
  line(s and "float y = __fmul_rn(accf, %s);" or "float y = accf;%s", s or "")
  if k.thr then
    line("y = __fsub_rn(y, %s);	// relu(y - thr)", EMIT.cfloat(k.thr))
    line("y = y > 0.0f ? y : 0.0f;")
  end
  line("absum += fabsf(y);")
  local o = "out[((long long)(b * H + h) * T + t) * L + l]"
  if k.out == "f32" then
    line("%s = y;", o)
  elseif k.out == "bf16" then
    line("%s = dg_f32_to_bf16(y);", o)
  else
    line("const int cv = __float_as_int(dg_code_t(accf, a1, b1, CR, CLOM)) - 0x4b400000;")
    line("%s = (%s)cv;", o, k.out == "int8" and "signed char" or "unsigned char")
  end
  local pro = {}
  for _, l in ipairs(SCL.scale_prologue(sc)) do pro[#pro + 1] = "\t" .. l end
  if code then
    pro[#pro + 1] = "\tconst float so_v = *so;"
    pro[#pro + 1] = "\tconst float so_r = so_v > 0.0f ? __frcp_rn(so_v) : 0.0f;"
    for _, l in ipairs(SCL.code_consts(k.out, k.thr and EMIT.cfloat(k.thr) or nil, SCL.scale_expr(sc) or "1.0f")) do
      pro[#pro + 1] = "\t" .. l
    end
  end
  return table.concat(t, "\n"), table.concat(pro, "\n")
end

-- The entry's source, appended to the path's module: the device helpers
-- it needs come from device.lua under their include guards, so those the
-- module already holds are not defined twice.
function M.render(k)
  local g = M.geometry(k)
  local want = {}
  if k.out == "bf16" then want.bf16 = true end
  if k.out == "int8" or k.out == "uint8pos" then want.code = true end
  if not g.floats then want.dp4a = true end
  if k.weight == "ternary" then want.ternary = true end
  if k.weight == "sign1" then want.sign1 = true end
  local ot = FM.out_types[k.out].ctype
  local ep, pro = epilogue(k, g)
  -- the rows a pass: the smallest of 1, 2, 4 .. MRMAX that holds B·T
  local disp = {}
  local mr = 1
  while mr < g.MRMAX do
    disp[#disp + 1] = fmt("\tif (M <= %d) {\n\t\tdg_rows::run<%d>(xb, wq, sa, sw, out, so, out_absum, B, T);\n\t\treturn;\n\t}", mr, mr)
    mr = mr * 2
  end
  disp[#disp + 1] = fmt("\tdg_rows::run<%d>(xb, wq, sa, sw, out, so, out_absum, B, T);", g.MRMAX)
  local vars = {
    H = k.H, HIN = k.HIN, E = k.E, L = k.L, CE = g.CE, NCH = g.NCH, LPC = g.LPC, CPL = g.CPL,
    RUC = g.RUC, NT = M.THREADS, XR = g.XR, XT = g.floats and "float" or "unsigned",
    ACC = g.floats and "float" or "int", XBYTES = g.xb, XCB = g.XB, OT = ot,
    XLOAD = xload(g, k.act), DOT = dot(g, k), PROLOGUE = pro, EPILOGUE = ep,
    SIGNATURE = k.signature(FM.formats[k.act].ctype, FM.formats[k.weight].ctype):gsub("dg_lowrank_fwd%(",
      M.ENTRY .. "("),
    DISPATCH = table.concat(disp, "\n"),
  }
  vars.HELPERS = DEV.helpers(want)
  return EMIT.subst(KERNEL, vars)
end

return M

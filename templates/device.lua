--[[
device.lua — the CUDA device helpers a kernel asks for, each emitted once
and in a fixed order by `helpers`: bf16 <-> f32 by bit operations (round
half to even, NaN kept NaN: exactly dg_ref_f32_to_bf16) and the bf16x2
pack, the clamp of a rounded quotient to a code and the projection's output
codes, dp4a through inline PTX, cp.async; and the format decoders of
formats.lua (ternary, sign1, the lanes of an i8x4 word).
]]
local M = {}

local fmt = string.format
local FM = require("formats")

-- Sections of device code; each is emitted once, on request, by `helpers`.
local H = {}

H.bf16 = [[
// bf16 <-> f32 by bit operations, as dg_ref_f32_to_bf16 / dg_ref_bf16_to_f32:
// round half to even; a NaN keeps its sign and top payload and gets the quiet
// bit, so a payload only in the dropped bits does not turn into inf.
__device__ __forceinline__ float dg_bf16_to_f32(unsigned short h)
{
	return __uint_as_float((unsigned)h << 16);
}

__device__ __forceinline__ unsigned short dg_f32_to_bf16(float f)
{
	unsigned u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (unsigned short)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (unsigned short)(u >> 16);
}
]]

H.bf16x2 = [[
// Two floats → one bf16x2 word in one instruction (cvt.rn.bf16x2.f32, which
// packs its first source high): lo in bits 0..15, hi in 16..31, each rounded
// to nearest even as dg_f32_to_bf16 rounds it (a NaN becomes the canonical
// NaN). Where a kernel writes many bf16 values this is a fifth of the
// bit-operation form's instructions.
__device__ __forceinline__ unsigned dg_bf16x2(float lo, float hi)
{
	unsigned d;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
	return d;
}
]]

H.bf16x2_exact = [[
// lo, hi → one bf16x2 word (lo in bits 0..15), each exactly as
// dg_f32_to_bf16 rounds it: cvt.rn.bf16x2.f32 on sm_80 and later, except
// for a pair holding a NaN (cvt gives the canonical NaN, dg_f32_to_bf16
// keeps its sign and payload), which takes dg_f32_to_bf16.
__device__ __forceinline__ unsigned dg_pack2(float lo, float hi)
{
#if __CUDA_ARCH__ >= 800
	if (lo == lo && hi == hi) {
		unsigned d;
		asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
		return d;
	}
#endif
	return (unsigned)dg_f32_to_bf16(lo) | ((unsigned)dg_f32_to_bf16(hi) << 16);
}
]]

H.code = [[
// clamp(rint(q), lo, hi): __float2int_rn rounds half to even (NaN gives 0,
// out-of-range saturates), exactly rintf + clamp in the CPU reference.
__device__ __forceinline__ int dg_code(float q, int lo, int hi)
{
	int c = __float2int_rn(q);
	return c < lo ? lo : (c > hi ? hi : c);
}

// Output codes of the projection (dragon/ref.h): u = sat(fmaf(acc, a1, b1)),
// code = lo + rint(u·r), returned as the float 1.5·2^23 + code (lo_m =
// 1.5·2^23 + lo): adding it rounds u·r + lo to an integer, half to even, and
// the float's bits minus 0x4b400000 are the code (its low byte, the byte).
// Two FMAs on the FP32 pipe; the clamp is the FMA's saturation.
__device__ __forceinline__ float dg_code_t(float acc, float a1, float b1, float r, float lo_m)
{
	float u;	// fma.rn.sat: the saturation clamps to [0, 1] (NaN gives 0)
	asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(u) : "f"(acc), "f"(a1), "f"(b1));
	return fmaf(u, r, lo_m);
}
]]

H.dp4a = [[
// dp4a through inline PTX: c + Σ_j a.byte[j] · b.byte[j], exact in int32.
// s32.s32: both operands signed bytes. u32.s32: a unsigned (uint8pos codes
// 0..255, never wrapped into a signed byte), b signed.
__device__ __forceinline__ int dg_dp4a_ss(unsigned a, unsigned b, int c)
{
	int d;
	asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
	return d;
}

__device__ __forceinline__ int dg_dp4a_us(unsigned a, unsigned b, int c)
{
	int d;
	asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
	return d;
}
]]

H.cp_async = [[
// 16-byte cp.async global → shared (a shared-space address); src_bytes 0
// fills the 16 bytes with zeros (src must still be a valid global address).
__device__ __forceinline__ void dg_cp16(unsigned dst, const void *src, int src_bytes)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
		     :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void dg_cp_commit()
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N_>
__device__ __forceinline__ void dg_cp_wait()
{
	asm volatile("cp.async.wait_group %0;\n" :: "n"(N_) : "memory");
}
]]

H.cp_async_small = [[
// 8- and 4-byte cp.async (.ca: .cg takes only 16), for rows aligned to 8
// bytes only, codes, a scale; src_bytes 0 fills zeros.
__device__ __forceinline__ void dg_cp8(unsigned dst, const void *src, int src_bytes)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n"
		     :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void dg_cp4(unsigned dst, const void *src)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(dst), "l"(src) : "memory");
}
]]

H.ternary = FM.DECODERS.ternary
H.sign1 = FM.DECODERS.sign1
H.i8x4f = FM.DECODERS.i8x4f

local order = { "bf16", "bf16x2", "bf16x2_exact", "code", "dp4a", "ternary", "sign1", "i8x4f", "cp_async",
                "cp_async_small" }

-- The device helper sections named in `want` (a set), in a fixed order,
-- each under an include guard (DG_HELPER_<NAME>): a second entry appended
-- to a module (lowrank_rows.lua's) asks for what it needs, and the sections
-- the module already holds compile once.
function M.helpers(want)
  local out = {}
  for _, k in ipairs(order) do
    if want[k] then
      local g = "DG_HELPER_" .. k:upper()
      out[#out + 1] = fmt("#ifndef %s\n#define %s\n%s#endif // %s\n", g, g, H[k], g)
    end
  end
  for k in pairs(want) do
    if not H[k] then error(fmt("unknown helper section %q", k), 2) end
  end
  return table.concat(out, "\n")
end

return M

--[[
wgmma.lua — the pieces of an int8 GEMM on Hopper's warpgroup tensor cores
(wgmma.mma_async, sm_90a), shared by lowrank_wgmma.lua (the projection) and
decoder.lua (the decoder tail).

  C[m, n] = Σ_k A[m, k] · B[n, k]      A, B K-major, both in shared memory

A warpgroup (4 consecutive warps, the first a multiple of 4) issues
`wgmma.mma_async.sync.aligned.m64nNk32.s32.{s8|u8}.s8`: 64 rows of A × N
rows of B × 32 codes of K, exact int32 sums, asynchronously; commit_group /
wait_group order the results. Integer wgmma reads both operands K-major
from shared memory through 64-bit matrix descriptors.

Shared-memory layout (no swizzle, "interleaved"): the unit is a core
matrix, 8 rows × 16 bytes (16 codes of K) stored as 128 contiguous bytes,
row r at byte 16·r. A tile of R rows × K codes is (R/8) × (K/16) core
matrices: core (rg, kc) at byte rg·SBO + kc·128, SBO = (K/16)·128 = 8·K.
Descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start address
>> 4, 16-29 leading byte offset >> 4 (LBO: between core matrices adjacent
along K, 128 here), 32-45 stride byte offset >> 4 (SBO: between core
matrices adjacent along M / N), 62-63 swizzle mode (0: none). The k32 step
s of an instruction starts at byte 256·s of the tile (two core matrices
along K).

Accumulators (m64nN, s32): thread t of the warpgroup, warp w = t/32 (rows
16w..16w+15), lane = 4g + q: register 4j + i of the N/2 holds
  i = 0: (16w + g,     8j + 2q)      i = 1: (16w + g,     8j + 2q + 1)
  i = 2: (16w + g + 8, 8j + 2q)      i = 3: (16w + g + 8, 8j + 2q + 1)
— the m16n8 fragments of mma.sync, side by side along N.

Ordering rules kept by the users of these helpers: shared memory written
by ordinary stores or cp.async is made visible to the tensor cores'
(async) proxy with fence.proxy.async in each writing thread before the
barrier that precedes the wgmma; wgmma.fence precedes the first wgmma
after the accumulators were touched by other instructions; after
wait_group the accumulators are pinned with empty asm so that no read of
them is moved above the wait.
]]
local EMIT = require("emit")
local FM = require("formats")
local fmt = string.format

local M = {}

-- The warpgroup MMAs' ordering helpers, whatever the operand type (also
-- templates/wgmma_bf16.lua's): wgmma.fence, commit_group, wait_group, and
-- the generic-to-async proxy fence of shared memory.
M.SYNC = [[__device__ __forceinline__ void dg_wg_fence()
{
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void dg_wg_commit()
{
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void dg_wg_wait()
{
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// Shared memory written by this thread's generic stores (and cp.async) is
// made visible to the tensor cores' async proxy.
__device__ __forceinline__ void dg_fence_async_smem()
{
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

]]

-- The C helpers for an N-wide instruction (N = 64 | 128 | 256), A codes
-- unsigned (uint8pos) or signed; or (bf16 true) bf16 A and B with f32
-- sums: `wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16`, both
-- operands K-major (transpose immediates 0) in the same no-swizzle core
-- matrices: a core matrix is 8 rows × 16 bytes whatever the type (8 bf16
-- of K), so the descriptor, LBO and SBO are the byte counts above and one
-- instruction's K step (k16 bf16, k32 s8) is 32 bytes: two core matrices,
-- 256 bytes of the tile. The accumulators are floats in the same layout.
-- (no_sync: the ordering helpers left out, for a kernel that has them from
-- templates/wgmma_bf16.lua's helpers already.)
function M.helpers(n, act_unsigned, bf16, no_sync)
  local nr = n // 2
  local regs, outs = {}, {}
  for i = 0, nr - 1 do
    regs[#regs + 1] = "%" .. i
    outs[#outs + 1] = fmt(bf16 and "\"+f\"(d[%d])" or "\"+r\"(d[%d])", i)
  end
  local w = EMIT.writer()
  w:line(EMIT.subst([[
// ---- warpgroup tensor-core helpers (templates/wgmma.lua) --------------------
__device__ __forceinline__ unsigned long long dg_wg_desc(unsigned saddr, unsigned sbo)
{
	// no swizzle; LBO 128 bytes (the next ${LB} of K); SBO the next 8 rows
	return (unsigned long long)((saddr & 0x3ffffu) >> 4) | ((unsigned long long)(128u >> 4) << 16) |
	       ((unsigned long long)((sbo & 0x3ffffu) >> 4) << 32);
}

${SYNC}// d (+)= A · B over one ${KB} step: 64 x ${N} ${DS};
// scale_d 0: d = A·B (the first step of a tile), else d += A·B.
__device__ __forceinline__ void dg_wgmma(${CT} (&d)[${NR}], unsigned long long da, unsigned long long db,
					 int scale_d)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %${PS}, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n${N}${KS}.${DT}.${AT}.${BT} "
		     "{${REGS}}, %${PA}, %${PB}, p${IMM};\n}\n"
		     : ${OUTS}
		     : "l"(da), "l"(db), "r"(scale_d));
}

// Keeps the compiler from moving accesses of the accumulators across a
// wgmma wait (the asm above does not name them as read after it returns).
__device__ __forceinline__ void dg_wg_pin(${CT} (&d)[${NR}])
{
#pragma unroll
	for (int i = 0; i < ${NR}; ++i)
		asm volatile("" : "${PC}"(d[i]) :: "memory");
}
]], { N = n, NR = nr, REGS = table.concat(regs, ", "), OUTS = table.concat(outs, ", "),
      PA = nr, PB = nr + 1, PS = nr + 2, SYNC = no_sync and "" or M.SYNC,
      AT = bf16 and "bf16" or (act_unsigned and "u8" or "s8"), BT = bf16 and "bf16" or "s8",
      DT = bf16 and "f32" or "s32", CT = bf16 and "float" or "int", PC = bf16 and "+f" or "+r",
      KS = bf16 and "k16" or "k32", KB = bf16 and "k16" or "k32",
      LB = bf16 and "8 bf16" or "16 codes",
      DS = bf16 and "f32, A and B bf16" or fmt("int32, A %s codes, B s8", act_unsigned and "u8" or "s8"),
      -- bf16: imm-scale-a, imm-scale-b 1 (no negation), imm-trans-a, -b 0 (K-major)
      IMM = bf16 and ", 1, 1, 0, 0" or "" }))
  return w:text()
end

-- Decoders of packed weights into s8 core-matrix rows (16 codes, 16 bytes
-- each), natural K order.
M.decoders = [[
// ternary: one word (16 codes, code i at bits 2i: 00 0, 01 +1, 11 -1, 10
// read as 0) → 16 s8 bytes in K order. Shifting the word by 2k brings
// codes k, 4+k, 8+k, 12+k to the low bits of bytes 0..3; each byte becomes
// 0x00 / 0x01 / 0xff with one multiply-add; eight byte permutes put the
// bytes back in K order.
__device__ __forceinline__ uint4 dg_tern16(unsigned w)
{
	unsigned o[4];
#pragma unroll
	for (int k = 0; k < 4; ++k) {
		const unsigned t = w >> (2 * k);
		const unsigned nz = t & 0x01010101u;
		const unsigned ng = (t >> 1) & nz;
		o[k] = ng * 0xfeu + nz;	// byte i: code 4i + k
	}
	const unsigned t0 = __byte_perm(o[0], o[1], 0x5140), t1 = __byte_perm(o[2], o[3], 0x5140);
	const unsigned t2 = __byte_perm(o[0], o[1], 0x7362), t3 = __byte_perm(o[2], o[3], 0x7362);
	return make_uint4(__byte_perm(t0, t1, 0x5410), __byte_perm(t0, t1, 0x7632),
			  __byte_perm(t2, t3, 0x5410), __byte_perm(t2, t3, 0x7632));
}
]]

-- The statements that decode this thread's packed weight unit rb[s] (16
-- bytes of storage: ternary 64 codes, sign1 128) into s8 core-matrix rows
-- at `o` (unsigned char *; rows of 16 codes 128 bytes apart), natural K
-- order. Shared by lowrank_wgmma.lua and decoder.lua.
function M.unit_decoder(weight)
  if weight == "ternary" then
    return [[
*(uint4 *)(o + 0 * 128) = dg_tern16(rb[s].x);
*(uint4 *)(o + 1 * 128) = dg_tern16(rb[s].y);
*(uint4 *)(o + 2 * 128) = dg_tern16(rb[s].z);
*(uint4 *)(o + 3 * 128) = dg_tern16(rb[s].w);]]
  end
  local q = FM.i8x4_of_word("sign1", "x_")
  return fmt([[
const unsigned vw[4] = { rb[s].x, rb[s].y, rb[s].z, rb[s].w };
#pragma unroll
for (int i = 0; i < 4; ++i) {
	const unsigned x_ = vw[i];
	*(uint4 *)(o + (2 * i) * 128) = make_uint4(%s);
	*(uint4 *)(o + (2 * i + 1) * 128) = make_uint4(%s);
}]], FM.quad(q, 1, ",\n\t\t\t\t\t\t    "), FM.quad(q, 5, ",\n\t\t\t\t\t\t\t"))
end

-- The descriptor of a K-major operand in 128-byte swizzled rows, as TMA
-- writes them (the warp-specialized integer kernels: decoder.lua's,
-- lowrank_wgmma.lua's); ${SW_DESC} in their text.
M.SW_DESC = [[
// The descriptor of a K-major tile of rows of 128 bytes with the 128-byte
// swizzle (layout type 1): 1024 bytes between 8-row groups (SBO), LBO unused.
__device__ __forceinline__ unsigned long long dg_sw_desc(unsigned saddr)
{
	return (unsigned long long)((saddr & 0x3ffffu) >> 4) | (1ull << 16) | ((unsigned long long)(1024u >> 4) << 32) |
	       (1ull << 62);
}
]]

return M

--[[
mma.lua — the pieces of a block-tiled int8 GEMM on tensor cores
(mma.sync.aligned.m16n8k32.row.col.s32.{s8|u8}.s8.s32), shared by
lowrank.lua (projection, relu_mask) and decoder.lua.

  C[m, n] = Σ_k A[m, k] · B[n, k]      A, B K-major (rows of bytes along K)

Shared memory: `stages` buffers, each the A tile (BM rows) then the B tile
(BN rows), a row RS bytes (BK codes and padding). Operands already stored as
one byte a code (i8x4 act codes, int8 weights) arrive by 16-byte cp.async
(zero-filled past the edge); ternary (2 bits) and sign1 (1 bit) weights are
loaded into registers one step ahead and decoded into s8 rows after the
step's math. A multi-stage cp.async pipeline (commit_group / wait_group)
keeps stages-1 K steps in flight.

Fragments (PTX ISA, m16n8k32 8-bit): lane = 4·g + q (g = groupID 0..7,
q = threadID_in_group 0..3):
  a0 = A[g][4q..4q+3]  a1 = A[g+8][4q..]  a2 = A[g][16+4q..]  a3 = A[g+8][16+4q..]
  b0 = B[n=g][4q..4q+3]  b1 = B[n=g][16+4q..]
  c0 = C[g][2q]  c1 = C[g][2q+1]  c2 = C[g+8][2q]  c3 = C[g+8][2q+1]
K permutation: Σ_k A[m,k]·B[n,k] does not change when one permutation of
k is applied to both operands. A thread therefore reads KC/4 contiguous
bytes of a row with one LDS (KC = 64: 16 bytes, LDS.128; KC = 32: 8 bytes,
LDS.64) at byte 4q·(KC/16) of each KC-byte chunk, and feeds the words as
(a0, a2) / (b0, b1) of successive k32 steps: word 2s is "k 4q..4q+3" and
word 2s+1 is "k 16+4q.." of step s, for A rows g, g+8 and B row g alike.
Physical byte q·KC/4 + 8s + 4r + i holds logical k = 32s + 16r + 4q + i of
step s: a bijection on the chunk, the same for A and B, so every sum is
the exact integer dot product.

Bank conflicts: RS ≡ KC (mod 128). LDS.128 is served a quarter warp (8
lanes: rows g, g+1 × four 16-byte pieces) at a time: rows g and g+1 are 64
bytes apart modulo 128, so the 8 lanes cover all 32 banks once. LDS.64 is
served a half warp (rows g..g+3 × four 8-byte pieces) and rows are 32 bytes
apart modulo 128: again all 32 banks once.
]]
local EMIT = require("emit")
local FM = require("formats")
local fmt = string.format

local M = {}

-- The tensor-core path applies (the caller checks that both operands are
-- integer codes): sm_80 or newer (mma.sync s8 m16n8k32, cp.async), BK a
-- multiple of 32 (one k32 step), the warp tile whole m16n8 fragments.
-- The plans of lowrank.lua and decoder.lua ask it.
function M.fits(arch, bm, bn, bk, wm, wn)
  return arch >= 80 and bk % 32 == 0 and (bm // wm) % 16 == 0 and (bn // wn) % 8 == 0 and bm % wm == 0 and bn % wn == 0
end

-- Layout constants of a tile (the op plans read the pipeline bytes here).
function M.plan(bm, bn, bk, wm, wn, stages, weight)
  local p = { bm = bm, bn = bn, bk = bk, wm = wm, wn = wn }
  p.stages = math.max(2, stages)          -- stages 1 behaves as 2 here
  p.kc = (bk % 64 == 0) and 64 or 32      -- bytes a fragment load chunk
  p.rs = bk + ((p.kc - bk) % 128)         -- row stride, ≡ KC (mod 128)
  p.pipe = p.stages * (bm + bn) * p.rs    -- pipeline shared memory
  p.nt = wm * wn * 32
  p.weight = weight
  p.decode = (weight == "ternary" or weight == "sign1")
  -- decode unit: KU codes of one row, packed in KU/16 (ternary) or KU/32
  -- (sign1) words
  p.ku = math.min(bk, 64)
  if weight == "ternary" then p.uw = p.ku // 16 elseif weight == "sign1" then p.uw = p.ku // 32 end
  return p
end

-- Device helpers: cp.async, the MMA, the register decoders of packed weights.
function M.helpers(p, act_unsigned)
  local w = EMIT.writer()
  w:line(EMIT.subst([[
// ---- tensor-core GEMM helpers (templates/mma.lua) -------------------------
// 16-byte cp.async global → shared; src_bytes 0 fills the 16 bytes with zeros
// (rows past the edge; src must still be a valid global address).
__device__ __forceinline__ void dg_cp16(void *dst, const void *src, int src_bytes)
{
	const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
		     :: "r"(d), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void dg_cp_commit()
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void dg_cp_wait()
{
	asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// d += a·b on one m16n8k32 fragment: ${AT} A codes, s8 B codes, exact s32.
__device__ __forceinline__ void dg_mma(int (&d)[4], unsigned a0, unsigned a1, unsigned a2,
				       unsigned a3, unsigned b0, unsigned b1)
{
	asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.${AT}.s8.s32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
]], { AT = act_unsigned and "u8" or "s8" }))
  if p.decode then
    local uw = p.uw
    local load
    if uw == 4 then
      load = "const uint4 v = __ldg((const uint4 *)src);\n\tr[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;"
    elseif uw == 2 then
      load = "const uint2 v = __ldg((const uint2 *)src);\n\tr[0] = v.x; r[1] = v.y;"
    else
      load = "r[0] = __ldg((const unsigned *)src);"
    end
    w:linef("// A decode unit: %d codes of one weight row, %d packed word(s).", p.ku, uw)
    w:linef("__device__ __forceinline__ void dg_unit_ld(unsigned (&r)[%d], const unsigned char *src)", uw)
    w:line("{")
    w:line("\t" .. load)
    w:line("}")
    w:line()
    w:linef("// Writes the unit's %d codes as s8 bytes (16-byte stores) at dst.", p.ku)
    w:linef("__device__ __forceinline__ void dg_unit_st(unsigned char *dst, const unsigned (&r)[%d])", uw)
    w:line("{")
    if p.weight == "ternary" then
      w:line(fmt([[
#pragma unroll
	for (int i = 0; i < %d; ++i)	// a word: 16 codes = 16 bytes
		*(uint4 *)(dst + 16 * i) = make_uint4(%s);]], uw, FM.quad(FM.i8x4_of_word("ternary", "r[i]"), 1,
                                                                ",\n\t\t\t\t\t\t      ")))
    else
      local q = FM.i8x4_of_word("sign1", "r[i]")
      w:line(fmt([[
#pragma unroll
	for (int i = 0; i < %d; ++i) {	// a word: 32 codes = 32 bytes
		*(uint4 *)(dst + 32 * i) = make_uint4(%s);
		*(uint4 *)(dst + 32 * i + 16) = make_uint4(%s);
	}]], uw, FM.quad(q, 1, ",\n\t\t\t\t\t\t      "), FM.quad(q, 5, ",\n\t\t\t\t\t\t\t   ")))
    end
    w:line("}")
  end
  return w:text()
end

-- constexprs of the plan (inside the rendered file, before the kernel).
function M.constants(p, K)
  return EMIT.subst([[
// ---- tensor-core tile (templates/mma.lua) ----------------------------------
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};	// block tile, K step (codes)
constexpr int WM = ${WM}, WN = ${WN};		// warps: WM rows x WN cols
constexpr int NT = WM * WN * 32;		// threads a block
constexpr int NWARP = WM * WN;
constexpr int S = ${S};				// pipeline stages
constexpr int KC = ${KC};			// bytes a fragment load covers along K
constexpr int RS = ${RS};			// shared row stride (bytes), ≡ KC mod 128
constexpr int A_BYTES = BM * RS, B_BYTES = BN * RS;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int WTM = BM / WM, WTN = BN / WN;	// warp tile
constexpr int MT = WTM / 16, NT8 = WTN / 8;	// m16 x n8 fragments a warp
constexpr int KT = ${K} / BK;			// K steps of the whole reduction
constexpr int CPR = BK / 16;			// 16-byte chunks a row
constexpr int SA = (BM * CPR + NT - 1) / NT;	// A chunks a thread
]], { BM = p.bm, BN = p.bn, BK = p.bk, WM = p.wm, WN = p.wn, S = p.stages, KC = p.kc, RS = p.rs, K = K })
    .. (p.decode and EMIT.subst([[
constexpr int KU = ${KU};			// codes a decode unit (B rows)
constexpr int UPR = BK / KU;			// units a row
constexpr int SB = (BN * UPR + NT - 1) / NT;	// B units a thread
]], { KU = p.ku }) or [[
constexpr int SB = (BN * CPR + NT - 1) / NT;	// B chunks a thread
]])
end

--[[
The GEMM of one tile, inside the kernel. The kernel defines before it:
  tid, lane, warp; smem (the dynamic shared buffer);
  a_row(row)  → const unsigned char * of A tile row `row` at k = 0, or
                nullptr past the edge (zeros);   a_zf: any valid global byte
  a_koff(kt)  → byte offset of K step kt from a row's k = 0 (long long)
  b_row(row), b_koff(kt) → the same for B (b_koff in bytes of the storage)
  kt0, nkt    → the block's first K step and how many
and gets `int acc[MT][NT8][4]` (zeroed here), warp row wr, col wc, g, q.
The caller syncs before reusing shared memory after it (the pipeline ends
with wait_group 0 and a barrier).
]]
function M.gemm(p)
  local v = {
    UW = p.uw or 0,
    FT = p.kc == 64 and "uint4" or "uint2",
  }
  local w = EMIT.writer()
  w:line([[
	// ---- operand slots: A chunk u = tid + s*NT is (row u / CPR, chunk u % CPR)
	int a_dst[SA];			// byte offset in a stage; -1: no chunk for this slot
	const unsigned char *a_src[SA];	// the chunk at k = 0; nullptr: zeros
#pragma unroll
	for (int s = 0; s < SA; ++s) {
		const int u = tid + s * NT, row = u / CPR, c = u % CPR;
		a_dst[s] = -1;
		a_src[s] = nullptr;
		if (u < BM * CPR) {
			a_dst[s] = row * RS + c * 16;
			const unsigned char *rp = a_row(row);
			if (rp)
				a_src[s] = rp + c * 16;
		}
	}]])
  if p.decode then
    w:line(EMIT.subst([[
	// B decode units: u = tid + s*NT is (row u / UPR, unit u % UPR)
	int b_dst[SB];
	const unsigned char *b_src[SB];
#pragma unroll
	for (int s = 0; s < SB; ++s) {
		const int u = tid + s * NT, row = u / UPR, c = u % UPR;
		b_dst[s] = -1;
		b_src[s] = nullptr;
		if (u < BN * UPR) {
			b_dst[s] = A_BYTES + row * RS + c * KU;
			const unsigned char *rp = b_row(row);
			if (rp)
				b_src[s] = rp + c * (KU / ${DIV});
		}
	}
	unsigned rb[SB][${UW}];	// packed units of one K step, in flight
	auto b_load = [&](int kt) {
		const long long off = b_koff(kt);
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			if (b_src[s]) {
				dg_unit_ld(rb[s], b_src[s] + off);
			} else {
#pragma unroll
				for (int i = 0; i < ${UW}; ++i)
					rb[s][i] = ${ZERO};	// decodes to code 0
			}
		}
	};
	auto b_store = [&](int stg) {
		unsigned char *base = smem + stg * STAGE_BYTES;
#pragma unroll
		for (int s = 0; s < SB; ++s)
			if (b_dst[s] >= 0)
				dg_unit_st(base + b_dst[s], rb[s]);
	};]], { UW = p.uw, DIV = p.weight == "ternary" and 4 or 8,
            -- sign1 has no zero code: a word of zeros decodes to -1, so rows
            -- past the edge are all -1 there; they only feed outputs that are
            -- never stored, which is harmless. Ternary 0 decodes to 0.
            ZERO = "0u" }))
  else
    w:line([[
	// B chunks, as A
	int b_dst[SB];
	const unsigned char *b_src[SB];
#pragma unroll
	for (int s = 0; s < SB; ++s) {
		const int u = tid + s * NT, row = u / CPR, c = u % CPR;
		b_dst[s] = -1;
		b_src[s] = nullptr;
		if (u < BN * CPR) {
			b_dst[s] = A_BYTES + row * RS + c * 16;
			const unsigned char *rp = b_row(row);
			if (rp)
				b_src[s] = rp + c * 16;
		}
	}]])
  end
  -- issue: the cp.async copies of step kt into stage stg
  w:line([[
	auto issue = [&](int kt, int stg) {
		unsigned char *base = smem + stg * STAGE_BYTES;
		const long long ao = a_koff(kt);
#pragma unroll
		for (int s = 0; s < SA; ++s)
			if (a_dst[s] >= 0)
				dg_cp16(base + a_dst[s], a_src[s] ? (const void *)(a_src[s] + ao) : a_zf,
					a_src[s] ? 16 : 0);]])
  if not p.decode then
    w:line([[
		const long long bo = b_koff(kt);
#pragma unroll
		for (int s = 0; s < SB; ++s)
			if (b_dst[s] >= 0)
				dg_cp16(base + b_dst[s], b_src[s] ? (const void *)(b_src[s] + bo) : b_zf,
					b_src[s] ? 16 : 0);]])
  end
  w:line("\t};")
  -- compute
  local mm = { "\t\t\t\t\tdg_mma(acc[mt][nt], a[mt][0].x, a[mt][1].x, a[mt][0].y, a[mt][1].y, b.x, b.y);" }
  if p.kc == 64 then
    mm[2] = "\t\t\t\t\tdg_mma(acc[mt][nt], a[mt][0].z, a[mt][1].z, a[mt][0].w, a[mt][1].w, b.z, b.w);"
  end
  v.MMA = table.concat(mm, "\n")
  w:line(EMIT.subst([[
	// ---- fragments: this lane's rows g, g+8 of each m16 tile, row g of each
	// n8 tile, KC/4 bytes at q·KC/4 of each KC-byte chunk (see mma.lua)
	const int g = lane >> 2, q = lane & 3;
	const int wr = warp / WN, wc = warp % WN;
	const int a_frag = (wr * WTM + g) * RS + q * (KC / 4);
	const int b_frag = A_BYTES + (wc * WTN + g) * RS + q * (KC / 4);
	int acc[MT][NT8][4];
#pragma unroll
	for (int mt = 0; mt < MT; ++mt)
#pragma unroll
		for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
			for (int i = 0; i < 4; ++i)
				acc[mt][nt][i] = 0;
	auto compute = [&](int stg) {
		const unsigned char *as = smem + stg * STAGE_BYTES + a_frag;
		const unsigned char *bs = smem + stg * STAGE_BYTES + b_frag;
#pragma unroll
		for (int kc = 0; kc < BK / KC; ++kc) {
			${FT} a[MT][2];	// rows g and g+8 of each m16 tile
#pragma unroll
			for (int mt = 0; mt < MT; ++mt) {
				a[mt][0] = *(const ${FT} *)(as + (mt * 16) * RS + kc * KC);
				a[mt][1] = *(const ${FT} *)(as + (mt * 16 + 8) * RS + kc * KC);
			}
#pragma unroll
			for (int nt = 0; nt < NT8; ++nt) {
				const ${FT} b = *(const ${FT} *)(bs + (nt * 8) * RS + kc * KC);
#pragma unroll
				for (int mt = 0; mt < MT; ++mt) {
${MMA}
				}
			}
		}
	};
]], v))
  -- pipeline
  if p.decode then
    w:line([[
	// ---- pipeline: S-1 steps in flight. A by cp.async; B loaded to registers
	// before a step's math and decoded into its (free) stage after it.
#pragma unroll
	for (int st = 0; st < S - 1; ++st) {
		if (st < nkt) {
			issue(kt0 + st, st);
			b_load(kt0 + st);
			b_store(st);
		}
		dg_cp_commit();
	}
#pragma unroll 1
	for (int i = 0; i < nkt; ++i) {
		dg_cp_wait<S - 2>();	// step i's copies have landed (this thread's)
		__syncthreads();	// ... everyone's; and step i-1's math is done
		const int nx = i + S - 1;
		if (nx < nkt) {
			issue(kt0 + nx, nx % S);
			b_load(kt0 + nx);
		}
		dg_cp_commit();
		compute(i % S);
		if (nx < nkt)
			b_store(nx % S);	// stage nx % S was step i-1's: free
	}
	dg_cp_wait<0>();
	__syncthreads();]])
  else
    w:line([[
	// ---- pipeline: S-1 steps in flight by cp.async, one barrier a step.
#pragma unroll
	for (int st = 0; st < S - 1; ++st) {
		if (st < nkt)
			issue(kt0 + st, st);
		dg_cp_commit();
	}
#pragma unroll 1
	for (int i = 0; i < nkt; ++i) {
		dg_cp_wait<S - 2>();	// step i's copies have landed (this thread's)
		__syncthreads();	// ... everyone's; and step i-1's math is done
		const int nx = i + S - 1;
		if (nx < nkt)
			issue(kt0 + nx, nx % S);	// into step i-1's stage
		dg_cp_commit();
		compute(i % S);
	}
	dg_cp_wait<0>();
	__syncthreads();]])
  end
  return w:text()
end

return M

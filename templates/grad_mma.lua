--[[
grad_mma.lua — the tensor-core path of the four gradient GEMMs
(templates/grad.lua picks it with M.fits and renders it with M.render;
the ABI, the grids and the grad_weight splits are grad.lua's, the per-op
addressing grad_ops.lua's).

mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (sm_80+), the GEMM
C[m, n] = Σ_k A[m, k] · B[k, n], A the gradient (f32, or bf16 where the
spec's src says so: the lowrank ops), B the other operand.
Fragment layouts relied on (PTX ISA, "Matrix Fragments for mma.m16n8k16"
with .bf16; lane = 4·g + q, g = groupID 0..7, q = threadID_in_group 0..3;
a .b32 register holds two bf16, the lower-indexed element in bits 0..15):
  A (16x16, row): a0 = A[g][2q, 2q+1]    a1 = A[g+8][2q, 2q+1]
                  a2 = A[g][2q+8, 2q+9]  a3 = A[g+8][2q+8, 2q+9]
  B (16x8, col):  b0 = B[k 2q, 2q+1][n g]   b1 = B[k 2q+8, 2q+9][n g]
  C (16x8, f32):  c0, c1 = C[g][2q, 2q+1]   c2, c3 = C[g+8][2q, 2q+1]
ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the
addresses of rows 0..7 of matrix i (16 bytes each). Without .trans,
register i of lane (g, q) holds [row g][cols 2q, 2q+1] of matrix i; with
.trans, [rows 2q, 2q+1][col g] (low, high).
  * A K-major in shared memory (grad_input ops), As[m][k]: no .trans;
    matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15,
    k 8-15) are a0..a3 — lane l addresses row m = l % 16, k = 8·(l / 16).
  * A M-major (grad_weight ops), As[k][m]: .trans; a stored matrix has rows
    k, cols m, so register i of lane (g, q) is A[m g][k 2q, 2q+1]:
    matrices (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15,
    m 8-15) are a0..a3 — lane l = 8i + r addresses k = 8·(i / 2) + r,
    m = 8·(i % 2).
  * B, Bs[k][n]: .trans; matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7,
    n 8-15), (k 8-15, n 8-15) are b0, b1 of n tile 2p and b0, b1 of 2p+1.

Each element is converted once, when it is staged, never per fragment:
  * A bf16 (src=bf16) needs no conversion: it streams by cp.async straight
    into a ring of S bf16 stages laid out as ldmatrix reads them (As,
    pitch PA), S-1 K steps in flight, and the MMA reads stage i % S. A
    chunk is 8 values (16 bytes, cp.async.cg) when L % 8 == 0, else 4
    (8 bytes, cp.async.ca: a row of grad is then only 8-byte aligned);
    a chunk past M, MM or K is zero-filled. The pipeline below is the
    same without the convert (its copy wait stays: the barrier after it
    publishes the stage).
  * A f32 streams by 16-byte cp.async into a ring of S f32 stages, S-1
    K steps in flight without registers. Its layout is chunk-linear (chunk
    u of a step at 16·u bytes): the thread that copies a chunk is the one
    that converts it, so it needs no barrier in between, and both the copies
    and the 16-byte reads cover whole 128-byte lines. After a step's math a
    thread waits for its own copies of the next step, rounds them to bf16
    (cvt.rn.bf16x2.f32, one instruction a pair) and stores them into the
    next of two bf16 buffers, which ldmatrix reads.
  * B is loaded into registers one step ahead (16-byte loads where the
    packed axis allows) and decoded to bf16 into the same buffer after the
    step's math: integer codes by the integer → float conversion, ternary
    codes by a 16-entry table (a nibble, two codes, to a bf16 pair: one
    shared load, conflict-free), sign1 bits by selects.
  One barrier a step:
    prologue: steps 0..S-2 issued; step 0 converted into buffer 0; barrier.
    step i: issue step i+S-1 into ring stage (i-1) % S; load B of step
    i+1; math on buffer i % 2; wait for step i+1's copies, convert them and
    store B of step i+1 into buffer (i+1) % 2; barrier.
  Shared pitches: bf16 rows of PA = BK + 8 (As[m][k]) or BM + 8 (As[k][m])
  and PB = BN + 8: a row is an odd number of 16-byte chunks, so the 8 rows
  of an ldmatrix phase fall in 8 distinct 16-byte bank groups.

Precision: an f32 gradient (and an f32 operand) is rounded to bf16 (round
to nearest even: a relative error of at most 2^-8 a value); a bf16
gradient, integer codes and bf16 operands are exact in bf16. Products of two bf16 are exact in f32 and
the sums are f32, so |got − ref| <= (2^-8 + K·2^-24) · Σ_k |a_k·b_k| per
output (twice the first term with an f32 operand), and the error relative
to the norm is about 1e-3. (tf32 m16n8k8 would keep 10 bits of the
gradient at half the bf16 rate.) The scale multiplies the f32 sum once at
the end.

Shared memory (dynamic; M.smem_bytes, grad.lua M.plan checks it): f32
A: S·BM·BK·4 bytes of ring plus two buffers of the bf16 A tile and BK·PB
bf16 of B; bf16 A: S bf16 A tiles plus two B tiles. And 64 bytes of static
table for ternary.
]]
local EMIT = require("emit")
local FM = require("formats")
local GOPS = require("grad_ops")
local DEV = require("device")
local fmt = string.format

local M = {}

-- The tensor-core path applies: sm_80 or newer, BK a multiple of 16 (one
-- k16 MMA step), warp tiles whole 16x16 (an m16 A fragment; two n8 B tiles
-- a ldmatrix.x4). grad.lua M.plan asks.
function M.fits(arch, bm, bn, bk, wm, wn)
  return arch >= 80 and bk % 16 == 0 and bm % wm == 0 and bn % wn == 0 and
         (bm // wm) % 16 == 0 and (bn // wn) % 16 == 0
end

local indent = EMIT.indent

-- ---- B units ------------------------------------------------------------------

-- How one B unit of format f is loaded (EU values along n from word pointer
-- p at element n into r[0 .. NWB-1]) and decoded to EU bf16 at bd
-- (unsigned short *, 16-byte aligned when EU % 8 == 0, else 8). `wide`:
-- the packed axis and bn are multiples of 16, so an i8x4 unit may be four
-- words (one 16-byte load).
local function b_unit(f, bn, wide)
  local F = FM.formats[f]
  if f == "f32" then
    return { EU = 4, NWB = 4,
      load = "const uint4 v = __ldg((const uint4 *)(p + n));\n" ..
             "r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;",
      decode = "*(uint2 *)bd = make_uint2(dg_bf16x2(__uint_as_float(r[0]), __uint_as_float(r[1])),\n" ..
               "\t\t\t\t dg_bf16x2(__uint_as_float(r[2]), __uint_as_float(r[3])));" }
  elseif f == "bf16" then
    return { EU = 4, NWB = 2,
      load = "const uint2 v = __ldg((const uint2 *)(p + n / 2));\n" ..
             "r[0] = v.x; r[1] = v.y;",
      decode = "*(uint2 *)bd = make_uint2(r[0], r[1]);" }
  elseif f == "ternary" then
    return { EU = 16, NWB = 1, lut = true,
      load = "r[0] = __ldg(p + n / 16);",
      decode = [[
#pragma unroll
for (int c = 0; c < 2; ++c)	// 16 codes = two uint4 of bf16 pairs, a nibble (two codes) a lookup
	*(uint4 *)(bd + 8 * c) = make_uint4(lut[(r[0] >> (16 * c)) & 15u], lut[(r[0] >> (16 * c + 4)) & 15u],
					     lut[(r[0] >> (16 * c + 8)) & 15u], lut[(r[0] >> (16 * c + 12)) & 15u]);]] }
  elseif f == "sign1" then
    -- bn 16: a unit is half a word (the shift picks the half)
    local eu = math.min(32, bn)
    return { EU = eu, NWB = 1,
      load = "r[0] = __ldg(p + n / 32) >> (n % 32);",
      decode = fmt([[
#pragma unroll
for (int c = 0; c < %d; ++c) {	// %d codes = %d uint2 of bf16 pairs
	const unsigned q4 = (r[0] >> (4 * c)) & 15u;
	*(uint2 *)(bd + 4 * c) = make_uint2(dg_sign_bf(q4 & 1u) | (dg_sign_bf(q4 & 2u) << 16),
					     dg_sign_bf(q4 & 4u) | (dg_sign_bf(q4 & 8u) << 16));
}]], eu // 4, eu, eu // 4) }
  else -- i8x4 codes: int8, int4, uint8pos (|code| <= 255: exact in bf16)
    local fn = F.unsigned and "dg_u8x4_bf16" or "dg_s8x4_bf16"
    if wide then
      return { EU = 16, NWB = 4, i8 = true,
        load = "const uint4 v = __ldg((const uint4 *)(p + n / 4));\n" ..
               "r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;",
        decode = fmt([[
#pragma unroll
for (int c = 0; c < 2; ++c) {	// 16 codes = two uint4 of bf16 pairs
	const uint2 lo = %s(r[2 * c]), hi = %s(r[2 * c + 1]);
	*(uint4 *)(bd + 8 * c) = make_uint4(lo.x, lo.y, hi.x, hi.y);
}]], fn, fn) }
    end
    return { EU = 4, NWB = 1, i8 = true,
      load = "r[0] = __ldg(p + n / 4);",
      decode = fmt("*(uint2 *)bd = %s(r[0]);", fn) }
  end
end

-- Values a B staging unit of format f holds along n (grad.lua M.plan:
-- BN must be a multiple).
function M.unit_eu(f, bn, wide)
  return b_unit(f, bn, wide).EU
end

-- Four i8x4 codes → two bf16 pairs without a conversion instruction (the
-- conversion pipe runs at a quarter of the FP32 rate and would bound the
-- staging): byte u becomes the float 2^23 + u (a byte permute into
-- 0x4b0000uu), an exact subtraction leaves the code, and since a code has at
-- most 8 significant bits its bf16 is the float's upper half, exactly.
local I8_HELPERS = [[
__device__ __forceinline__ uint2 dg_bf16_pack4(float f0, float f1, float f2, float f3)
{
	return make_uint2(__byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632),
			  __byte_perm(__float_as_uint(f2), __float_as_uint(f3), 0x7632));
}

// Signed codes: the byte offset by 128 (x ^ 0x80), then 2^23 + 128 off.
__device__ __forceinline__ uint2 dg_s8x4_bf16(unsigned w)
{
	const unsigned x = w ^ 0x80808080u;
	return dg_bf16_pack4(__uint_as_float(__byte_perm(x, 0x4b000000u, 0x7650)) - 8388736.0f,
			     __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7651)) - 8388736.0f,
			     __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7652)) - 8388736.0f,
			     __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7653)) - 8388736.0f);
}

__device__ __forceinline__ uint2 dg_u8x4_bf16(unsigned w)
{
	return dg_bf16_pack4(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7650)) - 8388608.0f,
			     __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7651)) - 8388608.0f,
			     __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7652)) - 8388608.0f,
			     __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7653)) - 8388608.0f);
}
]]

-- (grad_wgmma.lua's decoder_grad_weight decodes its codes with them too)
M.I8_HELPERS = I8_HELPERS

local HELPERS = [[
// ---- tensor-core helpers (templates/grad_mma.lua) ---------------------------
// A ternary code (00 0, 01 +1, 11 -1, the unused 10 as 0) / a sign1 bit
// (set +1, clear -1) as bf16 bits.
__device__ __forceinline__ unsigned dg_tern_bf(unsigned c)
{
	return (c & 1u) ? (0x3f80u | ((c & 2u) << 14)) : 0u;
}

__device__ __forceinline__ unsigned dg_sign_bf(unsigned bit)
{
	return bit ? 0x3f80u : 0xbf80u;
}

// Four 8x8 b16 matrices from a shared-space address, as stored / transposed
// (see the layout notes in the template).
__device__ __forceinline__ void dg_ldsm_x4(unsigned (&d)[4], unsigned a)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a) : "memory");
}

__device__ __forceinline__ void dg_ldsm_x4_t(unsigned (&d)[4], unsigned a)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a) : "memory");
}

// c += a·b on one m16n8k16 fragment: bf16 inputs, f32 accumulation.
__device__ __forceinline__ void dg_mma_bf16(float (&c)[4], const unsigned (&a)[4],
					    const unsigned (&b)[2])
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
]]

local HEAD = [[
// ---- specialization constants ----------------------------------------------
constexpr int H = ${H};		// heads
constexpr int HIN = ${HIN};		// input heads of the projection: 1 or H
constexpr int E = ${E};		// embd
constexpr int L = ${L};		// latent width per head
typedef ${GT} GT;		// the gradient A (grad): ${gfmt}
typedef ${OT} OT;		// decoder_grad_input's grad_y: ${ofmt}

// ---- tile (tensor cores) ---------------------------------------------------
constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK};	// block tile, K step
constexpr int WM = ${WM}, WN = ${WN};		// warps a block: WM rows x WN cols
constexpr int NT = WM * WN * 32;		// threads a block
constexpr int S = ${S};			// A ring stages (S-1 steps in flight)
constexpr int WTM = BM / WM, WTN = BN / WN;	// warp tile
constexpr int MT = WTM / 16, NT8 = WTN / 8;	// m16 x n8 fragments a warp

// ---- staging: A in chunks of CE values (${CE_WHY}), B in units of EU_B values (${bfmt})
constexpr int CE = ${CE};			// A values a chunk
constexpr int CPR = ${CPR};		// A chunks a tile row (${CPR_WHY})
constexpr int A_CHUNKS = ${A_CHUNKS};		// A chunks a step
constexpr int SA = (A_CHUNKS + NT - 1) / NT;	// A chunks a thread
constexpr int EPW_B = ${EPW_B};		// B values a 32-bit storage word
constexpr int EU_B = ${EU_B};		// B values a unit
constexpr int NWB = ${NWB};			// raw words a B unit
constexpr int UB = BN / EU_B;			// B units a tile row
constexpr int SB = (BK * UB + NT - 1) / NT;	// B units a thread

// ---- shared memory (bytes): ${LAYOUT_WHY}
// A tiles are ${A_SHAPE} (pitch PA), B tiles Bs[k][n] (pitch PB), bf16.
constexpr int PA = ${PA};		// A pitch (bf16): an odd number of 16-byte chunks
constexpr int PB = BN + 8;		// B pitch (bf16), the same
constexpr int A16_BYTES = ${A16_ROWS} * PA * 2;
constexpr int B16_BYTES = BK * PB * 2;
${LAYOUT}]]

-- The shared-memory layout of an f32 A: a chunk-linear f32 ring, then two
-- bf16 buffers (A then B) that the convert fills.
local LAYOUT_F32 = [[
constexpr int RING_STAGE = A_CHUNKS * 16;
constexpr int RING_BYTES = S * RING_STAGE;
constexpr int BUF_BYTES = A16_BYTES + B16_BYTES;	// total: RING_BYTES + 2 * BUF_BYTES = ${SMEM}

// byte offsets of A tile i (a buffer, i = step % 2) and B tile i
__device__ __forceinline__ int dg_a16_at(int i) { return RING_BYTES + i * BUF_BYTES; }
__device__ __forceinline__ int dg_b16_at(int i) { return RING_BYTES + i * BUF_BYTES + A16_BYTES; }
]]

-- bf16 A: the ring is S A tiles themselves, then two B tiles.
local LAYOUT_BF16 = [[
// total: S * A16_BYTES + 2 * B16_BYTES = ${SMEM}
// byte offsets of A tile i (a ring stage, i = step % S) and B tile i (step % 2)
__device__ __forceinline__ int dg_a16_at(int i) { return i * A16_BYTES; }
__device__ __forceinline__ int dg_b16_at(int i) { return S * A16_BYTES + i * B16_BYTES; }
]]

local KERNEL = [=[
extern "C" __global__ void __launch_bounds__(NT)
${ENTRY}(${SIG})
{
	extern __shared__ __align__(16) unsigned char smem[];	// the A ring, then the tiles (HEAD)
${LUT}
	const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
	const int tid = threadIdx.x;
	const int lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, q = lane & 3;		// MMA groupID, thread in group
	const int wr = warp / WN, wc = warp % WN;	// warp's row / col in the block
	const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
${PROLOGUE}
	const int nkt = k_end - k_begin;
	const unsigned *bw = (const unsigned *)${BNAME};	// B as 32-bit words
${ROW_BT}
${A_SLOTS}

	// ---- B: unit u = tid + s·NT is (k row u / UB, EU_B values from n =
	// (u % UB)·EU_B); loaded a step ahead, decoded after the step's math.
	unsigned rb[SB][NWB];
	bool rbv[SB];		// B unit inside K and N (else it stores zeros)
${RBS_DECL}
	auto load_b = [&](int kt) {
${B_STEP}
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
${B_ROW}
				unsigned (&r)[NWB] = rb[s];
${LOAD_B}
			}
		}
	};
	auto store_b = [&](int buf) {
		unsigned short *bs = (unsigned short *)(smem + dg_b16_at(buf));
#pragma unroll
		for (int s = 0; s < SB; ++s) {
			const int u = tid + s * NT, kk = u / UB, nu = u % UB;
			if (${B_GUARD}true) {
				unsigned short *bd = bs + kk * PB + nu * EU_B;	// Bs[kk][nu·EU_B ..]
				const unsigned (&r)[NWB] = rb[s];
				if (rbv[s]) {
${DECODE_B}
${RBS_APPLY}
				} else {
#pragma unroll
					for (int c = 0; c < EU_B / 4; ++c)
						*(uint2 *)(bd + 4 * c) = make_uint2(0u, 0u);
				}
			}
		}
	};

	// ---- the MMA of one buffer: f32 sums, k ascending within a fragment.
	// Lane offsets (bytes) of its ldmatrix rows, k16 step 0, fragment 0.
	const int li = lane >> 3, lr = lane & 7;
${A_LANE}
	const unsigned b_lane = (unsigned)((((li & 1) * 8 + lr) * PB + wc * WTN + (li >> 1) * 8) * 2);
	float acc[MT][NT8][4];
#pragma unroll
	for (int mt = 0; mt < MT; ++mt)
#pragma unroll
		for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
			for (int i = 0; i < 4; ++i)
				acc[mt][nt][i] = 0.0f;
	auto compute = [&](int abuf, int bbuf) {
		const unsigned as = sbase + dg_a16_at(abuf) + a_lane;
		const unsigned bs = sbase + dg_b16_at(bbuf) + b_lane;
#pragma unroll
		for (int ks = 0; ks < BK / 16; ++ks) {
			unsigned a[MT][4], b[NT8][2];
#pragma unroll
			for (int mt = 0; mt < MT; ++mt)
${A_FRAG}
#pragma unroll
			for (int np = 0; np < NT8 / 2; ++np) {
				unsigned d[4];
				dg_ldsm_x4_t(d, bs + (ks * 16 * PB + np * 16) * 2);
				b[2 * np][0] = d[0];
				b[2 * np][1] = d[1];
				b[2 * np + 1][0] = d[2];
				b[2 * np + 1][1] = d[3];
			}
#pragma unroll
			for (int mt = 0; mt < MT; ++mt)
#pragma unroll
				for (int nt = 0; nt < NT8; ++nt)
					dg_mma_bf16(acc[mt][nt], a[mt], b[nt]);
		}
	};

	// ---- pipeline (the notes in the template): one barrier a step.
#pragma unroll
	for (int st = 0; st < S - 1; ++st) {
		if (st < nkt)
			issue_a(k_begin + st, st);
		dg_cp_commit();
	}
	if (nkt > 0) {
		load_b(k_begin);
		dg_cp_wait<S - 2>();	// this thread's copies of step 0
${CONVERT_0}
		store_b(0);
	}
	__syncthreads();
#pragma unroll 1
	for (int i = 0; i < nkt; ++i) {
		const int nx = i + S - 1;
		if (nx < nkt)
			issue_a(k_begin + nx, nx % S);	// the stage step i-1 had
		dg_cp_commit();
		const bool more = i + 1 < nkt;
		if (more)
			load_b(k_begin + i + 1);
		compute(${A_TILE}, i & 1);
		if (more) {
			dg_cp_wait<S - 2>();	// this thread's copies of step i+1
${CONVERT_NEXT}
			store_b((i + 1) & 1);	// buffer (i+1) % 2 was step i-1's: free
		}
		__syncthreads();
	}
	dg_cp_wait<0>();

${EPILOGUE}
}
]=]

-- (b, t) of row kk of a K step whose first row is (b0, t0): one wrap when
-- T >= BK (kk < BK), a division otherwise.
local ROW_BT = [[
	auto row_bt = [&](int kk, int b0, int t0, int &b, int &t) {
		t = t0 + kk;
		b = b0;
		if (t >= T) {
			if (T >= BK) {
				t -= T;
				++b;
			} else {
				b += t / T;
				t %= T;
			}
		}
	};]]

local A_SLOTS_KMAJOR = [[
	// ---- A: chunk u = tid + s·NT of a step is row u / CPR (m), floats
	// 4·(u % CPR) .. (k); rows past M are zero-filled.
	const GT *a_src[SA];		// the chunk at k = 0; nullptr: zeros
#pragma unroll
	for (int s = 0; s < SA; ++s) {
		const int u = tid + s * NT, row = u / CPR, c = u % CPR;
		a_src[s] = nullptr;
		if (${A_GUARD}m0 + row < M)
			a_src[s] = dg_a_base(grad, m0 + row, z, T) + 4 * c;
	}
	auto issue_a = [&](int kt, int stg) {
		const long long off = dg_a_koff(kt, T);
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
			if (${A_GUARD}true)
				dg_cp16(sbase + stg * RING_STAGE + u * 16,
					a_src[s] ? (const void *)(a_src[s] + off) : (const void *)grad,
					a_src[s] ? 16 : 0);
		}
	};
	// ring stage stg → bf16 buffer buf, As[m][k]: this thread's chunks only.
	auto convert_a = [&](int stg, int buf) {
		const float *ring = (const float *)(smem + stg * RING_STAGE);
		unsigned short *as = (unsigned short *)(smem + dg_a16_at(buf));
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT, row = u / CPR, c = u % CPR;
			if (${A_GUARD}true) {
				const float4 v = *(const float4 *)(ring + 4 * u);
				*(uint2 *)(as + row * PA + 4 * c) = make_uint2(dg_bf16x2(v.x, v.y), dg_bf16x2(v.z, v.w));
			}
		}
	};]]

local A_SLOTS_MMAJOR = [[
	// ---- A: chunk u = tid + s·NT of a step is k row u / CPR, floats
	// 4·(u % CPR) .. of the block's rows (m); zeros past K or MM (MM % 4 ==
	// 0: a chunk is wholly in or out).
	auto issue_a = [&](int kt, int stg) {
		const int kb = kt * BK, b0 = kb / T, t0 = kb - b0 * T;
		(void)b0;
		(void)t0;
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT, kk = u / CPR, c = u % CPR, m = m0 + 4 * c;
			if (${A_GUARD}true) {
				const GT *src = grad;
				int bytes = 0;
				if (kb + kk < K && m < MM) {
${A_ROW}
					bytes = 16;
				}
				dg_cp16(sbase + stg * RING_STAGE + u * 16, src, bytes);
			}
		}
	};
	// ring stage stg → bf16 buffer buf, As[k][m]: this thread's chunks only.
	auto convert_a = [&](int stg, int buf) {
		const float *ring = (const float *)(smem + stg * RING_STAGE);
		unsigned short *as = (unsigned short *)(smem + dg_a16_at(buf));
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT, kk = u / CPR, c = u % CPR;
			if (${A_GUARD}true) {
				const float4 v = *(const float4 *)(ring + 4 * u);
				*(uint2 *)(as + kk * PA + 4 * c) = make_uint2(dg_bf16x2(v.x, v.y), dg_bf16x2(v.z, v.w));
			}
		}
	};]]

-- bf16 A (src=bf16): cp.async straight into ring stage stg's As tile, the
-- layout ldmatrix reads; no convert.
local A_SLOTS_KMAJOR_BF16 = [[
	// ---- A: chunk u = tid + s·NT of a step is row u / CPR (m), values
	// CE·(u % CPR) .. (k), copied into stage stg's As[m][k]; rows past M
	// are zero-filled.
	const GT *a_src[SA];		// the chunk at k = 0; nullptr: zeros
	unsigned a_dst[SA];		// its byte offset in an A tile
#pragma unroll
	for (int s = 0; s < SA; ++s) {
		const int u = tid + s * NT, row = u / CPR, c = u % CPR;
		a_src[s] = nullptr;
		a_dst[s] = (unsigned)((row * PA + CE * c) * 2);
		if (${A_GUARD}m0 + row < M)
			a_src[s] = dg_a_base(grad, m0 + row, z, T) + CE * c;
	}
	auto issue_a = [&](int kt, int stg) {
		const long long off = dg_a_koff(kt, T);
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT;
			(void)u;
			if (${A_GUARD}true)
				${CP}(sbase + dg_a16_at(stg) + a_dst[s],
					a_src[s] ? (const void *)(a_src[s] + off) : (const void *)grad,
					a_src[s] ? CE * 2 : 0);
		}
	};]]

local A_SLOTS_MMAJOR_BF16 = [[
	// ---- A: chunk u = tid + s·NT of a step is k row u / CPR, values
	// CE·(u % CPR) .. of the block's rows (m), copied into stage stg's
	// As[k][m]; zeros past K or MM (MM % CE == 0: a chunk is wholly in or
	// out).
	auto issue_a = [&](int kt, int stg) {
		const int kb = kt * BK, b0 = kb / T, t0 = kb - b0 * T;
		(void)b0;
		(void)t0;
#pragma unroll
		for (int s = 0; s < SA; ++s) {
			const int u = tid + s * NT, kk = u / CPR, c = u % CPR, m = m0 + CE * c;
			if (${A_GUARD}true) {
				const GT *src = grad;
				int bytes = 0;
				if (kb + kk < K && m < MM) {
${A_ROW}
					bytes = CE * 2;
				}
				${CP}(sbase + dg_a16_at(stg) + (unsigned)((kk * PA + CE * c) * 2), src, bytes);
			}
		}
	};]]

-- Lane offsets and fragment loads of A (see the layout notes).
local A_LANE_KMAJOR = "\tconst unsigned a_lane = (unsigned)(((wr * WTM + (lane & 15)) * PA + (lane >> 4) * 8) * 2);"
local A_FRAG_KMAJOR = "\t\t\t\tdg_ldsm_x4(a[mt], as + (mt * 16 * PA + ks * 16) * 2);"
local A_LANE_MMAJOR = "\tconst unsigned a_lane = (unsigned)((((li >> 1) * 8 + lr) * PA + wr * WTM + (li & 1) * 8) * 2);"
local A_FRAG_MMAJOR = "\t\t\t\tdg_ldsm_x4_t(a[mt], as + (ks * 16 * PA + mt * 16) * 2);"

local EPI_INPUT = [[
	// ---- epilogue: ${SCALE_WHY}; fragment rows g, g+8, cols 2q, 2q+1
	// (N is even: a pair is wholly in or out), float2 stores (f32) or one
	// bf16x2 word (out=bf16: each rounded to nearest even once).
${SCALE_LOAD}
#pragma unroll
	for (int mt = 0; mt < MT; ++mt)
#pragma unroll
		for (int hr = 0; hr < 2; ++hr) {
			const int m = m0 + wr * WTM + mt * 16 + g + 8 * hr;
			if (m >= M)
				continue;
#pragma unroll
			for (int nt = 0; nt < NT8; ++nt) {
				const int n = n0 + wc * WTN + nt * 8 + 2 * q;
				if (n < N)
${STORE}
			}
		}]]

local EPI_WEIGHT = [[
	// ---- epilogue: splits == 1: grad_w (+)= ${SCALED_DESC}; else the raw sum
	// into partial p (dst + p·NW), summed by the reduce entry. Fragment rows
	// g, g+8, cols 2q, 2q+1.
${SCALE_LOAD}
	float *out = splits == 1 ? dst : dst + (long long)sp * NW;
#pragma unroll
	for (int mt = 0; mt < MT; ++mt)
#pragma unroll
		for (int hr = 0; hr < 2; ++hr) {
			const int m = m0 + wr * WTM + mt * 16 + g + 8 * hr;
			if (m >= MM)
				continue;
#pragma unroll
			for (int nt = 0; nt < NT8; ++nt) {
				const int n = n0 + wc * WTN + nt * 8 + 2 * q;
				if (n >= N)
					continue;
				float2 *o = (float2 *)(out + dg_out(m, n, h, T));
				const float c0 = acc[mt][nt][2 * hr], c1 = acc[mt][nt][2 * hr + 1];
				if (splits != 1) {
					*o = make_float2(c0, c1);
				} else {
					float2 v = make_float2(${S0}, ${S1});
					if (accumulate) {
						const float2 pv = *o;
						v.x = __fadd_rn(pv.x, v.x);
						v.y = __fadd_rn(pv.y, v.y);
					}
					*o = v;
				}
			}
		}]]

-- Shared memory bytes of the tensor-core tile (grad.lua M.plan); a_bf16:
-- the gradient is bf16 (src=bf16), so the ring is the A tiles themselves.
function M.smem_bytes(a_kmajor, a_bf16, bm, bn, bk, stages)
  local S = math.max(2, stages)
  local a16 = a_kmajor and bm * (bk + 8) or bk * (bm + 8)
  local b16 = bk * (bn + 8)
  if a_bf16 then return S * a16 * 2 + 2 * b16 * 2 end
  return S * bm * bk * 4 + 2 * (a16 + b16) * 2
end

-- Renders the tensor-core kernel; `c` holds what grad.lua's render
-- worked out (spec, op, its OPS entry o, formats, shape, tile, banner lines).
function M.render(c)
  local o, op, bfmt, F = c.o, c.op, c.bfmt, c.F
  local bm, bn, bk, wm, wn = c.bm, c.bn, c.bk, c.wm, c.wn
  local S = math.max(2, c.stages)
  local packed_len = op:match("^lowrank") and c.E or c.L
  local u = b_unit(bfmt, bn, packed_len % 16 == 0 and bn % 16 == 0)
  local smem = c.smem -- grad.lua M.plan: M.smem_bytes
  local nt = wm * wn * 32
  -- a bf16 gradient (src=bf16) is copied straight into the A tiles, in
  -- chunks of 8 values (16 bytes) where L % 8 == 0 keeps every row of grad
  -- 16-byte aligned (and an M-major chunk wholly inside MM = L), else 4
  local a16 = c.gfmt == "bf16"
  local ce = (a16 and c.L % 8 == 0) and 8 or 4
  local a_chunks = bm * bk // ce
  local ub = bn // u.EU
  local b_guard = (bk * ub) % nt ~= 0 and "u < BK * UB && " or ""
  local a_guard = a_chunks % nt ~= 0 and "u < A_CHUNKS && " or ""

  local v = {
    H = c.H, HIN = c.HIN, E = c.E, L = c.L,
    BM = bm, BN = bn, BK = bk, WM = wm, WN = wn, S = S,
    PA = o.a_kmajor and "BK + 8" or "BM + 8", A_SHAPE = o.a_kmajor and "As[m][k]" or "As[k][m]",
    A16_ROWS = o.a_kmajor and "BM" or "BK", SMEM = smem, bfmt = bfmt,
    CE = ce, CE_WHY = a16 and fmt("%d bytes of bf16, cp.async into the A tile", ce * 2) or "16 bytes of f32",
    CPR = o.a_kmajor and "BK / CE" or "BM / CE", CPR_WHY = o.a_kmajor and "along k" or "along m",
    A_CHUNKS = o.a_kmajor and "BM * CPR" or "BK * CPR",
    EPW_B = F.epw, EU_B = u.EU, NWB = u.NWB,
    GT = c.GT, OT = c.OT, gfmt = c.gfmt, ofmt = c.ofmt,
    LAYOUT_WHY = a16 and "S bf16 A tiles (the cp.async ring), then two B tiles."
                     or "the f32 ring (S stages, chunk-linear), then two\n// buffers, each an A tile then a B tile.",
    LAYOUT = EMIT.subst(a16 and LAYOUT_BF16 or LAYOUT_F32, { SMEM = smem }),
  }
  local kv = {
    ENTRY = c.entry, BT = F.ctype, BNAME = c.bname, B_GUARD = b_guard,
    LOAD_B = indent(u.load, 4), DECODE_B = indent(u.decode, 5),
    LUT = u.lut and "\t__shared__ unsigned lut[16];\t// a nibble (two ternary codes) → a bf16 pair\n" ..
                    "\tif (threadIdx.x < 16)\n" ..
                    "\t\tlut[threadIdx.x] = dg_tern_bf(threadIdx.x & 3u) | (dg_tern_bf(threadIdx.x >> 2) << 16);\n" ..
                    "\t__syncthreads();\t// the table, before the prologue decodes step 0"
                or "",
  }
  kv.SIG = EMIT.subst(o.sig, kv)
  local at_end = F.code and not c.vec -- a vector scale goes into B as it is staged
  local scale_load = at_end and fmt("\tconst float s = *%s;\t\t// the %s's scale", o.scale,
                                    o.w_operand and "weight" or "activation")
                            or (c.vec and fmt("\t(void)%s;\t// the scales went into B as it was staged", o.scale)
                            or "\t// float operand: no scale")
  local function scaled(x) return at_end and fmt("__fmul_rn(%s, s)", x) or x end
  kv.RBS_DECL, kv.RBS_LOAD, kv.RBS_APPLY = "", "", ""
  if c.vec then
    -- B(k, n) · s_k: the decoded bf16 (exact for codes) times the scale,
    -- rounded to bf16 once more
    kv.RBS_DECL = "\tfloat rbs[SB];\t\t// the scale of each unit's B row (per " ..
                  (o.w_operand and "channel" or "token") .. ")"
    kv.RBS_LOAD = fmt("\t\t\trbs[s] = rbv[s] ? dg_b_scale(%s, k, %s, T) : 0.0f;", o.scale,
                      o.a_kmajor and "z" or "h")
    kv.RBS_APPLY = [[
#pragma unroll
					for (int c = 0; c < EU_B / 2; ++c) {	// B(k, n) · s_k, rounded to bf16
						unsigned *pr = (unsigned *)(bd + 2 * c);
						const unsigned x = *pr;
						*pr = dg_bf16x2(__fmul_rn(__uint_as_float(x << 16), rbs[s]),
								__fmul_rn(__uint_as_float(x & 0xffff0000u), rbs[s]));
					}]]
  end
  local slots = a16 and (o.a_kmajor and A_SLOTS_KMAJOR_BF16 or A_SLOTS_MMAJOR_BF16)
                   or (o.a_kmajor and A_SLOTS_KMAJOR or A_SLOTS_MMAJOR)
  -- f32: convert the ring stage into the bf16 buffer; bf16: the copy is the tile
  kv.CONVERT_0 = a16 and "\t\t// bf16 A: the copies are the tile (ring stage 0)" or "\t\tconvert_a(0, 0);"
  kv.CONVERT_NEXT = a16 and "\t\t\t// bf16 A: the copies are the tile (ring stage (i+1) % S)"
                        or "\t\t\tconvert_a((i + 1) % S, (i + 1) & 1);"
  kv.A_TILE = a16 and "i % S" or "i & 1"

  -- decoder_grad_weight's A rows are k itself (grad is (B·T, E)): no (b, t)
  local a_row = op == "decoder_grad_weight"
    and "\t\t\t\t\tsrc = grad + (long long)(kb + kk) * E + m;\t// A row k = b*T + t"
    or "\t\t\t\t\tint bb, tt;\n\t\t\t\t\trow_bt(kk, b0, t0, bb, tt);\n" ..
       "\t\t\t\t\tsrc = dg_a_krow(grad, bb, tt, h, T) + m;"
  kv.A_SLOTS = EMIT.subst(slots, { A_GUARD = a_guard, A_ROW = a_row, CP = ce == 8 and "dg_cp16" or "dg_cp8" })
  if o.a_kmajor then
    -- lowrank_grad_input splits K (GOPS.GI_SPLIT); decoder_grad_input (K = E,
    -- a few steps) runs it whole
    kv.PROLOGUE = o.split and GOPS.GI_SPLIT.PROLOGUE
                  or "\tconst int M = B * T;\t\t\t// output rows (b, t)\n" ..
                     "\tconst int z = blockIdx.z;\t\t// head" ..
                     "\n\tconst int k_begin = 0, k_end = KT;"
    kv.ROW_BT = ""
    kv.B_STEP = ""
    kv.K_GUARD_B = ""
    kv.B_ROW = "\t\t\t\tconst unsigned *p = dg_b_row(bw, k, z, T);"
    kv.A_LANE, kv.A_FRAG = A_LANE_KMAJOR, A_FRAG_KMAJOR
    kv.EPILOGUE = EMIT.subst(EPI_INPUT, {
      SCALE_WHY = o.split and GOPS.GI_SPLIT.why(at_end)
                  or (F.code and fmt("%s = %s · Σ (the integer operand's scale, once)", o.out_name, o.scale)
                              or fmt("%s = Σ", o.out_name)),
      SCALE_LOAD = (o.split and at_end) and GOPS.GI_SPLIT.SCALE_LOAD or scale_load,
      -- out=bf16 (decoder_grad_input's grad_y): the pair rounded to nearest even once
      STORE = EMIT.subst(c.ofmt == "bf16"
        and "\t\t\t\t\t*(unsigned *)(${OUT} + dg_out(m, n, z, T)) =\n\t\t\t\t\t\tdg_bf16x2(${S0}, ${S1});"
        or "\t\t\t\t\t*(float2 *)(${OUT} + dg_out(m, n, z, T)) =\n\t\t\t\t\t\tmake_float2(${S0}, ${S1});",
        { OUT = o.split and "out" or o.out_name, S0 = scaled("acc[mt][nt][2 * hr]"), S1 = scaled("acc[mt][nt][2 * hr + 1]") }) })
  else
    kv.PROLOGUE = "\tconst int K = B * T;\t\t\t// the reduction (b, t)\n" ..
                  "\tconst int h = blockIdx.z % H, sp = blockIdx.z / H;	// head, split\n" ..
                  "\tconst int kt_all = (K + BK - 1) / BK;\n" ..
                  "\tconst int k_begin = min(sp * kt_per_split, kt_all);\n" ..
                  "\tconst int k_end = min(k_begin + kt_per_split, kt_all);	// empty: writes zeros"
    kv.ROW_BT = ROW_BT
    kv.B_STEP = "\t\tconst int kb = kt * BK, b0 = kb / T, t0 = kb - b0 * T;"
    kv.K_GUARD_B = "k < K && "
    kv.B_ROW = "\t\t\t\tint bb, tt;\n\t\t\t\trow_bt(kk, b0, t0, bb, tt);\n" ..
               "\t\t\t\tconst unsigned *p = dg_b_krow(bw, bb, tt, h, T);"
    kv.A_LANE, kv.A_FRAG = A_LANE_MMAJOR, A_FRAG_MMAJOR
    kv.EPILOGUE = EMIT.subst(EPI_WEIGHT, {
      SCALED_DESC = F.code and "sa · Σ" or "Σ", SCALE_LOAD = scale_load,
      S0 = scaled("c0"), S1 = scaled("c1") })
  end

  local w = EMIT.writer()
  c.about[#c.about + 1] = fmt("path: tensor cores (mma.sync m16n8k16 bf16, f32 sums; sm_%d >= sm_80, BK %% 16 == 0,", c.arch)
  c.about[#c.about + 1] = fmt("  warp tile %dx%d whole 16x16): gradient %s, %s operand decoded",
                              bm // wm, bn // wn,
                              a16 and "bf16, copied by cp.async into the A tiles" or "rounded to bf16 once as staged",
                              bfmt)
  c.about[#c.about + 1] = fmt("  to bf16 once (%s); both read by ldmatrix; %d-stage %s cp.async ring, %d bytes of",
                              (F.code or bfmt == "bf16") and "exact" or "rounded", S, a16 and "bf16" or "f32", smem)
  c.about[#c.about + 1] = "  dynamic shared memory (templates/grad_mma.lua)."
  w:line(EMIT.banner(c.spec, "grad.lua", c.about))
  w:line(DEV.helpers({ bf16x2 = true, cp_async = true, cp_async_small = true }))
  w:line(HELPERS)
  if u.i8 then w:line(I8_HELPERS) end
  w:line(EMIT.subst(HEAD, v))
  w:line(EMIT.subst(o.text, { HIN_H = c.HIN_H }))
  w:line(EMIT.subst(GOPS.ADDR[op], { HIN_H = c.HIN_H }))
  w:line(EMIT.subst(KERNEL, kv))
  return w:text()
end

return M

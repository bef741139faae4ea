--[[
pack.lua — i8x4 packing of int8 codes along the reduction axis and back
(dg_ref_pack_i8x4 / dg_ref_unpack_i8x4 mirror them):

  extern "C" __global__ void dg_pack_i8x4(const signed char *codes,
      int *packed, long long rows)
    codes (rows, K, C) → packed (rows, C, K/4): the word (r, c, k/4) holds
    codes k..k+3 of column c, code k in the low byte.
  extern "C" __global__ void dg_unpack_i8x4(const int *packed,
      signed char *codes, long long rows)
    the inverse.

  K = embd, C = latent (compile-time); rows is a run-time argument. Any
  grid: blocks walk (row, K tile, C tile) tiles grid-stride. Each tile
  (TK codes along K by TC columns) goes through shared memory, so both the
  reads and the writes are coalesced along the axis that is contiguous in
  memory (C for codes, K/4 for packed); an odd pitch keeps the column reads
  of shared memory free of bank conflicts.
]]
local SPEC = require("spec")
local EMIT = require("emit")
local TILES = require("tiles")
local fmt = string.format

local M = {}

local COMMON = [[
constexpr int K = ${K};		// embd: the packed (reduction) axis
constexpr int C = ${C};		// latent: columns
constexpr int NT = ${NT};		// threads a block
constexpr int TK = ${TK};		// tile: TK codes along K (a multiple of 4) ...
constexpr int TC = ${TC};		// ... by TC columns
constexpr int TKW = TK / 4;		// packed words a tile column
constexpr int PITCH = TC + 1;		// bytes a shared tile row (odd: no bank conflicts)
constexpr int KTILES = (K + TK - 1) / TK;
constexpr int CTILES = (C + TC - 1) / TC;
]]

local PACK = [[
extern "C" __global__ void __launch_bounds__(NT)
dg_pack_i8x4(const signed char *__restrict__ codes, int *__restrict__ packed, long long rows)
{
	__shared__ unsigned char tile[TK * PITCH];	// (TK, TC) codes, row pitch PITCH
	const long long ntiles = rows * KTILES * CTILES;
	for (long long tl = blockIdx.x; tl < ntiles; tl += gridDim.x) {
		const long long r = tl / (KTILES * CTILES);
		const int rest = (int)(tl - r * (KTILES * CTILES));
		const int k0 = rest / CTILES * TK, c0 = rest % CTILES * TC;
		const signed char *src = codes + r * K * C;	// (K, C)
		int *dst = packed + r * C * (K / 4);		// (C, K/4)
		// Read the tile along C (contiguous in codes).
		for (int i = threadIdx.x; i < TK * TC; i += NT) {
			const int kk = i / TC, cc = i % TC;
			if (k0 + kk < K && c0 + cc < C)
				tile[kk * PITCH + cc] = (unsigned char)src[(long long)(k0 + kk) * C + c0 + cc];
		}
		__syncthreads();
		// Write it along K/4 (contiguous in packed): four codes a word.
		for (int i = threadIdx.x; i < TC * TKW; i += NT) {
			const int cc = i / TKW, kw = i % TKW;
			if (k0 + 4 * kw < K && c0 + cc < C) {
				const unsigned char *t = tile + 4 * kw * PITCH + cc;
				dst[(long long)(c0 + cc) * (K / 4) + k0 / 4 + kw] =
					(int)((unsigned)t[0] | (unsigned)t[PITCH] << 8 |
					      (unsigned)t[2 * PITCH] << 16 | (unsigned)t[3 * PITCH] << 24);
			}
		}
		__syncthreads();
	}
}
]]

local UNPACK = [[
extern "C" __global__ void __launch_bounds__(NT)
dg_unpack_i8x4(const int *__restrict__ packed, signed char *__restrict__ codes, long long rows)
{
	__shared__ unsigned char tile[TK * PITCH];	// (TK, TC) codes, row pitch PITCH
	const long long ntiles = rows * KTILES * CTILES;
	for (long long tl = blockIdx.x; tl < ntiles; tl += gridDim.x) {
		const long long r = tl / (KTILES * CTILES);
		const int rest = (int)(tl - r * (KTILES * CTILES));
		const int k0 = rest / CTILES * TK, c0 = rest % CTILES * TC;
		const int *src = packed + r * C * (K / 4);	// (C, K/4)
		signed char *dst = codes + r * K * C;		// (K, C)
		// Read the tile along K/4 (contiguous in packed).
		for (int i = threadIdx.x; i < TC * TKW; i += NT) {
			const int cc = i / TKW, kw = i % TKW;
			if (k0 + 4 * kw < K && c0 + cc < C) {
				const unsigned u = (unsigned)__ldg(src + (long long)(c0 + cc) * (K / 4) + k0 / 4 + kw);
				unsigned char *t = tile + 4 * kw * PITCH + cc;
				t[0] = (unsigned char)u;
				t[PITCH] = (unsigned char)(u >> 8);
				t[2 * PITCH] = (unsigned char)(u >> 16);
				t[3 * PITCH] = (unsigned char)(u >> 24);
			}
		}
		__syncthreads();
		// Write it along C (contiguous in codes).
		for (int i = threadIdx.x; i < TK * TC; i += NT) {
			const int kk = i / TC, cc = i % TC;
			if (k0 + kk < K && c0 + cc < C)
				dst[(long long)(k0 + kk) * C + c0 + cc] = (signed char)tile[kk * PITCH + cc];
		}
		__syncthreads();
	}
}
]]

function M.plan(spec)
  local op = SPEC.one_of(spec, "op", { "pack_i8x4", "unpack_i8x4" })
  return TILES.threads_plan(spec, { "dg_" .. op }, op .. ".cu")
end

function M.render(spec, plan)
  local op = SPEC.one_of(spec, "op", { "pack_i8x4", "unpack_i8x4" })
  local K = SPEC.int_field(spec, "embd", 4)
  local Cc = SPEC.int_field(spec, "latent", 1)
  local nt = plan.tile.threads

  local v = { K = K, C = Cc, NT = nt, TK = math.min(128, K), TC = 32 }
  local about
  if op == "pack_i8x4" then
    about = {
      fmt("pack_i8x4: codes (rows, %d, %d) int8 → packed (rows, %d, %d) i8x4, code k in the low byte.",
          K, Cc, Cc, K // 4),
      "",
      fmt("dg_pack_i8x4(const signed char *codes, int *packed, long long rows)   any grid, %d threads", nt),
    }
  else
    about = {
      fmt("unpack_i8x4: packed (rows, %d, %d) i8x4 → codes (rows, %d, %d) int8.", Cc, K // 4, K, Cc),
      "",
      fmt("dg_unpack_i8x4(const int *packed, signed char *codes, long long rows)   any grid, %d threads", nt),
    }
  end

  local w = EMIT.writer()
  w:line(EMIT.banner(spec, "pack.lua", about))
  w:line(EMIT.subst(COMMON, v))
  w:line(op == "pack_i8x4" and PACK or UNPACK)
  return w:text()
end

return M

--[[
tiles.lua — the tile rules every op's plan is made of.

Every op module answers plan(spec) before it renders: the path its kernel
takes, the tile (an auto tile resolved to the module's default), and the
launch info of every entry, or nil and a message naming the field when
the spec's tile cannot run on that path. The host asks plan for
validation, tuning candidates, defaults and launches alike, so these
rules live here and in the op modules and nowhere else (codegen/codegen.c
caches the answers). A refusal is returned, never raised: a raised error
is a template bug.

Here: the shared-memory limits of an arch, the tile's text and its
refusal, the GEMM block tile's checks (powers of two, BK against the
reduction, warps, stages, the SIMT warp tile, shared memory), and the
plan of an element-wise op (a thread count).
]]
local M = {}

local fmt = string.format

function M.is_pow2(n)
  return n > 0 and (n & (n - 1)) == 0
end

M.SMEM_STATIC = 48 * 1024 -- static shared memory a block may use

-- Dynamic shared memory a block may opt in to on an arch.
function M.smem_limit(arch)
  if arch >= 90 then return 227 * 1024 end
  if arch == 80 or arch == 87 then return 163 * 1024 end
  if arch >= 86 then return 99 * 1024 end
  if arch >= 70 then return arch == 75 and 64 * 1024 or 96 * 1024 end
  return M.SMEM_STATIC
end

-- A GEMM block's tile from a grid of (n-tiles, m-tiles) blocks, taken m
-- fastest: the blocks resident at once cover few n-tiles and every m-tile
-- of them, so they share the B operand's columns through L2. For a kernel
-- whose B is the large operand (decoder_grad_weight's y, 0.5 GB a layer at
-- D 1280, H 16, N 16384), read from HBM once instead of once an m-tile.
-- (A grid laid out m first needs no remapping: decoder_gate_bwd's.)
M.M_FASTEST = [[
	const unsigned tile_id = blockIdx.y * gridDim.x + blockIdx.x;	// m fastest (tiles.lua M_FASTEST)
	const int m0 = (int)(tile_id % gridDim.y) * BM, n0 = (int)(tile_id / gridDim.y) * BN;]]

function M.tile_is_auto(t)
  return t.bm == 0 and t.bn == 0 and t.bk == 0 and t.wm == 0 and t.wn == 0 and t.stages == 0 and t.threads == 0
end

-- The tile's text, as the canonical spec writes it.
function M.tile_text(t)
  if M.tile_is_auto(t) then return "auto" end
  if t.threads ~= 0 and t.stages ~= 0 then return fmt("t%d/%d", t.threads, t.stages) end
  if t.threads ~= 0 then return "t" .. t.threads end
  return fmt("%dx%dx%d/%dx%d/%d", t.bm, t.bn, t.bk, t.wm, t.wn, t.stages)
end

-- A refusal of tile t: nil and "tile=<t>: <message>" (an auto tile says
-- which default it stands for).
function M.refuse(t, auto, msg, ...)
  local head = auto and fmt("tile=auto (default %s): ", M.tile_text(t)) or fmt("tile=%s: ", M.tile_text(t))
  return nil, head .. fmt(msg, ...)
end

function M.pow2_in(v, lo, hi)
  return v >= lo and v <= hi and M.is_pow2(v)
end

-- A copy of the spec's tile with every field an integer (0 when absent).
function M.tile_of(spec)
  local t = {}
  for _, k in ipairs({ "bm", "bn", "bk", "wm", "wn", "stages", "threads" }) do
    t[k] = math.tointeger(spec.tile and spec.tile[k] or 0) or 0
  end
  return t
end

-- BM and BN powers of two from 16 to 256, BK from 4 to 128: every GEMM
-- block tile, whatever its path.
function M.gemm_tile_pow2(t, auto)
  if not M.pow2_in(t.bm, 16, 256) or not M.pow2_in(t.bn, 16, 256) then
    return M.refuse(t, auto, "BM and BN must be powers of two from 16 to 256")
  end
  if not M.pow2_in(t.bk, 4, 128) then
    return M.refuse(t, auto, "BK must be a power of two from 4 to 128")
  end
  return true
end

-- BK divides the compile-time reduction length red (named red_name).
function M.bk_divides(t, auto, red, red_name)
  if red % t.bk ~= 0 then
    return M.refuse(t, auto, "BK=%d must divide %s=%d (the reduction length)", t.bk, red_name, red)
  end
  return true
end

-- WM x WN warps of a warp-tiled (not warpgroup) GEMM tile.
function M.warps_ok(t, auto)
  if not M.pow2_in(t.wm, 1, 8) or not M.pow2_in(t.wn, 1, 8) or t.wm * t.wn > 16 then
    return M.refuse(t, auto, "WM and WN must be 1, 2, 4 or 8 with WM*WN <= 16 warps")
  end
  return true
end

function M.stages_ok(t, auto, lo, hi)
  if t.stages < lo or t.stages > hi then
    return M.refuse(t, auto, "stages must be %d to %d", lo, hi)
  end
  return true
end

-- The SIMT warp tile: whole 4x8 lane grids, at most 64 outputs a thread.
function M.simt_warp_tile(t, auto)
  local wtm, wtn = t.bm // t.wm, t.bn // t.wn
  if wtm % 4 ~= 0 or wtn % 8 ~= 0 or t.bm < t.wm * 4 or t.bn < t.wn * 8 then
    return M.refuse(t, auto, "each warp's tile (BM/WM x BN/WN) must be at least 4x8 and a multiple of it")
  end
  if (wtm // 4) * (wtn // 8) > 64 then
    return M.refuse(t, auto, "%d outputs per thread; at most 64 fit in registers (more warps or a smaller tile)",
                    (wtm // 4) * (wtn // 8))
  end
  return true
end

-- Shared memory `bytes` within what a block may have (dynamic: the arch's
-- opt-in limit; static: 48 KiB).
function M.smem_fits(t, auto, bytes, arch, static)
  local limit = static and M.SMEM_STATIC or M.smem_limit(arch)
  if bytes > limit then
    return M.refuse(t, auto, "needs %d bytes of shared memory, more than the %d an sm_%d block can have (fewer stages or a smaller tile)",
                    bytes, limit, arch)
  end
  return true
end

-- The plan of an element-wise op (a thread count): default t256; threads a
-- multiple of 32 from 32 to 1024. entries: the kernel names (each gets the
-- block size), name the NVRTC program. max_stages: the stages (t<N>/<S>)
-- the op's kernel makes something of, 0 (or nil) where none: a tile that
-- names more is refused, so that no two specs render one kernel.
function M.threads_plan(spec, entries, name, max_stages)
  local t = M.tile_of(spec)
  local auto = M.tile_is_auto(t)
  if auto then t.threads = 256 end
  if t.threads < 32 or t.threads > 1024 or t.threads % 32 ~= 0 then
    return M.refuse(t, auto, "threads must be a multiple of 32 between 32 and 1024")
  end
  if t.stages > (max_stages or 0) then
    if (max_stages or 0) == 0 then
      return M.refuse(t, auto, "%s stages nothing: a thread count alone (t%d)", name:gsub("%.cu$", ""), t.threads)
    end
    return M.refuse(t, auto, "at most %d stages", max_stages)
  end
  local p = { tile = t, path = "element-wise", arch_specific = false, name = name, entries = {} }
  for i, e in ipairs(entries) do p.entries[i] = { name = e, threads = t.threads, smem = 0 } end
  return p
end

return M

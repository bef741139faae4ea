--[[
formats.lua — the storage formats and how their codes are decoded.

  * the format tables: each format's storage type, elements a 32-bit word,
    whether it holds integer codes and their qmax; the output types;
  * the device decoders of the packed formats (ternary, sign1, the lanes of
    an i8x4 word), emitted by device.lua's `helpers` on request, and
    `decoders`, the set of them a format needs;
  * the C expressions that decode one storage unit with them: to four i8x4
    words (the integer paths) or to four floats (the float paths). Every
    template that decodes a format builds its statements from these, so
    the bit layout of a code is written here once (and once in
    runtime/ref/ref_int.h, the CPU's loaders).
]]
local M = {}

local fmt = string.format

-- Storage of each format: C type of one element (or of the packed word),
-- elements per 32-bit word, whether it holds integer codes.
M.formats = {
  f32      = { ctype = "float",          epw = 1,  code = false, size = 4 },
  bf16     = { ctype = "unsigned short", epw = 2,  code = false, size = 2 },
  int8     = { ctype = "int",            epw = 4,  code = true,  qmax = 127 },
  int4     = { ctype = "int",            epw = 4,  code = true,  qmax = 7 },
  uint8pos = { ctype = "int",            epw = 4,  code = true,  qmax = 255,
               unsigned = true },
  ternary  = { ctype = "unsigned",       epw = 16, code = true,  qmax = 1 },
  sign1    = { ctype = "unsigned",       epw = 32, code = true,  qmax = 1 },
  i32      = { ctype = "int",            epw = 1,  code = false, size = 4 },
}

-- Output element types (one element per value).
M.out_types = {
  f32 = { ctype = "float", size = 4 },
  bf16 = { ctype = "unsigned short", size = 2 },
  int8 = { ctype = "signed char", size = 1 },
  uint8pos = { ctype = "unsigned char", size = 1 },
}

-- Codes a storage word holds along the reduction axis (1 for floats).
function M.codes_per_word(f)
  local F = M.formats[f]
  return F.code and F.epw or 1
end

-- The i8x4 words one storage word of codes decodes to: 4 (ternary), 8
-- (sign1), 1 (the i8x4 formats themselves).
function M.i8x4_words(f)
  return f == "ternary" and 4 or (f == "sign1" and 8 or 1)
end

-- The lane reader of an i8x4 word of codes of format f (decoders' i8x4f):
-- unsigned bytes for uint8pos, signed otherwise.
function M.lane_reader(f)
  return M.formats[f].unsigned and "dg_u8f" or "dg_s8f"
end

-- The MMA operand type of integer codes of format f: u8 for uint8pos
-- (never wrapped into a signed byte), s8 otherwise.
function M.mma_type(f)
  return M.formats[f].unsigned and "u8" or "s8"
end

-- ---- device decoders --------------------------------------------------------

M.DECODERS = {}

M.DECODERS.ternary = [[
// Ternary storage: 16 codes a word, code j at bits 2j..2j+1: 00 = 0,
// 01 = +1, 11 = -1 (10 is never written by the packer and decodes as 0).
// dg_tern4: the four codes of one byte → an i8x4 word (lane j = code j).
__device__ __forceinline__ unsigned dg_tern4(unsigned b)
{
	unsigned s = (b & 0x03u) | ((b & 0x0cu) << 6) | ((b & 0x30u) << 12) |
		     ((b & 0xc0u) << 18);      // code j → low bits of byte j
	unsigned nz = s & 0x01010101u;         // low bit: non-zero
	unsigned neg = (s >> 1) & nz;          // high bit (with low): negative
	return nz | (neg * 0xfeu);             // 0x01 / 0xff / 0x00 per lane
}

__device__ __forceinline__ float dg_tern1f(unsigned c)
{
	return (c & 1u) ? ((c & 2u) ? -1.0f : 1.0f) : 0.0f;
}
]]

M.DECODERS.sign1 = [[
// Sign storage: 32 codes a word, bit j set = +1, clear = -1.
// dg_sign4: the four codes of one nibble → an i8x4 word (lane j = code j).
__device__ __forceinline__ unsigned dg_sign4(unsigned n)
{
	unsigned s = (n & 1u) | ((n & 2u) << 7) | ((n & 4u) << 14) | ((n & 8u) << 21);
	return s | ((s ^ 0x01010101u) * 0xffu); // 0x01 where set, 0xff where clear
}

__device__ __forceinline__ float dg_sign1f(unsigned bit)
{
	return bit ? 1.0f : -1.0f;
}
]]

M.DECODERS.i8x4f = [[
// Lane j of an i8x4 word as a float: signed bytes, or unsigned (uint8pos).
__device__ __forceinline__ float dg_s8f(unsigned w, int j)
{
	return (float)(int)(signed char)(w >> (8 * j));
}

__device__ __forceinline__ float dg_u8f(unsigned w, int j)
{
	return (float)((w >> (8 * j)) & 0xffu);
}
]]

-- The decoder sections format f needs (ternary, sign1 as i8x4 or floats;
-- i8x4f with floats = true, for the lanes of an i8x4 word as floats), added
-- to the set `want`; returns it.
function M.decoders(f, want, floats)
  if f == "ternary" then want.ternary = true end
  if f == "sign1" then want.sign1 = true end
  if floats and M.formats[f].epw == 4 then want.i8x4f = true end
  return want
end

-- ---- decode expressions ---------------------------------------------------------

-- `w >> s` masked to `mask`, as short as C allows: no shift for the low
-- field, no mask for the high one.
local function field(w, s, mask, top)
  if s == 0 then return fmt("%s & %s", w, mask) end
  if s == top then return fmt("%s >> %d", w, s) end
  return fmt("(%s >> %d) & %s", w, s, mask)
end

-- The i8x4 words of one storage word `w` (a C expression) of ternary or
-- sign1 codes, in code order: ternary four (a byte each, dg_tern4), sign1
-- eight (a nibble each, dg_sign4).
function M.i8x4_of_word(f, w)
  local t = {}
  if f == "ternary" then
    for j = 0, 3 do t[#t + 1] = fmt("dg_tern4(%s)", field(w, 8 * j, "0xffu", 24)) end
  else
    assert(f == "sign1", "i8x4_of_word: a ternary or sign1 word")
    for j = 0, 7 do t[#t + 1] = fmt("dg_sign4(%s)", field(w, 4 * j, "15u", 28)) end
  end
  return t
end

-- The four floats of one unit `u` (a C expression) of codes: ternary a byte
-- (four 2-bit codes), sign1 a nibble (four bits), an i8x4 format a word
-- (four byte lanes).
function M.floats_of_unit(f, u)
  if f == "ternary" then
    return { fmt("dg_tern1f(%s)", field(u, 0, "3u", 6)), fmt("dg_tern1f(%s)", field(u, 2, "3u", 6)),
             fmt("dg_tern1f(%s)", field(u, 4, "3u", 6)), fmt("dg_tern1f(%s)", field(u, 6, "3u", 6)) }
  elseif f == "sign1" then
    return { fmt("dg_sign1f(%s & 1u)", u), fmt("dg_sign1f(%s & 2u)", u),
             fmt("dg_sign1f(%s & 4u)", u), fmt("dg_sign1f(%s & 8u)", u) }
  end
  local lane = M.lane_reader(f)
  return { fmt("%s(%s, 0)", lane, u), fmt("%s(%s, 1)", lane, u), fmt("%s(%s, 2)", lane, u),
           fmt("%s(%s, 3)", lane, u) }
end

-- Four of those expressions (list t from index i) as the arguments of a
-- make_uint4 / make_float4, the line broken after the second by `brk`
-- (e.g. ",\n\t\t\t   "), or whole on one line when brk is nil.
function M.quad(t, i, brk)
  i = i or 1
  return t[i] .. ", " .. t[i + 1] .. (brk or ", ") .. t[i + 2] .. ", " .. t[i + 3]
end

return M

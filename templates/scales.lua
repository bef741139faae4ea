--[[
scales.lua — the scales of a GEMM epilogue (dragon/spec.h dg_scale_gran):
a tensor's, a token's (a row's) or a channel's (a column's), and the
constants that turn a scaled sum into the projection's output codes.
]]
local M = {}

local fmt = string.format

-- The per-launch constants of dg_code_t for an out format (int8 | uint8pos)
-- and ReLU (relu: the threshold's C literal or nil), given the C names of
-- the scale s (or a literal) and of so_r = 1/so (0 when so <= 0). Lines of
-- C declaring ca, cb, CR, CLOM, a1, b1.
function M.code_consts(out, thr, s)
  local lo = (out == "int8" and not thr) and -127 or 0
  local hi = out == "int8" and 127 or 255
  local t = {
    fmt("const float ca = __fmul_rn(%s, so_r);	// codes (dragon/ref.h)", s),
    fmt("const float cb = %s;", thr and fmt("__fmul_rn(-(%s), so_r)", thr) or "0.0f"),
    fmt("constexpr float CR = %d.0f, CLO = %d.0f, CLOM = 12582912.0f + CLO;	// code range %d..%d", hi - lo, lo, lo, hi),
    "const float a1 = __fdiv_rn(ca, CR), b1 = __fdiv_rn(__fsub_rn(cb, CLO), CR);",
  }
  return t
end

-- An epilogue's scale of output (m, n), m a row of the head's B·T, n a
-- latent column: y = acc · s with s = sa·sw (both integer), sa or sw (one),
-- nothing (float × float); sa is *sa or, per token, sa[x row of m], sw is
-- *sw or, per channel, sw[h·L + n] — the float product rounded once, then
-- the multiply (dragon/ref.h). sc: { int_path, act_code, w_code, sa_vec,
-- sw_vec } of the spec.

-- The scale fields of a spec for formats fa, fw (formats.lua rows).
function M.scale_kind(spec, fa, fw)
  local sa_vec = fa.code and spec.ascale == "token" or false
  local sw_vec = fw.code and spec.wscale == "channel" or false
  return { int_path = fa.code and fw.code, act_code = fa.code, w_code = fw.code,
           sa_vec = sa_vec, sw_vec = sw_vec, any = fa.code or fw.code,
           vec = sa_vec or sw_vec }
end

-- The C expression of the x row of output row m (an int expression) of
-- head h: m itself when the input is shared (Hin 1), else (b·H + h)·T + t,
-- in 64 bits (B·H·T passes 2^31 where B·T does not: H 64, T 65536, B 513).
function M.x_row(hin, m)
  if hin == 1 then return m end
  return fmt("((long long)((%s) / T * H + h) * T + (%s) %% T)", m, m)
end

-- Lines before the element loops: the per-launch factors (sa_v, sw_v, and
-- s when neither varies).
function M.scale_prologue(sc)
  local t = {}
  if sc.act_code and not sc.sa_vec then t[#t + 1] = "const float sa_v = *sa;			// the act's scale" end
  if sc.w_code and not sc.sw_vec then t[#t + 1] = "const float sw_v = *sw;			// the weight's scale" end
  if sc.int_path and not sc.vec then
    t[#t + 1] = "const float s = __fmul_rn(sa_v, sw_v);	// integer × integer: y = acc · sa·sw"
  end
  return t
end

-- The scale of one element given C expressions of its row's sa (per token)
-- and its column's sw (per channel); nil for float × float.
function M.scale_expr(sc, sa_e, sw_e)
  if not sc.any then return nil end
  if sc.int_path and not sc.vec then return "s" end
  local a = sc.act_code and (sc.sa_vec and sa_e or "sa_v") or nil
  local w = sc.w_code and (sc.sw_vec and sw_e or "sw_v") or nil
  if a and w then return fmt("__fmul_rn(%s, %s)", a, w) end
  return a or w
end

return M

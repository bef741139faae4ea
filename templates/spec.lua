--[[
spec.lua — reading the spec table the host passes to plan and render.

Each check fails with a message naming the spec field (error level 2, so
the host reports the template line of the caller): an integer field and
its minimum, a field that must be one of a list, and a plain condition.
]]
local M = {}

local fmt = string.format

function M.check(cond, msg, ...)
  if not cond then error(fmt(msg, ...), 2) end
end

function M.int_field(spec, key, min)
  local v = spec[key]
  if math.type(v) ~= "integer" then
    if type(v) == "number" and v == math.floor(v) then
      v = math.tointeger(v)
    else
      error(fmt("spec.%s=%s: must be an integer", key, tostring(v)), 2)
    end
  end
  if min and v < min then
    error(fmt("spec.%s=%d: must be >= %d", key, v, min), 2)
  end
  return v
end

function M.one_of(spec, key, allowed)
  local v = spec[key]
  for _, a in ipairs(allowed) do
    if v == a then return v end
  end
  error(fmt("spec.%s=%s: must be one of %s", key, tostring(v),
            table.concat(allowed, ", ")), 2)
end

return M

--[[
qweight.lua — placeholder; the op family lands here.
]]
local M = {}

function M.render(spec)
  error(string.format("op=%s: not implemented yet (templates/qweight.lua)", tostring(spec.op)))
end

return M

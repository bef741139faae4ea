--[[
dragon.lua — the entry point of the templates.

The C host (codegen/) runs this in a sandboxed Lua state and calls

  local source, entries, name, launch = require("dragon").render(spec)

  spec     the validated spec, tile resolved (fields: op, heads, in_heads,
           embd, latent, weight, act, out, src, relu (false or the threshold),
           tile {bm, bn, bk, wm, wn, stages, threads}, arch, arch_specific,
           canonical, generator_version)
  source   the whole CUDA C++ file (no #include: NVRTC compiles it alone)
  entries  the extern "C" kernel names it defines, in a fixed order
  name     the NVRTC program name, "<op>.cu"
  launch   optional: entry → { threads = N, smem = BYTES } (block size and
           dynamic shared memory the runtime launches the entry with)

Each op family lives in its own module; this one only dispatches. Errors
are raised with error("message") naming the field and the problem.
]]
local M = {}

-- op → module that renders it
local OPS = {
  lowrank_fwd = "lowrank",
  quantize_act = "quantize",
  pack_i8x4 = "pack",
  unpack_i8x4 = "pack",
  quantize_weight = "qweight",
  pack_ternary = "qweight",
  pack_sign1 = "qweight",
  relu_mask = "lowrank",
  decoder_fwd = "decoder",
  lowrank_grad_input = "backward",
  lowrank_grad_weight = "backward",
  decoder_grad_input = "backward",
  decoder_grad_weight = "backward",
}

-- Load every op module now: the host loads this module when it creates the
-- sandbox, so a template that does not compile fails there, not at the first
-- render of its op.
local MODULES = {}
do
  local names = {}
  for _, mod in pairs(OPS) do names[mod] = true end
  local sorted = {}
  for mod in pairs(names) do sorted[#sorted + 1] = mod end
  table.sort(sorted)
  for _, mod in ipairs(sorted) do MODULES[mod] = require(mod) end
end

local function op_list()
  local names = {}
  for k in pairs(OPS) do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, ", ")
end

function M.render(spec)
  if type(spec) ~= "table" then
    error("render: spec must be a table, got " .. type(spec))
  end
  local mod = OPS[spec.op]
  if not mod then
    error(string.format("spec.op=%s: unknown op (known: %s)", tostring(spec.op), op_list()))
  end
  local source, entries, name, launch = MODULES[mod].render(spec)
  if type(source) ~= "string" or type(entries) ~= "table" or #entries == 0 or type(name) ~= "string" then
    error(string.format("templates/%s.lua: render returned no source, entries and name", mod))
  end
  return source, entries, name, launch
end

return M

--[[
dragon.lua — the entry point of the templates.

The C host (codegen/) runs this in a sandboxed Lua state. For every op the
op table (codegen/optable.c) names the module that renders it, and the
host passes that name as spec.module; it loads every such module when it
creates the sandbox, so a template that does not compile fails there, not
at the first render of its op. Two calls:

  local plan, err = require("dragon").plan(spec)
  local source = require("dragon").render(spec)

  spec     the spec as a table (fields: op, module, heads, in_heads, embd,
           latent, weight, act, out, src, relu (false or the threshold),
           tile {bm, bn, bk, wm, wn, stages, threads} (all 0: auto), arch,
           arch_specific, canonical, generator_version)
  plan     what the kernel of spec is, or nil and a message naming the
           field when its tile cannot run (a spec error, which the host
           reports as a usage error; a raised error is a template bug):
             tile            the tile, an auto one resolved to the default
             path            the kernel's path ("wgmma", "mma.sync", ...)
             arch_specific   the path needs the arch-specific target (sm_90a)
             name            the NVRTC program name, "<op>.cu"
             entries         { { name =, threads =, smem = }, ... }: the
                             extern "C" kernels in a fixed order, the block
                             size and dynamic shared memory of each launch
  source   the whole CUDA C++ file of the planned kernel (no #include: NVRTC
           compiles it alone); render is given the plan's resolved tile

Each op module answers plan(spec) and render(spec, plan): the module's
plan owns its kernel's rules (paths, tile limits, shared memory, defaults),
and nothing outside templates/ repeats them.
]]
local M = {}

local fmt = string.format

local function module_of(spec)
  if type(spec) ~= "table" then
    error("spec must be a table, got " .. type(spec), 3)
  end
  local name = spec.module
  if type(name) ~= "string" then
    error(fmt("spec.module=%s: the host names the template module of op %s", tostring(name),
              tostring(spec.op)), 3)
  end
  local mod = require(name)
  if type(mod) ~= "table" or type(mod.plan) ~= "function" or type(mod.render) ~= "function" then
    error(fmt("templates/%s.lua must return a table with plan and render functions", name), 3)
  end
  return mod, name
end

-- The plan's shape, checked once here so the host can trust it.
local function check_plan(p, name)
  local where = fmt("templates/%s.lua: plan", name)
  if type(p) ~= "table" or type(p.tile) ~= "table" or type(p.entries) ~= "table" or #p.entries < 1
     or type(p.name) ~= "string" or type(p.path) ~= "string" then
    error(where .. " must return { tile, path, name, entries } or nil and a message", 3)
  end
  for _, k in ipairs({ "bm", "bn", "bk", "wm", "wn", "stages", "threads" }) do
    if math.type(p.tile[k]) ~= "integer" or p.tile[k] < 0 then
      error(fmt("%s: tile.%s=%s must be a non-negative integer", where, k, tostring(p.tile[k])), 3)
    end
  end
  for i, e in ipairs(p.entries) do
    if type(e.name) ~= "string" or math.type(e.threads) ~= "integer" or e.threads < 1 or e.threads > 1024
       or (e.smem ~= nil and (math.type(e.smem) ~= "integer" or e.smem < 0)) then
      error(fmt("%s: entries[%d] must be { name = string, threads = 1..1024, smem = bytes }", where, i), 3)
    end
  end
end

function M.plan(spec)
  local mod, name = module_of(spec)
  local p, err = mod.plan(spec)
  if p == nil then
    if type(err) ~= "string" then
      error(fmt("templates/%s.lua: plan returned nil without a message", name), 2)
    end
    return nil, err
  end
  check_plan(p, name)
  return p
end

function M.render(spec)
  local mod, name = module_of(spec)
  local p, err = M.plan(spec)
  if p == nil then
    error(fmt("templates/%s.lua: render of a spec its plan refuses (%s)", name, err), 2)
  end
  local source = mod.render(spec, p)
  if type(source) ~= "string" or source == "" then
    error(fmt("templates/%s.lua: render returned no source", name), 2)
  end
  return source
end

return M

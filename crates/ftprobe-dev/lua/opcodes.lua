-- Many of the VM's opcodes, a few times each (for probes all over luaV_execute).
-- opcodes.lua [N] (default 3 rounds) prints "opcodes <checksum>", the same in every run.
local n = tonumber(arg and arg[1]) or 3
local acc = 0

local mt = {
  __add = function(a, b) return a.v + (type(b) == "table" and b.v or b) end,
  __index = function(t, k) return #tostring(k) end,
  __newindex = function(t, k, v) rawset(t, k, v * 2) end,
  __call = function(self, x) return x + 1 end,
  __len = function() return 7 end,
  __eq = function() return true end,
  __lt = function(a, b) return a.v < b.v end,
  __le = function(a, b) return a.v <= b.v end,
  __concat = function(a, b) return "c" end,
  __unm = function(a) return -a.v end,
  __close = function() acc = acc + 1 end,
}

local function vararg(...)
  local a, b = ...
  local t = { ... }
  return select("#", ...) + #t + (a or 0) + (b or 0)
end

local function counter()
  local c = 0
  return function(k) c = c + (k or 1); return c end
end

local function tail(k)
  if k <= 0 then return 0 end
  return tail(k - 1)
end

for round = 1, n do
  -- integer and float arithmetic, constants and registers
  local i, f = round, round + 0.5
  acc = acc + i + 1 + i * 3 - i // 2 + i % 5 + i ^ 2 + f / 2 + f * f - f // 1 + f % 1.5
  acc = acc + (i << 3) + (i >> 1) + (i & 6) + (i | 9) + (i ~ 5) + (~i) + (-i) + (-f)
  acc = acc + (i & 0xff) + (i | 0x10) + (i ~ 0x3) + (i << 1) + (1 << i) + (i >> 2)
  -- comparisons with registers, constants, immediates
  if i < 3 then acc = acc + 1 end
  if i <= f then acc = acc + 2 end
  if i > 1 then acc = acc + 3 end
  if i >= 2 then acc = acc + 4 end
  if i == 2 then acc = acc + 5 end
  if i ~= 3 then acc = acc + 6 end
  if f == 1.5 then acc = acc + 7 end
  if "a" < "b" then acc = acc + 8 end
  local nothing = nil
  if not nothing then acc = acc + 9 end
  if nothing == nil and true then acc = acc + 10 end
  -- strings
  local s = "x" .. i .. "y" .. f
  acc = acc + #s + #("abc"):rep(i) + (s:find("y") or 0)
  -- tables: constructor, set/get with every key kind, length, list
  local t = { 1, 2, 3, a = 4, [10] = 5, [2.5] = 6 }
  t[4] = i
  t.b = f
  t["c" .. i] = 1
  t[i + 100] = 2
  local key = "a"
  acc = acc + t[1] + t.a + t[10] + t[2.5] + t[4] + t.b + t[key] + #t
  local list = {}
  for k = 1, 40 do list[k] = k end
  acc = acc + #list + table.unpack(list, 3, 3)
  -- metatables
  local o = setmetatable({ v = i }, mt)
  local p = setmetatable({ v = i + 1 }, mt)
  acc = acc + (o + p) + (o + 2) + o.zzz + o(5) + #o + (o == p and 1 or 0)
  acc = acc + (o < p and 1 or 0) + (o <= p and 1 or 0) + #(o .. p) + (-o)
  o.w = 3
  acc = acc + rawget(o, "w")
  do
    local c <close> = o
    acc = acc + 1
  end
  -- loops: numeric int and float, generic pairs/ipairs, while, repeat
  for k = 1, 5 do acc = acc + k end
  for k = 1.0, 2.0, 0.5 do acc = acc + k end
  for k = 10, 1, -3 do acc = acc + k end
  for k, v in pairs(t) do acc = acc + (type(v) == "number" and v or 0) end
  for k, v in ipairs(list) do acc = acc + v end
  local w = 0
  while w < 5 do w = w + 1 end
  repeat w = w - 2 until w < 0
  acc = acc + w
  -- closures, upvalues, varargs, tail calls, self calls, multiple results
  local cnt = counter()
  cnt(); cnt(2)
  acc = acc + cnt() + vararg(1, 2, 3) + vararg() + tail(20)
  local a, b, c = string.byte("abc", 1, 3)
  acc = acc + a + b + c + select(2, 10, 20, 30)
  -- errors caught
  local ok, err = pcall(function() error({ code = i }) end)
  acc = acc + (ok and 0 or err.code)
  ok = pcall(function() return nil + 1 end)
  acc = acc + (ok and 0 or 1)
  -- coroutines
  local co = coroutine.wrap(function(x)
    local y = coroutine.yield(x + 1)
    return y * 2
  end)
  acc = acc + co(i) + co(3)
  -- goto
  local g = 0
  ::again::
  g = g + 1
  if g < 3 then goto again end
  acc = acc + g
end

print("opcodes " .. string.format("%.3f", acc))

-- Creates a known number of tables and prints exactly one line: "tables created: N".
-- Every table constructor executed below adds one to `created`, right beside it, so N is
-- counted by the script itself. The code between constructors calls nothing that makes
-- tables, so luaH_new under this script minus luaH_new under empty.lua equals N.

local created = 0

-- 1000 flat tables in one loop.
local keep = 0
for i = 1, 1000 do
  local t = { i }
  created = created + 1
  keep = keep + t[1]
end

-- An array of 50 records, each with a nested table.
local records = {}
created = created + 1
for i = 1, 50 do
  local inner = { i, i * 2 }
  created = created + 1
  records[i] = { id = i, inner = inner }
  created = created + 1
end

-- A 10 x 10 grid: one outer table, 10 rows.
local grid = {}
created = created + 1
for r = 1, 10 do
  local row = {}
  created = created + 1
  for c = 1, 10 do
    row[c] = r * c
  end
  grid[r] = row
end

-- Use what was built, so nothing above is dead.
local check = keep
for i = 1, #records do
  check = check + records[i].inner[2]
end
check = check + grid[10][10]
assert(check == 500500 + 2550 + 100)

print("tables created: " .. created)

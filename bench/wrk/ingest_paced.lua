-- bench/wrk/ingest.lua at a fixed request rate (wrk2-style pacing, for latency at a given load):
--
--   wrk -s bench/wrk/ingest_paced.lua URL -- MODE ID_PREFIX DESTINATION API_KEY BATCH_SIZE RATE
--
-- RATE is requests per second of each wrk thread. Each thread keeps a schedule of send times
-- (one every 1/RATE s, on a monotonic clock) and wrk's delay() holds each request back until
-- its slot, whichever connection sends it. wrk times a request from when it is written, so the
-- latency excludes the wait for the slot; a server that falls behind shows up as a lower
-- achieved rate (the schedule never runs more than 1 s ahead of the clock's debt).

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "ingest.lua")

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
  int clock_gettime(int clock_id, bench_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local now_ts = ffi.new("bench_timespec")

local function now_ms()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, now_ts)
  return tonumber(now_ts.tv_sec) * 1000 + tonumber(now_ts.tv_nsec) / 1e6
end

local base_init = init
local period_ms, next_at

function init(args)
  base_init(args)
  period_ms = 1000 / tonumber(args[6])
end

function delay()
  local now = now_ms()
  next_at = math.max((next_at or now) + period_ms, now - 1000)
  local wait = next_at - now
  return wait > 0 and wait or 0
end

-- wrk script of `python -m bench.ingest`: POSTs messages the way producers do.
--
--   wrk -s bench/wrk/ingest.lua URL -- MODE ID_PREFIX DESTINATION API_KEY [BATCH_SIZE]
--
-- MODE "single": POST /v1/destinations/DESTINATION/messages, one message per request;
-- MODE "batch":  POST /v1/messages, BATCH_SIZE messages per request (default 100).
-- MODE "fields20": as "single", with a body of 20 fields (~450 bytes) that the benchmark's
--                 payload schema (bench/ingest_stack.py, SCHEMA_20_FIELDS) accepts.
-- Every message gets a fresh message_id (the receiver answers a repeated id "duplicate" and
-- stores nothing): ID_PREFIX is the first 18 characters of a UUIDv7 made by the benchmark for
-- this wrk run ("tttttttt-tttt-7rrr"); each thread appends its number and a counter, so the ids
-- are unique, time-ordered per run, and canonical lower-case UUIDs.
-- At the end it prints one JSON line (after wrk's own report) that the benchmark parses.

local thread_count = 0

function setup(thread)
  thread:set("thread_index", thread_count)
  thread_count = thread_count + 1
end

local mode, prefix, destination, headers, batch_size
local counter = 0
local salt = 0

function init(args)
  mode, prefix, destination = args[1], args[2], args[3]
  headers = {["Authorization"] = "Bearer " .. args[4], ["Content-Type"] = "application/json"}
  batch_size = tonumber(args[5] or "100")
  math.randomseed(os.time() + thread_index * 7919)
  salt = math.random(0, 0xffff)
  if mode ~= "single" and mode ~= "batch" and mode ~= "fields20" then
    error("MODE must be 'single', 'batch' or 'fields20', got " .. tostring(mode))
  end
end

local function next_id()
  counter = counter + 1
  -- variant 10xx in the 4th group; 12 bits of thread index; 16 bits of salt + 32-bit counter
  return string.format("%s-%x%03x-%04x%08x", prefix, 8 + (thread_index % 4),
                       thread_index % 0x1000, salt, counter)
end

-- a body of typical size (~200 bytes of JSON)
local body_format = '{"order_id":"o-%d-%d","customer":"c-%d","amount":123.45,"currency":"EUR",'
  .. '"items":[{"sku":"sku-1","qty":2},{"sku":"sku-2","qty":1}],'
  .. '"note":"a benchmark message with a body of typical size"}'

local body20_format = '{"order_id":"o-%d-%d","customer":"c-%d","amount":123.45,"currency":"EUR",'
  .. '"status":"new","country":"DE","city":"Berlin","zip":"10115","street":"Main St 1",'
  .. '"email":"buyer@example.com","phone":"+49301234567","channel":"web","priority":2,'
  .. '"gift":false,"discount":0.0,"tax":19.5,"shipping":4.99,"weight_g":1200,'
  .. '"items":[{"sku":"sku-1","qty":2},{"sku":"sku-2","qty":1}],'
  .. '"note":"a benchmark message with twenty fields"}'

local function message(with_destination)
  local id = next_id()
  local format = mode == "fields20" and body20_format or body_format
  local body = string.format(format, thread_index, counter, counter % 1000)
  if with_destination then
    return '{"message_id":"' .. id .. '","destination":"' .. destination .. '","body":'
      .. body .. '}'
  end
  return '{"message_id":"' .. id .. '","body":' .. body .. '}'
end

function request()
  if mode ~= "batch" then
    return wrk.format("POST", "/v1/destinations/" .. destination .. "/messages", headers,
                      message(false))
  end
  local parts = {}
  for i = 1, batch_size do
    parts[i] = message(true)
  end
  return wrk.format("POST", "/v1/messages", headers,
                    '{"messages":[' .. table.concat(parts, ",") .. ']}')
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nWRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,'
      .. '"write":%d,"status":%d,"timeout":%d},"latency_us":{"p50":%d,"p90":%d,"p99":%d,'
      .. '"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end

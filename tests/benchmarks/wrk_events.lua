-- wrk script: POST one event per request, each with a new event_id, so every request is stored
-- (a repeated id would be answered 200 "duplicate" without storing anything).
-- The body comes from the file in BENCH_BODY with the placeholder __EVENT_ID__.
-- BENCH_DELAY_MS paces each connection (a request every that many ms) for the latency run.
-- done() prints one JSON line that the benchmark reads.

local prefix, suffix
local counter = 0
local thread_count = 0
local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
local run = os.getenv("BENCH_RUN") or "run"

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
end

function init(args)
  local file = assert(io.open(os.getenv("BENCH_BODY"), "r"))
  local body = file:read("*a")
  file:close()
  local at = assert(string.find(body, "__EVENT_ID__", 1, true))
  prefix = string.sub(body, 1, at - 1)
  suffix = string.sub(body, at + string.len("__EVENT_ID__"))
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  counter = counter + 1
  return wrk.format(nil, nil, nil, prefix .. run .. "-" .. tid .. "-" .. counter .. suffix)
end

if delay_ms > 0 then
  function delay()
    return delay_ms
  end
end

function done(summary, latency, requests)
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"non2xx":%d,"socket_errors":%d,'
      .. '"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end

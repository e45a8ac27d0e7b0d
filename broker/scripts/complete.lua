-- Finish a batch: store each result in Celery's format, publish it, and drop
-- the task from in-flight. A stored SUCCESS is never overwritten, so a
-- redelivered task keeps one consistent result.
-- The batch's bookkeeping (its metrics counters, the executor's counts, its latency
-- model) is not added here: the executor sends it after, with that of the other batches
-- stored meanwhile (count.lua), off the tasks' path.
-- Returns the batch's size, negated when none of its messages was in in-flight and no
-- result was stored anew: then there is nothing to count. Otherwise its size is added to
-- the metrics hash's `stored` at once (the coordinator's demand reads it).
-- Running it again with the same arguments (a retry after a lost reply, or after a
-- failover, when the first run may or may not have reached the new primary) changes
-- nothing that the first run made: a result already stored with the same bytes is
-- left alone, a dead letter is added only for a message still in in-flight, and
-- `stored` is added only when the run found one of its messages in in-flight or stored
-- a result anew.
-- batch: (raw message, result key, result JSON) triples; an empty result key means the
-- JSON is a dead-letter record (a message without a usable id). A result key that
-- refuses its result (of another type) dead-letters that task with Redis's reason; the
-- rest of the batch is stored.
-- KEYS: inflight, dead, stats, metrics
-- ARGV: result_ttl, dead_cap, dead_ttl, batch...
local inflight, dead, stats, metrics = unpack(KEYS, 1, 4)
local result_ttl, dead_cap, dead_ttl = unpack(ARGV, 1, 3)
local batch = rest(ARGV, 4)
local RESULT_PREFIX, METRICS_PREFIX = 'celery-task-meta-', 'tandem:metrics:'
-- In-flight holds the oldest claims on the right, in the order the batch lists
-- them: when its last N entries are this batch, one LTRIM drops them all; otherwise
-- each task is removed on its own, searched from the right.
local n = #batch / 3
local tail = n > 0 and call('LRANGE', inflight, -n, -1) or {}
local in_order = n > 0 and #tail == n
for i = 1, #batch, 3 do
  in_order = in_order and tail[n - (i - 1) / 3] == batch[i]
end
-- Which messages are in in-flight, read before anything is written: the first write is
-- then a result's SET, which Redis refuses under maxmemory, so the whole store is
-- refused (a script that wrote first would be let through past maxmemory).
local held = {}  -- by triple index: the message was in in-flight
for i = 1, #batch, 3 do
  held[i] = in_order or call('LPOS', inflight, batch[i], 'RANK', -1) ~= false
end
local counted = n == 0
for i = 1, #batch, 3 do
  local raw, key, meta = batch[i], batch[i + 1], batch[i + 2]
  counted = counted or held[i]
  if key == '' then
    if held[i] then dead_letter(dead, meta, dead_cap, dead_ttl, stats) end
  else
    local stored, refused = store_result(key, meta, result_ttl, stats)
    counted = counted or stored == 'stored'
    if refused and held[i] then
      local now = redis.call('TIME')
      local record = cjson.encode({
        id = string.sub(key, #RESULT_PREFIX + 1),
        model = string.sub(metrics, #METRICS_PREFIX + 1),
        reason = 'ResultRefused: ' .. key .. ': ' .. refused,
        executors = {},
        at = now[1] .. '.' .. string.format('%06d', tonumber(now[2])),
        at_s = tonumber(now[1]) + tonumber(now[2]) / 1e6,
        message = raw,
      })
      dead_letter(dead, record, dead_cap, dead_ttl, stats)
    end
  end
end
if in_order then
  call('LTRIM', inflight, 0, -n - 1)
else
  for i = 1, #batch, 3 do
    if held[i] then call('LREM', inflight, -1, batch[i]) end
  end
end
-- Negative: nothing of the batch was in in-flight or stored anew (a retry, or a task
-- answered already), so there is nothing to count later either.
if not counted then return -n end
if n > 0 then tally(metrics, 'stored', n) end
return n

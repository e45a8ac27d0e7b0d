-- Finish a batch: store each result in Celery's format, publish it, and drop
-- the task from in-flight. A stored SUCCESS is never overwritten, so a
-- redelivered task keeps one consistent result.
-- The batch's metrics counters are added in the same step, and the executor's latency
-- model, when given, replaces its share of the model's speed hash; or the results go
-- alone, and count.lua adds the bookkeeping of several batches after (as executors do).
-- Returns the batch's size, negated when none of its messages was in in-flight and no
-- result was stored anew: then there is nothing to count. Otherwise its size is added to
-- the metrics hash's `stored` at once, however the rest is counted.
-- Running it again with the same arguments (a retry after a lost reply, or after a
-- failover, when the first run may or may not have reached the new primary) changes
-- nothing that the first run made: a result already stored with the same bytes is
-- left alone, a dead letter is added only for a message still in in-flight, and the
-- counters are added only when the run found one of its messages in in-flight or
-- stored a result anew.
-- speed: only when a latency model is given. batch: M, then M (metrics field,
-- increment) pairs, then rate, lag_ms, extra_ms, base_ms, per_item_ms, margin_ms (rate ''
-- when not given), then (raw message, result key, result JSON) triples; an empty result
-- key means the JSON is a dead-letter record (a message without a usable id). A result
-- key that refuses its result (of another type) dead-letters that task with Redis's
-- reason; the rest of the batch is stored.
-- KEYS: inflight, executor, dead, stats, metrics, speed...
-- ARGV: result_ttl, dead_cap, dead_ttl, batch...
local inflight, executor, dead, stats, metrics = unpack(KEYS, 1, 5)
local speed = rest(KEYS, 6)
local result_ttl, dead_cap, dead_ttl = unpack(ARGV, 1, 3)
local batch = rest(ARGV, 4)
local RESULT_PREFIX, METRICS_PREFIX = 'celery-task-meta-', 'tandem:metrics:'
-- M '' stores the results alone: the executor adds the batch's counters and latency
-- model after them with count.lua, off the task's path (at low load).
local later = batch[1] == ''
local first = 2 + 2 * (tonumber(batch[1]) or 0) + 6
-- In-flight holds the oldest claims on the right, in the order the batch lists
-- them: when its last N entries are this batch, one LTRIM drops them all; otherwise
-- each task is removed on its own, searched from the right.
local n = (#batch - first + 1) / 3
local tail = n > 0 and call('LRANGE', inflight, -n, -1) or {}
local in_order = n > 0 and #tail == n
for i = first, #batch, 3 do
  in_order = in_order and tail[n - (i - first) / 3] == batch[i]
end
-- Which messages are in in-flight, read before anything is written: the first write is
-- then a result's SET, which Redis refuses under maxmemory, so the whole store is
-- refused (a script that wrote first would be let through past maxmemory).
local held = {}  -- by triple index: the message was in in-flight
for i = first, #batch, 3 do
  held[i] = in_order or call('LPOS', inflight, batch[i], 'RANK', -1) ~= false
end
local counted = n == 0  -- an empty batch publishes its latency model alone
for i = first, #batch, 3 do
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
  for i = first, #batch, 3 do
    if held[i] then call('LREM', inflight, -1, batch[i]) end
  end
end
-- Negative: nothing of the batch was in in-flight or stored anew (a retry, or a task
-- answered already), so there is nothing to count later either.
if not counted then return -n end
-- The tasks answered, counted with their results (the coordinator's demand reads it).
if n > 0 then tally(metrics, 'stored', n) end
if later then return n end  -- the rest is counted by count.lua
count_batch(batch, 1, n, 1, executor, metrics, speed[1])
return n

-- Bookkeeping sent apart from the results that complete.lua stored: an executor sends
-- its results first and this after, off the tasks' path, for the batches stored since
-- its last count. It adds their metrics counters, counts them and their tasks in the
-- executor's hash and, when given, replaces the executor's share of the speed hash.
-- Sent once and never retried: a reply lost to a cut connection may lose these
-- counts, never count them twice.
-- speed: only when a latency model is given. bookkeeping: M, then M (metrics field,
-- increment) pairs, then rate, lag_ms, extra_ms, base_ms, per_item_ms, margin_ms (rate ''
-- when not given).
-- KEYS: executor, metrics, speed...
-- ARGV: tasks, batches, bookkeeping...
local executor, metrics = unpack(KEYS, 1, 2)
local speed = rest(KEYS, 3)
local tasks, batches = unpack(ARGV, 1, 2)
local bookkeeping = rest(ARGV, 3)
local last = 1 + 2 * tonumber(bookkeeping[1])
for i = 2, last, 2 do tally(metrics, bookkeeping[i], bookkeeping[i + 1]) end
if not registered(executor) then return 1 end
call('HINCRBY', executor, 'tasks', tonumber(tasks))
call('HINCRBY', executor, 'batches', tonumber(batches))
local s = last + 1
if bookkeeping[s] ~= '' and speed[1] then
  call('HSET', executor, 'base_ms', bookkeeping[s + 3], 'per_item_ms', bookkeeping[s + 4],
    'margin_ms', bookkeeping[s + 5])
  set_speed(executor, speed[1], tonumber(bookkeeping[s]), tonumber(bookkeeping[s + 1]),
    tonumber(bookkeeping[s + 2]))
end
return 1

-- Bookkeeping sent apart from the results that complete.lua stored alone: an executor
-- sends its results first and this after, off the tasks' path, for the batches stored
-- since its last count. It adds their metrics counters, counts them and their tasks in
-- the executor's hash and, when given, replaces the executor's share of the speed hash,
-- as complete.lua does for one batch.
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
count_batch(bookkeeping, 1, tonumber(tasks), tonumber(batches), executor, metrics, speed[1])
return 1

-- A batch's bookkeeping alone, after complete.lua stored its results without it: at low
-- load an executor sends its results first and this after, off the task's path. It adds
-- the batch's metrics counters, counts the batch in the executor's hash and, when given,
-- replaces the executor's share of the speed hash, as complete.lua does under load.
-- Sent once per batch and never retried: a reply lost to a cut connection may lose
-- one batch's counters, never count them twice.
-- speed: only when a latency model is given. bookkeeping: M, then M (metrics field,
-- increment) pairs, then rate, lag_ms, extra_ms, base_ms, per_item_ms, margin_ms (rate ''
-- when not given).
-- KEYS: executor, metrics, speed...
-- ARGV: tasks, bookkeeping...
local executor, metrics = unpack(KEYS, 1, 2)
local speed = rest(KEYS, 3)
local tasks = unpack(ARGV, 1, 1)
local bookkeeping = rest(ARGV, 2)
count_batch(bookkeeping, 1, tonumber(tasks), executor, metrics, speed[1])
return 1

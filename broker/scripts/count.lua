-- A batch's bookkeeping alone, after complete.lua stored its results without it: at low
-- load an executor sends its results first and this after, off the task's path. It adds
-- the batch's metrics counters, counts the batch in the executor's hash and, when given,
-- replaces the executor's share of the speed hash, as complete.lua does under load.
-- Sent once per batch and never retried: a reply lost to a cut connection may lose
-- one batch's counters, never count them twice.
-- KEYS: executor hash, metrics hash, and the speed hash when a latency model is given
-- ARGV: the batch's tasks, M, then M (metrics field, increment) pairs, then rate,
--       lag_ms, extra_ms, base_ms, per_item_ms, margin_ms (rate '' when not given)
count_batch(ARGV, 2, tonumber(ARGV[1]), KEYS[1], KEYS[2], KEYS[3])
return 1

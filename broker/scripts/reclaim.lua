-- Hand an executor's tasks back and remove it. Unless forced, only if its
-- heartbeat lapsed.
-- L2 tasks were never started: they go back to the head of L1 (the end
-- consumers pop), each to its priority's list. In-flight tasks were claimed:
-- if the executor died or crashed holding them (count_deliveries '1'), each gets a
-- delivery, recorded as this executor's id in its deliveries list. A task with
-- max_deliveries goes to the poison list, for the coordinator to bury; one with
-- fewer but some goes to the retry list, to be computed alone; others to L1.
-- Its share of the model's speed hash goes with it.
-- l1: the L1 keys of priority 0, 3, 6 and 9; force and count_deliveries: '1' or '0';
-- deliveries_ttl in s.
-- Returns the number of tasks moved, or -1 if the executor is alive.
-- KEYS: executor, executors, l2, inflight, changes, stats, retry, poison, l1_0, l1_3,
--       l1_6, l1_9, deadlines, speed
-- ARGV: executor_id, force, count_deliveries, max_deliveries, deliveries_prefix,
--       deliveries_ttl, metrics
local executor, executors, l2, inflight, changes, stats, retry, poison, l1_0, l1_3,
  l1_6, l1_9, deadlines, speed = unpack(KEYS, 1, 14)
local executor_id, force, count_deliveries, max_deliveries, deliveries_prefix,
  deliveries_ttl, metrics = unpack(ARGV, 1, 7)
local l1 = {l1_0, l1_3, l1_6, l1_9}
local expires = tonumber(call('HGET', executor, 'expires_ms'))
if force ~= '1' and expires and expires > now_ms() then return -1 end
local n = 0
for _, m in ipairs(call('LRANGE', l2, 0, -1)) do
  call('RPUSH', l1_of(m, l1), m)
  n = n + 1
end
redis.call('DEL', l2)
local counting, most = count_deliveries == '1', tonumber(max_deliveries)
local redelivered, poisoned = 0, 0
for _, m in ipairs(call('LRANGE', inflight, 0, -1)) do
  local deliveries = deliveries_prefix .. redis.sha1hex(m)
  if counting then
    call('RPUSH', deliveries, executor_id)
    redis.call('EXPIRE', deliveries, deliveries_ttl)
  end
  local times = call('LLEN', deliveries)
  if times >= most then
    call('RPUSH', poison, m)
    poisoned = poisoned + 1
  elseif times > 0 then
    call('RPUSH', retry, m)
  else
    call('RPUSH', l1_of(m, l1), m)
  end
  redelivered = redelivered + 1
end
redis.call('DEL', inflight)
if redelivered > 0 then tally(stats, 'redelivered', redelivered) end
if poisoned > 0 then tally(stats, 'poisoned', poisoned) end
settle_route(changes, executor, executor_id, metrics)
change(changes, executor, executor_id, 'GONE')
not_ready(executor, executor_id)
set_speed(executor, speed, 0, 0, 0)
redis.call('DEL', executor)
call('SREM', executors, executor_id)
call('ZREM', deadlines, executor_id)
return n + redelivered

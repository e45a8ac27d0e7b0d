-- Hand an executor's tasks back and remove it. Unless forced, only if its
-- heartbeat lapsed.
-- L2 tasks were never started: they go back to the head of L1 (the end
-- consumers pop), each to its priority's list. In-flight tasks were claimed:
-- if the executor died or crashed holding them (ARGV[3] == '1'), each gets a
-- delivery, recorded as this executor's id in its deliveries list. A task with
-- max_deliveries goes to the poison list, for the coordinator to bury; one with
-- fewer but some goes to the retry list, to be computed alone; others to L1.
-- Its share of the model's speed hash goes with it.
-- KEYS: executor hash, executors set, L2, in-flight, changes, stats, retry,
--       poison, L1 keys of priority 0,3,6,9, deadlines set, speed hash
-- ARGV: executor id, force ('1' or '0'), count deliveries ('1' or '0'),
--       max deliveries, deliveries key prefix, deliveries ttl s, metrics hash
-- Returns the number of tasks moved, or -1 if the executor is alive.
local expires = tonumber(call('HGET', KEYS[1], 'expires_ms'))
if ARGV[2] ~= '1' and expires and expires > now_ms() then return -1 end
local n = 0
for _, m in ipairs(call('LRANGE', KEYS[3], 0, -1)) do
  call('RPUSH', l1_of(m, 9), m)
  n = n + 1
end
redis.call('DEL', KEYS[3])
local count, most = ARGV[3] == '1', tonumber(ARGV[4])
local redelivered, poisoned = 0, 0
for _, m in ipairs(call('LRANGE', KEYS[4], 0, -1)) do
  local deliveries = ARGV[5] .. redis.sha1hex(m)
  if count then
    call('RPUSH', deliveries, ARGV[1])
    redis.call('EXPIRE', deliveries, ARGV[6])
  end
  local times = call('LLEN', deliveries)
  if times >= most then
    call('RPUSH', KEYS[8], m)
    poisoned = poisoned + 1
  elseif times > 0 then
    call('RPUSH', KEYS[7], m)
  else
    call('RPUSH', l1_of(m, 9), m)
  end
  redelivered = redelivered + 1
end
redis.call('DEL', KEYS[4])
if redelivered > 0 then tally(KEYS[6], 'redelivered', redelivered) end
if poisoned > 0 then tally(KEYS[6], 'poisoned', poisoned) end
settle_route(KEYS[5], KEYS[1], ARGV[1], ARGV[7])
change(KEYS[5], KEYS[1], ARGV[1], 'GONE')
not_ready(KEYS[1], ARGV[1])
set_speed(KEYS[1], KEYS[14], 0, 0, 0)
redis.call('DEL', KEYS[1])
call('SREM', KEYS[2], ARGV[1])
call('ZREM', KEYS[13], ARGV[1])
return n + redelivered

-- Move an executor's L2 and in-flight tasks back to the head of L1 (the end
-- consumers pop), oldest nearest the head, each to its priority's list,
-- then remove the executor. Unless forced, only if its heartbeat lapsed.
-- In-flight tasks moved back count as redelivered in the stats hash.
-- KEYS: executor hash, executors set, L2, in-flight, changes, stats, L1 keys of priority 0,3,6,9
-- ARGV: executor id, force ('1' or '0')
-- Returns the number of tasks moved, or -1 if the executor is alive.
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires_ms'))
if ARGV[2] ~= '1' and expires and expires > now_ms() then return -1 end
local function step(m)
  local ok, msg = pcall(cjson.decode, m)
  local p = 0
  if ok and type(msg) == 'table' and type(msg.properties) == 'table' then
    p = tonumber(msg.properties.priority) or 0
  end
  if p >= 9 then return 4 elseif p >= 6 then return 3 elseif p >= 3 then return 2 end
  return 1
end
local redelivered = redis.call('LLEN', KEYS[4])
if redelivered > 0 then redis.call('HINCRBY', KEYS[6], 'redelivered', redelivered) end
local n = 0
for _, list in ipairs({KEYS[3], KEYS[4]}) do
  for _, m in ipairs(redis.call('LRANGE', list, 0, -1)) do
    redis.call('RPUSH', KEYS[6 + step(m)], m)
    n = n + 1
  end
  redis.call('DEL', list)
end
change(KEYS[5], KEYS[1], ARGV[1], 'GONE')
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return n

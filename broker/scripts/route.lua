-- Route one task: to the L2 of an IDLE or WAITING executor with free
-- capacity, else to the model's L1. The candidate is the first of the model's
-- ready set (a WAITING executor, the fullest first, then the longest IDLE), so a
-- route costs the same however many executors serve the model. An entry whose
-- heartbeat lapsed is dropped on the way (the heartbeat adds it back if it lives).
-- An executor with no batch window (max_wait_ms 0) computes at once, so handing
-- it a task makes it WORKING here, which saves the executor a round trip.
-- KEYS: ready set, models set, target L1 key, L1 keys of every priority, changes
-- ARGV: model, message, executor key prefix, L2 key prefix, max_queue hash, metrics hash
-- Returns the executor id, or '' for L1.
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply('UNKNOWN_MODEL no worker serves ' .. ARGV[1])
end
local now = now_ms()
local best, state, cap
while true do
  local top = redis.call('ZRANGE', KEYS[1], 0, 0)
  if #top == 0 then break end
  local h = redis.call('HMGET', ARGV[3] .. top[1], 'state', 'cap', 'expires_ms')
  state, cap = h[1], tonumber(h[2])
  local expires = tonumber(h[3])
  if cap and cap > 0 and expires and expires > now
      and (state == 'IDLE' or state == 'WAITING') then
    best = top[1]
    break
  end
  redis.call('ZREM', KEYS[1], top[1])
end
if best then
  local hash = ARGV[3] .. best
  redis.call('LPUSH', ARGV[4] .. best, ARGV[2])
  if tonumber(redis.call('HGET', hash, 'max_wait_ms')) == 0 then
    redis.call('HSET', hash, 'state', 'WORKING', 'cap', 0)
    redis.call('ZREM', KEYS[1], best)
    change(KEYS[#KEYS], hash, best, 'WORKING')
  else
    cap = redis.call('HINCRBY', hash, 'cap', -1)
    if cap <= 0 then
      redis.call('ZREM', KEYS[1], best)
    elseif state == 'WAITING' then
      redis.call('ZADD', KEYS[1], cap, best)
    end
  end
  redis.call('HINCRBY', ARGV[6], 'route:L2', 1)
  return best
end
local max_queue = tonumber(redis.call('HGET', ARGV[5], ARGV[1]) or 0)
if max_queue > 0 then
  local depth = 0
  for i = 4, #KEYS - 1 do depth = depth + redis.call('LLEN', KEYS[i]) end
  if depth >= max_queue then
    return redis.error_reply('QUEUE_FULL ' .. ARGV[1] .. ' has ' .. depth .. ' tasks waiting')
  end
end
redis.call('LPUSH', KEYS[3], ARGV[2])
redis.call('HINCRBY', ARGV[6], 'route:L1', 1)
return ''

-- Route one task: to the L2 of an IDLE or WAITING executor with free
-- capacity, else to the model's L1. An executor with no batch window
-- (max_wait_ms 0) computes at once, so handing it a task makes it WORKING
-- here, which saves the executor a round trip.
-- KEYS: executors set, models set, target L1 key, L1 keys of every priority, changes
-- ARGV: model, message, executor key prefix, L2 key prefix, max_queue hash, metrics hash
-- Returns the executor id, or '' for L1.
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply('UNKNOWN_MODEL no worker serves ' .. ARGV[1])
end
local now = now_ms()
local best, best_cap, best_waiting = nil, 0, false
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local h = redis.call('HMGET', ARGV[3] .. id, 'state', 'cap', 'expires_ms')
  local state, cap, expires = h[1], tonumber(h[2]), tonumber(h[3])
  if cap and cap > 0 and expires and expires > now
      and (state == 'IDLE' or state == 'WAITING') then
    local waiting = state == 'WAITING'
    -- Prefer a WAITING executor (its window is already open), the fullest first.
    local better = best == nil
      or (waiting and not best_waiting)
      or (waiting and best_waiting and cap < best_cap)
    if better then
      best, best_cap, best_waiting = id, cap, waiting
    end
  end
end
if best then
  local hash = ARGV[3] .. best
  redis.call('LPUSH', ARGV[4] .. best, ARGV[2])
  if tonumber(redis.call('HGET', hash, 'max_wait_ms')) == 0 then
    redis.call('HSET', hash, 'state', 'WORKING', 'cap', 0)
    change(KEYS[#KEYS], hash, best, 'WORKING')
  else
    redis.call('HINCRBY', hash, 'cap', -1)
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

-- Route tasks of one model, each by the two-level rule: to the L2 of an IDLE or
-- WAITING executor with free capacity, else to the model's L1. The candidate is the
-- first of the model's ready set (a WAITING executor, the fullest first, then the
-- longest IDLE), so a route costs the same however many executors serve the model.
-- An entry whose heartbeat lapsed is dropped on the way (the heartbeat adds it back
-- if it lives). An executor with no batch window (max_wait_ms 0) computes at once,
-- so handing it a task makes it WORKING here, which saves the executor a round trip.
-- A WAITING executor whose capacity reaches 0 is told so on its full channel, which
-- closes its batch window at once.
-- KEYS: ready set, models set, target L1 key, L1 keys of every priority, changes
-- ARGV: model, executor key prefix, L2 key prefix, max_queue hash, metrics hash,
--       full channel prefix, then one message per task
-- Returns one reply per message: the executor id, 0 for L1, or the L1 depth that
-- refused it (QUEUE_FULL) as a negative number.
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply('UNKNOWN_MODEL no worker serves ' .. ARGV[1])
end
local now = now_ms()

local max_queue = tonumber(redis.call('HGET', ARGV[4], ARGV[1]) or 0)
local depth = nil
local out, to_l1, routed = {}, 0, 0
local ready = Ready(KEYS[1], ARGV[2], ARGV[3], ARGV[6], KEYS[#KEYS], now)
for i = 7, #ARGV do
  local id, state, window = ready.top()
  if id then
    ready.hand(id, state, window, ARGV[i])
    routed = routed + 1
    out[#out + 1] = id
  else
    if max_queue > 0 and not depth then
      depth = 0
      for k = 4, #KEYS - 1 do depth = depth + redis.call('LLEN', KEYS[k]) end
    end
    if max_queue > 0 and depth >= max_queue then
      out[#out + 1] = -depth
    else
      redis.call('LPUSH', KEYS[3], ARGV[i])
      if depth then depth = depth + 1 end
      to_l1 = to_l1 + 1
      out[#out + 1] = 0
    end
  end
end
if routed > 0 then redis.call('HINCRBY', ARGV[5], 'route:L2', routed) end
if to_l1 > 0 then redis.call('HINCRBY', ARGV[5], 'route:L1', to_l1) end
return out

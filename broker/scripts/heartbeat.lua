-- Push back the heartbeat deadline of each executor hash in KEYS. An IDLE or
-- WAITING one with room that route.lua dropped from the ready set while its
-- heartbeat had lapsed is put back.
-- Each deadline also goes in the deadlines set, where the coordinator finds lapsed ones.
-- KEYS: deadlines set, then executor hashes.
-- ARGV: ttl ms, then each executor's id, in the order of the hashes.
-- Returns the 1-based indexes of hashes that no longer exist.
local now = now_ms()
local deadline = now + tonumber(ARGV[1])
local missing = {}
for i = 2, #KEYS do
  local key, id = KEYS[i], ARGV[i]
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'expires_ms', deadline)
    redis.call('ZADD', KEYS[1], deadline, id)
    local h = redis.call('HMGET', key, 'state', 'cap', 'ready')
    local room = tonumber(h[2]) or 0
    if h[3] and room > 0 and (h[1] == 'IDLE' or h[1] == 'WAITING') then
      local score = h[1] == 'WAITING' and room or READY_IDLE + now_us()
      redis.call('ZADD', h[3], 'NX', score, id)
    end
  else
    missing[#missing + 1] = i - 1
  end
end
return missing

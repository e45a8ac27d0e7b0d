-- Push back the heartbeat deadline of each executor hash in KEYS. An IDLE or
-- WAITING one with capacity that route.lua dropped from the ready set while its
-- heartbeat had lapsed is put back.
-- KEYS: executor hashes. ARGV: ttl ms, then each executor's id, in the order of KEYS.
-- Returns the 1-based indexes of hashes that no longer exist.
local now = now_ms()
local deadline = now + tonumber(ARGV[1])
local missing = {}
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'expires_ms', deadline)
    local h = redis.call('HMGET', key, 'state', 'cap', 'ready')
    local cap = tonumber(h[2]) or 0
    if h[3] and cap > 0 and (h[1] == 'IDLE' or h[1] == 'WAITING') then
      local score = h[1] == 'WAITING' and cap or READY_IDLE + now_us()
      redis.call('ZADD', h[3], 'NX', score, ARGV[i + 1])
    end
  else
    missing[#missing + 1] = i
  end
end
return missing

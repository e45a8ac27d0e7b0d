-- Push back the heartbeat deadline of each executor hash in KEYS.
-- ARGV: ttl ms. Returns the 1-based indexes of hashes that no longer exist.
local deadline = now_ms() + tonumber(ARGV[1])
local missing = {}
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'expires_ms', deadline)
  else
    missing[#missing + 1] = i
  end
end
return missing

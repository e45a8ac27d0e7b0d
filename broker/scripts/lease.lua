-- The coordinator's lease (keys.COORDINATOR): one coordinator of a Redis works, and any
-- other stands by until the lease is free. Taken when free, kept (its time renewed) by its
-- holder, given up by its holder with a ttl of 0 ms.
-- Returns the lease's holder after the call ('' when none).
-- KEYS: lease
-- ARGV: holder, ttl_ms
local lease = unpack(KEYS, 1, 1)
local holder, ttl_ms = unpack(ARGV, 1, 2)
local ttl = tonumber(ttl_ms)
set_aside(lease, 'string')
local current = redis.call('GET', lease)
if current and current ~= holder then return current end
if ttl == 0 then
  redis.call('DEL', lease)
  return ''
end
redis.call('SET', lease, holder, 'PX', ttl)
return holder

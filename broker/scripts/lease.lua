-- The coordinator's lease (keys.COORDINATOR): one coordinator of a Redis works, and any
-- other stands by until the lease is free. Taken when free, kept (its time renewed) by its
-- holder, given up by its holder with a ttl of 0.
-- KEYS: the lease key
-- ARGV: holder, ttl ms (0: give it up)
-- Returns the lease's holder after the call ('' when none).
local holder, ttl = ARGV[1], tonumber(ARGV[2])
set_aside(KEYS[1], 'string')
local current = redis.call('GET', KEYS[1])
if current and current ~= holder then return current end
if ttl == 0 then
  redis.call('DEL', KEYS[1])
  return ''
end
redis.call('SET', KEYS[1], holder, 'PX', ttl)
return holder

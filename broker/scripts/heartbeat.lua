-- Push back the heartbeat deadline of each executor hash. An IDLE or WAITING one with
-- room that route.lua dropped from the ready set while its heartbeat had lapsed is put
-- back.
-- Each deadline also goes in the deadlines set, where the coordinator finds lapsed ones,
-- and each executor in its model's executors set and the models set: a set that was
-- set aside (another type was found there) is whole again within a beat.
-- executors: the executor hashes; ids: each executor's id, in the order of the hashes.
-- Returns the 1-based indexes of hashes that no longer exist.
-- KEYS: deadlines, models, executors...
-- ARGV: ttl_ms, executors_prefix, ids...
local deadlines, models = unpack(KEYS, 1, 2)
local executors = rest(KEYS, 3)
local ttl_ms, executors_prefix = unpack(ARGV, 1, 2)
local ids = rest(ARGV, 3)
local now = now_ms()
local deadline = now + tonumber(ttl_ms)
local missing = {}
for i, key in ipairs(executors) do
  local id = ids[i]
  if registered(key) then
    call('HSET', key, 'expires_ms', deadline)
    call('ZADD', deadlines, deadline, id)
    local h = call('HMGET', key, 'state', 'cap', 'ready', 'model')
    if h[4] then
      call('SADD', models, h[4])
      call('SADD', executors_prefix .. h[4], id)
    end
    local room = tonumber(h[2]) or 0
    if h[3] and room > 0 and (h[1] == 'IDLE' or h[1] == 'WAITING') then
      local score = h[1] == 'WAITING' and room or READY_IDLE + now_us()
      call('ZADD', h[3], 'NX', score, id)
    end
  else
    missing[#missing + 1] = i
  end
end
return missing

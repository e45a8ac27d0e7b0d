-- Finish a batch: store each result in Celery's format, publish it, and drop
-- the task from in-flight. A stored SUCCESS is never overwritten, so a
-- redelivered task keeps one consistent result.
-- KEYS: in-flight, executor hash, dead-letter list, stats hash
-- ARGV: result ttl seconds, then (raw message, result key, result JSON) triples;
--       an empty result key sends the raw message to the dead-letter list.
local ttl = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV, 3 do
  local raw, key, meta = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if key == '' then
    redis.call('LPUSH', KEYS[3], raw)
  else
    local old = redis.call('GET', key)
    local keep = false
    if old then
      local ok, decoded = pcall(cjson.decode, old)
      keep = ok and type(decoded) == 'table' and decoded.status == 'SUCCESS'
    end
    if keep then
      redis.call('HINCRBY', KEYS[4], 'duplicates', 1)
    else
      redis.call('SET', key, meta, 'EX', ttl)
      redis.call('PUBLISH', key, meta)
    end
  end
  redis.call('LREM', KEYS[1], 1, raw)
  n = n + 1
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'tasks', n)
  redis.call('HINCRBY', KEYS[2], 'batches', 1)
end
return n

-- Shared helpers, prepended to every tandem script.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The model's ready set (keys.ready): executors that can take a task now. Its key is
-- in each executor's hash. WAITING scores its capacity, IDLE READY_IDLE + since when (us).
local READY_IDLE = 1099511627776  -- 2^40, keys.READY_IDLE
local function ready_at(hash, id, score)
  local key = redis.call('HGET', hash, 'ready')
  if key then redis.call('ZADD', key, score, id) end
end
local function not_ready(hash, id)
  local key = redis.call('HGET', hash, 'ready')
  if key then redis.call('ZREM', key, id) end
end

-- Append one executor state change to the changes stream.
local function change(stream, hash, id, state)
  local model = redis.call('HGET', hash, 'model') or ''
  redis.call('XADD', stream, 'MAXLEN', '~', 10000, '*',
    'executor', id, 'model', model, 'state', state, 'ms', now_ms())
end

-- LPUSH the messages items[1..] onto key in order (the last ends leftmost), in
-- commands of up to 256 arguments.
local function push_all(key, items)
  for i = 1, #items, 256 do
    redis.call('LPUSH', key, unpack(items, i, math.min(i + 255, #items)))
  end
end

-- Pop up to n messages from the L1 keys KEYS[first..last], oldest first,
-- highest priority first, into the in-flight list. Appends them to out.
local function claim_l1(first, last, inflight, n, out)
  for i = first, last do
    if n <= 0 then break end
    local items = redis.call('RPOP', KEYS[i], n)
    if items then
      push_all(inflight, items)
      for _, m in ipairs(items) do out[#out + 1] = m end
      n = n - #items
    end
  end
  return out
end

-- A redelivered task waits in its model's retry list and is computed alone, so a
-- task that kills its executor takes no other task down with it. If out is still
-- empty, move one retry task into in-flight; returns true if it did.
local function claim_retry(retry, inflight, out)
  if #out > 0 then return false end
  local m = redis.call('RPOPLPUSH', retry, inflight)
  if not m then return false end
  out[1] = m
  return true
end

-- Store a Celery result and publish it, unless a SUCCESS or a REVOKED is already
-- stored: a redelivered task keeps one consistent result, and a revoked task's result
-- never flips. One SET ... GET; the rare kept result is written back. Returns true if
-- it stored.
local function store_result(key, meta, ttl, stats)
  local old = redis.call('SET', key, meta, 'EX', ttl, 'GET')
  if old then
    local ok, decoded = pcall(cjson.decode, old)
    local status = ok and type(decoded) == 'table' and decoded.status
    if status == 'SUCCESS' or status == 'REVOKED' then
      redis.call('SET', key, old, 'KEEPTTL')
      if status == 'SUCCESS' then redis.call('HINCRBY', stats, 'duplicates', 1) end
      return false
    end
  end
  redis.call('PUBLISH', key, meta)
  return true
end

-- Add one JSON record to the dead-letter list, newest first, capped and expiring.
local function dead_letter(dead, record, cap, ttl, stats)
  redis.call('LPUSH', dead, record)
  redis.call('LTRIM', dead, 0, tonumber(cap) - 1)
  redis.call('EXPIRE', dead, ttl)
  redis.call('HINCRBY', stats, 'dead_lettered', 1)
end

-- The reply of a claiming script: 1 if the batch is one redelivered task, else 0,
-- then the messages it moved into in-flight.
local function claimed(out, redelivered)
  table.insert(out, 1, redelivered and 1 or 0)
  return out
end

-- Shared helpers, prepended to every tandem script.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Every key a script touches is tandem's, but anyone with Redis can write there. A key
-- found holding another type than a step needs is moved aside to KEY:wrongtype (kept for
-- whoever wrote it, read by nobody) and noted in Redis's log, and the step goes on with
-- a fresh key instead of stopping the model: an executor whose own hash is set aside
-- finds itself gone and registers again. Returns true if it moved the key.
local function set_aside(key, wanted)
  local found = redis.call('TYPE', key)['ok']
  if found == wanted or found == 'none' then return false end
  redis.call('RENAME', key, key .. ':wrongtype')
  redis.log(redis.LOG_WARNING, 'tandem: ' .. key .. ' held a ' .. found .. ', not a ' ..
    wanted .. '; moved to ' .. key .. ':wrongtype')
  return true
end

-- True while an executor's hash is in the table (a TYPE, as cheap as EXISTS). One of
-- another type is set aside: that executor is gone, and registers again.
local function registered(hash)
  local found = redis.call('TYPE', hash)['ok']
  if found == 'hash' then return true end
  if found ~= 'none' then set_aside(hash, 'hash') end
  return false
end

-- The type a command needs at its key (nil: a command that never sets a key aside). Made
-- on an error only: a table built at the top would be built on every script call.
local function needs(command)
  return ({
    HSET = 'hash', HGET = 'hash', HMGET = 'hash', HDEL = 'hash', HINCRBY = 'hash',
    HINCRBYFLOAT = 'hash', ZADD = 'zset', ZREM = 'zset', ZRANGE = 'zset', ZCARD = 'zset',
    LPUSH = 'list', RPUSH = 'list', RPOP = 'list', LLEN = 'list', LRANGE = 'list',
    LREM = 'list', LTRIM = 'list', LPOS = 'list', RPOPLPUSH = 'list',
    SADD = 'set', SREM = 'set', SISMEMBER = 'set', SMEMBERS = 'set', XADD = 'stream',
  })[command]
end

-- redis.call(command, key, ...) on a key of tandem's: one holding another type is set
-- aside first (RPOPLPUSH: either key). Any other error is raised as redis.call raises it.
local function call(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    local wanted = needs(command)  -- a command not listed never sets a key aside
    local moved = wanted and string.find(reply.err, 'WRONGTYPE') and set_aside(key, wanted)
    if not moved and command == 'RPOPLPUSH' then moved = set_aside((...), 'list') end
    -- Not a wrong type: run it again with redis.call, which raises its error as Redis
    -- does (a script cannot raise an error reply by hand in every Redis version).
    reply = redis.call(command, key, ...)
  end
  return reply
end

-- The model's ready set (keys.ready): executors that can take a task now. Its key is
-- in each executor's hash. WAITING scores its room, IDLE READY_IDLE + since when (us).
local READY_IDLE = 1099511627776  -- 2^40, keys.READY_IDLE
local function ready_at(hash, id, score)
  local key = call('HGET', hash, 'ready')
  if key then call('ZADD', key, score, id) end
end
local function not_ready(hash, id)
  local key = call('HGET', hash, 'ready')
  if key then call('ZREM', key, id) end
end

-- Add `by` to a counter of the stats or a metrics hash. A hash of another type is set
-- aside; a field that is not a number starts again at `by`. A whole number (a Lua number
-- under 1e14, which tostring writes as digits, or a string of digits) takes HINCRBY; the
-- number's test skips tostring and a pattern, which cost ~6 us cold on a route.
local function tally(key, field, by)
  local whole
  if type(by) == 'number' then
    whole = by % 1 == 0 and by > -1e14 and by < 1e14
  else
    whole = string.find(by, '^-?%d+$')
  end
  local command = whole and 'HINCRBY' or 'HINCRBYFLOAT'
  local reply = redis.pcall(command, key, field, by)
  if type(reply) ~= 'table' or not reply.err then return end
  if set_aside(key, 'hash') then
    redis.call(command, key, field, by)
  elseif type(redis.pcall('HINCRBYFLOAT', key, field, by)) == 'table' then
    call('HSET', key, field, by)
  end
end

-- Append one executor state change to the changes stream. model and ms, when the
-- caller knows them, save a read each. The stream is for observers: a key of another
-- type there loses the record (pcall), never the step that changed the state.
local function change(stream, hash, id, state, model, ms)
  model = model or call('HGET', hash, 'model') or ''
  redis.pcall('XADD', stream, 'MAXLEN', '~', 10000, '*',
    'executor', id, 'model', model, 'state', state, 'ms', ms or now_ms())
end

-- The WORKING change a route made for an executor with no batch window (Ready.hand),
-- recorded after it: the change, at the route's time (the hash's routed_ms), and its task
-- in the route:L2 count of the model's metrics hash. In the route they cost ~20 us cold
-- on the task's path; the executor's next script (claim_or_idle, state, begin) or its
-- reclaim records them, before any change of its own, so the stream keeps every change
-- of an executor in order, one compute late.
local function settle_route(changes, hash, id, metrics)
  local ms = call('HGET', hash, 'routed_ms')
  if not ms then return end
  change(changes, hash, id, 'WORKING', nil, ms)
  tally(metrics, 'route:L2', 1)
  redis.call('HDEL', hash, 'routed_ms')
end

-- t[from], t[from + 1], ... as a list of their own: a script's variadic KEYS or ARGV
-- (unpack would stop at Lua's C stack limit on a large batch).
local function rest(t, from)
  local out = {}
  for i = from, #t do out[#out + 1] = t[i] end
  return out
end

-- The L1 list of message m at its priority, as kombu files it: of l1, the L1 keys of
-- priority 0, 3, 6 and 9. An unreadable priority is 0.
local function l1_of(m, l1)
  local ok, msg = pcall(cjson.decode, m)
  local p = 0
  if ok and type(msg) == 'table' and type(msg.properties) == 'table' then
    p = tonumber(msg.properties.priority) or 0
  end
  if p >= 9 then return l1[4] elseif p >= 6 then return l1[3]
  elseif p >= 3 then return l1[2] end
  return l1[1]
end

-- LPUSH the messages items[1..] onto key in order (the last ends leftmost), in
-- commands of up to 256 arguments.
local function push_all(key, items)
  for i = 1, #items, 256 do
    call('LPUSH', key, unpack(items, i, math.min(i + 255, #items)))
  end
end

-- Redis before 7 finds the first of `RPOP key n` by walking the list from its head: on a
-- long L1 (a backlog, when a freed executor claims most) each claim would cost Redis
-- time in proportion to the backlog. Past LONG_LIST, where that walk costs more than n
-- pops of one each, such a list is popped one at a time from its tail. Redis 7 seeks
-- from the nearer end, and came with redis.REDIS_VERSION.
local WALKS_FROM_HEAD = redis.REDIS_VERSION == nil
local LONG_LIST = 8192

-- Up to n items from the tail of a list, oldest first; false when it is empty.
local function pop_tail(key, n)
  if not WALKS_FROM_HEAD then return call('RPOP', key, n) end
  local length = call('LLEN', key)
  if length <= LONG_LIST then return length > 0 and call('RPOP', key, n) end
  local items = {}
  for i = 1, n do
    local m = redis.call('RPOP', key)  -- a list: LLEN's call() set any other type aside
    if not m then break end
    items[i] = m
  end
  return #items > 0 and items
end

-- Pop up to n messages from the L1 keys l1 (highest priority first), oldest first,
-- into the in-flight list. Appends them to out.
local function claim_l1(l1, inflight, n, out)
  for _, key in ipairs(l1) do
    if n <= 0 then break end
    local items = pop_tail(key, n)
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
  local m = call('RPOPLPUSH', retry, inflight)
  if not m then return false end
  out[1] = m
  return true
end

-- Store a Celery result and publish it, unless a SUCCESS or a REVOKED is already
-- stored: a redelivered task keeps one consistent result, and a revoked task's result
-- never flips. One SET ... GET; the rare kept result is written back. The very same
-- bytes stored already are this store repeated (a retry after a lost reply or a
-- failover), not a second compute: no duplicate, nothing published again. Returns
-- 'stored', 'same' or 'kept'; or false and Redis's error if the key refused it (a key
-- of another type).
local function store_result(key, meta, ttl, stats)
  local old = redis.pcall('SET', key, meta, 'EX', ttl, 'GET')
  if type(old) == 'table' and old.err then return false, old.err end
  if old == meta then return 'same' end
  if old then
    local ok, decoded = pcall(cjson.decode, old)
    local status = ok and type(decoded) == 'table' and decoded.status
    if status == 'SUCCESS' or status == 'REVOKED' then
      redis.call('SET', key, old, 'KEEPTTL')
      if status == 'SUCCESS' then tally(stats, 'duplicates', 1) end
      return 'kept'
    end
  end
  redis.call('PUBLISH', key, meta)
  return 'stored'
end

-- Add one JSON record to the dead-letter list, newest first, capped and expiring: the
-- list's key expires ttl s after its last record, and records older than ttl s (by their
-- at_s, epoch seconds) are dropped from its tail, so a steady trickle of dead letters
-- keeps about ttl s of them, not the cap.
local function dead_letter(dead, record, cap, ttl, stats)
  call('LPUSH', dead, record)
  redis.call('LTRIM', dead, 0, tonumber(cap) - 1)
  redis.call('EXPIRE', dead, ttl)
  local t = redis.call('TIME')
  local oldest = tonumber(t[1]) - tonumber(ttl)
  for _ = 1, 100 do  -- bounded: a few records age out per record added
    local ok, tail = pcall(cjson.decode, redis.call('LINDEX', dead, -1) or 'null')
    local at = ok and type(tail) == 'table' and tonumber(tail.at_s)
    if not at or at >= oldest then break end
    redis.call('RPOP', dead)
  end
  tally(stats, 'dead_lettered', 1)
end

-- The reply of a claiming script: 1 if the batch is one redelivered task, else 0,
-- then the messages it moved into in-flight.
local function claimed(out, redelivered)
  table.insert(out, 1, redelivered and 1 or 0)
  return out
end

-- A model's ready set, as route.lua and feed.lua hand it tasks. The executor hashes
-- are hash_prefix .. id, the L2 lists l2_prefix .. id, the full channels
-- full_prefix .. id; now is in ms.
local function Ready(set, hash_prefix, l2_prefix, full_prefix, now)
  local self, empty = {}, false
  -- The first live entry (id, state, window ms), or nil. Lapsed entries are dropped
  -- on the way; once the set is empty it stays so for the rest of the script.
  function self.top()
    while not empty do
      local top = call('ZRANGE', set, 0, 0)
      if #top == 0 then empty = true; return nil end
      local h = call('HMGET', hash_prefix .. top[1], 'state', 'cap', 'expires_ms',
        'max_wait_ms')
      local room, expires = tonumber(h[2]), tonumber(h[3])
      if room and room > 0 and expires and expires > now
          and (h[1] == 'IDLE' or h[1] == 'WAITING') then
        return top[1], h[1], tonumber(h[4]) or 0
      end
      call('ZREM', set, top[1])
    end
    return nil
  end
  -- Push message m onto executor id's L2 and take one from its room. With no
  -- batch window it computes at once, so it goes WORKING here, and the change and the
  -- task's route:L2 count are left to the executor's next script (settle_route); returns
  -- true then, so the caller does not count the task. A WAITING one whose room runs out
  -- is told on its full channel.
  function self.hand(id, state, window, m)
    local hash = hash_prefix .. id
    call('LPUSH', l2_prefix .. id, m)
    if window == 0 then
      call('HSET', hash, 'state', 'WORKING', 'cap', 0, 'routed_ms', now)
      call('ZREM', set, id)
      return true
    end
    local room = call('HINCRBY', hash, 'cap', -1)
    if room <= 0 then
      call('ZREM', set, id)
      redis.call('PUBLISH', full_prefix .. id, 'full')
    elseif state == 'WAITING' then
      call('ZADD', set, room, id)
    end
    return false
  end
  return self
end

-- An executor's share of its model's speed hash (keys.speed): the sums of rate, of
-- rate x lag_ms, of rate x extra_ms and of rate x max_batch, and the sum of max_batch,
-- over the live executors with a rate. set_speed replaces the share of the executor
-- whose hash is given; rate 0 takes it out. The sums are kept exact by every script
-- that changes an executor's rate, and the hash goes once no rate is left in it, so no
-- float error outlives the executors.
local function set_speed(hash, speed, rate, lag, extra)
  local old = call('HMGET', hash, 'rate', 'lag_ms', 'max_batch', 'extra_ms')
  local old_rate, old_lag = tonumber(old[1]) or 0, tonumber(old[2]) or 0
  local batch, old_extra = tonumber(old[3]) or 0, tonumber(old[4]) or 0
  if old_rate == 0 and rate == 0 then return end
  call('HSET', hash, 'rate', rate, 'lag_ms', lag, 'extra_ms', extra)
  local left = tonumber(call('HINCRBYFLOAT', speed, 'rate', rate - old_rate))
  if left <= 1e-6 then
    redis.call('DEL', speed)
    return
  end
  call('HINCRBYFLOAT', speed, 'rate_lag', rate * lag - old_rate * old_lag)
  call('HINCRBYFLOAT', speed, 'rate_extra', rate * extra - old_rate * old_extra)
  call('HINCRBYFLOAT', speed, 'rate_batch', (rate - old_rate) * batch)
  if (rate > 0) ~= (old_rate > 0) then
    call('HINCRBY', speed, 'batches', rate > 0 and batch or -batch)
  end
end

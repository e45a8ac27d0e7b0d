-- Shared helpers, prepended to every tandem script.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Append one executor state change to the changes stream.
local function change(stream, hash, id, state)
  local model = redis.call('HGET', hash, 'model') or ''
  redis.call('XADD', stream, 'MAXLEN', '~', 10000, '*',
    'executor', id, 'model', model, 'state', state, 'ms', now_ms())
end

-- Pop up to n messages from the L1 keys KEYS[first..last], oldest first,
-- highest priority first, into the in-flight list. Appends them to out.
local function claim_l1(first, last, inflight, n, out)
  for i = first, last do
    if n <= 0 then break end
    local items = redis.call('RPOP', KEYS[i], n)
    if items then
      for _, m in ipairs(items) do
        redis.call('LPUSH', inflight, m)
        out[#out + 1] = m
      end
      n = n - #items
    end
  end
  return out
end

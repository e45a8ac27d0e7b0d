-- Route tasks of one model, each by the two-level rule: to the L2 of an IDLE or
-- WAITING executor with room, else to the model's L1. The candidate is the
-- first of the model's ready set (a WAITING executor, the fullest first, then the
-- longest IDLE), so a route costs the same however many executors serve the model.
-- An entry whose heartbeat lapsed is dropped on the way (the heartbeat adds it back
-- if it lives). An executor with no batch window (max_wait_ms 0) computes at once,
-- so handing it a task makes it WORKING here, which saves the executor a round trip;
-- the executor records that change, and counts the task in route:L2, after its compute
-- (settle_route in _lib.lua).
-- A WAITING executor whose room reaches 0 is told so on its full channel, which
-- closes its batch window at once.
-- A task bound for L1 that has a deadline (its own, else the model's SLO) is refused
-- when the predicted wait passes it: the tasks ahead of it (the retry list and L1 at
-- its priority and above) over the model's rate, plus the lag from a claim to the
-- result (keys.speed). With the pipeline, a task that finds the batches claimed early
-- full waits for the computes in hand too (extra): sure once as many tasks are ahead
-- as those batches hold, and taken in proportion below that, where a task mostly
-- joins a batch as it is topped up. Nothing is predicted while no executor has
-- published a rate. ModelSpeed.wait_ms in broker/state.py is the same formula.
-- A task bound for L1 that has a deadline while no executor of the model is live (none
-- registered, or every heartbeat lapsed) is refused too: nothing could compute it in
-- time. Without a deadline it waits in L1, durably, for a worker to come.
-- Returns one reply per message: the executor id, 0 for L1, the L1 depth that
-- refused it (QUEUE_FULL) as a negative number, or {predicted wait ms, tasks ahead,
-- ms it had left} when the wait passes its deadline (OVERLOADED), with a wait of -1
-- when no executor is live.
-- route_messages(KEYS, ARGV) does it, for route.lua, route_one.lua and requeue.lua.
-- The keys: the model's ready set, the models set, the L1 key at the tasks' priority
-- (target), the retry list, the speed and SLO hashes, the model's executors set, then
-- the L1 keys of every priority. The arguments: the model, the prefixes of executor
-- hashes, L2 lists and full channels, the max_queue and metrics hashes, the ms the
-- tasks have left (left_ms, -1: none given), how many of the L1 keys are at or above
-- the tasks' priority (above), then one message per task.
-- KEYS: ready_set, models, target, retry, speed, slo, executors, l1...
-- ARGV: model, executor_prefix, l2_prefix, max_queue_hash, metrics, full_prefix,
--       left_ms, above, messages...
local function route_messages(KEYS, ARGV)
  local ready_set, models, target, retry, speed, slo, executors = unpack(KEYS, 1, 7)
  local l1 = rest(KEYS, 8)
  local model, executor_prefix, l2_prefix, max_queue_hash, metrics, full_prefix, left_ms,
    above = unpack(ARGV, 1, 8)
  local messages = rest(ARGV, 9)
  local now = now_ms()
  local ready = Ready(ready_set, executor_prefix, l2_prefix, full_prefix, now)
  local depth, ahead, rate, lag, extra, batch, held = nil, nil, nil, 0, 0, 0, 1
  local live
  local out, to_l1, routed, to_l2, refused, full = {}, 0, 0, 0, 0, 0
  local max_queue, budget

  -- What only a task bound for L1 needs: the model known (an executor in the ready set
  -- already says so), its L1 bound, and the deadline budget (its own, else the SLO).
  local function l1_rules()
    if max_queue then return end
    if routed == 0 and call('SISMEMBER', models, model) == 0 then
      return redis.error_reply('UNKNOWN_MODEL no worker serves ' .. model)
    end
    max_queue = tonumber(call('HGET', max_queue_hash, model) or 0)
    budget = tonumber(left_ms)
    if budget < 0 then
      budget = tonumber(call('HGET', slo, model) or 0)
      if budget <= 0 then budget = nil end
    end
  end

  -- The predicted wait of the next task into L1, in ms, or nil when none can be told.
  local function wait()
    if not budget then return nil end
    if not rate then
      local s = call('HMGET', speed, 'rate', 'rate_lag', 'rate_extra', 'rate_batch',
        'batches')
      rate = tonumber(s[1]) or 0
      if rate > 1e-6 then
        lag, extra = (tonumber(s[2]) or 0) / rate, (tonumber(s[3]) or 0) / rate
        batch, held = (tonumber(s[4]) or 0) / rate, math.max(tonumber(s[5]) or 1, 1)
      end
      ahead = call('LLEN', retry)
      for k = 1, tonumber(above) do ahead = ahead + call('LLEN', l1[k]) end
    end
    if rate <= 1e-6 then return nil end
    -- Claims take batches of about `batch`: the next one comes after half of one, on average.
    return (ahead + batch / 2) * 1000 / rate + lag + extra * math.min(1, ahead / held)
  end

  -- Whether an executor of the model has a heartbeat that has not lapsed. Asked only
  -- where no rate is known (an executor with one is live): a fleet just started, or none.
  local function anyone_live()
    if live == nil then
      live = false
      for _, id in ipairs(call('SMEMBERS', executors)) do
        local expires = tonumber(call('HGET', executor_prefix .. id, 'expires_ms'))
        if expires and expires > now then live = true; break end
      end
    end
    return live
  end

  for _, message in ipairs(messages) do
    local id, state, window = ready.top()
    if id then
      if not ready.hand(id, state, window, message) then to_l2 = to_l2 + 1 end
      routed = routed + 1
      out[#out + 1] = id
    else
      local unknown = l1_rules()
      if unknown then return unknown end
      if max_queue > 0 and not depth then
        depth = 0
        for _, key in ipairs(l1) do depth = depth + call('LLEN', key) end
      end
      local predicted = wait()
      if max_queue > 0 and depth >= max_queue then
        out[#out + 1] = -depth
        full = full + 1
      elseif budget and not predicted and not anyone_live() then
        out[#out + 1] = {-1, ahead, math.floor(budget)}
        refused = refused + 1
      elseif predicted and predicted > budget then
        out[#out + 1] = {math.ceil(predicted), ahead, math.floor(budget)}
        refused = refused + 1
      else
        call('LPUSH', target, message)
        if depth then depth = depth + 1 end
        if ahead then ahead = ahead + 1 end
        to_l1 = to_l1 + 1
        out[#out + 1] = 0
      end
    end
  end
  if to_l2 > 0 then tally(metrics, 'route:L2', to_l2) end
  if to_l1 > 0 then tally(metrics, 'route:L1', to_l1) end
  if refused > 0 then tally(metrics, 'shed:submit', refused) end
  if full > 0 then tally(metrics, 'refused:full', full) end
  return out
end

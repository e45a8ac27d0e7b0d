-- Start a batch: move all of L2 into in-flight, top up from L1, go WORKING.
-- A batch that would be empty takes one redelivered task alone instead.
-- If nothing was taken before (taken 0) and nothing arrives, stay as is.
-- room: max_batch - taken. changes: the state changes stream; metrics: the model's
-- metrics hash.
-- Returns 1 if it took a redelivered task, else 0, then the messages moved by this call.
-- KEYS: executor, l2, inflight, changes, retry, l1...
-- ARGV: executor_id, room, taken, metrics
local executor, l2, inflight, changes, retry = unpack(KEYS, 1, 5)
local l1 = rest(KEYS, 6)
local executor_id, room, taken, metrics = unpack(ARGV, 1, 4)
taken = tonumber(taken)
if not registered(executor) then return redis.error_reply('GONE') end
settle_route(changes, executor, executor_id, metrics)
local out = {}
while true do
  local m = call('RPOPLPUSH', l2, inflight)
  if not m then break end
  out[#out + 1] = m
end
local redelivered = taken == 0 and claim_retry(retry, inflight, out)
if not redelivered then
  claim_l1(l1, inflight, tonumber(room) - #out, out)
end
if #out == 0 and taken == 0 then return claimed(out, false) end
if call('HGET', executor, 'state') == 'STOPPING' then return claimed(out, redelivered) end
call('HSET', executor, 'state', 'WORKING', 'cap', 0)
not_ready(executor, executor_id)
change(changes, executor, executor_id, 'WORKING')
return claimed(out, redelivered)

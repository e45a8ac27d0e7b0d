-- After a compute, in one round trip: claim the next batch (one redelivered task
-- alone, else up to max_batch from L1, oldest and highest priority first), or, when
-- there is nothing to claim, go IDLE with all its room in the same atomic step, so no
-- task can wait in L1 while this executor is IDLE. A STOPPING executor claims
-- nothing more and stays STOPPING.
-- Returns 2 when it went IDLE (or is STOPPING); else 1 if it took a redelivered
-- task, 0 if not, then the messages moved into in-flight.
-- KEYS: executor, inflight, changes, retry, l1...
-- ARGV: executor_id, max_batch, metrics
local executor, inflight, changes, retry = unpack(KEYS, 1, 4)
local l1 = rest(KEYS, 5)
local executor_id, max_batch, metrics = unpack(ARGV, 1, 3)
if not registered(executor) then return redis.error_reply('GONE') end
settle_route(changes, executor, executor_id, metrics)
if call('HGET', executor, 'state') == 'STOPPING' then return {2} end
local out = {}
if claim_retry(retry, inflight, out) then return claimed(out, true) end
claim_l1(l1, inflight, tonumber(max_batch), out)
if #out > 0 then return claimed(out, false) end
call('HSET', executor, 'state', 'IDLE', 'cap', max_batch)
ready_at(executor, executor_id, READY_IDLE + now_us())
change(changes, executor, executor_id, 'IDLE')
return {2}

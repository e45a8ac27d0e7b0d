-- After a compute, in one round trip: claim the next batch (one redelivered task
-- alone, else up to N from L1, oldest and highest priority first), or, when there
-- is nothing to claim, go IDLE with all its room in the same atomic step, so no
-- task can wait in L1 while this executor is IDLE. A STOPPING executor claims
-- nothing more and stays STOPPING.
-- KEYS: executor hash, in-flight, changes, retry list, L1 keys of every priority
-- ARGV: executor id, max_batch, metrics hash
-- Returns 2 when it went IDLE (or is STOPPING); else 1 if it took a redelivered
-- task, 0 if not, then the messages moved into in-flight.
if not registered(KEYS[1]) then return redis.error_reply('GONE') end
settle_route(KEYS[3], KEYS[1], ARGV[1], ARGV[3])
if call('HGET', KEYS[1], 'state') == 'STOPPING' then return {2} end
local out = {}
if claim_retry(KEYS[4], KEYS[2], out) then return claimed(out, true) end
claim_l1(5, #KEYS, KEYS[2], tonumber(ARGV[2]), out)
if #out > 0 then return claimed(out, false) end
call('HSET', KEYS[1], 'state', 'IDLE', 'cap', ARGV[2])
ready_at(KEYS[1], ARGV[1], READY_IDLE + now_us())
change(KEYS[3], KEYS[1], ARGV[1], 'IDLE')
return {2}

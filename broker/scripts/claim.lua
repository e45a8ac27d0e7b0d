-- Claim tasks into in-flight. The executor stays WORKING. A batch that is still
-- empty (alone) takes one redelivered task alone if there is one; otherwise up to n
-- from L1, oldest and highest priority first.
-- Returns 1 if it took a redelivered task, else 0, then the messages moved.
-- KEYS: executor, inflight, retry, l1...
-- ARGV: n, alone
local executor, inflight, retry = unpack(KEYS, 1, 3)
local l1 = rest(KEYS, 4)
local n, alone = unpack(ARGV, 1, 2)
if not registered(executor) then return redis.error_reply('GONE') end
local out = {}
if alone == '1' and claim_retry(retry, inflight, out) then return claimed(out, true) end
return claimed(claim_l1(l1, inflight, tonumber(n), out), false)

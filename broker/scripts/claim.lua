-- Claim tasks into in-flight. The executor stays WORKING. A batch that is still
-- empty (ARGV[2] == '1') takes one redelivered task alone if there is one;
-- otherwise up to N from L1, oldest and highest priority first.
-- KEYS: executor hash, in-flight, retry list, L1 keys of every priority
-- ARGV: n, '1' if the batch is empty
-- Returns 1 if it took a redelivered task, else 0, then the messages moved.
if not registered(KEYS[1]) then return redis.error_reply('GONE') end
local out = {}
if ARGV[2] == '1' and claim_retry(KEYS[3], KEYS[2], out) then return claimed(out, true) end
return claimed(claim_l1(4, #KEYS, KEYS[2], tonumber(ARGV[1]), out), false)

-- Claim up to N tasks from L1, oldest first, into in-flight. The executor stays WORKING.
-- KEYS: executor hash, in-flight, L1 keys of every priority
-- ARGV: n
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('GONE') end
return claim_l1(3, #KEYS, KEYS[2], tonumber(ARGV[1]), {})

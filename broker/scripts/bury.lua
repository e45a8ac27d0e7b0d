-- Quarantine one poison message: take it off the poison list, store its FAILURE
-- (unless it succeeded meanwhile), add its dead-letter record, end its count.
-- Returns 0 if it was no longer on the poison list (already buried).
-- result: the result key, and result_meta: its JSON and ttl s, for a message with an id.
-- KEYS: poison, dead, deliveries, stats, result...
-- ARGV: raw, record, dead_cap, dead_ttl, result_meta...
local poison, dead, deliveries, stats = unpack(KEYS, 1, 4)
local result = rest(KEYS, 5)
local raw, record, dead_cap, dead_ttl = unpack(ARGV, 1, 4)
local result_meta = rest(ARGV, 5)
if call('LREM', poison, 1, raw) == 0 then return 0 end
if result[1] then store_result(result[1], result_meta[1], result_meta[2], stats) end
dead_letter(dead, record, dead_cap, dead_ttl, stats)
redis.call('DEL', deliveries)
return 1

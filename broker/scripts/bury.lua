-- Quarantine one poison message: take it off the poison list, store its FAILURE
-- (unless it succeeded meanwhile), add its dead-letter record, end its count.
-- Returns 0 if it was no longer on the poison list (already buried).
-- KEYS: poison list, dead-letter list, its deliveries list, stats[, result key]
-- ARGV: raw message, dead-letter record, dead-letter cap, dead-letter ttl s
--       [, result JSON, result ttl s]
if call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if KEYS[5] then store_result(KEYS[5], ARGV[5], ARGV[6], KEYS[4]) end
dead_letter(KEYS[2], ARGV[2], ARGV[3], ARGV[4], KEYS[4])
redis.call('DEL', KEYS[3])
return 1

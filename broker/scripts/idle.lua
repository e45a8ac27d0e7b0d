-- Go IDLE, with full capacity, only if the model's retry list and every L1 list
-- are empty.
-- KEYS: executor hash, changes, retry list, L1 keys of every priority
-- ARGV: executor id, max_batch
-- Returns 1 when IDLE, 0 when there is work to claim.
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('GONE') end
-- A stopping executor stays STOPPING, with no capacity: nothing more is routed to it.
if redis.call('HGET', KEYS[1], 'state') == 'STOPPING' then return 1 end
for i = 3, #KEYS do
  if redis.call('LLEN', KEYS[i]) > 0 then return 0 end
end
redis.call('HSET', KEYS[1], 'state', 'IDLE', 'cap', ARGV[2])
ready_at(KEYS[1], ARGV[1], READY_IDLE + now_us())
change(KEYS[2], KEYS[1], ARGV[1], 'IDLE')
return 1

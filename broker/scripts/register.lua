-- Register an executor. It starts WORKING with no room and no published rate
-- (a share left by an earlier registration of the same id is taken out), and its
-- first step claims any L1 backlog or goes IDLE. Sets its model's L1 bound and SLO.
-- KEYS: executor hash, executors set, models set, changes, stats, deadlines set,
--       speed hash
-- ARGV: executor id, model, worker, max_batch, ttl ms, max_wait_ms, pid, max_queue,
--       max_queue hash, ready set, slo ms, slo hash
set_speed(KEYS[1], KEYS[7], 0, 0, 0)
call('HSET', KEYS[1], 'id', ARGV[1], 'model', ARGV[2], 'worker', ARGV[3],
  'state', 'WORKING', 'cap', 0, 'max_batch', ARGV[4], 'max_wait_ms', ARGV[6],
  'pid', ARGV[7], 'expires_ms', now_ms() + tonumber(ARGV[5]),
  'started_ms', now_ms(), 'batches', 0, 'tasks', 0, 'ready', ARGV[10])
not_ready(KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1], 'routed_ms')  -- a route's record belongs to the hash it replaces
call('ZADD', KEYS[6], now_ms() + tonumber(ARGV[5]), ARGV[1])
call('SADD', KEYS[2], ARGV[1])
call('SADD', KEYS[3], ARGV[2])
if tonumber(ARGV[8]) > 0 then
  call('HSET', ARGV[9], ARGV[2], ARGV[8])
else
  call('HDEL', ARGV[9], ARGV[2])
end
if tonumber(ARGV[11]) > 0 then
  call('HSET', ARGV[12], ARGV[2], ARGV[11])
else
  call('HDEL', ARGV[12], ARGV[2])
end
change(KEYS[4], KEYS[1], ARGV[1], 'WORKING')
-- Every start, restart in place and registration after a reclaim: flapping shows here.
tally(KEYS[5], 'registrations', 1)
return 1

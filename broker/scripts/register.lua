-- Register an executor. It starts WORKING with no room and no published rate
-- (a share left by an earlier registration of the same id is taken out), and its
-- first step claims any L1 backlog or goes IDLE. Sets its model's L1 bound and SLO.
-- max_queue and slo_ms go in the hashes named by max_queue_hash and slo_hash.
-- KEYS: executor, executors, models, changes, stats, deadlines, speed
-- ARGV: executor_id, model, worker, max_batch, ttl_ms, max_wait_ms, pid, max_queue,
--       max_queue_hash, ready, slo_ms, slo_hash
local executor, executors, models, changes, stats, deadlines, speed = unpack(KEYS, 1, 7)
local executor_id, model, worker, max_batch, ttl_ms, max_wait_ms, pid, max_queue,
  max_queue_hash, ready, slo_ms, slo_hash = unpack(ARGV, 1, 12)
set_speed(executor, speed, 0, 0, 0)
call('HSET', executor, 'id', executor_id, 'model', model, 'worker', worker,
  'state', 'WORKING', 'cap', 0, 'max_batch', max_batch, 'max_wait_ms', max_wait_ms,
  'pid', pid, 'expires_ms', now_ms() + tonumber(ttl_ms),
  'started_ms', now_ms(), 'batches', 0, 'tasks', 0, 'ready', ready)
not_ready(executor, executor_id)
redis.call('HDEL', executor, 'routed_ms')  -- a route's record belongs to the hash it replaces
call('ZADD', deadlines, now_ms() + tonumber(ttl_ms), executor_id)
call('SADD', executors, executor_id)
call('SADD', models, model)
if tonumber(max_queue) > 0 then
  call('HSET', max_queue_hash, model, max_queue)
else
  call('HDEL', max_queue_hash, model)
end
if tonumber(slo_ms) > 0 then
  call('HSET', slo_hash, model, slo_ms)
else
  call('HDEL', slo_hash, model)
end
change(changes, executor, executor_id, 'WORKING')
-- Every start, restart in place and registration after a reclaim: flapping shows here.
tally(stats, 'registrations', 1)
return 1

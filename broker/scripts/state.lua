-- Record a state the scheduling does not depend on (WAITING, STOPPING).
-- STOPPING also zeroes its room, so nothing more is routed here, and takes the
-- executor's rate out of its model's speed hash, since it claims nothing more.
-- Returns the executor's room after the change.
-- KEYS: executor, changes, speed
-- ARGV: executor_id, state, metrics
local executor, changes, speed = unpack(KEYS, 1, 3)
local executor_id, state, metrics = unpack(ARGV, 1, 3)
if not registered(executor) then return redis.error_reply('GONE') end
settle_route(changes, executor, executor_id, metrics)
-- STOPPING is final: only a new registration leaves it.
if call('HGET', executor, 'state') == 'STOPPING' then return 0 end
call('HSET', executor, 'state', state)
if state == 'STOPPING' then
  call('HSET', executor, 'cap', 0)
  not_ready(executor, executor_id)
  set_speed(executor, speed, 0, 0, 0)
elseif state == 'WAITING' then
  local room = tonumber(call('HGET', executor, 'cap')) or 0
  if room > 0 then ready_at(executor, executor_id, room) else not_ready(executor, executor_id) end
end
change(changes, executor, executor_id, state)
return tonumber(call('HGET', executor, 'cap')) or 0

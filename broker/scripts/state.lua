-- Record a state the scheduling does not depend on (WAITING, STOPPING).
-- STOPPING also zeroes its room, so nothing more is routed here, and takes the
-- executor's rate out of its model's speed hash, since it claims nothing more.
-- KEYS: executor hash, changes, speed hash
-- ARGV: executor id, state, metrics hash
-- Returns the executor's room after the change.
if not registered(KEYS[1]) then return redis.error_reply('GONE') end
settle_route(KEYS[2], KEYS[1], ARGV[1], ARGV[3])
-- STOPPING is final: only a new registration leaves it.
if call('HGET', KEYS[1], 'state') == 'STOPPING' then return 0 end
call('HSET', KEYS[1], 'state', ARGV[2])
if ARGV[2] == 'STOPPING' then
  call('HSET', KEYS[1], 'cap', 0)
  not_ready(KEYS[1], ARGV[1])
  set_speed(KEYS[1], KEYS[3], 0, 0, 0)
elseif ARGV[2] == 'WAITING' then
  local room = tonumber(call('HGET', KEYS[1], 'cap')) or 0
  if room > 0 then ready_at(KEYS[1], ARGV[1], room) else not_ready(KEYS[1], ARGV[1]) end
end
change(KEYS[2], KEYS[1], ARGV[1], ARGV[2])
return tonumber(call('HGET', KEYS[1], 'cap')) or 0

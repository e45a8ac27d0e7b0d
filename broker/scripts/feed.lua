-- Hand tasks waiting in a model's L1 to its ready executors, as route.lua would
-- have, oldest and highest priority first: the coordinator runs this for every
-- model a few times a second, so tasks that plain Celery publishers pushed into L1
-- (they skip route.lua) reach an idle executor without any executor polling.
-- Costs a ZCARD when no executor is ready.
-- KEYS: ready set, L1 keys of every priority
-- ARGV: executor key prefix, L2 key prefix, full channel prefix, metrics hash
-- Returns the number of tasks handed on.
if call('ZCARD', KEYS[1]) == 0 then return 0 end
local ready = Ready(KEYS[1], ARGV[1], ARGV[2], ARGV[3], now_ms())
local moved, to_l2 = 0, 0
for i = 2, #KEYS do
  while true do
    if call('LLEN', KEYS[i]) == 0 then break end
    local id, state, window = ready.top()
    if not id then break end
    if not ready.hand(id, state, window, call('RPOP', KEYS[i])) then to_l2 = to_l2 + 1 end
    moved = moved + 1
  end
end
if to_l2 > 0 then tally(ARGV[4], 'route:L2', to_l2) end
return moved

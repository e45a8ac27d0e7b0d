-- Hand tasks waiting in a model's L1 to its ready executors, as route.lua would
-- have, oldest and highest priority first: the coordinator runs this for every
-- model a few times a second, so tasks that plain Celery publishers pushed into L1
-- (they skip route.lua) reach an idle executor without any executor polling.
-- Costs a ZCARD when no executor is ready.
-- Returns the number of tasks handed on.
-- KEYS: ready_set, l1...
-- ARGV: executor_prefix, l2_prefix, full_prefix, metrics
local ready_set = unpack(KEYS, 1, 1)
local l1 = rest(KEYS, 2)
local executor_prefix, l2_prefix, full_prefix, metrics = unpack(ARGV, 1, 4)
if call('ZCARD', ready_set) == 0 then return 0 end
local ready = Ready(ready_set, executor_prefix, l2_prefix, full_prefix, now_ms())
local moved, to_l2 = 0, 0
for _, key in ipairs(l1) do
  while true do
    if call('LLEN', key) == 0 then break end
    local id, state, window = ready.top()
    if not id then break end
    if not ready.hand(id, state, window, call('RPOP', key)) then to_l2 = to_l2 + 1 end
    moved = moved + 1
  end
end
if to_l2 > 0 then tally(metrics, 'route:L2', to_l2) end
return moved

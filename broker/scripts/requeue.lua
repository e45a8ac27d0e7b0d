-- Requeue one dead letter in one atomic step: route its message by the two-level rule
-- (_route.lua) with a fresh delivery count, and drop the letter. A letter no longer in
-- the list (requeued or purged meanwhile) is an error, and a refusal (QueueFull,
-- Overloaded) or an unknown model changes nothing: the letter stays.
-- KEYS: dead list, the message's deliveries key, then route.lua's keys
-- ARGV: the letter as stored, then route.lua's arguments with the one message
if not call('LPOS', KEYS[1], ARGV[1]) then
  return redis.error_reply('NO_LETTER the dead letter is gone (requeued or purged)')
end
local route_keys, route_argv = {}, {}
for i = 3, #KEYS do route_keys[#route_keys + 1] = KEYS[i] end
for i = 2, #ARGV do route_argv[#route_argv + 1] = ARGV[i] end
local reply = route_messages(route_keys, route_argv)
if reply.err then return reply end
local routed = reply[1]
if type(routed) == 'string' or routed == 0 then
  redis.call('DEL', KEYS[2])
  call('LREM', KEYS[1], 1, ARGV[1])
end
return reply

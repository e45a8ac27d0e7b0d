-- Requeue one dead letter in one atomic step: route its message by the two-level rule
-- (_route.lua) with a fresh delivery count, and drop the letter. A letter no longer in
-- the list (requeued or purged meanwhile) is an error, and a refusal (QueueFull,
-- Overloaded) or an unknown model changes nothing: the letter stays.
-- dead: the dead-letter list; deliveries: the message's deliveries list; letter: the
-- letter as stored; route_keys and route_args: route.lua's, with the one message.
-- KEYS: dead, deliveries, route_keys...
-- ARGV: letter, route_args...
local dead, deliveries = unpack(KEYS, 1, 2)
local route_keys = rest(KEYS, 3)
local letter = unpack(ARGV, 1, 1)
local route_args = rest(ARGV, 2)
if not call('LPOS', dead, letter) then
  return redis.error_reply('NO_LETTER the dead letter is gone (requeued or purged)')
end
local reply = route_messages(route_keys, route_args)
if reply.err then return reply end
local routed = reply[1]
if type(routed) == 'string' or routed == 0 then
  redis.call('DEL', deliveries)
  call('LREM', dead, 1, letter)
end
return reply

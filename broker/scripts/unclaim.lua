-- Hand claimed tasks back, unstarted: each leaves the executor's in-flight list and
-- goes to the head of L1 at its priority (the end consumers pop), so the next claim
-- takes them first, in the order given. For tasks a batch had no room for.
-- KEYS: in-flight, L1 keys of priority 0,3,6,9
-- ARGV: the messages, in the order they were claimed
-- Returns how many went back (a message no longer in in-flight is skipped).
local n = 0
for i = #ARGV, 1, -1 do
  local m = ARGV[i]
  if call('LREM', KEYS[1], -1, m) == 1 then
    call('RPUSH', l1_of(m, 2), m)
    n = n + 1
  end
end
return n

-- Hand claimed tasks back, unstarted: each leaves the executor's in-flight list and
-- goes to the head of L1 at its priority (the end consumers pop), so the next claim
-- takes them first, in the order given. For tasks a batch had no room for.
-- l1: the L1 keys of priority 0, 3, 6 and 9; messages: in the order they were claimed.
-- Returns how many went back (a message no longer in in-flight is skipped).
-- KEYS: inflight, l1...
-- ARGV: messages...
local inflight = unpack(KEYS, 1, 1)
local l1 = rest(KEYS, 2)
local messages = rest(ARGV, 1)
local n = 0
for i = #messages, 1, -1 do
  local m = messages[i]
  if call('LREM', inflight, -1, m) == 1 then
    call('RPUSH', l1_of(m, l1), m)
    n = n + 1
  end
end
return n

-- Start a batch: move all of L2 into in-flight, top up from L1, go WORKING.
-- A batch that would be empty takes one redelivered task alone instead.
-- If nothing was taken before (ARGV[3] == 0) and nothing arrives, stay as is.
-- KEYS: executor hash, L2, in-flight, changes, retry list, L1 keys of every priority
-- ARGV: executor id, room (max_batch - taken), taken, metrics hash
-- Returns 1 if it took a redelivered task, else 0, then the messages moved by this call.
if not registered(KEYS[1]) then return redis.error_reply('GONE') end
settle_route(KEYS[4], KEYS[1], ARGV[1], ARGV[4])
local out = {}
while true do
  local m = call('RPOPLPUSH', KEYS[2], KEYS[3])
  if not m then break end
  out[#out + 1] = m
end
local redelivered = tonumber(ARGV[3]) == 0 and claim_retry(KEYS[5], KEYS[3], out)
if not redelivered then
  claim_l1(6, #KEYS, KEYS[3], tonumber(ARGV[2]) - #out, out)
end
if #out == 0 and tonumber(ARGV[3]) == 0 then return claimed(out, false) end
if call('HGET', KEYS[1], 'state') == 'STOPPING' then return claimed(out, redelivered) end
call('HSET', KEYS[1], 'state', 'WORKING', 'cap', 0)
not_ready(KEYS[1], ARGV[1])
change(KEYS[4], KEYS[1], ARGV[1], 'WORKING')
return claimed(out, redelivered)

-- Route one task by the two-level rule (_route.lua has the rule), as route.lua does,
-- with its reply alone rather than in a list of one: a producer reads a bulk string or
-- an integer in fewer steps than an array, on every submit's path.
local out = route_messages(KEYS, ARGV)
if out.err then return out end
return out[1]

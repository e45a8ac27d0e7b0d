-- Route tasks of one model by the two-level rule (_route.lua has the rule, and names
-- the keys and arguments).
return route_messages(KEYS, ARGV)

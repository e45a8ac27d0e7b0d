-- Route tasks of one model by the two-level rule (_route.lua has the rule).
return route_messages(KEYS, ARGV)

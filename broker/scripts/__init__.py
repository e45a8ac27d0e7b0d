"""The atomic Lua scripts, loaded once per Redis client."""

from __future__ import annotations

from importlib import resources

import redis
from redis.commands.core import Script

NAMES = (
    "route",
    "route_one",
    "requeue",
    "feed",
    "begin",
    "claim",
    "claim_or_idle",
    "unclaim",
    "state",
    "complete",
    "count",
    "reclaim",
    "bury",
    "register",
    "heartbeat",
    "lease",
)


#: Scripts that also need the route itself (_route.lua), after _lib.lua.
INCLUDES = {"route": ("_route",), "route_one": ("_route",), "requeue": ("_route",)}


def source(name: str) -> str:
    """The full text of one script: _lib.lua's shared helpers, what it includes, itself."""
    here = resources.files(__name__)
    parts = ("_lib", *INCLUDES.get(name, ()), name)
    return "\n".join((here / f"{part}.lua").read_text() for part in parts)


class Scripts:
    """Every tandem script, registered on one client (EVALSHA, reloaded on NOSCRIPT)."""

    route: Script
    route_one: Script
    requeue: Script
    feed: Script
    begin: Script
    claim: Script
    claim_or_idle: Script
    unclaim: Script
    state: Script
    complete: Script
    count: Script
    reclaim: Script
    bury: Script
    register: Script
    heartbeat: Script
    lease: Script

    def __init__(self, client: redis.Redis) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))

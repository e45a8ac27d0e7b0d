"""The atomic Lua scripts, loaded once per Redis client."""

from __future__ import annotations

from importlib import resources

import redis

NAMES = (
    "route",
    "feed",
    "begin",
    "claim",
    "claim_or_idle",
    "unclaim",
    "state",
    "complete",
    "reclaim",
    "bury",
    "register",
    "heartbeat",
)


def source(name: str) -> str:
    """The full text of one script, with the shared helpers prepended."""
    here = resources.files(__name__)
    return (here / "_lib.lua").read_text() + "\n" + (here / f"{name}.lua").read_text()


class Scripts:
    """Every tandem script, registered on one client (EVALSHA, reloaded on NOSCRIPT)."""

    def __init__(self, client: redis.Redis) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))

"""An executor's full channel: route.lua says "full" there when a WAITING executor's
capacity reaches 0, so its batch window closes at once, without polling Redis.

Redis times out blocking commands only about every 100 ms (its `hz`), too coarse for
a window of a few ms; a subscription read with a client-side timeout is exact.
"""

from __future__ import annotations

import redis

from tandem.broker import keys


class FullSignal:
    """One subscription to one executor's full channel, on a connection of its own."""

    def __init__(self, client: redis.Redis, executor_id: str) -> None:
        self.channel = keys.full(executor_id)
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(self.channel)

    def clear(self) -> None:
        """Drop signals of earlier windows."""
        while self._pubsub.get_message(timeout=0) is not None:
            pass

    def wait(self, timeout_s: float) -> bool:
        """Block up to timeout_s for the signal; True if it came."""
        if timeout_s <= 0:
            return False
        return self._pubsub.get_message(timeout=timeout_s) is not None

    def close(self) -> None:
        self._pubsub.close()

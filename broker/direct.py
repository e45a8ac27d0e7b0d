"""Connections of its own for the low-load path's round trips (a producer's
route, an executor's wait on its L2 and its store).

Through the client, each call also passes redis-py's per-command layers: the pool's
checkout (a lock, a poll for stray bytes, its observability hooks), the retry wrapper
and the script object's own checks. After an idle spell that code runs cold, on the
path of every task at low load. A direct call sends
the packed command and reads the reply, with the same connection class, parser and
options as the client's pool (TLS, Sentinel, RESP).

A reply, or the command's own error, gives the connection back. A ConnectionError, a
timeout or an OSError drops it, and the call is made again through the client, which
reconnects and retries as it always did; a call asked to run once raises the error
instead (an executor's claims: run again after a lost reply, a claim would take more
tasks and leave the first ones in flight with nobody computing them). NOSCRIPT (the
script did not run) loads the script and runs it again. Anything else (an interrupt
mid-reply) drops the connection and is raised, so no half-read reply is ever read by a
later call.
"""

from __future__ import annotations

import os
import threading
import weakref
from functools import partial

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

#: PING, as pack_command writes it.
PING = b"*1\r\n$4\r\nPING\r\n"
#: How many packed leading arguments DirectCalls keeps (one entry per model and priority
#: for routes, one per executor for stores); past it, it starts afresh.
HEADS_KEPT = 1024
#: What _pack packs first and cuts off again (one byte, no space).
PLACEHOLDER = b"-"
#: Past this many bytes redis-py sends a value as a chunk of its own, uncopied; _pack
#: leaves such values to it (redis.connection's buffer cutoff).
BUFFER_CUTOFF = 6000


class DirectCalls:
    """Connections to the Redis of `client`, each used by one call at a time: a call takes
    an idle one (or makes one) and gives it back after its reply, so there are as many
    as calls ever ran at once. close() closes them all."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._pool = client.connection_pool
        self._idle: list = []  # list.pop and list.append need no lock of their own
        self._made: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()  # guards _made
        self._pid = os.getpid()
        self._heads: dict[tuple, tuple[int, bytes]] = {}  # leading arguments, packed

    def script(
        self,
        script: Script,
        keys,
        args,
        *,
        once: bool = False,
        publishes: bool = False,
        same: int = 0,
        then: tuple | None = None,
    ):
        """EVALSHA the script; its reply, or its error raised as the client raises it.
        once: a connection error is raised, never sent again (the client's retries would
        run a script whose reply was lost a second time).
        publishes: the script publishes to a client that waits for it, which should hear
        first. Redis writes its replies last-queued-first at the end of each event loop
        round, so a PING sent just before the script (one write, two replies) queues this
        caller's reply ahead of the subscriber's: the subscriber is written to, and wakes,
        before this caller does.
        same: how many of the leading keys and args come back unchanged from call to call
        (a model's keys, say): they are packed once and kept (see _pack).
        then: a command sent in the same write after the script (a WAIT for replicas, on
        the same connection); the reply is then (the script's, then's)."""
        call = ("EVALSHA", script.sha, len(keys), *keys, *args)
        lead = 3 + same if same else 0
        if once:
            return self._call(
                call, lambda: self._loaded(script, call, then), once=True, lead=lead, then=then
            )
        if then is None:
            through = partial(script, keys=keys, args=args)
        else:
            through = partial(self._pipelined, script, keys, args, then)
        return self._call(call, through, ping=publishes, lead=lead, then=then)

    def command(self, *args, once: bool = False):
        """A command whose reply needs no parsing by redis-py (BLMOVE, ECHO, ...). once:
        as for script()."""
        return self._call(args, lambda: self.client.execute_command(*args), once=once)

    def close(self) -> None:
        with self._lock:
            made = list(self._made)
        self._idle = []
        for connection in made:
            connection.disconnect()

    def _loaded(self, script: Script, call: tuple, then: tuple | None):
        """After NOSCRIPT (it did not run): load the script, then run it once, here."""
        self.client.script_load(script.script)
        return self._call(call, None, once=True, then=then)

    def _pipelined(self, script: Script, keys, args, then: tuple) -> tuple:
        """script() with `then`, through the client: one redis-py pipeline."""
        with self.client.pipeline(transaction=False) as pipe:
            script(keys=keys, args=args, client=pipe)
            pipe.execute_command(*then)
            return tuple(pipe.execute())

    def _call(
        self,
        args: tuple,
        through_client,
        once: bool = False,
        ping: bool = False,
        lead: int = 0,
        then: tuple | None = None,
    ):
        """through_client: the same call made through the client (None: raise instead).
        ping: a PING goes first, in the same write (see script). lead: see _pack. then:
        see script."""
        connection = self._take()
        try:
            if not connection.is_connected:
                # connect(), not the first send's own connect: a Sentinel connection
                # asks the sentinels for the primary only in connect().
                connection.connect()
            packed = self._pack(connection, args, lead)
            if ping:  # in the same write, so Redis reads both in one event loop round
                packed[0] = PING + packed[0]
            if then is not None:
                packed.extend(connection.pack_command(*then))
            connection.send_packed_command(packed, check_health=False)
            if ping:
                connection.read_response()  # PONG
            try:
                reply = connection.read_response()
            except redis.ResponseError as e:  # the command's own error: read on, then raise
                reply = e
            if then is not None:
                reply = (reply, connection.read_response())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            connection.disconnect()
            if once:
                raise
            return through_client()
        except BaseException:
            connection.disconnect()  # interrupted mid-reply: never read the rest later
            raise
        self._idle.append(connection)
        error = reply[0] if then is not None else reply
        if isinstance(error, NoScriptError) and through_client is not None:
            return through_client()  # loads the script again
        if isinstance(error, redis.ResponseError):
            raise error
        return reply

    def _pack(self, connection, args: tuple, lead: int) -> list:
        """connection.pack_command(*args), with the first `lead` arguments packed once and
        kept, since packing runs cold on an idle path. The rest are packed here, as
        redis-py packs them, in one loop rather than its three functions per argument;
        any other type, or a value past redis-py's buffer cutoff (which it sends as a
        chunk of its own), goes through pack_command, after a placeholder (pack_command
        splits a first argument holding spaces), spliced in after the kept ones."""
        if not lead:
            return connection.pack_command(*args)
        head = args[:lead]
        key = (head, tuple(map(type, head)))  # 1 and 1.0 are equal, but pack apart
        kept = self._heads.get(key)
        if kept is None:  # (how many arguments they pack to, their bytes)
            count, body = b"".join(connection.pack_command(*head))[1:].split(b"\r\n", 1)
            kept = self._heads[key] = (int(count), body)
            if len(self._heads) > HEADS_KEPT:
                self._heads.clear()
        rest = len(args) - lead
        encoder = connection.encoder
        tail = []
        for value in args[lead:]:
            kind = type(value)  # exact types: bool, subclasses and the rest are redis-py's
            if kind is str:
                value = value.encode(encoder.encoding, encoder.encoding_errors)
            elif kind is int or kind is float:
                value = repr(value).encode()
            elif kind is not bytes:
                break
            if len(value) > BUFFER_CUTOFF:
                break
            tail.append(b"$%d\r\n%s\r\n" % (len(value), value))
        else:
            return [b"*%d\r\n%s%s" % (kept[0] + rest, kept[1], b"".join(tail))]
        packed = connection.pack_command(PLACEHOLDER, *args[lead:])
        cut = len(b"*%d\r\n$1\r\n%s\r\n" % (rest + 1, PLACEHOLDER))
        packed[0] = b"*%d\r\n%s%s" % (kept[0] + rest, kept[1], packed[0][cut:])
        return packed

    def _take(self):
        if self._pid != os.getpid():  # a forked child: the parent's connections are not its own
            self._idle, self._pid = [], os.getpid()
        try:
            return self._idle.pop()
        except IndexError:
            connection = self._pool.connection_class(**self._pool.connection_kwargs)
            with self._lock:
                self._made.add(connection)
            return connection

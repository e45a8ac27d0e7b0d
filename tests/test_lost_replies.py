"""A claim whose reply is lost on the way back is not run again: the executor's claims are
sent once, and the lost connection is raised (the executor then hands back all it holds
and registers again; test_faults covers that). Run again, a claim would take more tasks
and leave the first run's in flight with no one computing them.

The loss is real: a TCP proxy between the client and a real Redis passes the command on
and closes the client's connection instead of passing back Redis's reply.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest
import redis

from tandem.broker import keys, message
from tandem.broker.settings import Settings
from tandem.broker.table import Table

MODEL = "m:1"


class ReplyCutter:
    """A proxy to 127.0.0.1:port. Once armed, the next reply that comes back from Redis,
    on any connection, is dropped and that client's connection closed."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.cut = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError):  # the other side closed
            while data := source.recv(65536):
                if replies and self._take_cut():
                    break
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _take_cut(self) -> bool:
        with self._lock:
            if not self.armed.is_set():
                return False
            self.armed.clear()
            self.cut += 1
            return True

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def cutter(redis_server):
    proxy = ReplyCutter(redis_server.port)
    yield proxy
    proxy.close()


@pytest.fixture
def table(cutter) -> Table:
    client = redis.Redis(host="127.0.0.1", port=cutter.port)
    yield Table(client, Settings(result_expires_s=60))
    client.close()


def route(table: Table, n: int) -> str:
    task_id, envelope = message.encode(MODEL, [n], queue=keys.l1(MODEL))
    table.route(MODEL, envelope)
    return task_id


def register(table: Table, executor_id: str, max_wait_ms: float = 0.0) -> None:
    table.register(
        executor_id, MODEL, worker="w", max_batch=2, ttl_ms=60_000, max_wait_ms=max_wait_ms, pid=1
    )


CLAIMS = {
    "claim_or_idle": lambda table: table.claim_or_idle("a", MODEL, 2),
    "claim": lambda table: table.claim("a", MODEL, 2),
    "begin": lambda table: table.begin("a", MODEL, room=2, taken=0),
}


@pytest.mark.parametrize("step", sorted(CLAIMS))
def test_a_claim_whose_reply_is_lost_is_raised_not_run_again(step, table, cutter, r):
    register(table, "a")  # WORKING: every task routed now waits in L1
    for n in range(6):
        route(table, n)
    assert table.l1_depth(MODEL) == 6
    r.script_load(getattr(table.scripts, step).script)  # so the cut reply is the claim's
    cutter.armed.set()
    with pytest.raises(redis.ConnectionError):
        CLAIMS[step](table)
    assert cutter.cut == 1
    assert r.llen(keys.inflight("a")) == 2  # the one run's claim, held for a reclaim
    assert table.l1_depth(MODEL) == 4  # and no second run took more
    assert len(CLAIMS[step](table)) == 2  # the next call, on a new connection


def test_a_wait_on_l2_whose_reply_is_lost_is_raised_not_run_again(table, cutter, r):
    register(table, "a")
    assert table.claim_or_idle("a", MODEL, 2) is None  # IDLE: the next task goes to its L2
    first, second = route(table, 1), route(table, 2)
    assert r.llen(keys.l2("a")) == 1 and table.l1_depth(MODEL) == 1  # WORKING after one
    cutter.armed.set()
    with pytest.raises(redis.ConnectionError):
        table.wait_l2("a", 1.0)
    assert cutter.cut == 1
    (held,) = r.lrange(keys.inflight("a"), 0, -1)
    assert first.encode() in held and not r.llen(keys.l2("a"))
    assert table.l1_depth(MODEL) == 1 and second  # a second BLMOVE would have waited

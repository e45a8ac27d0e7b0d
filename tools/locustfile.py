"""Locust users for `tandem bench --profile http`: the closed loop on the gateway.

Each user sends OIP infer requests of one item back to back on a keep-alive connection
(FastHttpUser). After TANDEM_BENCH_REQUESTS requests in all no more are sent, and the
run quits once they are answered. Run by tools/httpbench.py as
`python -m locust -f tools/locustfile.py --headless --json ...`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import gevent
from locust import FastHttpUser, constant, events, task
from locust.exception import StopUser

REQUESTS = int(os.environ.get("TANDEM_BENCH_REQUESTS", "1000"))
PATH = os.environ.get("TANDEM_BENCH_PATH", "/v2/models/sim/versions/1/infer")
BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1]}]})
sent = answered = 0
_environment: Any = None  # Locust's Environment, once it is made


@events.request.add_listener
def _answered(**_kw) -> None:
    global answered
    answered += 1
    if answered == REQUESTS:
        gevent.spawn(_environment.runner.quit)  # not from the user's own greenlet


@events.init.add_listener
def _init(environment, **_kw) -> None:
    global _environment
    _environment = environment


class Infer(FastHttpUser):
    wait_time = constant(0)

    @task
    def infer(self) -> None:
        global sent
        if sent >= REQUESTS:
            raise StopUser()
        sent += 1
        self.client.post(PATH, data=BODY, headers={"Content-Type": "application/json"})

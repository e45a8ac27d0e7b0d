"""The executor table in Redis: every executor's model, state, capacity and heartbeat,
and the atomic scripts (broker/scripts) that change it.

One class per caller, over one script runner (broker/runner.py: the scripts, the direct
calls, the fault points and the replica fence): Routes for producers (broker/routes.py),
Steps for executors (broker/steps.py), Upkeep and Demands for the coordinator
(broker/upkeep.py, broker/demand.py); Reads (broker/readmodel.py) and Revocations
(broker/revocations.py) for everyone. A Table is all of them, for the processes that
play several roles on one client.
"""

from __future__ import annotations

from tandem.broker.demand import Demands
from tandem.broker.readmodel import Reads
from tandem.broker.revocations import Revocations
from tandem.broker.routes import ROUTE_CHUNK, Routes, routed_reply
from tandem.broker.runner import convert_error
from tandem.broker.steps import Steps
from tandem.broker.upkeep import Upkeep

__all__ = [
    "ROUTE_CHUNK",
    "Table",
    "convert_error",
    "routed_reply",
]


class Table(Routes, Steps, Upkeep, Demands, Reads, Revocations):
    """The executor table, bound to one Redis client: every role's calls and reads."""

"""A worker pod's deletion cost (coordinator/podcost.py): what its executors hold, read
from a real Redis, and the merge patches the coordinator sends the API server, here a
local HTTP server standing in for it (no cluster runs where the tests run)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import wait_until
from tandem.broker.state import ExecutorInfo, State
from tandem.broker.table import Table
from tandem.coordinator import podcost
from tandem.coordinator.podcost import ANNOTATION, Cluster, PodCosts, costs, pod_of
from tandem.coordinator.service import Coordinator
from tandem.producers.client import Client


class API:
    """Records each PATCH; answers 404 for the pods in `gone`."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict, dict]] = []
        self.gone: set[str] = set()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_PATCH(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                pod = self.path.rsplit("/", 1)[1]
                api.patches.append((self.path, dict(self.headers), body))
                self.send_response(404 if pod in api.gone else 200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def cluster(self, tmp_path) -> Cluster:
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        return Cluster(f"http://127.0.0.1:{self.server.server_port}", "serving", token, None)

    def costs(self) -> dict[str, str]:
        return {
            path.rsplit("/", 1)[1]: body["metadata"]["annotations"][ANNOTATION]
            for path, _, body in self.patches
        }


@pytest.fixture
def api():
    stand_in = API()
    yield stand_in
    stand_in.server.shutdown()


def register(table: Table, executor_id: str, worker: str) -> None:
    table.register(
        executor_id, "sim:1", worker=worker, max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1
    )


def test_a_pod_costs_what_its_executors_hold_and_the_idle_pod_nothing(r, settings):
    table = Table(r, settings)
    register(table, "busy/sim:1/a", "sim.1-7@worker-busy")
    register(table, "busy/sim:1/b", "sim.1-8@worker-busy")  # two workers in one pod
    register(table, "idle/sim:1/c", "sim.1-9@worker-idle")
    table.set_state("idle/sim:1/c", "sim:1", State.IDLE)
    with Client(settings=settings) as client:
        client.submit_many("sim:1", [[n] for n in range(6)])  # all to L1: none is ready
    assert len(table.claim("busy/sim:1/a", "sim:1", 4)) == 4
    assert len(table.claim("busy/sim:1/b", "sim:1", 4)) == 2
    # 6 tasks held: cost 3 (6's bit length), where the idle pod costs 0.
    assert costs(table.executors("sim:1")) == {"worker-busy": 3, "worker-idle": 0}


def test_each_pod_is_patched_once_per_change_as_its_account(api, tmp_path, monkeypatch):
    def executor(worker: str, state: str, held: int) -> ExecutorInfo:
        return ExecutorInfo(
            id=worker, model="sim:1", worker=worker, state=state, room=0, max_batch=4,
            expires_ms=0, batches=0, tasks=0, l2_depth=0, inflight_depth=held,
        )  # fmt: skip

    pods = PodCosts(api.cluster(tmp_path))
    fleet = [executor("w@pod-a", "WORKING", 0), executor("w@pod-b", "IDLE", 0)]
    assert pods.update(costs(fleet)) == 2
    assert api.costs() == {"pod-a": "1", "pod-b": "0"}  # computing: at least 1
    path, headers, _ = api.patches[0]
    assert path == "/api/v1/namespaces/serving/pods/pod-a"
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert pods.update(costs(fleet)) == 0  # nothing changed: nothing sent
    fleet[1] = executor("w@pod-b", "WORKING", 9)
    assert pods.update(costs(fleet)) == 0  # changed, but set under MIN_INTERVAL_S ago
    monkeypatch.setattr(podcost, "MIN_INTERVAL_S", 0.0)
    assert pods.update(costs(fleet)) == 1 and api.costs()["pod-b"] == "4"  # 9: 4 bits
    fleet[1] = executor("w@pod-b", "WORKING", 12)
    assert pods.update(costs(fleet)) == 0  # 12 holds as many bits as 9: no patch
    api.gone.add("pod-c")  # a pod the API does not know: logged, tried again later
    assert pods.update(costs([*fleet, executor("w@pod-c", "IDLE", 0)])) == 0
    assert pods.update(costs([*fleet, executor("w@pod-c", "IDLE", 0)])) == 0
    assert [p for p, _, _ in api.patches].count("/api/v1/namespaces/serving/pods/pod-c") == 2


def test_the_coordinator_sets_the_costs_as_it_measures_the_fleet(r, settings, api, tmp_path):
    table = Table(r, settings)
    register(table, "a/sim:1/1", "sim.1-1@pod-a")
    with Client(settings=settings) as client:
        client.submit_many("sim:1", [[1], [2]])
    table.claim("a/sim:1/1", "sim:1", 4)
    coordinator = Coordinator(settings.replace(pod_deletion_cost=True), client=r)
    assert coordinator.pod_costs is None  # not in a cluster: nothing to patch
    coordinator.pod_costs = PodCosts(api.cluster(tmp_path))
    coordinator.scale()  # hands the fleet to the patching thread
    wait_until(lambda: api.costs() == {"pod-a": "2"}, 10, "pod-a's cost: 2 tasks held")


@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.text(max_size=20), st.from_regex(r"sim-[0-9]@[a-z0-9-]{0,12}", fullmatch=True)
            ),
            st.sampled_from(["IDLE", "WAITING", "WORKING", "STOPPING", ""]),
            st.integers(0, 10_000),
            st.integers(0, 10_000),
        ),
        max_size=20,
    )
)
def test_any_fleet_costs_what_it_holds(rows):
    """Any node names and depths: a pod's cost orders what it holds, and only a name
    Kubernetes could give a pod becomes one (it goes into the API's path)."""
    fleet = [
        ExecutorInfo(
            id=str(n),
            model="m:1",
            worker=worker,
            state=state,
            room=0,
            max_batch=1,
            expires_ms=0,
            batches=0,
            tasks=0,
            l2_depth=l2,
            inflight_depth=inflight,
        )  # fmt: skip
        for n, (worker, state, l2, inflight) in enumerate(rows)
    ]
    found = costs(fleet)
    pods: dict[str, int] = {}
    for e in fleet:
        if pod := pod_of(e.worker):
            pods[pod] = pods.get(pod, 0) + max(e.l2_depth + e.inflight_depth, e.state == "WORKING")
    assert set(found) == set(pods)
    assert all(podcost.POD_NAME.fullmatch(pod) and "/" not in pod for pod in found)
    for pod, held in pods.items():  # 0 only when it holds nothing; more held, never less
        assert found[pod] == 0 if held == 0 else 2 ** (found[pod] - 1) <= held < 2 ** found[pod]

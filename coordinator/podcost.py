"""Which worker a Kubernetes scale-in stops: each worker pod's
`controller.kubernetes.io/pod-deletion-cost` annotation, set by the coordinator from what
the pod's executors hold, so the ReplicaSet deletes the idlest worker first (Kubernetes
1.22 and later honour it). A worker with nothing in hand costs 0; one holding n tasks
costs n's bit length (1 for 1, 4 for 8 to 15), so the cost keeps the order of what pods
hold but changes far less often than their counts do.

A worker's pod is the host of its Celery node name (MODEL-PID@<host>): a pod's hostname is
its name. A thread of the coordinator patches pods through the API server as its service
account (compose/k8s: a Role that may get and patch pods), only when a pod's cost
changed, and at most once per pod every MIN_INTERVAL_S, so a slow API server never holds
up the coordinator's loop. Off unless TANDEM_POD_DELETION_COST is set, and then only
inside a cluster.
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from tandem.broker.state import ExecutorInfo

log = logging.getLogger("tandem.coordinator")

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: Where a pod finds its service account's token, CA and namespace.
ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The least time between two patches of one pod (s): a cost moves with every batch.
MIN_INTERVAL_S = 5.0
#: How long one patch may take before it counts as failed (s).
TIMEOUT_S = 5.0
#: A pod's name: a DNS subdomain (RFC 1123), as Kubernetes requires.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
POD_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")


def pod_of(worker: str) -> str | None:
    """The pod of a worker's node name: its host, if that can name a pod (a DNS
    subdomain); None if not. It goes into an API path, and Redis is anyone's to write."""
    host = worker.rpartition("@")[2]
    return host if POD_NAME.fullmatch(host) else None


def costs(executors: Iterable[ExecutorInfo]) -> dict[str, int]:
    """Each worker pod's deletion cost: the bit length of the tasks its live executors
    hold (L2 and in-flight; at least one while one of them computes)."""
    out: dict[str, int] = {}
    for e in executors:
        pod = pod_of(e.worker)
        if pod is None:
            continue
        held = e.l2_depth + e.inflight_depth
        if e.state == "WORKING":
            held = max(held, 1)
        out[pod] = out.get(pod, 0) + held
    return {pod: held.bit_length() for pod, held in out.items()}


class Cluster:
    """The API server, as this pod's service account (or as told, for tests)."""

    def __init__(self, url: str, namespace: str, token_file: Path, ca_file: Path | None) -> None:
        self.url, self.namespace, self.token_file = url.rstrip("/"), namespace, token_file
        self.tls = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None

    @classmethod
    def in_cluster(cls) -> Cluster | None:
        """The cluster this process runs in, or None outside one."""
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        if not host or not (ACCOUNT / "token").exists():
            return None
        namespace = (ACCOUNT / "namespace").read_text().strip()
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", namespace, ACCOUNT / "token", ACCOUNT / "ca.crt")

    def annotate(self, pod: str, value: str) -> None:
        """Set one annotation of a pod (a JSON merge patch)."""
        body = json.dumps({"metadata": {"annotations": {ANNOTATION: value}}}).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/namespaces/{self.namespace}/pods/{pod}",
            data=body,
            method="PATCH",
            headers={
                "Authorization": f"Bearer {self.token_file.read_text().strip()}",
                "Content-Type": "application/merge-patch+json",
            },
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.tls):
            pass


class PodCosts:
    """Keeps each worker pod's annotation at its cost."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._set: dict[str, tuple[int, float]] = {}  # pod -> (cost, when set)
        self._latest: dict[str, int] | None = None
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def offer(self, executors: Iterable[ExecutorInfo]) -> None:
        """The fleet as measured now, for the patching thread (started on the first
        call): it takes the latest offer and drops any it had not got to."""
        found = costs(executors)
        with self._changed:
            self._latest = found
            self._changed.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod costs", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._latest is not None)
                found, self._latest = self._latest or {}, None
            try:
                self.update(found)
            except Exception:  # noqa: BLE001 - a bug here never stops the coordinator
                log.exception("setting the pods' deletion costs failed")

    def update(self, found: dict[str, int]) -> int:
        """Patch each pod whose cost changed (not more often than MIN_INTERVAL_S); returns
        how many. A pod the API refuses (gone, not a pod of this namespace) is logged."""
        now, patched = time.monotonic(), 0
        for pod, cost in found.items():
            last = self._set.get(pod)
            if last is not None and (last[0] == cost or now - last[1] < MIN_INTERVAL_S):
                continue
            try:
                self.cluster.annotate(pod, str(cost))
            except (urllib.error.URLError, OSError) as e:
                log.warning("could not set %s of pod %s: %s", ANNOTATION, pod, e)
                self._set[pod] = (-1, now)  # tried: again after the interval
                continue
            self._set[pod] = (cost, now)
            patched += 1
        for pod in set(self._set) - set(found):
            del self._set[pod]
        return patched

"""The dashboard's coordinator panels drawn from live scrapes, for when no Grafana is at hand.

`python -m tandem.tools.dashboard docs/dashboard.png` starts a local stack (an embedded Redis,
a coordinator serving /metrics, 2 workers serving sim and tiny), drives a load in phases
(a low rate, a burst, bad inputs), scrapes /metrics twice a second and draws the panels of
compose/grafana/dashboards/tandem.json, computed as Prometheus computes them (rates of
counters, histogram_quantile over bucket increases). Needs the [bench] extra (matplotlib).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from tandem.broker.extras import require
from tandem.broker.settings import load_settings
from tandem.producers.client import Client
from tandem.server import free_port
from tandem.stack import Stack

#: (seconds, tasks/s to sim:1, tasks/s of bad inputs to tiny:1)
PHASES = ((8.0, 20.0, 0.0), (8.0, 800.0, 0.0), (8.0, 40.0, 10.0))
WINDOW_S = 3.0  # the rate and quantile window of the plot (Grafana's is [1m]/[5m])

Sample = dict[tuple[str, tuple], float]


def scrape(url: str) -> Sample:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def pick(sample: Sample, name: str, by: str) -> dict[str, float]:
    """sum by (by) (name), from one scrape."""
    out: dict[str, float] = defaultdict(float)
    for (metric, labels), value in sample.items():
        if metric == name:
            out[" ".join(v for k, v in labels if k in by.split(","))] += value
    return dict(out)


def rate(old: Sample, new: Sample, dt: float, name: str, by: str) -> dict[str, float]:
    before = pick(old, name, by)
    return {k: (v - before.get(k, 0.0)) / dt for k, v in pick(new, name, by).items()}


def quantile(old: Sample, new: Sample, name: str, phi: float) -> float | None:
    """histogram_quantile(phi, increase of name_bucket), summed over every label but le."""
    increase: dict[float, float] = defaultdict(float)
    for (metric, labels), value in new.items():
        if metric == f"{name}_bucket":
            le = float(dict(labels)["le"])
            increase[le] += value - old.get((metric, labels), 0.0)
    bounds = sorted(increase)
    if not bounds or increase[bounds[-1]] <= 0:
        return None
    rank, low, below = phi * increase[bounds[-1]], 0.0, 0.0
    for bound in bounds:
        if increase[bound] >= rank:
            if bound == float("inf"):
                return low
            inside = increase[bound] - below
            return low + (bound - low) * ((rank - below) / inside if inside else 1.0)
        low, below = bound, increase[bound]
    return low


def panels(scrapes: list[tuple[float, Sample]]) -> dict[str, dict[str, list]]:
    """Each panel's series: {panel title: {legend: [(t, value), ...]}}."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    t0 = scrapes[0][0]
    for t, sample in scrapes:
        back = next((s for s in scrapes if s[0] >= t - WINDOW_S), scrapes[0])
        dt, x = max(t - back[0], 1e-9), t - t0
        for key, v in pick(sample, "tandem_l1_depth", "model").items():
            out["L1 depth"][key].append((x, v))
        for key, v in pick(sample, "tandem_executors", "state").items():
            out["Executors by state"][key].append((x, v))
        if back[0] >= t:  # the first scrape: no window yet
            continue
        for key, v in rate(back[1], sample, dt, "tandem_tasks_routed_total", "route").items():
            out["Route mix (tasks/s)"][key].append((x, v))
        for key, v in rate(back[1], sample, dt, "tandem_task_failures_total", "reason").items():
            out["Failures by reason (tasks/s)"][key].append((x, v))
        for panel, name, phis in (
            ("Batch size", "tandem_batch_size", (0.5, 0.95)),
            ("Latency, submit to result (ms)", "tandem_latency_ms", (0.5, 0.95, 0.99)),
        ):
            for phi in phis:
                value = quantile(back[1], sample, name, phi)
                if value is not None:
                    out[panel][f"p{round(phi * 100)}"].append((x, value))
    return out


def drive(client: Client, phases=PHASES) -> None:
    """Open-loop load: each phase sends its rates for its seconds."""
    for seconds, good, bad in phases:
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            step = time.monotonic()
            client.submit_many("sim:1", [[n + i] for i in range(max(1, int(good / 20)))])
            if bad and n % max(1, int(good / bad)) == 0:
                client.submit("tiny:1", [1.0])  # tiny wants 8 numbers: BadInput
            n += 1
            time.sleep(max(0.0, 0.05 - (time.monotonic() - step)))  # pacing, 20 steps/s


def record(url: str, stop: threading.Event, every_s: float = 0.5) -> list[tuple[float, Sample]]:
    scrapes = []
    while not stop.wait(every_s):
        scrapes.append((time.monotonic(), scrape(url)))
    return scrapes


def draw(series: dict[str, dict[str, list]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = list(series)
    fig, axes = plt.subplots(3, 2, figsize=(12, 9), squeeze=False)
    for ax, title in zip(axes.flat, titles, strict=False):
        for legend, points in sorted(series[title].items()):
            ax.plot([p[0] for p in points], [p[1] for p in points], label=legend or "all")
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.legend(fontsize="small")
    fig.suptitle("tandem dashboard: the coordinator's /metrics under a low, a burst, a bad load")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(path: str, phases=PHASES) -> dict[str, dict[str, list]]:
    require("bench", "the dashboard plot")
    port = free_port()
    settings = load_settings(models=("sim:1", "tiny:1"), metrics_port=port)
    with tempfile.TemporaryDirectory() as folder, Stack(settings, data_dir=folder) as stack:
        url = f"http://127.0.0.1:{port}/metrics"
        stop, scrapes = threading.Event(), []
        recorder = threading.Thread(target=lambda: scrapes.extend(record(url, stop)))
        recorder.start()
        with Client(settings=stack.settings) as client:
            try:
                drive(client, phases)
                time.sleep(2 * WINDOW_S)  # the tail of the last phase, as a dashboard shows it
            finally:
                stop.set()
                recorder.join()
    series = panels(scrapes)
    draw(series, path)
    return series


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="where to write the PNG")
    main(parser.parse_args().path)

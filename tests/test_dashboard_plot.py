"""The dashboard plot's arithmetic, which must match Prometheus's (pure logic, no Redis)."""

from __future__ import annotations

import pytest

from tandem.tools import dashboard


def buckets(name: str, counts: dict[float, float], **labels) -> dict:
    """Cumulative bucket samples, as a scrape holds them."""
    return {
        (f"{name}_bucket", tuple(sorted({**labels, "le": str(le)}.items()))): value
        for le, value in counts.items()
    }


def test_quantile_interpolates_inside_a_bucket_as_prometheus_does():
    old = buckets("h", {1.0: 0, 2.0: 0, 4.0: 0, float("inf"): 0}, model="a")
    # 10 observations: 2 at most 1, 6 more at most 2, 2 more at most 4.
    new = buckets("h", {1.0: 2, 2.0: 8, 4.0: 10, float("inf"): 10}, model="a")
    assert dashboard.quantile(old, new, "h", 0.5) == pytest.approx(1.5)  # rank 5 of 2..8
    assert dashboard.quantile(old, new, "h", 0.9) == pytest.approx(3.0)  # rank 9 of 8..10
    assert dashboard.quantile(old, new, "h", 0.1) == pytest.approx(0.5)  # from 0 to 1
    assert dashboard.quantile(new, new, "h", 0.5) is None  # nothing observed in between


def test_quantile_sums_every_label_but_le_and_stops_at_the_last_finite_bound():
    old = {**buckets("h", {1.0: 0, float("inf"): 0}, model="a")}
    new = {
        **buckets("h", {1.0: 1, float("inf"): 4}, model="a"),
        **buckets("h", {1.0: 1, float("inf"): 2}, model="b"),
    }
    assert dashboard.quantile(old, new, "h", 0.2) == pytest.approx(0.6)
    assert dashboard.quantile(old, new, "h", 0.99) == 1.0  # in +Inf: the last finite bound


def test_rates_and_panels_from_scrapes(tmp_path):
    def scrape(routed_l1: float, l1: float) -> dict:
        return {
            ("tandem_tasks_routed_total", (("model", "sim:1"), ("route", "L1"))): routed_l1,
            ("tandem_l1_depth", (("model", "sim:1"),)): l1,
            ("tandem_executors", (("model", "sim:1"), ("state", "IDLE"))): 2,
        }

    scrapes = [(100.0, scrape(0, 0)), (101.0, scrape(50, 7)), (102.0, scrape(150, 3))]
    series = dashboard.panels(scrapes)
    assert series["L1 depth"]["sim:1"] == [(0.0, 0), (1.0, 7), (2.0, 3)]
    assert series["Route mix (tasks/s)"]["L1"] == [(1.0, 50.0), (2.0, 75.0)]  # 3 s window
    assert series["Executors by state"]["IDLE"][-1] == (2.0, 2)
    dashboard.draw(series, str(tmp_path / "d.png"))
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

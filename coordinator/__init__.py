"""The coordinator: hands L1 tasks to ready executors, reclaims dead ones, buries poison,
relays state changes, and serves Prometheus metrics."""

"""The protocol layer: key layout, atomic scripts, messages, results, settings, the
executor table and the Celery app. Producers, workers and the coordinator stand on it."""

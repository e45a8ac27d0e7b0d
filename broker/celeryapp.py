"""The Celery app for Celery's own command line, on the Redis every tandem command finds:

    celery -A tandem.broker.celeryapp flower          # Flower on the stack's Redis
    celery -A tandem.broker.celeryapp inspect active

Its Redis is TANDEM_REDIS_URL, else the `tandem up` running in the current folder (its
.tandem/stack.json), else localhost, as for every tandem command (broker/discovery.py);
Celery's own `--broker URL` overrides it. So Flower and `celery inspect` never need a
second copy of the URL (compose/k8s/tandem.env sets it for every service).
"""

from __future__ import annotations

from tandem.broker.app import make_app
from tandem.broker.discovery import stack_url
from tandem.broker.settings import load_settings

app = make_app(load_settings(fallback_url=stack_url))

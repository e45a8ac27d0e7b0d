"""The Celery app for Celery's own command line, built from the TANDEM_* environment:

    celery -A tandem.broker.celeryapp flower          # Flower on TANDEM_REDIS_URL
    celery -A tandem.broker.celeryapp inspect active

So Flower and `celery inspect` take the Redis URL from the same settings as every tandem
process (compose/tandem.env), never a second copy of it.
"""

from __future__ import annotations

from tandem.broker.app import make_app
from tandem.broker.settings import load_settings

app = make_app(load_settings())

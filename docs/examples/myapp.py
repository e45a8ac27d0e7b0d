"""An ordinary Celery app beside tandem: the next steps of a chain or a chord.

Run its worker from the folder where `tandem up` runs (or with TANDEM_REDIS_URL set):

    PYTHONPATH=docs/examples celery -A myapp worker -Q celery

Its task_routes send `tandem.infer` to the first-level queue of the model it names, so
callers need no `queue=` on each signature.
"""

from __future__ import annotations

from celery import Celery

from tandem.broker.app import route_infer
from tandem.broker.discovery import redis_url

url = redis_url()  # TANDEM_REDIS_URL, else the `tandem up` in this folder, else localhost
app = Celery("myapp", broker=url, backend=url)
# tandem.infer to its model's L1 queue (tandem.l1.NAME.VERSION); the rest to "celery".
app.conf.task_routes = (route_infer,)


@app.task(name="myapp.total")
def total(values):
    """The sum of a result: a list of numbers (a chain's step), or of a chord's results."""
    return sum(values)

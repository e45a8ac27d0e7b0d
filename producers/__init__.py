"""tandem's producer side: submit inference tasks and get their results."""

from tandem.producers.client import Client, TandemResult

__all__ = ["Client", "TandemResult"]

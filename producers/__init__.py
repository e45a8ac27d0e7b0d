"""tandem's producer side: submit inference tasks and get their results."""

from producers.client import Client, TandemResult

__all__ = ["Client", "TandemResult"]

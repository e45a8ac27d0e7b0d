"""The one error tree. Every error tandem raises on purpose is a TandemError."""

from __future__ import annotations

from collections.abc import Sequence


class TandemError(Exception):
    """Root of every error tandem raises on purpose."""

    #: A burst cut short (Table.route_many): the route replies of the messages enqueued
    #: before the error, in order.
    routed: Sequence = ()
    #: Client.submit_many: the results of the tasks enqueued before, or besides, the error.
    accepted: Sequence = ()


class BadArgument(TandemError, ValueError):
    """A caller's argument is malformed or out of range: a model name that is not
    NAME:VERSION, a priority outside 0-9. Also a ValueError, as it was before."""


class UnknownModel(TandemError):
    """No worker has registered this model version."""


class BadInput(TandemError):
    """A task's message or inputs are malformed or violate the model's spec."""


class QueueFull(TandemError):
    """The model's first-level queue is at its `max_queue` bound."""


class DeadlineExceeded(TandemError):
    """The task expired, or would have finished after its deadline, before an executor
    computed it; it never computed."""


class Overloaded(TandemError):
    """Refused at submit: the predicted wait in L1 already passes the task's deadline, or
    no executor of its model is live to compute it at all.

    `wait_s` is the predicted time to the task's result (infinite with no live executor),
    `deadline_s` the time it had left, `ahead` the tasks that waited before it. Nothing
    was enqueued."""

    def __init__(self, message: str, *, wait_s: float, deadline_s: float, ahead: int) -> None:
        super().__init__(message)
        self.wait_s = wait_s
        self.deadline_s = deadline_s
        self.ahead = ahead


class Revoked(TandemError):
    """The task was revoked before it computed; its result is Celery's REVOKED."""


class BrokerUnavailable(TandemError):
    """Redis could not be reached."""


class NotReplicated(BrokerUnavailable):
    """A submit's tasks reached the primary but not min_replicas replicas in time, so a
    failover could lose them: the submit is not acknowledged."""

    @classmethod
    def of(cls, acked: int, wanted: int, timeout_ms: int) -> NotReplicated:
        return cls(
            f"{acked} of {wanted} replica(s) acknowledged within {timeout_ms} ms: the "
            "primary took the tasks, but a failover now could lose them; submit again, "
            "or wait for the replicas"
        )


class ModelError(TandemError):
    """The model raised while computing this task."""

    #: The model's own traceback, formatted, kept for the task's FAILURE result.
    traceback: str | None = None


class ModelLoadError(TandemError):
    """A model in the repository cannot be loaded; the message names the file."""

    #: The optional extra whose absence is the whole cause, if that is it: the model is
    #: not broken, this install lacks what it needs.
    extra: str | None = None


class ProcessExited(TandemError):
    """A process tandem started (a worker, the coordinator) exited; the message has its log."""


class MissingExtra(TandemError):
    """A command needs an optional extra that is not installed; the message says how to."""

    #: The extra's name.
    extra: str | None = None


class BadSetting(TandemError, ValueError):
    """A setting is out of range; the message names it and its allowed values."""


class ExecutorGone(TandemError):
    """The coordinator reclaimed this executor; it must register again."""


class PoisonMessage(TandemError):
    """A task took down its executor too many times; it is quarantined in the dead letters."""


class ExecutorCrashed(TandemError):
    """An executor's own thread failed (its returner, a bug); it restarts in place."""


def one_line(error: BaseException) -> str:
    """An error as one line, `Type: message`; of a multi-line message (a TorchScript
    traceback, say) the last line, which names what went wrong."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    return f"{type(error).__name__}: {lines[-1]}" if lines else type(error).__name__

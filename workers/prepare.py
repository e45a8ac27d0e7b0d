"""The prepare stage, on the executor thread: decode each claimed message, check it (its
model, its deadline, a revocation) and validate its inputs. A bad task gets its error
set; nothing is raised, so one bad message never stops a batch."""

from __future__ import annotations

from datetime import datetime, timezone

from tandem.broker import message
from tandem.broker.errors import BadInput, Revoked, TandemError, UnknownModel
from tandem.broker.table import Table
from tandem.workers.models import Model


class Preparer:
    def __init__(self, model_ref: str, model: Model, table: Table, max_bytes: int) -> None:
        self.model_ref = model_ref
        self.model = model
        self.table = table
        self.max_bytes = max_bytes

    def prepare(self, raws: list[bytes], *, revocations: bool) -> list[message.Task]:
        """Decode and check each message. With revocations (Redis may hold revoke
        records), a revoked one gets Revoked and is never computed."""
        now = datetime.now(timezone.utc)
        tasks = [message.decode(raw, max_bytes=self.max_bytes) for raw in raws]
        revoked = self.table.revoked([t.id for t in tasks if t.id]) if revocations else ()
        for task in tasks:
            if task.id in revoked:
                task.error = Revoked(f"task {task.id} was revoked")
            self._check(task, now)
        return tasks

    def recheck(self, tasks: list[message.Task], *, revocations: bool) -> list[message.Task]:
        """Tasks prepared while the last batch computed, checked again as it starts: a
        revoke or a deadline may have come meanwhile."""
        now = datetime.now(timezone.utc)
        ids = [t.id for t in tasks if t.error is None and t.id]
        revoked = self.table.revoked(ids) if revocations and ids else ()
        for task in tasks:
            if task.error is None and task.id in revoked:
                task.error = Revoked(f"task {task.id} was revoked")
            task.check_deadline(now)
        return tasks

    def _check(self, task: message.Task, now: datetime) -> None:
        if task.error is None and task.model != self.model_ref:
            task.error = UnknownModel(
                f"task asks for model {task.model!r} but queue serves {self.model_ref!r}"
            )
        task.check_deadline(now)
        if task.error is None:
            try:
                task.inputs = self.model.validate(task.inputs)
            except TandemError as e:
                task.error = e
            except Exception as e:  # noqa: BLE001 - a validator bug fails the task, not the executor
                task.error = BadInput(f"inputs rejected: {type(e).__name__}: {e}")

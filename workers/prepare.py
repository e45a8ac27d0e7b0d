"""The prepare stage, on the executor thread: claim a batch's messages, decode each, check
it (its model, its deadline, a revocation) and validate its inputs. A bad task gets its
error set; nothing is raised, so one bad message never stops a batch. With the pipeline
on, the next batch is claimed and prepared early, while the last one computes."""

from __future__ import annotations

from datetime import datetime, timezone

from tandem.broker import message
from tandem.broker.errors import BadInput, Revoked, TandemError, UnknownModel
from tandem.broker.table import Table
from tandem.workers.models import Model


class Early(list):
    """Messages claimed while the previous batch computed, with their prepared tasks."""

    def __init__(self, raw: list[bytes], tasks: list[message.Task]) -> None:
        super().__init__(raw)
        self.tasks = tasks


class Preparer:
    def __init__(
        self,
        executor_id: str,
        model_ref: str,
        model: Model,
        table: Table,
        max_batch: int,
        max_bytes: int,
    ) -> None:
        self.executor_id = executor_id
        self.model_ref = model_ref
        self.model = model
        self.table = table
        self.max_batch = max_batch
        self.max_bytes = max_bytes

    def batch(self, batch: list[bytes], *, revocations: bool) -> list[message.Task]:
        """The tasks of the batch in hand, prepared (or, if prepared early, checked
        again) and topped up from L1."""
        if isinstance(batch, Early):
            tasks = self.recheck(batch.tasks, revocations=revocations)
            return self._top_up(tasks, early=True, revocations=revocations)
        return self._top_up(
            self.prepare(batch, revocations=revocations), early=False, revocations=revocations
        )

    def early(self, *, revocations: bool) -> list[bytes]:
        """While a batch computes: claim up to max_batch from L1 (never a retry task, which
        computes alone) and prepare it. The executor stays WORKING."""
        claimed = self.table.claim(self.executor_id, self.model_ref, self.max_batch)
        return Early(claimed, self.prepare(claimed, revocations=revocations)) if claimed else []

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

    def _top_up(
        self, tasks: list[message.Task], *, early: bool, revocations: bool
    ) -> list[message.Task]:
        """Fill the batch from L1 up to max_batch: a batch prepared early takes what
        arrived while the last one computed; any batch refills the slots of tasks that
        failed before compute (expired, bad input). Never from the retry list."""
        ready = sum(task.error is None for task in tasks)
        while ready < self.max_batch and (early or len(tasks) > ready):
            more = self.table.claim(self.executor_id, self.model_ref, self.max_batch - ready)
            if not more:
                break
            checked = self.prepare(more, revocations=revocations)
            tasks = tasks + checked
            ready += sum(task.error is None for task in checked)
            early = False
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

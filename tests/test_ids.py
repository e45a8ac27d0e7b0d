"""Task ids and delivery tags (broker/ids.py): random UUIDs, never shared."""

import os
import threading
import uuid

from tandem.broker import ids


def test_new_uuid_is_a_random_uuid4_as_celery_writes_one():
    made = [ids.new_uuid() for _ in range(2000)]
    assert len(set(made)) == len(made)
    for text in made:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == text


def test_new_uuids_are_never_shared_across_threads_or_a_fork():
    """Ids are made in batches: threads take each once, and a forked child makes its own
    rather than take what its parent had made ahead."""
    ids.new_uuid()  # the parent holds a batch made ahead
    ahead = set(ids._uuids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first ids, then out
        os.write(write, "".join(ids.new_uuid() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert len(child) == 3 * 36 and not {child[i : i + 36] for i in (0, 36, 72)} & ahead
    taken: list[list[str]] = [[] for _ in range(4)]

    def take(mine: list[str]) -> None:
        mine.extend(ids.new_uuid() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(mine,)) for mine in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    made = [text for mine in taken for text in mine]
    assert len(set(made)) == len(made) == 8000

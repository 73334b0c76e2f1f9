"""What a full disk looks like from where it is met: the study's disk stops the study, any other fails as found."""

import errno

from trainables import errors
from trainables.errors import no_space, no_space_at


def test_a_full_disk_is_the_studys_only_where_its_path_or_its_places_room_says_so(tmp_path, monkeypatch):
    study = tmp_path / "storage"
    study.mkdir()
    mine = OSError(errno.ENOSPC, "No space left on device", str(study / "exp" / "checkpoint_000001"))
    assert no_space_at(mine, [study]) == no_space(mine)

    shm = OSError(errno.ENOSPC, "No space left on device", "/dev/shm/torch_1_2")  # a DataLoader worker's batch
    assert no_space(shm) is not None and no_space_at(shm, [study]) is None
    assert "/dev/shm" in shm.__notes__[0] and "--shm-size" in shm.__notes__[0]

    # No path named (torch's shared-memory RuntimeError, SQLite's "disk is full"): the places' free bytes decide.
    loader = RuntimeError("unable to write to file </torch_9_1_3>: No space left on device (28)")
    monkeypatch.setattr(errors, "FULL_BELOW", 0)  # every place has room
    assert no_space_at(loader, [study]) is None and "/dev/shm" in loader.__notes__[0]
    monkeypatch.setattr(errors, "FULL_BELOW", 2**62)  # the study's disk has less free than the write needed
    sqlite = RuntimeError("sqlite3.OperationalError: database or disk is full")
    assert no_space_at(sqlite, [study]) == "sqlite3.OperationalError: database or disk is full"
    assert no_space_at(ValueError("not a disk"), [study]) is None

"""The slot ring a pixel-form folder's workers read batches into: page-locked shared slots, taken by the batch
sampler and freed once the device has copied them."""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from trainables.data.crops import ReadBatch

__all__: list[str] = []


class _Slotted(list):
    """A batch's dataset positions, as a batch sampler yields them, with the ring slot its worker fills."""

    slot: int


class _Filled(NamedTuple):
    """What a worker hands over for a batch read into ring slot `slot` (or, when the batch outgrew the slots, its
    pixels in `spill`): small arrays, pickled by value rather than passed as shared-memory tensors."""

    slot: int
    lengths: np.ndarray
    labels: np.ndarray
    indices: np.ndarray
    order: np.ndarray
    spill: torch.Tensor | None


class _SlotRing:
    """Batch buffers in shared memory that DataLoader workers fill in place and the device copies from.

    Why: the default path copies a pixel batch four times (out of the file's mapping, into the batch, into shared
    memory on hand-over, into pinned memory in the training process), two of them in the training process, whose
    host work then slows the step (docs/benchmarks.md, the pixel form). Here a worker reads each image from the file
    into its slot (one copy), and on CUDA the slots are page-locked (registered with the driver once), so the GPU
    copies straight from them: nothing is copied in the training process.

    A slot holds a batch somewhat larger than the split's mean (SIZE_MARGIN, SIZE_SPREAD); a rarer batch that does
    not fit travels the default way (`_Filled.spill`). Slots are taken by the batch sampler as it hands out each batch
    (`acquire`) and given back by the consumer once the device's copy has finished (`release` with its event);
    a new pass over the data (an epoch: the DataLoader has drained the workers by then) reclaims the slots batches
    of an unfinished pass still held. Every method runs in the training process's loader thread.
    """

    # A slot fits a batch of the split's mean bytes x SIZE_MARGIN plus SIZE_SPREAD standard deviations of a batch's
    # bytes (or its largest batch, where smaller): a spill is then a tail event, and the slots stay near a mean batch.
    SIZE_MARGIN, SIZE_SPREAD = 1.10, 6.0

    def __init__(self, folder: Any, batch_size: int, slots: int, *, shared: bool, pin: bool) -> None:
        sizes = np.asarray(folder._split.nbytes(folder.indices), dtype=np.int64)
        b = min(batch_size, len(sizes))
        largest = int(np.sort(sizes)[::-1][:b].sum())
        usual = int(b * sizes.mean() * self.SIZE_MARGIN + self.SIZE_SPREAD * sizes.std() * math.sqrt(b))
        self.slot_bytes = -(-min(largest, usual) // 512) * 512
        if shared:  # workers fill the slots: shared memory, which a full /dev/shm would fault on (SIGBUS), not refuse
            _check_shared_memory(slots, self.slot_bytes)
            # Made private, then moved into shared memory (torch's public way): empty, as nothing reads what it holds.
            self.buffer = torch.empty(slots, self.slot_bytes, dtype=torch.uint8).share_memory_()
        else:
            self.buffer = torch.empty(slots, self.slot_bytes, dtype=torch.uint8)
        self._free = list(range(slots))[::-1]
        self._held: set[int] = set()
        self._copying: collections.deque[tuple[int, Any]] = collections.deque()  # copies that may still run
        self.pinned = pin and self._register()

    def _register(self) -> bool:
        cudart = torch.cuda.cudart()
        ptr, size = self.buffer.data_ptr(), self.buffer.numel()
        if int(cudart.cudaHostRegister(ptr, size, 0)) != 0:
            return False  # e.g. a locked-memory limit: copies from pageable memory, correct but synchronous
        import weakref

        # Not at the interpreter's exit: the process's memory goes with it, and CUDA may be torn down by then.
        weakref.finalize(self, _unregister, cudart, ptr, self._copying).atexit = False
        return True

    def acquire(self) -> int:
        while not self._free and self._copying and self._copying[0][1].query():
            self._free.append(self._copying.popleft()[0])
        if not self._free and self._copying:
            slot, event = self._copying.popleft()
            event.synchronize()  # a copy already issued: it finishes on its own
            self._free.append(slot)
        if not self._free:
            raise RuntimeError(f"all {len(self.buffer)} pixel batch slots are held by batches in flight")
        slot = self._free.pop()
        self._held.add(slot)
        return slot

    def release(self, slot: int, event: Any = None) -> None:
        self._held.discard(slot)
        if event is None:
            self._free.append(slot)
        else:
            self._copying.append((slot, event))

    def reclaim(self) -> None:
        self._free += sorted(self._held)
        self._held.clear()

    def batch(self, filled: _Filled) -> ReadBatch:
        """The batch a worker filled, its pixels a view of its slot (or its spill)."""
        flat = filled.spill
        if flat is None:
            flat = self.buffer[filled.slot, : int(filled.lengths.sum())]
        return ReadBatch(
            flat,
            *(torch.from_numpy(a) for a in (filled.lengths, filled.labels, filled.indices, filled.order)),
        )


def _unregister(cudart, ptr: int, copying) -> None:
    # The slots stop being page-locked once no copy from them can still be running.
    for _, event in copying:
        event.synchronize()
    cudart.cudaHostUnregister(ptr)


def _check_shared_memory(slots: int, slot_bytes: int, where: str = "/dev/shm") -> None:
    from trainables.errors import FULL_BELOW, TrialRefused, free_bytes

    need, free = slots * slot_bytes, free_bytes(where) if os.path.isdir(where) else None
    if free is not None and need + FULL_BELOW > free:
        raise TrialRefused(
            f"data.num_workers: the pixel form's loader needs {need / 2**30:.2f} GiB of shared memory ({slots} batch "
            f"slots of {slot_bytes / 2**20:.0f} MiB: 2 a worker and 2 more) and {where} has {free / 2**30:.2f} GiB "
            "free. Fix: give the machine or container more shared memory (docker run --shm-size, Ray's shm_size), "
            "or lower data.num_workers or data.batch_size."
        )


class _SlotSampler:
    """A batch sampler's batches, each with the ring slot its worker fills (taken here, in the loader's thread)."""

    def __init__(self, batch_sampler, ring: _SlotRing) -> None:
        self.batch_sampler, self.ring = batch_sampler, ring

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[_Slotted]:
        self.ring.reclaim()
        for positions in self.batch_sampler:
            batch = _Slotted(positions)
            batch.slot = self.ring.acquire()
            yield batch


class _SlotReader(Dataset):
    """Runs in the workers: reads a batch's images (laid out by size, as FolderPixels.collate) into its slot."""

    def __init__(self, folder: Any, buffer: torch.Tensor) -> None:
        self.folder, self.buffer = folder, buffer

    def __len__(self) -> int:
        return len(self.folder)

    def __getitems__(self, batch: _Slotted) -> _Filled:
        folder, split = self.folder, self.folder._split
        index = folder.indices[np.asarray(batch, dtype=np.int64)]
        shapes = split.shapes[index]
        order = np.lexsort((shapes[:, 1], shapes[:, 0]))  # by (height, width), stable: FolderPixels.collate's layout
        lengths = np.asarray(split.nbytes(index[order]), dtype=np.int64)
        labels, spill = folder._labels[index], None
        if lengths.sum() > self.buffer.shape[1]:
            spill = folder.collate([folder.read(int(i)) for i in batch], order.tolist()).flat
        else:
            out = self.buffer[batch.slot].numpy()
            at = 0
            for i, n in zip(index[order].tolist(), lengths.tolist()):
                split.read_into(i, out[at : at + n])
                at += n
        return _Filled(batch.slot, lengths, labels, index, order, spill)

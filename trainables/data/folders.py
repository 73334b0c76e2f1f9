"""Image folders decoded and augmented in batches on the training device: byte-reading workers (FolderBytes), the
pixel form read into the slot ring (FolderPixels), and the thread that decodes and augments ahead of the loop."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from trainables.data.bundle import _to_device
from trainables.data.crops import (
    Images,
    ReadBatch,
    center_crop_boxes,
    crop_resize,
    decode_batch,
    random_resized_crop_boxes,
)
from trainables.data.rand_augment import DeviceRandAugment
from trainables.data.slots import _Filled, _SlotReader, _SlotRing, _SlotSampler

__all__ = ["FolderBytes", "FolderPixels"]


class FolderBytes(Dataset):
    """The files of an image folder, read as bytes by DataLoader workers; batches are decoded and augmented on the
    training device by `device_loader`.

    Items of the dataset itself are `(image, label, index)` like every DataBundle's, each decoded and transformed
    alone (for code that indexes a bundle directly); training goes through `device_loader`, whose batches are
    (uint8 images on the device, labels on the device, indices).
    `train`: random-resized crops and flips (timm's ImageNet training distribution) plus `rand_augment` when given;
    else timm's eval resize and central crop.
    """

    decodes_on_host = True  # workers only read files here, but reading overlaps the device's work: worth them
    copies_to_device = False  # what workers read is decoded from host memory, not copied to the device

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        indices: np.ndarray,
        size: int,
        *,
        train: bool,
        rand_augment: Any = None,
    ) -> None:
        self._paths = [p for p, _ in samples]
        self._setup([t for _, t in samples], indices, size, train, rand_augment)

    def _setup(self, labels, indices: np.ndarray, size: int, train: bool, rand_augment: Any) -> None:
        # What every folder form holds beside its storage: labels, the subset, the crop and the augmentation.
        self._labels = np.asarray(labels, dtype=np.int64)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.targets = self._labels[self.indices]
        self.size, self.train = size, train
        self.rand_augment = None if rand_augment is None else DeviceRandAugment(rand_augment)

    def __len__(self) -> int:
        return len(self.indices)

    def read(self, i: int) -> tuple[torch.Tensor, int, int]:
        index = int(self.indices[i])
        data = torch.from_numpy(np.fromfile(self._paths[index], dtype=np.uint8))
        return data, int(self._labels[index]), index

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        batch = self.collate([self.read(i)])
        cpu = torch.device("cpu")
        x = self.transform(self.images(batch, cpu), cpu, torch.Generator().manual_seed(int(torch.randint(2**62, ()))))
        return x[0], int(batch.labels[0]), int(batch.indices[0])

    @staticmethod
    def collate(items: list[tuple[torch.Tensor, int, int]], order: list[int] | None = None) -> ReadBatch:
        """Items as `read` returns them, as one batch, their bytes back to back in `order` (positions in `items`;
        default theirs). One flat tensor: a worker hands over one shared-memory block per batch, not one per image."""
        order = list(range(len(items))) if order is None else order
        datas = [items[k][0] for k in order]
        return ReadBatch(
            flat=torch.cat([d.reshape(-1) for d in datas]),
            lengths=torch.tensor([d.numel() for d in datas], dtype=torch.int64),
            labels=torch.tensor([item[1] for item in items], dtype=torch.int64),
            indices=torch.tensor([item[2] for item in items], dtype=torch.int64),
            order=torch.tensor(order, dtype=torch.int64),
        )

    def images(self, batch: ReadBatch, device: torch.device) -> Images:
        """A batch as `collate` made it, as RGB uint8 images on `device`, in the batch's (sampler's) order: here each
        file decoded (nvjpeg on CUDA)."""
        decoded = decode_batch(list(torch.split(batch.flat, batch.lengths.tolist())), device)
        positions = batch.order.tolist()
        in_order: list[torch.Tensor] = [None] * len(decoded)  # type: ignore[list-item]
        for k, img in zip(positions, decoded):
            in_order[k] = img
        return Images.of(in_order)

    def transform(self, images: Images, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        """Images (`images`' output) to a uint8 (N, 3, size, size) batch on `device`, augmented by draws from
        `generator`."""
        sizes = images.sizes()
        if not self.train:
            return crop_resize(images, center_crop_boxes(sizes, self.size), self.size).round_().clamp_(0, 255).byte()
        boxes = random_resized_crop_boxes(sizes, generator)
        flips = torch.rand(images.n, generator=generator) < 0.5
        x = crop_resize(images, boxes, self.size)
        if flips.any():
            rows = _to_device(torch.nonzero(flips).flatten(), device)
            x[rows] = x[rows].flip(3)
        # PIL hands RandAugment an 8-bit image.
        x = x.round_().clamp_(0, 255)
        if self.rand_augment is not None:
            x = self.rand_augment(x, generator)
        return x.byte()

    def device_loader(
        self,
        batch_sampler,
        device: torch.device,
        *,
        num_workers: int,
        pin_memory: bool,
        persistent_workers: bool,
        generator: torch.Generator | None = None,
    ) -> "_DeviceBatches":
        """Batches of `batch_sampler` as (uint8 images on `device`, labels on `device`, indices on the host).
        `generator`: the DataLoader's (None: torch's global one), which its iterations draw their workers' seeds
        from; the workers only read, and draw nothing from them."""
        loader = DataLoader(
            _Reader(self),
            batch_sampler=batch_sampler,
            collate_fn=self.collate,
            num_workers=num_workers,
            # Encoded bytes go to the decoder, which reads host memory; pixels are copied to the device as they are.
            pin_memory=pin_memory and self.copies_to_device,
            persistent_workers=persistent_workers,
            generator=generator,
        )
        return _DeviceBatches(self, loader, device)


class FolderPixels(FolderBytes):
    """A folder prepared in the pixel form (`sharpscale data prepare --form pixels`): workers read each image's
    stored pixels (page cache or disk) straight into a page-locked batch slot shared with the training process
    (`_SlotRing`), which goes to the device in one copy and is cropped, flipped and RandAugmented there as
    FolderBytes' decoded images are. Nothing is decoded while training, and nothing copied in the training process.

    `split` is the split's `trainables.data.prepare.PixelSplit`; the rest as FolderBytes.
    """

    copies_to_device = True
    # Workers read into the page-locked slots of a shared ring (`_SlotRing`); False: FolderBytes' loader, which copies
    # each batch through a DataLoader's shared memory and pinning thread (kept to compare them: bench_imagefolder.py).
    use_slots = True
    # Measured with the copying loader (a worker copied a 67 MB batch of 256 x 341 x 256 in about 85 ms): on an H200
    # with ViT-S/16 (docs/benchmarks.md) 2 workers fed 5,900 img/s, 4, 6 and 15 the same 7,200-7,600. With the slots
    # 6 workers fed 53,000-67,000 img/s with no model, 6x what ViT-S/16 trains at: the cap stays.
    max_workers = 6

    def __init__(self, split, indices: np.ndarray, size: int, *, train: bool, rand_augment: Any = None) -> None:
        self._split = split
        self._setup(split.labels, indices, size, train, rand_augment)

    def read(self, i: int) -> tuple[torch.Tensor, int, int]:
        index = int(self.indices[i])
        return torch.from_numpy(np.array(self._split.pixels(index))), int(self._labels[index]), index

    @staticmethod
    def collate(items: list[tuple[torch.Tensor, int, int]], order: list[int] | None = None) -> ReadBatch:
        """As FolderBytes.collate, the pixels laid out by image size (a stable sort): each size is then one run of
        the flat batch, which the device views as one tensor. Labels, indices and the images handed on keep the
        sampler's order: m-sharpness groups, micro-batches and mixup pairs are consecutive rows of the batch."""
        if order is None:
            order = sorted(range(len(items)), key=lambda k: tuple(items[k][0].shape))
        return FolderBytes.collate(items, order)

    def images(self, batch: ReadBatch, device: torch.device) -> Images:
        """The batch's pixels on `device` in one copy, each run of equal sizes viewed as one NCHW tensor (no copy per
        image or group), each group's rows its images' positions in the batch."""
        on_device = _to_device(batch.flat, device)
        shapes = self._split.shapes[batch.indices[batch.order].numpy()]  # in the flat layout's order
        starts = np.concatenate([[0], np.cumsum(batch.lengths.numpy())])
        cuts = [0, *(np.flatnonzero((shapes[1:] != shapes[:-1]).any(1)) + 1).tolist(), len(shapes)]
        groups = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            h, w = (int(v) for v in shapes[a])
            run = on_device[int(starts[a]) : int(starts[b])].view(b - a, h, w, 3).permute(0, 3, 1, 2)
            groups.append((batch.order[a:b], run))
        return Images(groups, len(shapes))

    def device_loader(
        self,
        batch_sampler,
        device: torch.device,
        *,
        num_workers: int,
        pin_memory: bool,
        persistent_workers: bool,
        generator: torch.Generator | None = None,
    ) -> "_DeviceBatches":
        """As FolderBytes.device_loader, with each batch read by a worker straight into a slot of a shared-memory
        ring (`_SlotRing`), page-locked on CUDA: the training process copies nothing on the host, and the GPU takes
        the batch from the slot."""
        if not self.use_slots:
            return super().device_loader(
                batch_sampler, device, num_workers=num_workers, pin_memory=pin_memory,
                persistent_workers=persistent_workers, generator=generator,
            )  # fmt: skip
        # A worker may hold prefetch_factor batches (2, DataLoader's default) and the consumer one being copied; the
        # rest are copies in flight, which free their slot when their event completes.
        slots = 2 * max(num_workers, 1) + 2
        ring = _SlotRing(
            self, _batch_size(batch_sampler), slots, shared=num_workers > 0, pin=pin_memory and device.type == "cuda"
        )
        loader = DataLoader(
            _SlotReader(self, ring.buffer),
            batch_sampler=_SlotSampler(batch_sampler, ring),
            collate_fn=_as_is,
            num_workers=num_workers,
            pin_memory=False,  # the slots are page-locked already
            persistent_workers=persistent_workers,
            generator=generator,
        )
        return _DeviceBatches(self, loader, device, ring)


def _batch_size(batch_sampler) -> int:
    size = getattr(batch_sampler, "batch_size", None)
    if size is None and isinstance(batch_sampler, Sequence):  # a fixed list of batches (tests, tools)
        size = max((len(b) for b in batch_sampler), default=1)
    if size is None:
        raise TypeError(f"{type(batch_sampler).__name__} has no batch_size: the pixel loader sizes its slots by it")
    return int(size)


def _as_is(batch):
    return batch


class _Reader(Dataset):
    def __init__(self, folder: FolderBytes) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        return self.folder.read(i)


class _DeviceBatches:
    """Iterates a byte loader, decoding and augmenting each batch on the device in a thread, up to `AHEAD` batches
    ahead of the consumer.

    The decode (nvjpeg's host-side work and its waits) and the augmentation's launches run in a producer thread,
    which torch and torchvision leave the interpreter to while they work: the training thread keeps the device fed
    meanwhile. On CUDA the producer's kernels run on a side stream; the consumer's stream waits for each batch's
    event. The draws come from one generator seeded, when iteration starts, from torch's global generator (which the
    loop seeds per epoch and rank) and used by the producer alone, batch after batch: an epoch is reproducible.
    """

    AHEAD = 2
    _END = object()

    def __init__(self, folder: FolderBytes, loader: DataLoader, device: torch.device, ring: _SlotRing | None = None):
        self.folder, self.loader, self.device, self.ring = folder, loader, device, ring

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(int(torch.randint(2**62, ())))
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        ready: queue.Queue = queue.Queue(maxsize=self.AHEAD)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False  # the consumer has gone

        def produce() -> None:
            try:
                with torch.cuda.device(self.device) if stream is not None else contextlib.nullcontext():
                    for batch in self.loader:
                        if not put(self._launch(batch, generator, stream)):
                            return
                put(self._END)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
                put(err)

        thread = threading.Thread(target=produce, name="sharpscale-device-batches", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield self._hand_over(*item)
        finally:
            stop.set()
            thread.join()

    def _launch(self, batch, generator, stream):
        slot = None
        if isinstance(batch, _Filled):
            filled, batch = batch, self.ring.batch(batch)
            if filled.spill is None:
                slot = filled.slot
            else:
                self.ring.release(filled.slot)  # the batch outgrew the slots: it came in its spill
        else:
            batch = ReadBatch(*batch)
        if stream is None:
            x = self.folder.transform(self.folder.images(batch, self.device), self.device, generator)
            if slot is not None:
                self.ring.release(slot)  # the transform has read the slot: its result is a new tensor
            return x, batch.labels, batch.indices, None
        with torch.cuda.stream(stream):
            x = self.folder.transform(self.folder.images(batch, self.device), self.device, generator)
            y = _to_device(batch.labels, self.device)
            event = torch.cuda.Event()
            event.record(stream)
        if slot is not None:
            self.ring.release(slot, event)  # free once the device has copied it
        return x, y, batch.indices, event

    def _hand_over(self, x, y, indices, event):
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            # Made on the side stream, used on this one: the allocator must not reuse them before this one is done.
            x.record_stream(current)
            y.record_stream(current)
        else:
            y = y.to(self.device)
        return x, y, indices

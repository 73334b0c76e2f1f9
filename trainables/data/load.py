"""A dataset loaded by its registry entry (load_dataset), and the fixed unaugmented batches of a trial's training set
(fixed_batches)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from trainables.data.bundle import DataBundle, DatasetError
from trainables.data.registry import DATASETS, device_rand_augment_problem, resident_problem
from trainables.data.seeds import _stratified_prefix
from trainables.data.staging import stage_root

if TYPE_CHECKING:
    from trainables.config import DataConfig

__all__ = ["Loader", "fixed_batches", "load_dataset"]

Loader = Callable[["DataConfig", "Path | None", Callable[[np.ndarray], np.ndarray], bool], DataBundle]


def load_dataset(data: "DataConfig | str", /, *, device: torch.device | str | None = None, **fields: Any) -> DataBundle:
    """The dataset that `data` (a DataConfig, or a registry name plus DataConfig fields) describes.

    `data.device_resident` None (auto) builds the device-resident form when `device` is a CUDA device and
    the dataset allows it (`resident_problem`); True builds it on any device. `data.decode` auto decodes and
    augments an image folder on the device when `device` is a CUDA device (trainables.data.folders), else in host workers. Every field problem is
    reported at once in one DatasetError; a bad path or file raises DatasetError naming the path, the
    expected layout, what was found and the fix. See `DATASETS` for what each dataset is and how
    `basic`/`strong` augment it (`strong` adds mixup, applied by the loop to whole batches on the device).
    """
    from trainables.config import DataConfig, format_validation_error

    if isinstance(data, DataConfig):
        if fields:
            raise TypeError("load_dataset: pass either a DataConfig or a name with fields, not both")
        cfg = data
    else:
        from pydantic import ValidationError

        try:
            paths_as_str = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in fields.items()}
            cfg = DataConfig.model_validate({"name": data, **paths_as_str})
        except ValidationError as err:
            lines = format_validation_error(err, prefix="data.")
            raise DatasetError("load_dataset got invalid arguments:\n  - " + "\n  - ".join(lines)) from None
    spec = DATASETS[cfg.name]
    on_cuda = device is not None and torch.device(device).type == "cuda"
    resident = cfg.device_resident
    if resident is None:
        resident = on_cuda and resident_problem(spec, cfg.augment, cfg.img_size) is None
    if spec.device_decode and cfg.decode == "auto":
        ops_fit = cfg.augment != "strong" or device_rand_augment_problem(cfg.randaugment) is None
        cfg = cfg.model_copy(update={"decode": "device" if on_cuda and ops_fit else "cpu"})
    if spec.device_decode and cfg.loader == "auto":
        # Today's torch loader: on the H200, DALI was not the faster path for every recipe and model (strong ViT-S/16
        # 0.385 of synthetic data against torch's 0.549, ResNet-50 SAM 0.704 against 0.833; basic ViT-S/16 0.663
        # against 0.588; benchmarks/results/imagefolder_dali.csv), so it is asked for by name until it is.
        cfg = cfg.model_copy(update={"loader": "torch"})

    def train_indices_for(labels: np.ndarray) -> np.ndarray:
        return _stratified_prefix(labels, float(cfg.fraction), int(cfg.fraction_seed))

    # A URI root is staged once per node into its local cache; a path is used in place.
    root = None if cfg.root is None else stage_root(cfg.root)
    return spec.load(cfg, root, train_indices_for, resident)


def fixed_batches(
    data: "DataConfig",
    *,
    samples: int,
    batch_size: int,
    seed: int = 0,
    data_root: str | None = None,
    device: torch.device | str | None = None,
    bundle: DataBundle | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed batches of a trial's own training set (its dataset, fraction and fraction seed), unaugmented.

    `samples` examples (at most the subset's size) drawn once by `seed` from the training subset, in batches of
    `batch_size`, normalised as the model takes them, on `device`. The one definition of a geometry measurement
    set: the in-trial probe (trainables.loop) and the checkpoint measures (analysis.record) both draw theirs here.
    data_root: where the dataset lives here, when not at `data.root`. bundle: the trial's own loaded `data`
    (augmented or not, on the host or the device): its training split's unaugmented view is taken instead of
    loading the dataset again, with the same samples and values.
    """
    for name, value in (("samples", samples), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}. Fix: e.g. {name}=128.")
    train = getattr(bundle.train, "unaugmented", lambda: None)() if bundle is not None else None
    if train is None:
        update: dict[str, Any] = {"augment": "none", "device_resident": False}
        if data_root is not None:
            update["root"] = data_root
        bundle = load_dataset(data.model_copy(update=update))
        train = bundle.train
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:samples].tolist()
    batches = []
    for start in range(0, len(order), batch_size):
        positions = order[start : start + batch_size]
        if hasattr(train, "get_batch"):  # a whole batch at once, where the split lives (the device, maybe)
            x, y, _ = train.get_batch(positions)
        else:
            items = [train[i] for i in positions]
            x = torch.stack([torch.as_tensor(item[0]) for item in items])
            y = torch.tensor([int(item[1]) for item in items])
        x = bundle.prepare(x)
        batches.append((x.to(device) if device is not None else x, y.to(device) if device is not None else y))
    return batches

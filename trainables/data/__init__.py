"""The data wing: the torch-free dataset registry, one module per dataset, the bundle a loader hands the loop, the
seeds of its draws, the device-side crops, RandAugment, folders and slot ring, and `data prepare`, fetch and
staging."""

from __future__ import annotations

from optim.lazy import exports

# Each public name once, with the module that defines it, loaded on first use (PEP 562): trainables.config imports
# the registry, which must not pay for torch through this package's __init__ (`sharpscale --help` and `validate` stay
# torch-free). Type checkers read __init__.pyi, generated from this by optim.lazy.write_stubs().
__all__, __getattr__, __dir__ = exports(
    __name__,
    {
        "bundle": ("DataBundle", "DatasetError"),
        "load": ("fixed_batches", "load_dataset"),
        "registry": ("DATASETS", "DatasetSpec"),
        "seeds": ("SeededBatch", "batch_seeds", "epoch_seed", "eval_positions", "fraction_indices"),
        "sets": ("random_crop_flip",),
    },
)

"""The dataset registry, torch-free: each dataset's name, description, rules (root, device-resident form) and loader by name, and the RandAugment string check."""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainables.data import Loader

__all__ = [
    "DATASETS",
    "DEVICE_RAND_OPS",
    "DatasetSpec",
    "device_rand_augment_problem",
    "fraction_keep",
    "package_file",
    "rand_augment_hparams",
    "rand_augment_problem",
    "resident_problem",
]


@dataclass(frozen=True)
class DatasetSpec:
    """One registered dataset: how to load it, and what the config rules need to know about it.

    ``loader`` names the load function in trainables.data (which imports torch), read only when a dataset is
    loaded: ``load(cfg, root, train_indices_for, resident)`` gives the bundle; ``root`` is the local directory
    (None when the dataset needs none), ``train_indices_for(labels)`` the fraction subset, ``resident`` whether to
    build the device-resident form.
    """

    name: str
    description: str
    loader: str
    needs_root: bool
    # Small enough to keep on the accelerator: `none`/`basic` augmentation then runs batched on the device.
    # (`strong` keeps RandAugment in host workers.)
    device_resident: bool = False
    native_size: int | None = None  # the only img_size the resident form takes (None: any)
    # Image files that can be decoded and augmented in batches on the training device (`data.decode`).
    device_decode: bool = False
    # Classes of a fixed dataset (None where the data or the config decide): analysis.chance_error reads it for the
    # error of a model that learned nothing (1 - 1/classes), M4's eps0.
    num_classes: int | None = None
    # Samples of each class in the training split, in class order (None where the data or the config decide): the
    # config rules read it to size a `data.fraction` subset before any data is loaded.
    train_class_sizes: tuple[int, ...] | None = None

    def subset_size(self, fraction: float) -> int | None:
        """Samples in this dataset's class-stratified `fraction` subset (None where the class sizes are unknown)."""
        if self.train_class_sizes is None:
            return None
        return sum(fraction_keep(fraction, n) for n in self.train_class_sizes)

    @property
    def load(self) -> Loader:
        return getattr(importlib.import_module("trainables.data"), self.loader)


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "digits",
            "scikit-learn's 8x8 digits, embedded: fixed stratified 80/20 train/val split",
            "_load_digits",
            needs_root=False,
            device_resident=True,
            num_classes=10,
            # 1,438 train images (trainables.data's fixed split); pinned against the loaded split by a test.
            train_class_sizes=(142, 146, 142, 146, 145, 146, 145, 143, 139, 144),
        ),
        DatasetSpec(
            "cifar10",
            "CIFAR-10, the python-version pickles; val is the test batch",
            "_load_cifar",
            needs_root=True,
            device_resident=True,
            native_size=32,
            num_classes=10,
            train_class_sizes=(5000,) * 10,
        ),
        DatasetSpec(
            "cifar100",
            "CIFAR-100 (fine labels), the python-version pickles; val is the test set",
            "_load_cifar",
            needs_root=True,
            device_resident=True,
            native_size=32,
            num_classes=100,
            train_class_sizes=(500,) * 100,
        ),
        DatasetSpec(
            "imagefolder",
            "any train/val tree of class folders (ImageNet-style), decoded per sample",
            "_load_imagefolder",
            needs_root=True,
            device_decode=True,
        ),
        DatasetSpec(
            "synthetic",
            "random images for throughput measurements; no augmentation",
            "_load_synthetic",
            needs_root=False,
        ),
    )
}


def fraction_keep(fraction: float, n: int) -> int:
    """How many of a class's `n` training samples a `fraction` subset keeps: round(fraction * n), at least one."""
    return max(1, int(math.floor(fraction * n + 0.5)))


def resident_problem(spec: DatasetSpec, augment: str, img_size: int | None) -> str | None:
    """Why this dataset cannot take the device-resident form with these settings, or None when it can."""
    if not spec.device_resident:
        return f"dataset {spec.name!r} is not registered as device-resident (it does not fit in device memory)"
    if augment == "strong":
        return "augment 'strong' runs RandAugment on host workers"
    if spec.native_size is not None and img_size not in (None, spec.native_size):
        return f"the resident form keeps {spec.name}'s native {spec.native_size} px, got img_size={img_size}"
    return None


def rand_augment_problem(config: object) -> str | None:
    """Why `config` is not a timm RandAugment string, or None when it is one."""
    if not isinstance(config, str):
        return f"must be a string such as 'rand-m9-mstd0.5', got {config!r}"
    parse = _timm_rand_augment()  # outside the try: a failure to find timm's parser is not the string's fault
    try:
        parse(config, rand_augment_hparams(32, (0.5, 0.5, 0.5)))
    except Exception as exc:  # noqa: BLE001 - timm signals a bad string with asserts and ValueErrors
        return (
            f"must be a timm RandAugment string such as 'rand-m9-mstd0.5' (sections m, n, p, mstd, mmax, inc, t "
            f"after 'rand'), got {config!r} ({type(exc).__name__}: {exc})"
        )
    return None


# timm's RandAugment ops that trainables.jpeg applies in batches on the device (every op of timm's default and
# 'increasing' RandAugment sets); a RandAugment string using any other op is decoded and augmented on the host.
DEVICE_RAND_OPS = frozenset(
    {
        "AutoContrast",
        "Equalize",
        "Invert",
        "Rotate",
        "Posterize",
        "PosterizeIncreasing",
        "PosterizeOriginal",
        "Solarize",
        "SolarizeIncreasing",
        "SolarizeAdd",
        "Color",
        "ColorIncreasing",
        "Contrast",
        "ContrastIncreasing",
        "Brightness",
        "BrightnessIncreasing",
        "Sharpness",
        "SharpnessIncreasing",
        "ShearX",
        "ShearY",
        "TranslateX",
        "TranslateY",
        "TranslateXRel",
        "TranslateYRel",
    }
)


def device_rand_augment_problem(config: str) -> str | None:
    """Why the RandAugment string `config` cannot run on the device (an op without a device version), or None."""
    if rand_augment_problem(config):
        return None  # not a RandAugment string at all: rand_augment_problem reports that
    ops = {op.name for op in _timm_rand_augment()(config, rand_augment_hparams(32, (0.5, 0.5, 0.5))).ops}
    unknown = sorted(ops - DEVICE_RAND_OPS)
    if unknown:
        return f"its ops {unknown} have no device version (the device applies {sorted(DEVICE_RAND_OPS)})"
    return None


def rand_augment_hparams(size: int, mean: Sequence[float]) -> dict[str, Any]:
    """The hyper-parameters of timm's RandAugment for ``size`` px images of this ``mean``."""
    # The same ones timm's create_transform passes: translation relative to the image size and fill with the
    # dataset mean.
    return dict(translate_const=int(size * 0.45), img_mean=tuple(min(255, round(255 * m)) for m in mean))


_AUTO_AUGMENT = "_sharpscale_timm_auto_augment"


def _timm_rand_augment() -> Callable[..., Any]:
    """timm's ``rand_augment_transform``, the one parser of RandAugment strings, without importing torch.

    ``timm/data/auto_augment.py`` needs only PIL and numpy, but ``import timm.data.auto_augment`` runs timm's
    ``__init__``, which imports torch (seconds): a study file's check loads that one file on its own. Where timm
    has moved it or gained imports, the ordinary import serves (correct, only slower);
    tests/trainables/test_datasets_registry.py pins that the file still loads alone and is timm's own function.
    Only checks use it: a training transform comes from timm itself (trainables.data), so its classes pickle by
    timm's module name into any data-loader worker.
    """
    if "timm" in sys.modules:  # already paid for: timm's own module object
        from timm.data.auto_augment import rand_augment_transform as timm_rand_augment

        return timm_rand_augment
    module = sys.modules.get(_AUTO_AUGMENT)
    if module is None:
        module = _load_alone()
    if module is None:
        from timm.data.auto_augment import rand_augment_transform as timm_rand_augment

        return timm_rand_augment
    return module.rand_augment_transform


def package_file(package: str, *parts: str) -> Path | None:
    """A file shipped inside an installed package (``parts`` below its folder), found without importing the package
    (``find_spec`` of a top-level package runs none of its code); None where it is not."""
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (path := Path(folder, *parts)).is_file():
            return path
    return None


def _load_alone():
    path = package_file("timm", "data", "auto_augment.py")
    if path is None:
        return None
    file_spec = importlib.util.spec_from_file_location(_AUTO_AUGMENT, path)
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[_AUTO_AUGMENT] = module
    try:
        file_spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - it now imports from timm (or torch), or fails alone: the ordinary import serves
        del sys.modules[_AUTO_AUGMENT]
        return None
    return module

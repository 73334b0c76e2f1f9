"""The dataset registry, torch-free: every fact of each dataset (classes, sizes, split sizes, normalisation, archive
and root layout, the rules of its forms) and its loader by name, and the RandAugment string check."""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DALI_INSTALL",
    "DATASETS",
    "DEVICE_RAND_OPS",
    "Archive",
    "DatasetSpec",
    "Layout",
    "dali_available",
    "device_rand_augment_problem",
    "expected_layout",
    "fraction_keep",
    "package_file",
    "rand_augment_hparams",
    "rand_augment_problem",
    "resident_problem",
]


@dataclass(frozen=True)
class Layout:
    """What a data root must hold: ``alternatives``, each a set of relative paths (a trailing / is a directory), any
    one of which will do; ``words``, the same for a person (``<root>`` standing for the root)."""

    alternatives: tuple[tuple[str, ...], ...]
    words: str


@dataclass(frozen=True)
class Archive:
    """An official archive: where it is, its md5, the folder it unpacks to, the files the loader reads there by their
    role (``parts``: CIFAR's ``train``, ``test`` and ``meta`` pickles), the keys it reads inside them (``keys``:
    CIFAR's ``labels`` and ``class_names``) and what the files are, in words."""

    url: str
    md5: str
    folder: str
    parts: Mapping[str, tuple[str, ...]]
    keys: Mapping[str, str] = field(default_factory=dict)
    contents: str = ""

    @property
    def files(self) -> tuple[str, ...]:
        """Every file of the folder the loader reads, in the order of ``parts``."""
        return tuple(f for files in self.parts.values() for f in files)

    @property
    def layout(self) -> Layout:
        """The unpacked folder under a root, or its files directly in the root."""
        return Layout(
            (tuple(f"{self.folder}/{f}" for f in self.files), self.files),
            f"<root>/{self.folder}/{{{', '.join(self.files)}}} ({self.contents}), or those files directly in <root>",
        )


@dataclass(frozen=True)
class DatasetSpec:
    """One registered dataset: every fact about it that the config rules, the cost estimate, the fetch and the
    loaders read, and how to load it.

    ``loader`` is ``"module:attribute"`` of the load function, the module relative to ``trainables.data`` (one
    module per dataset, importing torch), imported only when a dataset is loaded: ``load(cfg, root, train_indices_for, resident)`` gives the bundle; ``root`` is
    the local directory (None when the dataset needs none), ``train_indices_for(labels)`` the fraction subset,
    ``resident`` whether to build the device-resident form.
    """

    name: str
    description: str
    loader: str
    needs_root: bool
    # The img_size a trial gets when its config leaves img_size unset.
    default_size: int
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
    # Images in the validation split (None where the data decide): with train_class_sizes, what a study's cost
    # estimate counts before any data is read.
    val_size: int | None = None
    # Per-channel mean and std the images are normalised by (None: computed from the loaded training split).
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    # Its official archive, which `sharpscale data fetch` downloads (None: none to fetch).
    archive: Archive | None = None
    # What its data root must hold, where it has no archive to say it (None: a dataset without a root).
    layout: Layout | None = None

    @property
    def split_sizes(self) -> tuple[int, int] | None:
        """(training images, validation images) of its full splits, where the registry knows them."""
        if self.train_class_sizes is None or self.val_size is None:
            return None
        return sum(self.train_class_sizes), self.val_size

    @property
    def root_layout(self) -> Layout | None:
        """What its data root must hold: its archive's folder, or its own layout; None for a dataset without one."""
        return self.archive.layout if self.archive is not None else self.layout

    def scored_images(self, split: str = "test") -> int | None:
        """Validation images one evaluation on `split` scores (DataConfig.eval_split): all of them, or one of the two
        halves trainables.data.eval_positions draws ('test' takes the odd one out); None where the data decide."""
        if self.val_size is None:
            return None
        if split == "all":
            return self.val_size
        if split not in ("selection", "test"):
            raise ValueError(f"eval_split must be 'all', 'selection' or 'test', got {split!r}")
        half = self.val_size // 2
        return half if split == "selection" else self.val_size - half

    def subset_size(self, fraction: float) -> int | None:
        """Samples in this dataset's class-stratified `fraction` subset (None where the class sizes are unknown)."""
        if self.train_class_sizes is None:
            return None
        return sum(fraction_keep(fraction, n) for n in self.train_class_sizes)

    @property
    def load(self) -> Callable[..., Any]:
        """The load function (importing its module, and torch, on first use): a trainables.data.load.Loader."""
        module, _, attr = self.loader.partition(":")
        return getattr(importlib.import_module(module, __package__), attr)


_CIFAR_PICKLES = "the official python-version pickles"

# Adding a dataset: its module in trainables/data/ (a `load` function) and one entry below; the config rules,
# `--dry-run`'s estimate, `sharpscale data fetch`, the pre-run root check and the loaders read it, and
# tests/trainables/test_datasets_registry.py runs every entry (a dataset with a root adds a fake of it there).
DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "digits",
            "scikit-learn's 8x8 digits, embedded: fixed stratified 80/20 train/val split",
            ".digits:load",
            needs_root=False,
            default_size=8,
            device_resident=True,
            num_classes=10,
            # 1,438 train and 359 val images (trainables.data.digits' fixed split); pinned against the loaded split by a
            # test. Normalised by the training split's own mean and std.
            train_class_sizes=(142, 146, 142, 146, 145, 146, 145, 143, 139, 144),
            val_size=359,
        ),
        DatasetSpec(
            "cifar10",
            "CIFAR-10, the python-version pickles; val is the test batch",
            ".cifar:load",
            needs_root=True,
            default_size=32,
            device_resident=True,
            native_size=32,
            num_classes=10,
            train_class_sizes=(5000,) * 10,
            val_size=10_000,
            # The true per-pixel statistics of the training sets. The often copied CIFAR-10 std
            # (0.2023, 0.1994, 0.2010) is the mean of per-image stds, not the dataset std.
            mean=(0.4914, 0.4822, 0.4465),
            std=(0.2470, 0.2435, 0.2616),
            archive=Archive(
                url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                md5="c58f30108f718f92721af3b95e74349a",
                folder="cifar-10-batches-py",
                parts={
                    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
                    "test": ("test_batch",),
                    "meta": ("batches.meta",),
                },
                keys={"labels": "labels", "class_names": "label_names"},
                contents=_CIFAR_PICKLES,
            ),
        ),
        DatasetSpec(
            "cifar100",
            "CIFAR-100 (fine labels), the python-version pickles; val is the test set",
            ".cifar:load",
            needs_root=True,
            default_size=32,
            device_resident=True,
            native_size=32,
            num_classes=100,
            train_class_sizes=(500,) * 100,
            val_size=10_000,
            mean=(0.5071, 0.4865, 0.4409),
            std=(0.2673, 0.2564, 0.2762),
            archive=Archive(
                url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                md5="eb9058c3a382ffc7106e4002c42a8d85",
                folder="cifar-100-python",
                parts={"train": ("train",), "test": ("test",), "meta": ("meta",)},
                keys={"labels": "fine_labels", "class_names": "fine_label_names"},
                contents=_CIFAR_PICKLES,
            ),
        ),
        DatasetSpec(
            "imagefolder",
            "any train/val tree of class folders (ImageNet-style), decoded per sample",
            ".imagefolder:load",
            needs_root=True,
            default_size=224,
            device_decode=True,
            mean=(0.485, 0.456, 0.406),  # ImageNet's statistics
            std=(0.229, 0.224, 0.225),
            layout=Layout(
                (("train/", "val/"),),
                "<root>/train/<class_name>/<image>.jpg|png and <root>/val/<class_name>/<image>.jpg|png "
                "with the same class folders in train and val",
            ),
        ),
        DatasetSpec(
            "synthetic",
            "random images for throughput measurements; no augmentation",
            ".synthetic:load",
            needs_root=False,
            default_size=32,
            mean=(0.0, 0.0, 0.0),
            std=(1.0, 1.0, 1.0),
        ),
    )
}


def expected_layout(name: str) -> str:
    """The layout a data root of dataset `name` must have, in words ('' for datasets that need no root)."""
    spec = DATASETS.get(name)
    layout = spec.root_layout if spec is not None else None
    return layout.words if layout is not None else ""


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


# timm's RandAugment ops that trainables.data.rand_augment applies in batches on the device (every op of timm's default and
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


# How a user gets NVIDIA DALI, the loader of plain image folders on CUDA where it is installed (trainables.data.dali).
DALI_INSTALL = "pip install 'sharpscale[dali]'"


def dali_available() -> bool:
    """Whether NVIDIA DALI is importable here, found without importing it (nor torch): config checks call it."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # no `nvidia` namespace package at all
        return False


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
    Only checks use it: a training transform comes from timm itself (the dataset modules), so its classes pickle by
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

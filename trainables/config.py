"""The trial configuration: every knob of one training run, typed, validated, with its default, in one place."""

from __future__ import annotations

import difflib
import functools
import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainables.errors import UserError, shown

#: The torch.compile modes a CompiledModule runs (trainables.compiled), each with CUDA graphs or not
#: (compiled._WITHOUT_GRAPHS: the form a trial falls back to where graphs cannot run). Here, not in compiled, so
#: that validating a config imports no torch. `train.compile` offers the first two (TRAIN_COMPILE_MODES); the
#: max-autotune ones (Inductor's GEMM templates autotuned at compile time) compiled past 100 s on Mixer-S/4 with no
#: gain measured yet (docs/benchmarks.md), so only the benchmarks time them.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TRAIN_COMPILE_MODES = COMPILE_MODES[:2]

__all__ = [
    "CHECKPOINT_AUTO_RATIO",
    "ConfigError",
    "DataConfig",
    "GeometryConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "TrainConfig",
    "TrialConfig",
    "checkpoint_problem",
    "format_validation_error",
]


class _Strict(BaseModel):
    # A mistyped key must fail loudly, not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# train.checkpoint_every: 'auto' checkpoints once a trial has run this many times as long as its last checkpoint cost.
CHECKPOINT_AUTO_RATIO = 100

# timm.create_model keywords that load weights from the hub or a config naming some: refused outright.
FILE_LOADING_KWARGS = frozenset({"pretrained", "pretrained_cfg", "pretrained_cfg_overlay"})
# The one that reads a file: accepted only inside model.checkpoint_roots (checkpoint_problem), read as weights only.
CHECKPOINT_KWARG = "checkpoint_path"


def checkpoint_problem(value: Any, roots: tuple[str, ...]) -> str | None:
    """Why `model.kwargs.checkpoint_path` = `value` may not be read under `roots` (None: it may). Symbolic links are
    resolved first, on the machine that asks: validation on the driver, and again where the trial loads it."""
    field = f"model.kwargs.{CHECKPOINT_KWARG}"
    if not roots:
        return (
            f"{field}: models are built untrained unless model.checkpoint_roots names the folders a weights file may "
            f"be read from (empty, the default: none), got {shown(value)}. Fix: add the folder holding it to "
            f"model.checkpoint_roots, or remove {CHECKPOINT_KWARG}."
        )
    if not isinstance(value, str) or not value.startswith("/"):
        return f"{field}: must be an absolute file path, got {shown(value)}. Fix: write the file's absolute path."
    resolved = Path(value).resolve()
    if any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        return None
    return (
        f"{field}: {shown(value)} resolves to {shown(str(resolved))} (symbolic links followed), outside every folder "
        f"of model.checkpoint_roots {shown(list(roots))}. Fix: put the weights file under one of them, or add its "
        f"folder to model.checkpoint_roots."
    )


class ModelConfig(_Strict):
    """Which timm model, and how to size it for small images."""

    name: str = Field("vit_tiny_patch16_224", description="timm model name (ViT, Mixer or ResNet).")
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides passed to timm (patch_size, embed_dim, depth, num_heads, num_blocks, ...).",
    )
    checkpoint_roots: tuple[str, ...] = Field(
        (),
        description="Absolute folders a kwargs.checkpoint_path may name a weights file in (symbolic links resolved "
        "before the check, at load and again on the node that reads it, which reads tensors only: torch.load "
        "weights_only=True). Empty (the default): no checkpoint_path is read; models are built untrained.",
    )
    drop_rate: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout before the classifier.")
    drop_path_rate: float = Field(0.0, ge=0.0, lt=1.0, description="Stochastic depth rate.")
    cifar_stem: bool = Field(False, description="ResNet only: 3x3 stride-1 stem, no max-pool (small images).")
    fused_attn: bool = Field(True, description="timm's fused attention; off for double backward (Hessians).")

    @field_validator("name")
    @classmethod
    def _known_family(cls, name: str) -> str:
        from trainables.families import model_family

        model_family(name)
        return name

    @field_validator("kwargs")
    @classmethod
    def _no_weights_from_files(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        loaders = sorted(set(kwargs) & FILE_LOADING_KWARGS)
        if loaders:
            raise ValueError(
                f"model.kwargs.{loaders[0]}: models are built untrained (pretrained=False), and no key of a study "
                f"makes timm download weights or read a file it names, got {', '.join(loaders)}. Fix: remove "
                f"{' and '.join(loaders)} (a weights file of your own goes in {CHECKPOINT_KWARG}, inside "
                f"model.checkpoint_roots)."
            )
        return kwargs

    @field_validator("checkpoint_roots")
    @classmethod
    def _absolute_roots(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        relative = [r for r in roots if not r.startswith("/")]
        if relative:
            raise ValueError(
                f"model.checkpoint_roots: each folder must be an absolute path, got {shown(relative[0])}. Fix: write "
                f"its absolute path."
            )
        return roots

    @model_validator(mode="after")
    def _checkpoint_inside_roots(self) -> ModelConfig:
        if CHECKPOINT_KWARG in self.kwargs:
            problem = checkpoint_problem(self.kwargs[CHECKPOINT_KWARG], self.checkpoint_roots)
            if problem:
                raise ValueError(problem)
        return self


class DataConfig(_Strict):
    """Which dataset (a name in `trainables.data.DATASETS`), which fraction of its training set, how it is fed."""

    name: str = Field("digits", description="Registry name in trainables.data.DATASETS (digits, cifar10, ...).")
    root: str | None = Field(
        None, description="Directory holding the dataset, or a URI (s3://, gs://, file://) each node stages once."
    )

    @field_validator("root")
    @classmethod
    def _no_credentials(cls, root: str | None) -> str | None:
        # Printed by the preflight, an MLflow param and part of every trial's payload: no key or token in it.
        from trainables.secrets import credential_problem

        if root is not None and (problem := credential_problem("data.root", root)):
            raise ValueError(problem)
        return root

    img_size: int | None = Field(None, ge=4, description="Input resolution; None keeps the dataset's own.")
    augment: Literal["none", "basic", "strong"] = Field(
        "basic",
        description="Training augmentation: none; basic (random crop and horizontal flip); strong (basic, RandAugment "
        "and mixup).",
    )
    fraction: float = Field(1.0, gt=0.0, le=1.0, description="Class-stratified share of the training set.")
    fraction_seed: int = Field(0, ge=0, description="Seed of the subset; smaller fractions nest in larger ones.")
    batch_size: int = Field(64, ge=1, description="Global batch size (split evenly over data-parallel workers).")
    accumulate: int = Field(
        1,
        ge=1,
        description="Micro-batches each worker's share of the batch is split into: every pass of a step runs over them "
        "in turn and their gradients add up to the whole share's (one perturbation per accumulated gradient).",
    )
    eval_batch_size: int = Field(512, ge=1, description="Batch size of validation (no gradients are kept).")
    eval_split: Literal["all", "selection", "test"] = Field(
        "all",
        description="Which part of the validation set the trial is scored on: all of it; or one of its two fixed, "
        "disjoint halves (trainables.data.eval_positions): 'selection', where a study's search chooses its knobs, "
        "and 'test', where its confirm runs measure the choice on data it never saw (studies.confirm).",
    )
    num_workers: int | None = Field(
        None,
        ge=0,
        description="DataLoader worker processes per training process; None: none for in-memory and device-resident "
        "data, else one per CPU the trial's torch threads allow, less one (at most 16; at most 6 for a folder prepared as "
        "pixels with data.decode device, which needs no more). Any number draws the same augmentations: each "
        "batch's draws come from a seed of the batch's own (trainables.data.SeededBatch).",
    )
    device_resident: bool | None = Field(
        None,
        description="Keep the dataset on the training device and augment batches there; None: on for CUDA trials of "
        "datasets that allow it (digits, CIFAR at native size, augment none or basic).",
    )
    decode: Literal["auto", "cpu", "device"] = Field(
        "auto",
        description="Image folders: where images are decoded and augmented. 'device': workers only read the files; "
        "each batch is decoded (nvjpeg on CUDA), cropped, flipped and RandAugmented on the training device. 'cpu': "
        "workers decode and augment each image with PIL (timm's transforms). auto: 'device' on CUDA where the "
        "RandAugment string's ops all have a device version, else 'cpu'.",
    )
    loader: Literal["auto", "dali", "torch"] = Field(
        "auto",
        description="Image folders decoded on the device (data.decode device): which loader. 'dali': NVIDIA DALI "
        "(install: pip install 'sharpscale[dali]'): reads, decodes on the GPU with its hardware JPEG decoder where "
        "the card has one, crops, flips, RandAugments and normalises in one pipeline (trainables.data.dali). "
        "'torch': DataLoader workers read the bytes, torchvision's nvjpeg decodes them and torch ops augment them "
        "(trainables.data.folders). auto: 'torch', the faster of the two as measured (docs/benchmarks.md). The pixel "
        "form (data prepare --form pixels) has nothing to decode and always takes 'torch'.",
    )
    mixup_alpha: float = Field(
        0.8, ge=0.0, allow_inf_nan=False, description="Mixup alpha of the 'strong' augmentation."
    )
    randaugment: str = Field("rand-m9-mstd0.5", description="timm RandAugment string of the 'strong' augmentation.")
    synthetic_samples: int = Field(4096, ge=1, description="synthetic only: training-set size (throughput runs).")
    synthetic_classes: int = Field(10, ge=2, description="synthetic only: number of classes.")

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        from trainables.data.registry import DATASETS

        if name not in DATASETS:
            close = difflib.get_close_matches(name, list(DATASETS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"must be one of {sorted(DATASETS)}, got {shown(name)}.{hint}")
        return name

    @field_validator("augment", mode="before")
    @classmethod
    def _known_augment(cls, augment: Any) -> Any:
        options = ("none", "basic", "strong")
        if isinstance(augment, str) and augment not in options:
            close = difflib.get_close_matches(augment, options, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"must be one of {list(options)}, got {shown(augment)}.{hint}")
        return augment

    @model_validator(mode="after")
    def _dataset_rules(self) -> "DataConfig":
        from trainables.data.registry import (
            DALI_INSTALL,
            DATASETS,
            dali_available,
            device_rand_augment_problem,
            expected_layout,
            rand_augment_problem,
            resident_problem,
        )

        spec = DATASETS[self.name]
        problems = []
        if spec.needs_root and self.root is None:
            problems.append(
                f"data.root: required for data.name={self.name!r}, got none. "
                f"Fix: set data.root to the directory that holds the {self.name} files ({expected_layout(self.name)})."
            )
        if self.accumulate > self.batch_size:
            problems.append(
                f"data.accumulate: must not exceed data.batch_size ({self.batch_size}), got {self.accumulate}. "
                "Fix: lower accumulate or raise the batch size (each micro-batch needs at least one sample)."
            )
        if self.augment == "strong" and (problem := rand_augment_problem(self.randaugment)):
            problems.append(f"data.randaugment: {problem}. Fix: use e.g. 'rand-m9-mstd0.5'.")
        if self.decode == "device" and not spec.device_decode:
            problems.append(
                f"data.decode: 'device' is for datasets registered with device decoding "
                f"({sorted(n for n, s in DATASETS.items() if s.device_decode)}), got data.name={self.name!r}. "
                "Fix: leave data.decode unset (auto)."
            )
        elif (
            self.decode == "device"
            and self.augment == "strong"
            and (problem := device_rand_augment_problem(self.randaugment))
        ):
            problems.append(
                f"data.decode: 'device' cannot apply data.randaugment={self.randaugment!r}: {problem}. "
                "Fix: set data.decode to 'cpu' or 'auto', or use a RandAugment string of supported ops."
            )
        if self.loader == "dali" and not spec.device_decode:
            problems.append(
                f"data.loader: 'dali' is for datasets registered with device decoding "
                f"({sorted(n for n, s in DATASETS.items() if s.device_decode)}), got data.name={self.name!r}. "
                "Fix: leave data.loader unset (auto)."
            )
        elif self.loader == "dali" and self.decode == "cpu":
            problems.append(
                "data.loader: 'dali' decodes on the device, which data.decode='cpu' rules out. "
                "Fix: set data.decode to 'device' or 'auto', or data.loader to 'auto'."
            )
        elif self.loader == "dali" and not dali_available():
            problems.append(
                "data.loader: 'dali' needs NVIDIA DALI, which is not installed here (import nvidia.dali fails). "
                f"Fix: {DALI_INSTALL}, or set data.loader to 'auto' (DALI where installed, else torch)."
            )
        if self.device_resident and (problem := resident_problem(spec, self.augment, self.img_size)):
            problems.append(
                f"data.device_resident: true is impossible here: {problem}. Fix: leave it unset (auto) or false."
            )
        problems += self._subset_problems(spec)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _subset_problems(self, spec) -> list[str]:
        # Where the registry knows the class sizes, the subset that `fraction` keeps is known before any data is
        # loaded: a share under one sample, or fewer samples than one batch, would only fail inside the trial.
        kept = spec.subset_size(self.fraction)
        if kept is None:
            return []
        total = sum(spec.train_class_sizes)
        if self.fraction * total < 1:
            return [
                f"data.fraction: must keep at least one of the {total:,} training samples of {self.name} "
                f"(fraction x {total:,} >= 1), got {self.fraction!r} ({self.fraction * total:.3g} samples; each class "
                f"would still keep one, so the run would not train on that share). Fix: use at least "
                f"{1 / total:.2g}, e.g. 0.1."
            ]
        if kept < self.batch_size:
            # Worded as the trial's own check (trainables.loop._loaders), which stays for datasets sized at load.
            return [
                f"data.batch_size: must not exceed the training-set size ({kept} of the {total:,} training samples "
                f"of {self.name} at data.fraction={self.fraction!r}), got {self.batch_size}. Fix: lower the batch "
                f"size to at most {kept} or raise data.fraction to at least {_least_fraction(spec, self.batch_size)}."
            ]
        return []


def _least_fraction(spec, samples: int) -> float:
    """The smallest two-digit fraction whose subset of `spec` holds `samples` (1.0 when none below does)."""
    fraction = samples / sum(spec.train_class_sizes)
    while fraction < 1.0:
        shown_fraction = float(f"{fraction:.2g}")
        if spec.subset_size(shown_fraction) >= samples:
            return shown_fraction
        fraction *= 1.01
    return 1.0


class OptimizerConfig(_Strict):
    """The base optimizer and the sharpness-aware method wrapped around it."""

    method: str = Field("none", description="Registry name in optim.METHODS (none, sam, asam, gsam, ...).")
    base: Literal["adamw", "sgd"] = Field("adamw", description="The base optimizer the method wraps.")
    lr: float = Field(1e-3, gt=0.0, description="Peak learning rate of the base optimizer.")
    weight_decay: float = Field(0.05, ge=0.0, description="Decoupled for AdamW; never on 1-D tensors.")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's moment decay rates (beta1, beta2).")
    hparams: dict[str, float | int | bool] = Field(
        default_factory=dict,
        description="The method's own knobs (rho, alpha, k, lam, ...); unset ones keep optim's defaults.",
    )
    grad_clip: float | None = Field(None, gt=0.0, description="Clip the final update gradient to this norm.")
    global_perturbation: bool = Field(False, description="DDP: one global eps instead of per-replica eps.")
    scope: str | dict[str, list[str]] = Field(
        "all",
        description="Which parameters a perturbing method perturbs (direction and norm over them alone; the update "
        "still from every gradient): all; norm (the affine parameters of BatchNorm/LayerNorm/GroupNorm: SAM-ON); or "
        "{include: [patterns], exclude: [patterns]} of parameter names (fnmatch), each checked against the model.",
    )
    schedule: dict[str, Any] | None = Field(
        None,
        description="Which steps perturb (None: every step); the others are the base optimizer's step: start_epoch "
        "or start_fraction (late-phase SAM), every (k), probability (SS-SAM, seeded by train.seed), adaptive "
        "{c, decay} (AE-SAM: when ||g||^2 >= its EMA mean + c EMA std).",
    )

    @model_validator(mode="after")
    def _method_and_hparams(self) -> "OptimizerConfig":
        from optim import METHODS

        if self.method not in METHODS:
            close = difflib.get_close_matches(self.method, list(METHODS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"optimizer.method: must be one of {sorted(METHODS)}, got {shown(self.method)}.{hint}")
        accepted = METHODS[self.method].hparams
        unknown = sorted(set(self.hparams) - set(accepted))
        if unknown:
            raise ValueError(
                f"optimizer.hparams: method {shown(self.method)} takes {sorted(accepted) or 'no hparams'}, "
                f"got {unknown}. Fix: remove them or pick a method that takes them."
            )
        # Cached: a study validates every cell and every search bound, mostly with the same few settings. The
        # type is part of the key: 1, 1.0 and True are equal, but a method may take only one of them.
        hparams = tuple(sorted((k, type(v), v) for k, v in self.hparams.items()))
        problem = _hparam_problem(
            self.method,
            hparams,
            self.base,
            self.lr,
            self.momentum,
            tuple(self.betas),
            self.global_perturbation,
            self.weight_decay,
        )
        if problem:
            raise ValueError(problem)
        _check_step_kinds(self, epochs=None)
        return self


def _check_step_kinds(cfg: "OptimizerConfig", *, epochs: int | None) -> None:
    # optim's torch-free rules (optim._scope, optim._schedule), the one home of each: the forms, a method that does not
    # perturb taking neither, the adaptive gate's methods; with the run's epochs, a start at or after its end.
    import optim

    try:
        optim.check_step_kinds(
            cfg.method,
            {**optim.METHODS[cfg.method].hparams, **cfg.hparams},
            scope=cfg.scope,
            schedule=cfg.schedule,
            epochs=epochs,
        )
    except ValueError as err:
        field = "schedule" if str(err).startswith("schedule") else "scope"
        raise ValueError(f"optimizer.{field}: {err}") from None


@functools.lru_cache(maxsize=1024)
def _hparam_problem(
    method: str,
    hparams: tuple,
    base: str,
    lr: float,
    momentum: float,
    betas: tuple,
    global_perturbation: bool,
    weight_decay: float = 0.0,
) -> str | None:
    """What `_check_hparam_values` finds wrong with these settings (the fields it reads), or None."""
    cfg = types.SimpleNamespace(
        method=method,
        hparams={k: v for k, _, v in hparams},
        base=base,
        lr=lr,
        momentum=momentum,
        betas=betas,
        global_perturbation=global_perturbation,
        weight_decay=weight_decay,
    )
    try:
        _check_hparam_values(cfg)
    except ValueError as err:
        return str(err)
    return None


def _check_hparam_values(cfg: "OptimizerConfig") -> None:
    # The registry entry is the one place a method's knob rules live (its class checks with the same rules): a bad
    # value (rho < 0, k = 0, e_start < e_tilde, msam on SGD without momentum) fails at load, without torch.
    import optim

    # AdamW keeps a first moment whatever its settings; SGD keeps one when its momentum is > 0.
    try:
        optim.check_hparams(
            cfg.method,
            base={"sgd": "SGD", "adamw": "AdamW"}.get(cfg.base, cfg.base),
            base_keeps_momentum=cfg.base != "sgd" or cfg.momentum > 0,
            global_perturbation=cfg.global_perturbation,
            **cfg.hparams,
        )
    except (ValueError, TypeError) as err:
        raise ValueError(f"optimizer.hparams: {err}") from None
    # A method with an update of its own (bSAM) reads none of the base optimizer's knobs but lr: its registry entry
    # says which must hold one value and which must stay at their defaults (optim.check_base, the one home of both).
    base_knobs = ("base", "weight_decay", "momentum", "betas")
    try:
        optim.check_base(
            cfg.method,
            {k: tuple(getattr(cfg, k)) if k == "betas" else getattr(cfg, k) for k in base_knobs},
            {k: OptimizerConfig.model_fields[k].default for k in base_knobs},
        )
    except ValueError as err:
        raise ValueError(f"optimizer.{err}") from None


class ScheduleConfig(_Strict):
    """Epochs and the learning-rate schedule (timm's schedulers, stepped every update)."""

    epochs: int = Field(10, ge=1, description="Epochs the trial trains (the schedule's length).")
    sched: Literal["cosine", "linear", "constant"] = Field(
        "cosine",
        description="Per-step decay to min_lr after the warm-up, cosine or linear; constant: optimizer.lr throughout, "
        "no warm-up.",
    )
    warmup_epochs: int = Field(0, ge=0, description="Epochs of linear warm-up from warmup_lr to optimizer.lr.")
    warmup_lr: float = Field(1e-6, ge=0.0, description="Learning rate the warm-up starts from.")
    min_lr: float = Field(0.0, ge=0.0, description="Learning rate the decay ends at (cosine and linear).")

    @model_validator(mode="after")
    def _warmup_fits(self) -> "ScheduleConfig":
        if self.warmup_epochs >= self.epochs:
            raise ValueError(
                f"schedule.warmup_epochs: must be < schedule.epochs ({self.epochs}), got {self.warmup_epochs}. "
                f"Fix: shorten the warm-up or train longer."
            )
        return self


class TrainConfig(_Strict):
    """How the loop runs: seed, device, precision, loss options, checkpoints."""

    seed: int = Field(0, ge=0, description="Seeds the weights' initialisation, batch order, dropout and augmentation.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when a GPU is visible, else CPU.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 autocast on CUDA, fp32 on CPU."
    )
    channels_last: bool | None = Field(None, description="None: on for CUDA, off for CPU.")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="Label smoothing of the cross-entropy loss.")
    threads: int | None = Field(None, ge=1, description="torch CPU threads per process; None leaves torch's choice.")
    checkpoint_every: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        1,
        description="Epochs between checkpoints (the last epoch always saves). 'auto': after the first epoch, then "
        f"once the trial has run {CHECKPOINT_AUTO_RATIO} times as long as its last checkpoint took to write and hand "
        f"over (so checkpoints cost about 1/{CHECKPOINT_AUTO_RATIO} of its time); an interrupted trial resumes from "
        "its last checkpoint, losing at most that long a stretch.",
    )
    eval_every: int = Field(
        1,
        ge=1,
        description="Epochs between validation passes (the last epoch is always evaluated); an epoch not evaluated "
        "logs no validation metrics (val_*, best_*). For long runs on small fractions, so that validation does not "
        "outweigh training.",
    )
    divergence_check_every: int = Field(
        20, ge=1, description="Steps between checks for a non-finite loss (each check syncs the device)."
    )
    compile: Literal[("auto", "off", *TRAIN_COMPILE_MODES)] = Field(  # type: ignore[valid-type]
        "auto",
        description="torch.compile of the training step's model (every method's passes, MESA's teacher): "
        "'reduce-overhead' adds CUDA graphs, 'default' compiles without them, 'off' runs eager. auto: "
        "reduce-overhead on CUDA, off on CPU (trainables.compiled.resolve_compile says which settings fall back).",
    )
    compile_cache: str | None = Field(
        None,
        description="Directory of torch's compile cache (Inductor's FX graph and kernel caches), shared by the "
        "trials that name it; it holds code the trials run, so it must be the trial user's own, mode 700, under "
        "folders no other user can write (else the trial is refused). None: <tempdir>/sharpscale-compile-<uid> on "
        "each node's own disk (trainables.compiled.use_cache_dir).",
    )

    def evaluates(self, epoch: int, epochs: int) -> bool:
        """Whether the validation split is evaluated after `epoch` (0-based) of a run of `epochs` epochs."""
        return epoch == epochs - 1 or (epoch + 1) % self.eval_every == 0


class GeometryConfig(_Strict):
    """Loss-geometry measures taken inside the trial, on its device, on a fixed set of its own training samples.

    Off unless `measures` names some. The measures are those of `analysis.geometry.probes.MEASURES` (the studies
    layer checks the names at load; trainables never imports analysis); the probe that takes them is handed to
    `trainables.fit` by the caller. Every measure of one measurement shares the samples, the mode and the mask seed:
    one Hessian per measurement set.
    """

    measures: list[str] = Field(
        default_factory=list,
        description="Names of the measures registered in analysis.geometry.probes.MEASURES (checked at study load "
        "against analysis.geometry.names.MEASURE_NAMES); empty: no geometry, no cost.",
    )
    every: int = Field(0, ge=0, description="Also measure after every k-th epoch; 0: only after the last epoch.")
    batches: int = Field(2, ge=1, description="Batches of fixed training samples the measures average over.")
    batch_size: int = Field(128, ge=1, description="Samples per measurement batch (unaugmented, drawn once by seed).")
    seed: int = Field(
        0,
        ge=0,
        description="Draws the fixed samples, Lanczos' start vector and the probe vectors; in train mode also the "
        "dropout/drop-path masks (analysis.geometry's mask_seed), the same for every measure.",
    )
    mode: Literal["eval", "train"] = Field(
        "eval", description="BatchNorm and dropout as in evaluation, or as in training with masks fixed by seed."
    )
    hvp_mode: str = Field("auto", description="analysis.geometry's hvp_mode (auto picks an exact mode per model).")
    max_iter: int = Field(20, ge=1, description="lambda_max / blockwise: Lanczos iterations (one HVP each).")
    tol: float = Field(1e-3, gt=0.0, allow_inf_nan=False, description="lambda_max / blockwise: relative tolerance.")
    trace_samples: int = Field(32, ge=2, description="hessian_trace: Hutchinson probe vectors (one HVP each).")
    flatness_sigma: float = Field(
        0.01, gt=0.0, allow_inf_nan=False, description="average_flatness: std of the weight noise."
    )
    flatness_draws: int = Field(10, ge=2, description="average_flatness: noise draws (one forward pass each).")
    surrogate_rho: float = Field(
        0.05,
        gt=0.0,
        allow_inf_nan=False,
        description="surrogate_gap: radius of the ascent step (not the method's rho).",
    )

    @field_validator("measures")
    @classmethod
    def _distinct_names(cls, measures: list[str]) -> list[str]:
        repeated = sorted({m for m in measures if measures.count(m) > 1})
        if repeated:
            raise ValueError(
                f"geometry.measures: each measure is listed once, got {repeated} more than once. Fix: list each once."
            )
        return measures

    @property
    def enabled(self) -> bool:
        return bool(self.measures)

    def due(self, epoch: int, epochs: int) -> bool:
        """Whether the measures are taken after `epoch` (0-based) of a run of `epochs` epochs."""
        if not self.measures:
            return False
        return epoch == epochs - 1 or (self.every > 0 and (epoch + 1) % self.every == 0)


class TrialConfig(_Strict):
    """One trial: what `trainables.fit` runs and what MLflow records as the run's params."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    geometry: GeometryConfig = Field(default_factory=GeometryConfig)

    @model_validator(mode="after")
    def _schedule_within_the_run(self) -> "TrialConfig":
        # The optimizer section checked its schedule's form; a start (an epoch, or a fraction of schedule.epochs) is
        # checked against the run's length here, where both are known.
        if self.optimizer.schedule is not None:
            _check_step_kinds(self.optimizer, epochs=self.schedule.epochs)
        return self

    @classmethod
    def load(cls, data: "TrialConfig | dict[str, Any]") -> "TrialConfig":
        """Validate a plain dict (or pass a TrialConfig through); a ConfigError lists every problem at once."""
        if isinstance(data, cls):
            return data
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err)) from None

    def flat(self) -> dict[str, Any]:
        """Dotted-key view (`optimizer.hparams.rho`), the form logged as MLflow params."""
        return _flatten(self.model_dump(mode="json"))


class ConfigError(UserError):
    """A configuration is invalid; the message lists each problem with its field path, rule, value and fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(f"  - {p}" for p in self.problems))


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def format_validation_error(err: ValidationError, prefix: str = "") -> list[str]:
    """One line per pydantic error: `path: rule, got value.` (custom validators already carry their fix)."""
    lines: list[str] = []
    unions: dict[tuple[str, str], list[str]] = {}  # (path, value shown) -> each union member's rule, in order
    for e in err.errors():
        # A union's members name themselves in the location (factors.x.list[any]): the field is the path without them.
        loc = [str(p) for p in e["loc"] if not _union_member(p)]
        path = prefix + ".".join(loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key. Fix: remove it or check its spelling.")
        elif e["type"] == "value_error":
            # Our own validators name their field themselves, one problem a line.
            for line in msg.split("\n"):
                lines.append(line if ":" in line.split(" ")[0] else f"{path}: {line}")
        elif len(loc) < len(e["loc"]):
            key = (path, shown(e.get("input")))
            if key not in unions:
                unions[key] = []
                lines.append(key)  # placeholder: one line for all of the union's members, where the first came
            unions[key].append(msg.removeprefix("Input should be "))
        else:
            lines.append(f"{path}: {msg}, got {shown(e.get('input'))}.")
    return [
        f"{line[0]}: Input should be {' or '.join(unions[line])}, got {line[1]}." if isinstance(line, tuple) else line
        for line in lines
    ]


# The tags pydantic-core gives a union's members in an error's location (their schema types: 'list[any]',
# 'dict[str,any]', 'function-after[check(), ...]', 'literal['a','b']'): never a user's key such as a factor 'x[1]'.
_UNION_MEMBER = re.compile(
    r"(list|dict|set|frozenset|tuple|literal|nullable|union|tagged-union|chain|lax-or-strict|json-or-python|"
    r"is-instance|is-subclass|model|dataclass|typed-dict|definition-ref|default|constrained|"
    r"function-(after|before|wrap|plain))\[.*\]",
    re.DOTALL,
)


def _union_member(part: Any) -> bool:
    """Whether a pydantic error location part names a member of a union (one of pydantic-core's schema tags, see
    _UNION_MEMBER) rather than a field, a key or an index."""
    return isinstance(part, str) and _UNION_MEMBER.fullmatch(part) is not None

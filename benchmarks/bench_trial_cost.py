"""Where a trial's time goes outside its training passes, phase by phase, without Ray, Optuna or MLflow.

For each model of the shipped CIFAR studies (ResNet-18 with the CIFAR stem, ViT-S/4, Mixer-S/4 at 32 px, batch 256),
`trainables.fit` runs one trial as a study runs it (validation and a checkpoint after every epoch, the
rho_sensitivity measures after the last epoch with --geometry) on a fake CIFAR-10 in the official layout that the
script writes (random pixels), with fit's phases timed by wrapping the loop's own functions: data load, model build,
loaders, the measurement set and the probe's check, each epoch's training pass (epoch_time_s), validation,
checkpoint, geometry. Each trial's fixed cost is its wall time less the sum of its epoch_time_s; validation images/s
(what the cost estimate counts validation from) is the validation split over the validation seconds. Then, once, in
a fresh interpreter: the cold cost of a trial process (imports of torch, timm and trainables, the CUDA context).
What it does not see: Ray's actor start and Tune's checkpoint copy to storage, MLflow's records (about 0.1 s a call on
SQLite; trainables.ray_train logs each trial's fixed_time_s with them included).

With --record, each model's figures become rows of benchmarks/results/trial_cost.csv, the file `sharpscale run
--dry-run` costs a study from (studies/cost.py): train_none / train_sam (the last epoch's images/s), val, fixed_s
(the trial's wall less its epochs, validation, checkpoints and geometry), checkpoint_s (one), geometry_s (one
Hessian-vector product per measurement image) and, on the GPU, nothing of the compiled step (bench_trainables
compile measures that). --smoke measures the three tiny models of a study's --smoke form on the embedded digits on
CPU (studies/spec/_smoke.py), so that a --smoke study gets an estimate that its run then checks. --study STUDY
measures the models of a study's own cells (each distinct model, image size and batch once, none and SAM, on the
device and data the study sets, --epochs of them): the rows a study such as the quickstart on CPU is costed from.

  python -m benchmarks.bench_trial_cost --geometry --record  # on the GPU: the three models, none and SAM
  python -m benchmarks.bench_trial_cost --smoke --record     # CPU: the --smoke form's models
  python -m benchmarks.bench_trial_cost --study studies/quickstart.yaml --record  # the quickstart's own models
  python -m benchmarks.bench_trial_cost --quick              # tiny model, digits-sized, on CPU: the script only
"""

from __future__ import annotations

import argparse
import collections
import copy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import trainables.loop as loop

MODELS = {
    "ResNet-18": {"name": "resnet18", "cifar_stem": True},
    "ViT-S/4": {"name": "vit_small_patch16_224", "kwargs": {"patch_size": 4}},
    "Mixer-S/4": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4}},
}
QUICK = {"tiny mixer": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 1, "embed_dim": 16}}}
PHASES = {
    "load_dataset": "data load",
    "create_model": "model build",
    "_loaders": "loaders",
    "_geometry_batches": "measurement set",
    "_check_probe": "probe check",
    "_evaluate": "validation",
    "_save": "checkpoint",
    "_measure_geometry": "geometry",
}


def _timed(spent: dict[str, float], label: str, fn, device: str, calls: dict[str, int]):
    def wrapper(*args, **kwargs):
        calls[label] += 1
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if device == "cuda":
                torch.cuda.synchronize()
            spent[label] += time.perf_counter() - t0

    return wrapper


def trial(cfg: dict, device: str, probe=None, calls=None) -> tuple[float, float, dict[str, float], list[dict]]:
    """One fit with its phases timed: (wall, sum of epoch_time_s, seconds per phase, the epochs' metrics); `calls`,
    where given, counts each phase's calls."""
    spent: dict[str, float] = collections.defaultdict(float)
    calls = collections.defaultdict(int) if calls is None else calls
    saved = {name: getattr(loop, name) for name in PHASES if hasattr(loop, name)}
    for name, fn in saved.items():
        setattr(loop, name, _timed(spent, PHASES[name], fn, device, calls))
    seen: list[dict] = []
    try:
        t0 = time.perf_counter()
        loop.fit(cfg, reporter=lambda m, c: seen.append(m), probe=probe)
        wall = time.perf_counter() - t0
    finally:
        for name, fn in saved.items():
            setattr(loop, name, fn)
    return wall, sum(m["epoch_time_s"] for m in seen), dict(spent), seen


def cold_start(device: str) -> dict[str, float]:
    """Seconds a fresh trial process pays before its first step, in a new interpreter."""
    code = (
        "import time; t=time.perf_counter(); import torch; a=time.perf_counter(); import timm; b=time.perf_counter(); "
        "import trainables.loop, trainables.config; c=time.perf_counter(); "
        f"torch.zeros(1, device='{device}'); d=time.perf_counter(); "
        "print(a-t, b-a, c-b, d-c)"
    )
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=_env(root)
    )
    keys = ("import torch", "import timm", "import trainables", "CUDA context" if device == "cuda" else "first tensor")
    return dict(zip(keys, map(float, out.stdout.split())))


def _env(root: str) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def study_models(path: str) -> dict[str, dict]:
    """One trial config of each distinct (model, image size, batch) among the study's cells, keyed by its figure
    prefix (studies.cost's key of the model); the cell's data, train and geometry sections as the study sets them."""
    from studies.cost import model_key
    from studies.spec import load_study
    from trainables.config import TrialConfig
    from trainables.data.registry import DATASETS

    out = {}
    for cell in load_study(path, require_data=False).cells:
        data = TrialConfig.load(cell.config).data
        size = data.img_size or DATASETS[data.name].default_size
        out.setdefault(f"{model_key(cell.config.get('model', {}))} {size}px b{data.batch_size}", cell.config)
    return out


def _config(model: dict, method: str, args, device: str, root: str | None) -> dict:
    if args.study:  # `model` is the cell's whole config (study_models)
        cfg = copy.deepcopy(model)
        cfg["optimizer"] = {**cfg.get("optimizer", {}), "method": method}
        cfg["optimizer"]["hparams"] = {"rho": 0.05} if method == "sam" else {}
        cfg["schedule"] = {**cfg.get("schedule", {}), "epochs": args.epochs, "warmup_epochs": 0}
        if not args.geometry:
            cfg.pop("geometry", None)
        return cfg
    if args.smoke:
        from studies.spec._smoke import _SMOKE

        cfg = {**copy.deepcopy(_SMOKE), "model": model}
        cfg["optimizer"] = {"method": method, "lr": 1e-3, "hparams": {"rho": 0.05} if method == "sam" else {}}
        if not args.geometry:
            cfg.pop("geometry")
        else:
            cfg["geometry"].update(measures=["lambda_max", "hessian_trace"])
        return cfg
    batch = 64 if args.quick else 256
    cfg = {
        "model": model,
        "data": {"name": "cifar10", "root": root, "batch_size": batch, "augment": "basic"},
        "optimizer": {"method": method, "lr": 1e-3, "hparams": {"rho": 0.05} if method == "sam" else {}},
        "schedule": {"epochs": args.epochs, "warmup_epochs": 0},
        "train": {"device": device},
    }
    if args.geometry:
        cfg["geometry"] = {"measures": ["lambda_max", "hessian_trace"]}
        if args.quick:
            cfg["geometry"].update(batches=1, batch_size=16, max_iter=2, trace_samples=2)
    return cfg


def _figures(cfg: dict, wall: float, train: float, spent: dict, calls: dict, seen: list[dict], n_val: int):
    """The trial_cost.csv fields of one trial (studies/cost.py CardFigures), from what it measured; n_val: the
    validation images each validation pass read."""
    from studies.cost import geometry_image_hvps
    from trainables.config import TrialConfig

    config = TrialConfig.load(cfg)
    out = {"train": seen[-1]["images_per_sec"]}
    if spent.get("validation"):
        out["val"] = calls["validation"] * n_val / spent["validation"]
    if spent.get("checkpoint"):
        out["checkpoint_s"] = spent["checkpoint"] / calls["checkpoint"]
    if spent.get("geometry"):
        out["geometry_s"] = spent["geometry"] / geometry_image_hvps(config.geometry, config.schedule.epochs)
    outside = sum(spent.get(k, 0.0) for k in ("validation", "checkpoint", "geometry"))
    out["fixed_s"] = wall - train - outside
    return out


def _record(rows: list[tuple]) -> None:
    """Each model's figures as trial_cost.csv rows: train_* from each method's trial, the rest from the SAM trial
    (the process's later trial of the model, past the first trial's warm-up)."""
    import os

    from benchmarks import results
    from studies.cost import model_key
    from trainables.config import TrialConfig
    from trainables.data.registry import DATASETS

    load = f"load average {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} cores)"
    out = []
    for key, model in {key: cfg["model"] for key, _, cfg, _ in rows}.items():
        mine = {method: figs for k, method, _, figs in rows if k == key}
        cfg = next(c for k, m, c, _ in rows if k == key)
        config = TrialConfig.load(cfg)
        size = config.data.img_size or DATASETS[config.data.name].default_size
        prefix = f"{model_key(model)} {size}px b{config.data.batch_size}"
        late = mine.get("sam") or next(iter(mine.values()))
        for method in ("none", "sam"):
            if method in mine:
                out.append(
                    {
                        "figure": f"{prefix} train_{method}",
                        "value": f"{mine[method]['train']:.4g}",
                        "unit": "img/s",
                        "note": f"{key}, the last of {config.schedule.epochs} epochs; {load}",
                    }
                )
        for field, unit in (("val", "img/s"), ("fixed_s", "s"), ("checkpoint_s", "s"), ("geometry_s", "s")):
            if field in late:
                out.append(
                    {
                        "figure": f"{prefix} {field}",
                        "value": f"{late[field]:.4g}",
                        "unit": unit,
                        "note": f"{key}; {load}",
                    }
                )
    path = results.append("trial_cost", out)
    print(f"# {len(out)} rows appended to {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-train", type=int, default=25_600, help="training images of the fake CIFAR-10 (default 25,600)")
    p.add_argument("--n-val", type=int, default=10_000, help="validation images (default CIFAR-10's 10,000)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--methods", nargs="+", default=["none", "sam"])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--geometry", action="store_true", help="also rho_sensitivity's measures after the last epoch")
    p.add_argument("--quick", action="store_true", help="tiny model and data on CPU: checks the script only")
    p.add_argument("--smoke", action="store_true", help="the --smoke form's models on digits, on CPU")
    p.add_argument("--study", help="the models of this study's cells, on its own device and data")
    p.add_argument("--record", action="store_true", help="append the figures to benchmarks/results/trial_cost.csv")
    args = p.parse_args()
    from benchmarks.bench_data import write_fake_cifar10

    device = "cpu" if args.quick or args.smoke else "cuda"
    if args.study:
        models = study_models(args.study)
        device = next(iter(models.values())).get("train", {}).get("device") or device
    elif args.smoke:
        from studies.spec._smoke import _SMOKE_MODELS

        models = {f"smoke {family}": model for family, model in _SMOKE_MODELS.items()}
        torch.set_num_threads(1)  # the smoke form's train.threads
    else:
        models = QUICK if args.quick else {k: MODELS[k] for k in args.models}
    n_train, n_val = (512, 256) if args.quick else (args.n_train, args.n_val)
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"# a trial's time outside training, {card}, torch {torch.__version__}")
    print(f"# cold trial process: {cold_start(device)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if not (args.smoke or args.study):
            write_fake_cifar10(Path(tmp), n_train, n_val)
        rows = []
        for key, model in models.items():
            for method in args.methods:
                cfg = _config(model, method, args, device, tmp)
                probe = None
                if "geometry" in cfg:
                    from analysis.geometry.probes import make_probe

                    probe = make_probe(cfg)
                calls: dict[str, int] = collections.defaultdict(int)
                wall, train, spent, seen = trial(cfg, device, probe, calls)
                if args.smoke or args.study:
                    from trainables.data.registry import DATASETS

                    n_val = DATASETS[cfg["data"]["name"]].split_sizes[1]
                figures = _figures(cfg, wall, train, spent, calls, seen, n_val)
                rows.append((key, method, cfg, figures))
                phases = ", ".join(f"{k} {v:.2f}" for k, v in spent.items())
                print(
                    f"{key} {method}: wall {wall:.2f} s, epochs {train:.2f} s, fixed {wall - train:.2f} s "
                    f"({phases}); train img/s {statistics.median(m['images_per_sec'] for m in seen):,.0f} (median of "
                    f"{len(seen)} epochs; the first pays for warm-up); "
                    + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()),
                    flush=True,
                )
    if args.record:
        _record(rows)


if __name__ == "__main__":
    main()

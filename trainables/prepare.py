"""The prepared form of an image folder (`sharpscale data prepare`): every image resized once so its shorter side is
near the crop's scale, re-encoded as a baseline JPEG, in the same train/val/class layout, with a manifest of how."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainables.errors import UserError, shown

__all__ = [
    "MANIFEST",
    "PrepareError",
    "Prepared",
    "default_short_side",
    "prepare_folder",
    "prepare_problems",
    "read_manifest",
]

#: The manifest's file name in a prepared folder; written last, so a folder holding it is complete.
MANIFEST = "sharpscale-prepared.json"
_FORMAT = "sharpscale-prepared-imagefolder"
_VERSION = 2  # 2: `subsampling` recorded (1 left it to PIL's default)
_SPLITS = ("train", "val")
#: The JPEG quality of re-encoded images (PIL's scale).
DEFAULT_QUALITY = 90
#: Chroma subsampling of re-encoded images.
SUBSAMPLING = "4:2:0"
# PIL writes quality above 95 with little gain and much larger files (its own documentation says to avoid them).
QUALITY_RANGE = (1, 95)
SHORT_SIDE_RANGE = (16, 8192)


class PrepareError(UserError):
    """A `data prepare` request that cannot be done as given (every problem at once, each with its fix)."""


def default_short_side(img_size: int) -> int:
    """The shorter side timm's eval transform resizes to before its central crop (floor(img_size / crop_pct): 256 for
    224): at this size the prepared eval images are what the eval transform makes of the originals, resized once."""
    from trainables.jpeg import eval_resize_size  # torch's import only when asked: the CLI builds its help without it

    return eval_resize_size(img_size)


@dataclass(frozen=True)
class Prepared:
    """What `prepare_folder` did: the manifest's contents."""

    format: str
    version: int
    source: str
    short_side: int
    quality: int
    subsampling: str
    resample: str
    files: dict[str, int]
    resized: int
    copied: int
    bytes_before: int
    bytes_after: int
    pixels_before: int
    pixels_after: int
    seconds: float
    created: str
    pillow: str


def _images(split_dir: Path) -> list[tuple[Path, Path]]:
    """(source file, path relative to the split) of every image torchvision's ImageFolder would list."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    classes, class_to_idx = find_classes(str(split_dir))
    samples = make_dataset(str(split_dir), class_to_idx, extensions=IMG_EXTENSIONS, allow_empty=True)
    return [(Path(p), Path(p).relative_to(split_dir)) for p, _ in samples]


def prepare_problems(source: Path, dest: Path, *, short_side: int, quality: int, workers: int) -> list[str]:
    """Every reason `prepare_folder(source, dest, ...)` cannot run, each naming the value, the rule and the fix."""
    problems = []
    from trainables.fetch import expected_layout  # here: the CLI builds its help from this module's constants

    layout = expected_layout("imagefolder")
    if not source.is_dir():
        problems.append(f"SOURCE '{source}' is not a directory. Fix: name a folder laid out as {layout}.")
    else:
        missing = [s for s in _SPLITS if not (source / s).is_dir()]
        if missing:
            problems.append(
                f"SOURCE '{source}' has no {' or '.join(repr(s) for s in missing)} folder. Fix: name a folder laid "
                f"out as {layout}."
            )
        elif (source / MANIFEST).is_file():
            problems.append(
                f"SOURCE '{source}' is itself a prepared folder ({MANIFEST} is there): resizing it again would "
                "resample twice. Fix: prepare from the original folder."
            )
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        problems.append(
            f"--to '{dest}' exists and is not an empty directory: prepare never writes over files. Fix: name a new "
            "directory, or remove that one."
        )
    if source.is_dir() and dest.resolve().is_relative_to(source.resolve()):
        problems.append(f"--to '{dest}' lies inside SOURCE '{source}'. Fix: name a directory outside it.")
    lo, hi = SHORT_SIDE_RANGE
    if not lo <= short_side <= hi:
        problems.append(f"--short-side must be in [{lo}, {hi}] pixels, got {short_side}. Fix: e.g. 256 for 224 crops.")
    lo, hi = QUALITY_RANGE
    if not lo <= quality <= hi:
        problems.append(f"--quality must be in [{lo}, {hi}] (PIL's JPEG quality), got {quality}. Fix: e.g. 90.")
    if workers < 1:
        problems.append(f"--workers must be at least 1, got {workers}. Fix: e.g. {os.cpu_count() or 1}.")
    return problems


def resized_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """(height, width) with the shorter side `short_side` and the longer int(short_side * long / short), as
    torchvision's Resize(int) computes it; an image whose shorter side is already at most `short_side` keeps its
    size (never upscaled)."""
    short, long = min(height, width), max(height, width)
    if short <= short_side:
        return height, width
    other = int(short_side * long / short)
    return (short_side, other) if height <= width else (other, short_side)


def _prepare_one(job: tuple[str, str, int, int]) -> tuple[int, int, int, int, bool, bool] | str:
    """One image: (bytes before, bytes after, pixels before, pixels after, resized, copied as it was), or why it
    could not be read (every unreadable image is listed at the end, not the first one alone)."""
    from PIL import Image

    try:
        return _prepare_image(*job)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:  # PIL's errors for a bad file
        with contextlib.suppress(OSError):
            os.remove(job[1])
        return f"{type(err).__name__}: {err}"


def _prepare_image(src: str, dst: str, short_side: int, quality: int) -> tuple[int, int, int, int, bool, bool]:
    from PIL import Image

    data_before = os.path.getsize(src)
    with Image.open(src) as img:
        w, h = img.size
        new_h, new_w = resized_size(h, w, short_side)
        resize = (new_h, new_w) != (h, w)
        # A progressive JPEG is re-encoded even when small enough: the prepared form is baseline throughout.
        if not resize and img.format == "JPEG" and img.mode == "RGB" and not img.info.get("progressive"):
            shutil.copyfile(src, dst)  # already small: the original bytes, no second compression
            return data_before, data_before, h * w, h * w, False, True
        rgb = img.convert("RGB")  # what both decode paths read (ImageReadMode.RGB; PIL's convert("RGB"))
        if resize:
            # PIL's antialiased bicubic, the filter timm's eval Resize applies to PIL images.
            rgb = rgb.resize((new_w, new_h), Image.Resampling.BICUBIC)
        # Baseline (not progressive): nvjpeg decodes it on its hardware path. 4:2:0 chroma, as most cameras' and
        # ImageNet's JPEGs (and what was measured). EXIF is dropped, but no orientation is lost: neither decode path
        # applies it (torchvision's ImageFolder loader and decode_jpeg leave the pixels as stored).
        rgb.save(dst, "JPEG", quality=quality, subsampling=SUBSAMPLING)
    return data_before, os.path.getsize(dst), h * w, new_h * new_w, resize, False


def prepare_folder(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    short_side: int,
    quality: int = DEFAULT_QUALITY,
    workers: int | None = None,
    log=None,
) -> Prepared:
    """Write the prepared form of image folder `source` to `dest` (which must not exist or be empty) and return what
    was done (also `dest/sharpscale-prepared.json`).

    Each image of train/ and val/ is resized so its shorter side is `short_side` (aspect kept, never upscaled) with
    PIL's bicubic filter and saved as an RGB baseline JPEG at `quality` under the same class folder, named
    `<stem>.jpg`; baseline JPEGs already small enough are copied as they are (a progressive one is re-encoded).
    Everything is written to a sibling folder first and renamed to `dest` at the end, so an interrupted run leaves
    no half-prepared `dest`; an image that cannot be read refuses the whole run after every image was tried, listing
    each unreadable one (the prepared form holds every image of the original or none).
    """
    from trainables import fetch  # here, not at the top: see prepare_problems

    source, dest = Path(source).expanduser(), Path(dest).expanduser()
    workers = (os.cpu_count() or 1) if workers is None else workers
    problems = prepare_problems(source, dest, short_side=short_side, quality=quality, workers=workers)
    jobs: list[tuple[str, str, int, int]] = []
    counts: dict[str, int] = {}
    staging = dest.parent / f".{dest.name}.preparing-{os.getpid()}"
    if not problems:
        for split in _SPLITS:
            images = _images(source / split)
            counts[split] = len(images)
            seen: dict[Path, Path] = {}
            for path, rel in images:
                out = rel.with_suffix(".jpg")
                if out in seen:
                    problems.append(
                        f"'{path}' and '{seen[out]}' would both be written as {split}/{out}. Fix: rename one of them."
                    )
                seen[out] = path
                jobs.append((str(path), str(staging / split / out), short_side, quality))
        if not counts.get("train"):
            problems.append(f"SOURCE '{source}/train' holds no images. Fix: name a folder laid out as "
                            f"{fetch.expected_layout('imagefolder')}.")  # fmt: skip
    if problems:
        raise PrepareError("cannot prepare the image folder:\n  - " + "\n  - ".join(problems))

    t0 = time.perf_counter()
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for d in {Path(j[1]).parent for j in jobs}:
            d.mkdir(parents=True, exist_ok=True)
        for split in _SPLITS:
            (staging / split).mkdir(parents=True, exist_ok=True)
        if log:
            log(f"Preparing {len(jobs)} images from {source} (short side {short_side}, quality {quality}, "
                f"{workers} workers)")  # fmt: skip
        if workers == 1:
            done = [_prepare_one(j) for j in jobs]
        else:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=workers) as pool:
                done = list(pool.map(_prepare_one, jobs, chunksize=max(1, min(64, len(jobs) // (4 * workers)))))
        unreadable = [(job[0], why) for job, why in zip(jobs, done) if isinstance(why, str)]
        if unreadable:
            raise PrepareError(
                f"cannot prepare the image folder: {len(unreadable)} image(s) in SOURCE could not be read, and the "
                f"prepared form must hold every image of the original (nothing was written):\n  - "
                + "\n  - ".join(f"'{path}': {why}" for path, why in unreadable)
                + "\nFix: replace or remove each of them in SOURCE, then run `sharpscale data prepare` again."
            )
        from PIL import __version__ as pillow

        prepared = Prepared(
            format=_FORMAT,
            version=_VERSION,
            source=str(source.resolve()),
            short_side=short_side,
            quality=quality,
            subsampling=SUBSAMPLING,
            resample="PIL bicubic (antialiased)",
            files=counts,
            resized=sum(d[4] for d in done),
            copied=sum(d[5] for d in done),
            bytes_before=sum(d[0] for d in done),
            bytes_after=sum(d[1] for d in done),
            pixels_before=sum(d[2] for d in done),
            pixels_after=sum(d[3] for d in done),
            seconds=round(time.perf_counter() - t0, 3),
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            pillow=pillow,
        )
        (staging / MANIFEST).write_text(json.dumps(asdict(prepared), indent=2) + "\n")
        if dest.exists():
            dest.rmdir()  # empty, checked above
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return prepared


def read_manifest(root: str | os.PathLike) -> Prepared | None:
    """The manifest of a prepared folder at `root`, or None when `root` is not one; a PrepareError for a manifest of
    another version (a field added since: prepare it again)."""
    path = Path(root).expanduser() / MANIFEST
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    if raw.get("format") != _FORMAT:
        return None
    missing = [k for k in Prepared.__dataclass_fields__ if k not in raw]
    if raw.get("version") != _VERSION or missing:
        raise PrepareError(
            f"{path}: a prepared folder's manifest of version {shown(raw.get('version'))}, but this sharpscale reads "
            f"version {_VERSION}" + (f" (it lacks {', '.join(missing)})" if missing else "") + ". Fix: prepare the "
            "source again with this version's `sharpscale data prepare`."
        )
    return Prepared(**{k: raw[k] for k in Prepared.__dataclass_fields__})

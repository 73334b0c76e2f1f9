"""The prepared forms of an image folder (`sharpscale data prepare`): every image resized once so its shorter side is
near the crop's scale, kept as baseline JPEGs in the same layout or as decoded pixels in one file a split, with a
manifest of how; and the reader of the pixel form."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainables.errors import UserError, no_space, shown

__all__ = [
    "FORMS",
    "MANIFEST",
    "PixelSplit",
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
_VERSION = 3  # 3: `form` and `classes` (2 was the JPEG form alone); 2: `subsampling` (1 left it to PIL's default)
_SPLITS = ("train", "val")
#: The prepared forms: baseline JPEGs in the original's layout (an ordinary image folder), or the decoded pixels of
#: each split in one file (no decode at all when training: the bytes are the image).
FORMS = ("jpeg", "pixels")
# The pixel form, per split: every image's uint8 RGB rows (height x width x 3) back to back, and an int64 index of
# (offset, height, width, label) per image, in torchvision ImageFolder's order.
PIXELS_FILE = "pixels.u8"
INDEX_FILE = "index.npy"


def _stored_bytes(height, width):
    """Bytes of an image as the pixel form stores it, uint8 RGB rows (ints or numpy arrays of them): the one home of
    that rule, for the writer, the index check and the readers."""
    return height * width * 3


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
    # torch's import only when asked: the CLI builds its help without it
    from trainables.data.crops import eval_resize_size

    return eval_resize_size(img_size)


@dataclass(frozen=True)
class Prepared:
    """What `prepare_folder` did: the manifest's contents."""

    format: str
    version: int
    form: str
    source: str
    short_side: int
    quality: int | None  # the JPEG form's; None for pixels
    subsampling: str | None
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
    classes: list[str]  # the class names, label order (the pixel form has no class folders to list them)


def _images(
    split_dir: Path, classes: list[str] | None = None
) -> tuple[list[str], list[tuple[Path, Path, int]], list[tuple[Path, str]]]:
    """The class names, (source file, path relative to the split, label) of every image torchvision's ImageFolder
    would list, in its order, and (path, why) of each listed name that is no regular file; `classes` (the train
    split's) numbers the labels of another split.

    Unlike ImageFolder's walk, each real directory is entered once and each real file listed once: a link loop was
    walked some 40 levels deep (a class multiplied 41-fold), and a FIFO named like an image blocked its reader."""
    import stat

    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

    found, class_to_idx = find_classes(str(split_dir))
    if classes is not None:
        class_to_idx = {c: i for i, c in enumerate(classes)}
        found = [c for c in found if c in class_to_idx]
    samples: list[tuple[Path, Path, int]] = []
    not_files: list[tuple[Path, str]] = []
    files_seen: set[str] = set()
    for name in sorted(class_to_idx):
        if not (split_dir / name).is_dir():
            continue
        for root, _, names in sorted(_walk_once(split_dir / name)):
            for fname in sorted(names):
                path = Path(root) / fname
                if not fname.lower().endswith(IMG_EXTENSIONS):
                    continue
                try:
                    mode = path.stat().st_mode
                except OSError as err:
                    not_files.append((path, f"cannot be read ({err.strerror}; a broken link?)"))
                    continue
                if not stat.S_ISREG(mode):
                    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
                    not_files.append((path, f"is {kind}, not a regular file, so it was not opened"))
                elif (real := os.path.realpath(path)) not in files_seen:
                    files_seen.add(real)
                    samples.append((path, path.relative_to(split_dir), class_to_idx[name]))
    return found, samples, not_files


def _walk_once(top: Path):
    """os.walk following links, entering each real directory once."""
    entered: set[str] = set()
    for root, dirs, names in os.walk(top, followlinks=True):
        real = os.path.realpath(root)
        if real in entered:
            dirs[:] = []  # a link back to a directory already walked (a loop, or a second name for it)
            continue
        entered.add(real)
        yield root, dirs, names


def prepare_problems(
    source: Path, dest: Path, *, short_side: int, quality: int | None, workers: int, form: str = "jpeg"
) -> list[str]:
    """Every reason `prepare_folder(source, dest, ...)` cannot run, each naming the value, the rule and the fix."""
    problems = []
    if form not in FORMS:
        problems.append(f"--form must be one of {list(FORMS)}, got {shown(form)}. Fix: e.g. --form pixels.")
    if form == "pixels" and quality is not None:
        problems.append(
            f"--quality is the JPEG form's, got {quality} with --form pixels (which stores pixels as they are). "
            "Fix: leave --quality out, or use --form jpeg."
        )
    for stale in sorted(dest.parent.glob(f".{dest.name}.preparing-*")) if dest.parent.is_dir() else ():
        problems.append(
            f"'{stale}' is what an interrupted `data prepare` to --to '{dest}' left (a killed run cannot remove "
            f"it), and may hold many GB. Fix: remove it (rm -r '{stale}'), unless a run to '{dest}' is still going."
        )
    from trainables.data.fetch import expected_layout  # here: the CLI builds its help from this module's constants

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
    if quality is not None and not lo <= quality <= hi:
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


def _pixel_header(src: str) -> tuple[int, int] | str:
    """(height, width) of an image as stored (its header alone), or why it cannot be read."""
    from PIL import Image

    try:
        with Image.open(src) as img:
            return img.size[1], img.size[0]
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        return f"{type(err).__name__}: {err}"


def _pixels_one(job: tuple[str, str, int, int, int]) -> tuple[int, int, int, int, bool, bool] | str:
    """One image decoded, resized and written at its offset in the split's pixel file: the statistics
    `_prepare_one` returns, or why it could not be read."""
    from PIL import Image

    src, dst, offset, short_side, expected = job
    try:
        data_before = os.path.getsize(src)
        with Image.open(src) as img:
            w, h = img.size
            new_h, new_w = resized_size(h, w, short_side)
            rgb = img.convert("RGB")
            if (new_h, new_w) != (h, w):
                rgb = rgb.resize((new_w, new_h), Image.Resampling.BICUBIC)  # as the JPEG form resizes
            data = rgb.tobytes()  # RGB rows, height x width x 3: the layout the reader views
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        return f"{type(err).__name__}: {err}"
    if len(data) != expected:  # the header's size promised another: never write over a neighbour
        return f"decoded to {len(data)} bytes where its header promised {expected}"
    fd = os.open(dst, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:  # a write may be short; the file is sparse, so a byte not written would read as black
            view = view[os.pwrite(fd, view, offset + len(data) - len(view)) :]
    finally:
        os.close(fd)
    return data_before, len(data), h * w, new_h * new_w, (new_h, new_w) != (h, w), False


def _worker_start() -> None:
    # A worker forked inside _sigterm_interrupts would turn the SIGTERM that ends it into a caught exception.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_jobs(fn, jobs: list, workers: int) -> list:
    """`fn` over `jobs` in order, in `workers` processes (in this one for 1). A stop ends the workers with it."""
    if workers == 1 or len(jobs) < 2:
        return [fn(j) for j in jobs]
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_start)
    try:
        return list(pool.map(fn, jobs, chunksize=max(1, min(64, len(jobs) // (4 * workers)))))
    except BaseException:
        # SIGTERM reaches this process alone (Ctrl-C reaches the workers too): without this they would go on
        # writing into a staging folder being removed, orphaned. The executor has no public way to end them.
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raised as KeyboardInterrupt while preparing (main thread only), so it cleans up as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _unreadable_error(unreadable: list[tuple[str, str]]) -> PrepareError:
    """The refusal that lists every image of SOURCE that could not be read, with why."""
    return PrepareError(
        f"cannot prepare the image folder: {len(unreadable)} image(s) in SOURCE could not be read, and the "
        f"prepared form must hold every image of the original (nothing was written):\n  - "
        + "\n  - ".join(f"'{path}': {why}" for path, why in unreadable)
        + "\nFix: replace or remove each of them in SOURCE, then run `sharpscale data prepare` again."
    )


def _write_jpegs(listing: dict, staging: Path, short_side: int, quality: int, workers: int) -> list:
    """Each image as a baseline JPEG under its split and class folder in `staging`: the statistics of each."""
    jobs = [(str(path), str(staging / split / rel.with_suffix(".jpg")), short_side, quality)
            for split, items in listing.items() for path, rel, _ in items]  # fmt: skip
    for d in {Path(j[1]).parent for j in jobs}:
        d.mkdir(parents=True, exist_ok=True)
    done = _run_jobs(_prepare_one, jobs, workers)
    unreadable = [(job[0], why) for job, why in zip(jobs, done) if isinstance(why, str)]
    if unreadable:
        raise _unreadable_error(unreadable)
    return done


def _write_pixels(listing: dict, staging: Path, short_side: int, workers: int) -> list:
    """Each split's pixel file and index. Two passes: the headers give every image's resized size, hence its offset;
    then each worker decodes, resizes and writes its images in place (no pixels cross a pipe)."""
    import numpy as np

    items = [(split, path, label) for split, its in listing.items() for path, _, label in its]
    headers = _run_jobs(_pixel_header, [str(path) for _, path, _ in items], workers)
    why_not = {str(path): why for (_, path, _), why in zip(items, headers) if isinstance(why, str)}
    jobs, offsets = [], dict.fromkeys(listing, 0)
    rows: dict[str, list[tuple[int, int, int, int]]] = {split: [] for split in listing}
    for (split, path, label), header in zip(items, headers):
        if isinstance(header, str):
            continue  # still decode every other image: the refusal lists each unreadable one, not the first pass's
        h, w = header
        new_h, new_w = resized_size(h, w, short_side)
        size = _stored_bytes(new_h, new_w)
        rows[split].append((offsets[split], new_h, new_w, label))
        jobs.append((str(path), str(staging / split / PIXELS_FILE), offsets[split], short_side, size))
        offsets[split] += size
    need, free = sum(offsets.values()), shutil.disk_usage(staging).free
    if need > free:  # refused before writing: a full disk met halfway would cost the run's time and leave nothing
        raise PrepareError(
            f"cannot prepare the image folder: the pixel form needs {need:,} bytes ({need / 1e9:.2f} GB), and "
            f"'{staging.parent}' has {free:,} free. Fix: free space there or name a --to on a larger disk (or use --form jpeg, "
            "about a tenth of the bytes)."
        )
    for split, total in offsets.items():
        with open(staging / split / PIXELS_FILE, "wb") as f:
            f.truncate(total)  # sparse until written: the workers fill it in place
    done = _run_jobs(_pixels_one, jobs, workers)
    why_not.update((job[0], why) for job, why in zip(jobs, done) if isinstance(why, str))
    if why_not:
        raise _unreadable_error([(str(path), why_not[str(path)]) for _, path, _ in items if str(path) in why_not])
    for split, split_rows in rows.items():
        with open(staging / split / INDEX_FILE, "wb") as f:
            np.save(f, np.asarray(split_rows, dtype=np.int64).reshape(-1, 4))
            _sync(f)
        with open(staging / split / PIXELS_FILE, "rb+") as f:
            _sync(f)
    return done


def _sync(f) -> None:
    # On disk before the manifest says the folder is complete: a crash after the rename must not leave holes.
    f.flush()
    os.fsync(f.fileno())


def prepare_folder(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    short_side: int,
    quality: int | None = None,
    workers: int | None = None,
    form: str = "jpeg",
    log=None,
) -> Prepared:
    """Write the prepared form of image folder `source` to `dest` (which must not exist or be empty) and return what
    was done (also `dest/sharpscale-prepared.json`).

    Each image of train/ and val/ is resized so its shorter side is `short_side` (aspect kept, never upscaled) with
    PIL's bicubic filter. `form` "jpeg": saved as an RGB baseline JPEG at `quality` (None: DEFAULT_QUALITY; the pixel
    form refuses one) under the same class folder,
    named `<stem>.jpg`; baseline JPEGs already small enough are copied as they are (a progressive one is
    re-encoded). `form` "pixels": the decoded RGB pixels of each split in one file (`PixelSplit` reads it), about 10x
    the JPEG form's bytes (2-4x a typical original's), and nothing left to decode when training; the disk's free
    space is checked before any pixel is written, and the files are synced before the manifest.
    Everything is written to a sibling folder first and renamed to `dest` at the end, so an interrupted run leaves
    no half-prepared `dest`; an image that cannot be read refuses the whole run after every image was tried, listing
    each unreadable one (the prepared form holds every image of the original or none).
    """
    source, dest = Path(source).expanduser(), Path(dest).expanduser()
    workers = (os.cpu_count() or 1) if workers is None else workers
    problems = prepare_problems(source, dest, short_side=short_side, quality=quality, workers=workers, form=form)
    quality = DEFAULT_QUALITY if quality is None else quality
    listing: dict[str, list[tuple[Path, Path, int]]] = {}
    classes: list[str] = []
    if not problems:
        classes, listing, found = _listing(source, form)
        problems += found
    if problems:
        raise PrepareError("cannot prepare the image folder:\n  - " + "\n  - ".join(problems))

    t0 = time.perf_counter()
    staging = dest.parent / f".{dest.name}.preparing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with _sigterm_interrupts():
        return _prepare_into(staging, dest, source, form, listing, classes, short_side, quality, workers, log, t0)


def _prepare_into(staging, dest, source, form, listing, classes, short_side, quality, workers, log, t0) -> Prepared:
    """prepare_folder's writing: into `staging`, renamed to `dest` at the end; `staging` removed whatever stops it."""
    try:
        for split in _SPLITS:
            (staging / split).mkdir(parents=True, exist_ok=True)
        if log:
            log(f"Preparing {sum(map(len, listing.values()))} images from {source} as {form} (short side {short_side}"
                + (f", quality {quality}" if form == "jpeg" else "") + f", {workers} workers)")  # fmt: skip
        if form == "jpeg":
            done = _write_jpegs(listing, staging, short_side, quality, workers)
        else:
            done = _write_pixels(listing, staging, short_side, workers)
        from PIL import __version__ as pillow

        prepared = Prepared(
            format=_FORMAT,
            version=_VERSION,
            form=form,
            source=str(source.resolve()),
            short_side=short_side,
            quality=quality if form == "jpeg" else None,
            subsampling=SUBSAMPLING if form == "jpeg" else None,
            resample="PIL bicubic (antialiased)",
            files={split: len(items) for split, items in listing.items()},
            resized=sum(d[4] for d in done),
            copied=sum(d[5] for d in done),
            bytes_before=sum(d[0] for d in done),
            bytes_after=sum(d[1] for d in done),
            pixels_before=sum(d[2] for d in done),
            pixels_after=sum(d[3] for d in done),
            seconds=round(time.perf_counter() - t0, 3),
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            pillow=pillow,
            classes=classes,
        )
        with open(staging / MANIFEST, "w") as f:
            f.write(json.dumps(asdict(prepared), indent=2) + "\n")
            _sync(f)
        if dest.exists():
            dest.rmdir()  # empty, checked above
        staging.rename(dest)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if (full := no_space(err)) is not None and not isinstance(err, PrepareError):
            raise PrepareError(
                f"cannot prepare the image folder: the disk of --to '{dest}' filled while writing ({full}); nothing "
                "was kept. Fix: free space there or name a --to on a larger disk, then run it again."
            ) from err
        raise
    return prepared


def _listing(source: Path, form: str) -> tuple[list[str], dict[str, list[tuple[Path, Path, int]]], list[str]]:
    """The train split's classes, every split's images, and the problems of that listing for `form`."""
    from trainables.data import fetch  # here, not at the top: see prepare_problems

    problems: list[str] = []
    layout = fetch.expected_layout("imagefolder")
    try:
        classes, train, not_train = _images(source / "train")
        val_classes, _, _ = _images(source / "val")
        _, val, not_val = _images(source / "val", classes)
    except FileNotFoundError as err:  # torchvision's: a split without class folders
        return [], {}, [f"SOURCE '{source}': {err}. Fix: name a folder laid out as {layout}."]
    listing = {"train": train, "val": val}
    problems += [
        f"'{path}' {why}. Fix: remove it from SOURCE, or put the image file itself there."
        for path, why in [*not_train, *not_val]
    ]
    if set(val_classes) != set(classes):
        only_train, only_val = sorted(set(classes) - set(val_classes)), sorted(set(val_classes) - set(classes))
        problems.append(
            f"SOURCE '{source}': train/ and val/ have different class folders (only in train: {only_train}; only in "
            f"val: {only_val}), which the image folder it prepares would refuse. Fix: give both the same class folders."
        )
    for split, items in listing.items() if form == "jpeg" else ():  # the pixel form writes no file an image
        seen: dict[Path, Path] = {}
        for path, rel, _ in items:
            out = rel.with_suffix(".jpg")
            if out in seen:
                problems.append(
                    f"'{path}' and '{seen[out]}' would both be written as {split}/{out}. Fix: rename one of them."
                )
            seen[out] = path
    for split, items in listing.items():
        if not items:
            problems.append(f"SOURCE '{source}/{split}' holds no images. Fix: name a folder laid out as {layout}.")
    return classes, listing, problems


class PixelSplit:
    """One split of a folder prepared in the pixel form: `len`, `labels`, `shapes` (height, width) and `pixels(i)`,
    image i's uint8 (height, width, 3) array, a view of the memory-mapped file (nothing is read until it is used).

    Checked when opened, so a damaged folder is refused at load, not in a DataLoader worker hours into training: the
    index is (N, 4) int64 with positive sizes, each offset follows the previous image, and the pixel file holds
    exactly the bytes the index names. `source` (the manifest's) goes into the fix. Pickles without its mapping
    (DataLoader workers map the file again): a pickled memmap would copy the split.
    """

    def __init__(self, split_dir: str | os.PathLike, source: str | None = None) -> None:
        import numpy as np

        self.dir = Path(split_dir)
        index_path, pixels_path = self.dir / INDEX_FILE, self.dir / PIXELS_FILE
        try:
            index = np.load(index_path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise self.damaged(source, f"its index '{index_path}' cannot be read ({type(err).__name__}: {err})")
        if index.ndim != 2 or index.shape[1] != 4 or index.dtype != np.int64:
            raise self.damaged(source, f"its index '{index_path}' is {index.dtype} {index.shape}, not int64 (N, 4)")
        sizes = _stored_bytes(index[:, 1], index[:, 2])
        follows = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        if (index[:, 1:3] <= 0).any() or not np.array_equal(index[:, 0], follows):
            raise self.damaged(source, f"its index '{index_path}' has sizes or offsets that do not follow each other")
        want = int(sizes.sum())
        have = pixels_path.stat().st_size if pixels_path.is_file() else None
        if have != want:
            found = "is missing" if have is None else f"holds {have:,} bytes"
            raise self.damaged(source, f"its pixel file '{pixels_path}' {found} where its index names {want:,}")
        self.offsets, self.labels = index[:, 0], index[:, 3]
        self.shapes = index[:, 1:3]
        self._map = None
        self._fd: int | None = None  # opened by the first read_into of each process

    @staticmethod
    def damaged(source: str | None, what: str) -> PrepareError:
        """The refusal of a damaged pixel folder: what is wrong, and the command that prepares it again."""
        again = f"sharpscale data prepare {source} --to NEW_DIR --form pixels" if source else "sharpscale data prepare"
        return PrepareError(
            f"a folder prepared as pixels is damaged: {what}. Fix: prepare it again (`{again}`) and point data.root "
            "at the new folder."
        )

    def __len__(self) -> int:
        return len(self.labels)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_map": None, "_fd": None}

    def nbytes(self, i):
        """Bytes of image(s) i (an int, or an index array for an array) as stored (`_stored_bytes`)."""
        shape = self.shapes[i]
        return _stored_bytes(shape[..., 0], shape[..., 1])

    def read_into(self, i: int, out) -> None:
        """Image i's stored bytes read straight into `out` (a writable buffer of `nbytes(i)` bytes, e.g. a slice of a
        shared-memory batch): one copy, from the page cache or the disk, with no mapping of the file."""
        if self._fd is None:
            import weakref

            self._fd = os.open(self.dir / PIXELS_FILE, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fd)
        view = memoryview(out).cast("B")
        offset, done = int(self.offsets[i]), 0
        while done < len(view):  # a read may return less than asked (a signal, a network file system)
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got == 0:
                raise self.damaged(None, f"its pixel file '{self.dir / PIXELS_FILE}' ends inside image {i}")
            done += got

    def pixels(self, i: int):
        import numpy as np

        if self._map is None:
            self._map = np.memmap(self.dir / PIXELS_FILE, dtype=np.uint8, mode="r")
        h, w = (int(v) for v in self.shapes[i])
        offset = int(self.offsets[i])
        return self._map[offset : offset + _stored_bytes(h, w)].reshape(h, w, 3)


def read_manifest(root: str | os.PathLike) -> Prepared | None:
    """The manifest of a prepared folder at `root`, or None when `root` is not one; a PrepareError, with its fix, for
    a manifest that cannot be read, of a form this version does not know, of an older version that lacks a field (read
    as the JPEG form where it is version 2, which had no other form) or of a newer version."""
    path = Path(root).expanduser() / MANIFEST
    if not path.is_file():
        return None
    again = "Fix: prepare the source again with this version's `sharpscale data prepare` into a new folder."
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PrepareError(f"{path}: a prepared folder's manifest that cannot be read ({err}). {again}") from err
    if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
        return None
    version = raw.get("version")
    if version == 2:  # the JPEG form, before the pixel form existed: its folders stay readable as they are
        raw = {"form": "jpeg", "classes": [], **raw, "version": _VERSION}
    if isinstance(version, int) and version > _VERSION:
        raise PrepareError(
            f"{path}: a prepared folder's manifest of version {version}, written by a newer sharpscale than this one "
            f"(which reads version {_VERSION}). Fix: upgrade sharpscale, or prepare the source again with this one."
        )
    missing = [k for k in Prepared.__dataclass_fields__ if k not in raw]
    if raw.get("version") != _VERSION or missing:
        raise PrepareError(
            f"{path}: a prepared folder's manifest of version {shown(version)}, but this sharpscale reads "
            f"version {_VERSION}" + (f" (it lacks {', '.join(missing)})" if missing else "") + f". {again}"
        )
    if raw["form"] not in FORMS:
        raise PrepareError(
            f"{path}: a prepared folder's manifest names form {shown(raw['form'])}, not one of {list(FORMS)}. {again}"
        )
    return Prepared(**{k: raw[k] for k in Prepared.__dataclass_fields__})

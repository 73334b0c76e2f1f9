"""`sharpscale data`: put datasets where every node of a cluster reads them (`fetch` an official archive,
`prepare` an image folder at the crop's scale)."""

from __future__ import annotations

import argparse
from pathlib import Path

from studies.cli.base import Command, positive_int

# Light constants only (tested by test_validate_imports): the archive and worker-pool code is imported by the action.
from trainables.data.prepare import DEFAULT_QUALITY, FORMS, MANIFEST


class DataFetch(Command):
    name = "fetch"
    help = "download a dataset's official archive, check its md5, unpack it into DIR or upload it to a URI"
    description = (
        "Download the official python-version archive of DATASET, check its md5, unpack it safely and "
        "put its folder (cifar-10-batches-py or cifar-100-python) in DIR, or upload it under a URI that pyarrow.fs "
        "opens (s3://, gs://, file://, ...). DIR_OR_URI is then what data.root names; each node stages a URI "
        "root once into its local cache ($SHARPSCALE_DATA_CACHE, default ~/.cache/sharpscale/data)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dataset", metavar="DATASET", help="cifar10 or cifar100")
        parser.add_argument(
            "--to", required=True, metavar="DIR_OR_URI", help="a directory, or a URI such as s3://BUCKET/cifar10"
        )
        parser.add_argument("--url", default=None, help="the archive's URL on a mirror (default: the official one)")
        parser.add_argument(
            "--md5", default=None, help="the md5 of the archive at --url (default: the official archive's)"
        )

    def take_action(self, args) -> int:
        from trainables.fetch import fetch_dataset

        where = fetch_dataset(args.dataset, args.to, url=args.url, md5=args.md5, log=lambda msg: print(msg, flush=True))
        print(f"Use it with: --set data.root={where}   (or data.root: {where} in the study file)")
        return 0


class DataPrepare(Command):
    name = "prepare"
    help = "resize an image folder once so its shorter sides are near the crop's scale (fewer pixels to decode)"
    description = (
        "Write the prepared form of the image folder SOURCE (train/ and val/, one sub-folder per class) "
        "to --to: every image resized so its shorter side is --short-side (aspect kept, never upscaled; PIL's "
        "antialiased bicubic) and, in the jpeg form (the default), saved as an RGB baseline JPEG at --quality in the same layout; baseline JPEGs already "
        "small enough are copied as they are (progressive ones are re-encoded). An image that cannot be read stops "
        "it: every unreadable image is listed with the fix and nothing is written. A manifest ("
        + MANIFEST
        + ") records the source, the settings and "
        "the counts. Point data.root at --to: the jpeg form is an ordinary image folder; the pixels form (--form pixels) "
        "holds each split's decoded pixels in one file, which data.root reads as the folder it came from (same "
        "classes, order and transforms), with nothing to decode while training. The default short side is what "
        "timm's eval transform resizes to before its central crop (256 for --img-size 224), so validation images "
        "match the original's up to the JPEG re-encoding; training crops of the prepared images have fewer source pixels "
        "(a crop under img_size on a side is upsampled), so use a larger --short-side to keep more detail. Measured "
        "gains are in docs/benchmarks.md."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("source", metavar="SOURCE", help="the image folder to prepare (holding train/ and val/)")
        parser.add_argument(
            "--to", required=True, metavar="DIR", help="a new (or empty) directory for the prepared form"
        )
        parser.add_argument(
            "--short-side",
            type=int,
            default=None,
            help="the shorter side in pixels after resizing (default: what timm's eval transform resizes to for "
            "--img-size, 256 for 224)",
        )
        parser.add_argument(
            "--img-size",
            type=positive_int,
            default=224,
            help="the crop size the data will be trained at (default 224)",
        )
        parser.add_argument(
            "--quality", type=int, default=None, help=f"JPEG quality, 1-95, of --form jpeg (default {DEFAULT_QUALITY})"
        )
        parser.add_argument(
            "--workers",
            type=positive_int,
            default=None,
            help="processes resizing in parallel (default: every CPU core)",
        )
        parser.add_argument(
            "--form",
            choices=FORMS,
            default="jpeg",
            help="jpeg: baseline JPEGs in the original's layout (default); pixels: each split's decoded pixels in one "
            "file (about 10x the JPEG form's bytes, 2-4x a typical original's; nothing to decode while training: the "
            "fastest device path)",
        )

    def take_action(self, args) -> int:
        from trainables.data.prepare import default_short_side, prepare_folder

        short_side = args.short_side if args.short_side is not None else default_short_side(args.img_size)
        done = prepare_folder(
            args.source,
            args.to,
            short_side=short_side,
            quality=args.quality,
            workers=args.workers,
            form=args.form,
            log=lambda msg: print(msg, flush=True),
        )
        copied = f", {done.copied} copied as they were" if done.form == "jpeg" else ""
        print(
            f"Prepared {sum(done.files.values())} images as {done.form} ({done.resized} resized{copied}) in "
            f"{done.seconds:.1f} s: {done.pixels_after / max(done.pixels_before, 1):.2f} of the pixels and "
            f"{done.bytes_after / max(done.bytes_before, 1):.2f} of the bytes. Manifest: {Path(args.to) / MANIFEST}"
        )
        kind = "an image folder like the original" if done.form == "jpeg" else "read as the image folder it came from"
        print(f"Use it with: --set data.root={Path(args.to).expanduser().resolve()}   ({kind})")
        return 0


class Data(Command):
    name = "data"
    help = "put datasets where every node of a cluster reads them"
    subcommands = (DataFetch, DataPrepare)

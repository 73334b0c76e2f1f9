"""`sharpscale data prepare`: the command prepares a tiny image folder the test writes, and refuses bad input with
every problem at once and the usage exit status."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from studies.cli import EXIT_USAGE, main
from trainables.data.prepare import default_short_side, read_manifest


def _folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("cat", "dog"):
            (root / split / c).mkdir(parents=True)
            Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(root / split / c / "0.jpg")
    return root


def test_the_cli_prepares_and_refuses(tmp_path, capsys):
    src = _folder(tmp_path / "src")
    assert (
        main(["data", "prepare", str(src), "--to", str(tmp_path / "out"), "--short-side", "20", "--workers", "2"]) == 0
    )
    out = capsys.readouterr().out
    assert "Prepared 4 images" in out and f"data.root={(tmp_path / 'out').resolve()}" in out
    assert read_manifest(tmp_path / "out").short_side == 20
    # The default short side comes from --img-size.
    assert (
        main(["data", "prepare", str(src), "--to", str(tmp_path / "out2"), "--img-size", "14", "--workers", "1"]) == 0
    )
    assert read_manifest(tmp_path / "out2").short_side == default_short_side(14)
    capsys.readouterr()
    # The pixel form: its manifest says so, and the line says how data.root reads it.
    assert main(["data", "prepare", str(src), "--to", str(tmp_path / "px"), "--form", "pixels", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "Prepared 4 images as pixels" in out and "read as the image folder it came from" in out
    assert read_manifest(tmp_path / "px").form == "pixels"
    code = main(["data", "prepare", str(src), "--to", str(tmp_path / "out"), "--quality", "0"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "exists and is not an empty directory" in err and "--quality must be in [1, 95]" in err

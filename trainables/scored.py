"""Per-image correctness of a trial's final evaluation: packed into a run's tags, read back, aligned across runs."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

import numpy as np

__all__ = ["SCORED_FORMAT", "ScoredImages", "images_digest"]

# The record's layout; a reader refuses any other (an older reader meeting a newer record falls back to seeds alone).
SCORED_FORMAT = 1


def images_digest(dataset: str, split: str, positions: np.ndarray, labels: np.ndarray) -> str:
    """What makes two runs' vectors comparable bit by bit: the dataset, the split, the scored positions in their
    order, and those images' labels (two versions of a dataset under one name disagree somewhere in them)."""
    h = hashlib.sha256()
    h.update(json.dumps([str(dataset), str(split)]).encode())
    h.update(np.ascontiguousarray(positions, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class ScoredImages:
    """Which images of the scored split one run classified correctly (top-1), in the order of `digest`'s positions.

    The intervals of analysis resample these images, with the same draws for every run of equal digest: runs
    scored on the same images share the test set's luck, which resampling seeds alone never sees.
    """

    correct: np.ndarray  # bool, one entry per scored image
    digest: str  # images_digest of the images, in that order

    @classmethod
    def of(cls, correct, *, dataset: str, split: str, positions, labels) -> ScoredImages:
        correct = np.asarray(correct, dtype=bool).ravel()
        positions, labels = np.asarray(positions).ravel(), np.asarray(labels).ravel()
        if not (len(correct) == len(positions) == len(labels)):
            raise ValueError(
                f"correct, positions and labels must have one entry per scored image, got {len(correct)}, "
                f"{len(positions)}, {len(labels)}"
            )
        return cls(correct, images_digest(dataset, split, positions, labels))

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean()) if len(self.correct) else float("nan")

    def to_text(self) -> str:
        """A compact JSON record: the bits packed 8 to a byte (numpy.packbits), base64; 5,000 images take 840
        characters."""
        bits = base64.b64encode(np.packbits(self.correct).tobytes()).decode("ascii")
        return json.dumps(
            {"format": SCORED_FORMAT, "n": int(len(self.correct)), "digest": self.digest, "bits": bits},
            separators=(",", ":"),
        )

    @classmethod
    def from_text(cls, text: str) -> ScoredImages:
        """The record `to_text` wrote; ValueError for anything else (another format, a torn or edited record)."""
        try:
            record = json.loads(text)
            fmt, n, digest, bits = record["format"], int(record["n"]), str(record["digest"]), record["bits"]
        except (TypeError, ValueError, KeyError) as err:
            raise ValueError(f"not a scored-images record ({type(err).__name__}: {err})") from None
        if fmt != SCORED_FORMAT:
            raise ValueError(f"scored-images record of format {fmt!r}; this reader knows format {SCORED_FORMAT}")
        packed = np.frombuffer(base64.b64decode(bits, validate=True), dtype=np.uint8)
        if len(packed) != (n + 7) // 8:
            raise ValueError(f"scored-images record holds {len(packed)} bytes for n={n} images, not {(n + 7) // 8}")
        return cls(np.unpackbits(packed, count=n).astype(bool), digest)

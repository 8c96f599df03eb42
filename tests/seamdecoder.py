"""A decoder written as a user would, outside the library: ``"negative"`` (PIL's pixels, inverted, as a tensor), registered
on import -- so a spawned loader worker that unpickles :func:`keep` (a transform of this module) registers it too."""

from __future__ import annotations

import numpy as np

from lightning_lmdb.codec import decoders


def _negative(data: bytes | memoryview, info: object, decode_size: int | None) -> object:
    pixels = np.asarray(decoders.decode_pil(data))
    return decoders.hwc_to_tensor(np.ascontiguousarray(255 - pixels))


NEGATIVE = decoders.register_decoder(decoders.ImageDecoder("negative", _negative, parity="PIL's pixels inverted (a test decoder)."))


def keep(image: object) -> object:
    """An identity transform: what brings this module (and its decoder) into a spawned worker."""
    return image

"""Real image files for tests: encoded by Pillow, as a user's images would be."""

from __future__ import annotations

import io


def png(width: int, height: int, color=(10, 120, 10)) -> bytes:
    """A solid-colour RGB PNG of ``width`` x ``height``."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()

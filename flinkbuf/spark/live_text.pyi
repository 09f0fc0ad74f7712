"""Type stubs for flinkbuf.spark.live_text: the live view in a terminal."""

from collections.abc import Mapping
from typing import Any, Final, TextIO

__all__ = ["fetch", "render", "view_url", "watch"]

MAX_DOCUMENT: Final[int]

def view_url(text: str) -> str: ...
def fetch(url: str, timeout: float) -> dict[str, Any]: ...
def render(
    doc: Mapping[str, Any], url: str = "", *, colour: bool = False, width: int | None = None
) -> str: ...
def watch(
    url: str,
    *,
    interval: float = 1.0,
    count: int | None = None,
    timeout: float = 5.0,
    out: TextIO | None = None,
) -> int: ...

"""The `truthlens eval` progress bar: tqdm on stderr, drawn only when asked (by default on a terminal).

tqdm comes with the `eval` extra and is imported only when a bar is drawn; redirected or piped
stderr (CI logs, subprocess tests) gets no carriage-return noise at all.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class Progress:
    def __init__(self, total: int, enabled: bool, label: str = "eval", stream: TextIO | None = None) -> None:
        self.total = total
        self.enabled = enabled
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="ex", file=self.stream, mininterval=0.1, dynamic_ncols=True)

    @staticmethod
    def auto(mode: str, stream: TextIO | None = None) -> bool:
        """`on` | `off` | `auto` (on only when the stream is a TTY)."""
        if mode == "on":
            return True
        if mode == "off":
            return False
        s = stream if stream is not None else sys.stderr
        return bool(getattr(s, "isatty", lambda: False)())

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

"""A dependency-free progress bar on stderr, drawn only on a terminal.

`truthlens eval` ships with the base package, which does not depend on tqdm;
redirected or piped stderr (CI logs, subprocess tests) gets no carriage-return
noise at all.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, enabled: bool, label: str = "eval", stream: TextIO | None = None) -> None:
        self.total = total
        self.enabled = enabled
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._start = time.perf_counter()
        self._last_draw = 0.0

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
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last_draw >= 0.1 or self.done >= self.total:
            self._last_draw = now
            self._draw(now)

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        rate = self.done / elapsed
        frac = self.done / self.total if self.total else 1.0
        width = 30
        filled = int(round(frac * width))
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            f" {rate:.1f} ex/s eta {_fmt(eta)}  "
        )
        self.stream.flush()


def _fmt(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"

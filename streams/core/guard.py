"""The dead-letter-rate guard: the one deliberate stop of the pipeline.

When more than ``share`` of the last ``window`` messages were invalid, something upstream is broken (a bad
deploy, a wrong topic). Dead-lettering the whole topic would bury the real data under noise and let the
offsets move past it; halting before the commit keeps the input where it is until an operator decides
(docs/operations.md, "Resuming after TTFTIngestHalted").
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class DeadLetterGuard:
    """Sliding window over the last ``window`` messages; trips when the invalid share exceeds ``share``."""

    window: int
    share: float
    _seen: deque[bool] = field(default_factory=deque)
    _dead: int = 0
    tripped: bool = False

    def observe(self, dead: bool) -> bool:
        """Record one message; returns True when the guard trips (and stays tripped)."""
        self._seen.append(dead)
        self._dead += dead
        if len(self._seen) > self.window:
            self._dead -= self._seen.popleft()
        if len(self._seen) >= self.window and self._dead > self.share * self.window:
            self.tripped = True
        return self.tripped

    @property
    def dead_share(self) -> float:
        return self._dead / len(self._seen) if self._seen else 0.0

    @property
    def dead_letters(self) -> int:
        return self._dead

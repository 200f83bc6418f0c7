"""What the log says about requests answered with an error, for every door alike.

A client's mistake (4xx) is the client's to read in the answer: logged at DEBUG, where an
operator can still follow one by its request id. A failure of the server's own (500) is
logged at WARNING, every one. Shedding is neither: under overload a server refuses thousands
of requests a second (503) or lets some miss their deadline (504), each already counted in
``batching_rejected_total``, and a WARNING line for each would cost the event loop more than
the refusal itself, in the very moment it has least to spare, and bury everything else in the
log. So each shedding status logs its first answer at once, then at most one WARNING line per
:data:`SUMMARY_INTERVAL` that says how many more there were and quotes the latest; every one
is still at DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Statuses that say "not now" under load rather than "something is wrong".
SHEDDING = frozenset({503, 504})

#: Seconds between two WARNING lines about the same shedding status.
SUMMARY_INTERVAL = 10.0


@dataclass(slots=True)
class _Window:
    last_warned: float
    suppressed: int = 0


class AnswerLog:
    """Logs error answers: see the module's text for which, and at what level.

    :param logger: where the lines go.
    :param clock: seconds, monotonic (tests inject one).
    """

    def __init__(self, logger: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.clock = clock
        self._windows: dict[int, _Window] = {}

    def answered(self, what: str, status: int, message: str) -> None:
        """``what`` (``"request ID"``, ``"gRPC request ID"``) was answered ``status`` because
        of ``message``."""
        if status < 500:
            self.logger.debug("%s answered %d: %s", what, status, message)
        elif status not in SHEDDING:
            self.logger.warning("%s answered %d: %s", what, status, message)
        else:
            self._shed(what, status, message)

    def _shed(self, what: str, status: int, message: str) -> None:
        now = self.clock()
        window = self._windows.get(status)
        if window is not None and now - window.last_warned < SUMMARY_INTERVAL:
            window.suppressed += 1
            self.logger.debug("%s answered %d: %s", what, status, message)
            return
        more = 0 if window is None else window.suppressed
        self._windows[status] = _Window(last_warned=now)
        if more:
            message = f"{message} (and {more} more answered {status} in the last "
            message += f"{SUMMARY_INTERVAL:.0f} s; each at DEBUG)"
        self.logger.warning("%s answered %d: %s", what, status, message)


#: The server's one answer log, on the ``batching`` logger.
answer_log = AnswerLog(logging.getLogger("batching"))


def internal_message(request_id: str) -> str:
    """What a caller is told, on any door, of a failure of the server's own: nothing but the
    request id to look for in the log."""
    return f"internal server error (request id {request_id}; the server log has the details)"

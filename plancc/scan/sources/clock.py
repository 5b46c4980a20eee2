"""The clock chat templates read: `strftime_now(fmt)` gives `template_date` at midnight UTC, formatted the same on
every machine.

In transformers `strftime_now(fmt)` is `datetime.now().strftime(fmt)`: the C library's strftime, which reads the
machine's time zone (`%s`) and locale (`%a`, `%b`, `%c`, `%p`, `%x`, ...). A plan must not depend on either, so the
directives are formatted here, as the C ("POSIX") locale formats them, for one instant in UTC. For 2024-01-01:

    %a Mon   %A Monday   %b %h Jan   %B January   %c Mon Jan  1 00:00:00 2024   %C 20   %d 01   %D 01/01/24
    %e ' 1'   %F 2024-01-01   %g 24   %G 2024   %H 00   %I 12   %j 001   %k ' 0'   %l 12   %m 01   %M 00
    %n newline   %p AM   %P am   %r 12:00:00 AM   %R 00:00   %s 1704067200   %S 00   %t tab   %T 00:00:00
    %u 1   %U 00   %V 01   %w 1   %W 01   %x 01/01/24   %X 00:00:00   %y 24   %Y 2024   %z +0000   %:z +00:00
    %Z UTC   %f 000000   %% %

glibc's flags `-` (no padding), `_` (spaces), `0` (zeros), `^` (upper case), `#` (names in upper case, `%p` and
`%Z` in lower) and its `E`/`O` modifiers (no effect in the C locale) are read too; anything else is kept as written,
as glibc keeps a directive it does not know.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import UTC, datetime

_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_COMPOSITE = {"c": "%a %b %e %H:%M:%S %Y", "D": "%m/%d/%y", "F": "%Y-%m-%d", "r": "%I:%M:%S %p", "R": "%H:%M",
              "T": "%H:%M:%S", "x": "%m/%d/%y", "X": "%H:%M:%S"}
_DIRECTIVE = re.compile(r"%([-_0^#]?)[EO]?(:z|[A-Za-z%])")

Field = str | tuple[int, int, str]  # text, or (number, width, padding)


def _fields(t: datetime) -> dict[str, Field]:
    """What each simple directive gives for `t`."""
    iso_year, iso_week, iso_day = t.isocalendar()
    yday0, sunday0 = t.timetuple().tm_yday - 1, iso_day % 7  # glibc's tm_yday and tm_wday
    hour12 = t.hour % 12 or 12
    day, month = _DAYS[t.weekday()], _MONTHS[t.month - 1]
    return {
        "a": day[:3], "A": day, "b": month[:3], "h": month[:3], "B": month, "p": "AM" if t.hour < 12 else "PM",
        "P": "am" if t.hour < 12 else "pm", "n": "\n", "t": "\t", "z": "+0000", ":z": "+00:00", "Z": "UTC", "%": "%",
        "C": (t.year // 100, 2, "0"), "d": (t.day, 2, "0"), "e": (t.day, 2, " "), "g": (iso_year % 100, 2, "0"),
        "G": (iso_year, 1, "0"), "H": (t.hour, 2, "0"), "I": (hour12, 2, "0"), "j": (yday0 + 1, 3, "0"),
        "k": (t.hour, 2, " "), "l": (hour12, 2, " "), "m": (t.month, 2, "0"), "M": (t.minute, 2, "0"),
        "s": (int(t.timestamp()), 1, "0"), "S": (t.second, 2, "0"), "u": (iso_day, 1, "0"),
        "U": ((yday0 - sunday0 + 7) // 7, 2, "0"), "V": (iso_week, 2, "0"), "w": (sunday0, 1, "0"),
        "W": ((yday0 - (sunday0 - 1) % 7 + 7) // 7, 2, "0"), "y": (t.year % 100, 2, "0"), "Y": (t.year, 1, "0"),
        "f": (t.microsecond, 6, "0"),
    }


def _format(fields: dict[str, Field], fmt: str) -> str:
    """`fmt` with every directive it holds replaced by its field (a composite one by its parts)."""
    def one(match: re.Match) -> str:
        flag, name = match.groups()
        if name in _COMPOSITE:
            text = _format(fields, _COMPOSITE[name])
        elif name in fields:
            field = fields[name]
            if isinstance(field, str):
                text = field
            else:
                value, width, pad = field
                pad = {"-": "", "_": " ", "0": "0"}.get(flag, pad)
                text = str(value).rjust(width, pad) if pad else str(value)
        else:
            return match.group(0)
        if flag == "^" or (flag == "#" and name in "aAbBh"):
            return text.upper()
        return text.lower() if flag == "#" and name in ("p", "Z") else text

    return _DIRECTIVE.sub(one, fmt)


def strftime_now(date: str) -> Callable[[str], str]:
    """`strftime_now` for a template rendered on `date` (YYYY-MM-DD): midnight UTC that day, in the C locale."""
    fields = _fields(datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC))

    @functools.lru_cache(maxsize=64)
    def formatted(fmt: str) -> str:
        if not isinstance(fmt, str):
            raise TypeError(f"strftime_now() argument must be str, not {type(fmt).__name__}")
        return _format(fields, fmt)

    return formatted

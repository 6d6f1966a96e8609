"""Reading a setting's text the one way every parser shares.

Reading a setting's text: its numbers (in the digits 0-9 only), its paths (looked at without an
OSError), and how a message shows it (escaped, shortened). What every parser (`parsers`)
shares, so each reads numbers and paths one way: Python's own readers take more than a setting
should (`int` reads '٣' and '1_000', `str.isdigit` passes '²' that `int` then refuses, `int`
stops past 4,300 digits, `float` reads 'nan' and Arabic-Indic digits), and a path's check can
fail for reasons of its own (a NUL, a name too long)."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Literal


class SettingError(ValueError):
    """A setting has a value that cannot be used. The message is meant for the user."""


SHOWN_CHARACTERS = 200  # of a value a message quotes (a long path whole); the rest is counted
# Digits beyond any setting's bounds: a longer number is out of range, never read by int().
MOST_DIGITS = 18
# Each unambiguous (one way to match a text), so a long text that fails fails in linear time.
_WHOLE_RE = re.compile(r"([+-]?)([0-9]+)", re.ASCII)
_MOST_DECIMAL = 100
_DECIMAL_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def shown(value: object) -> str:
    """`value` as a message quotes it: escaped as Python writes a string (control
    characters, NUL, lone surrogates as \\x.., \\u..: always printable), and past
    SHOWN_CHARACTERS cut, with its length said."""
    text = str(value)
    if len(text) <= SHOWN_CHARACTERS:
        return repr(text)
    return f"{text[:SHOWN_CHARACTERS]!r}... ({len(text):,} characters)"


def plain(text: str) -> str:
    """`text` unquoted where it is short and printable (a suggestion to copy), else `shown`."""
    return text if len(text) <= SHOWN_CHARACTERS and text.isprintable() else shown(text)


def is_digits(text: str) -> bool:
    """Whether `text` is ASCII digits 0-9 only (not '²', '٣' or the
    fullwidth digits, which isdigit passes)."""
    return text.isascii() and text.isdigit()


def whole_number(text: str) -> int | None:
    """The whole number `text` writes in the digits 0-9 (a sign, and spaces around, allowed),
    else None. One of more than MOST_DIGITS digits reads as ±10**MOST_DIGITS: beyond every
    setting's range, and never handed to int()."""
    match = _WHOLE_RE.fullmatch(text.strip())
    if match is None:
        return None
    sign, digits = match.group(1), match.group(2).lstrip("0") or "0"
    value = 10**MOST_DIGITS if len(digits) > MOST_DIGITS else int(digits)
    return -value if sign == "-" else value


def decimal_number(text: str) -> float | None:
    """The number `text` writes in the digits 0-9 (`0.001`, `1e-3`, `.5`; no `nan`, `inf` or
    `_`), else None; one too large for a float reads as infinite. Past _MOST_DECIMAL
    characters a SettingError: float() takes a while to read thousands of digits, and no
    setting needs more than a float holds."""
    stripped = text.strip()
    if not _DECIMAL_RE.fullmatch(stripped):
        return None
    if len(stripped) > _MOST_DECIMAL:
        raise SettingError(f"a number of {len(stripped):,} characters; at most {_MOST_DECIMAL}")
    return float(stripped)


PathKind = Literal["folder", "file", "other"]


def path_of(text: str) -> Path:
    """The path `text` names (spaces around dropped, `~` expanded); refused when the system
    could not use it at all (a NUL in it)."""
    stripped = text.strip()
    if "\0" in stripped:
        raise SettingError("a path cannot hold a NUL character")
    try:
        return Path(stripped).expanduser()
    except RuntimeError:  # ~name of no user here, or ~ with no home folder known
        head = shown(stripped.split("/", 1)[0])
        raise SettingError(f"{head} names no home folder here; write the path out") from None


def path_kind(path: Path) -> PathKind | None:
    """What is at `path`: a folder, a file, something else, or None (nothing, or a file on
    the way to it). A path the system refuses to look at (too long, not encodable, not
    permitted) is a SettingError that says why, not an OSError."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise SettingError(f"{shown(path)} cannot be looked at ({err.strerror or err})") from None
    except ValueError:  # a character the file system's encoding cannot write
        raise SettingError(f"{shown(path)} holds characters no file name can") from None
    if stat.S_ISDIR(mode):
        return "folder"
    return "file" if stat.S_ISREG(mode) else "other"

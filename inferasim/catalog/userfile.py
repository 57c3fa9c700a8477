"""Reading a file a user named: every way it can fail becomes a ValueError that names the option
(or field) and the path, never a traceback (a folder given for a file, a path under a file, no
permission, bytes that are not UTF-8)."""

from __future__ import annotations

from pathlib import Path

from inferasim.errors import UserError


class UserFileError(UserError):
    """A user-named file that cannot be read; the message names what it was for."""


def read_user_text(path: str | Path, what: str) -> str:
    """The text of ``path``; ``what`` names it in errors (``--workload``, ``the spec file``)."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserFileError(f"{what}: {p} does not exist") from None
    except IsADirectoryError:
        raise UserFileError(f"{what}: {p} is a folder; give a file") from None
    except NotADirectoryError:
        raise UserFileError(f"{what}: {p} is not a path to a file (a part of it is a file, not a folder)") from None
    except PermissionError:
        raise UserFileError(f"{what}: {p} cannot be read (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{what}: {p} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise UserFileError(f"{what}: cannot read {p}: {exc.strerror or exc}") from None

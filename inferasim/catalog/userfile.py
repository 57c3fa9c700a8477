"""Reading a file a user named: every way it can fail becomes a ValueError that names the option
(or field) and the path, never a traceback (a folder given for a file, a path under a file, no
permission, bytes that are not UTF-8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

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


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping key given twice is an error: YAML 1.2 requires
    keys to be unique, and PyYAML would keep the last one silently (`maxGPUs: 8` then `maxGPUs: 64`
    would search 64 GPUs with nothing said)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key: PyYAML's own check reports it
                continue
            if first != line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (lines {first} and {line}); keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """One YAML document, safely loaded; a key given twice is a yaml.YAMLError naming it."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml_all(text: str) -> list[Any]:
    """Every document of a YAML stream, as load_yaml loads one."""
    return list(yaml.load_all(text, Loader=_UniqueKeyLoader))  # noqa: S506 - a SafeLoader subclass

"""The :class:`AnchorStore`: a list of folders of anchor ``*.json`` files (the shipped ``anchors/`` and
whatever the operator adds), the anchor it picks for a kernel set and layout (measured on purpose
before live traffic, then the nearest layout), and :class:`NoCompatibleAnchor` naming how the
nearest anchors differ when none fits. Bad files are collected, not fatal, so ``inferasim anchors
check`` can list them all at once. The anchor schema and its files are :mod:`inferasim.model.anchors`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from inferasim.core.layout import Layout
from inferasim.errors import InferasimError
from inferasim.model.anchors import Anchor, AnchorFileError, KernelSet, load_anchor, write_anchor_file


def _shown(field_name: str, value: str) -> str:
    """A kernel-set field for a message: an empty one says what it stands for."""
    if value:
        return repr(value)
    return {"precision": "auto (the checkpoint's)", "engine_version": "any version",
            "kv_dtype": "auto"}.get(field_name, "unset")


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------


class NoCompatibleAnchor(InferasimError, LookupError):
    """No anchor measured this kernel set; the message names how the nearest anchors differ."""

    def __init__(
        self,
        kernel_set: KernelSet,
        nearest: list[tuple[Anchor, list[tuple[str, str, str]]]],
        folders: Iterable[Path] = (),
    ) -> None:
        self.kernel_set = kernel_set
        self.nearest = nearest
        message = f"no anchor for {kernel_set.describe()}"
        if nearest:
            described = []
            for anchor, diffs in nearest:
                # An unset field (no --precision, no --engine-version) reads as what it means.
                fields = ", ".join(f"{name} ({_shown(name, have)} vs {_shown(name, want)})"
                                   for name, have, want in diffs)
                described.append(f"{anchor.filename()} differs in {fields}")
            message += "; nearest: " + "; ".join(described)
        else:
            where = ", ".join(str(f) for f in folders) or "no folders"
            message += f"; the anchor store is empty ({where})"
        super().__init__(message)


# --------------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------------


# Provenance ranks in the store (lower first): passive anchors only when nothing measured on purpose exists.
_METHOD_RANK: dict[str, int] = {"passive": 1, "canary": 1}


def method_rank(anchor: Anchor) -> int:
    """0 for anchors measured on purpose, 1 for those taken from live traffic (passive, canary)."""
    return _METHOD_RANK.get(anchor.provenance.method, 0)

# Field weights for "nearest": a different model or engine is farther than a different build.
_DISTANCE = {"model": 8, "engine": 4, "gpu": 4, "precision": 2}


class AnchorStore:
    """Anchors read from folders of ``*.json`` files; later folders add to earlier ones."""

    def __init__(self, *folders: str | Path) -> None:
        self.folders: list[Path] = [Path(f) for f in folders]
        self._anchors: list[tuple[Path, Anchor]] = []
        self._errors: list[AnchorFileError] = []
        self.last_replaced: Path | None = None  # where save() moved the anchor it replaced
        self.reload()

    def reload(self) -> None:
        """Read every folder again (eagerly: `anchors check` wants all errors at once)."""
        self._anchors, self._errors = [], []
        for folder in self.folders:
            if not folder.exists():
                continue  # a missing folder is an empty one (e.g. no operator anchors yet)
            if not folder.is_dir():
                self._errors.append(AnchorFileError(folder, ["is not a folder"]))
                continue
            for path in sorted(folder.glob("*.json")):
                try:
                    self._anchors.append((path, load_anchor(path)))
                except AnchorFileError as exc:
                    self._errors.append(exc)

    def all(self) -> list[Anchor]:
        return [a for _, a in self._anchors]

    def items(self) -> list[tuple[Path, Anchor]]:
        """(file, anchor) pairs, in reading order."""
        return list(self._anchors)

    def errors(self) -> list[AnchorFileError]:
        return list(self._errors)

    def __len__(self) -> int:
        return len(self._anchors)

    def candidates(self, kernel_set: KernelSet) -> list[Anchor]:
        """Anchors of exactly this kernel set, best first (fewest GPUs, then most points)."""
        return self._ranked(kernel_set, None)

    def find(self, kernel_set: KernelSet, layout: Layout | None = None) -> Anchor:
        """The anchor for ``kernel_set``: the same layout if measured, else the fewest GPUs, then
        the most points; ties go to the anchor read last (later folders hold newer measurements).
        """
        ranked = self._ranked(kernel_set, layout)
        if ranked:
            return ranked[0]
        scored = []
        for _, anchor in self._anchors:
            diffs = anchor.kernel_set.differences(kernel_set)
            distance = sum(_DISTANCE.get(name, 1) for name, _, _ in diffs)
            scored.append((len(diffs), distance, anchor.filename(), anchor, diffs))
        scored.sort(key=lambda s: s[:3])
        raise NoCompatibleAnchor(kernel_set, [(s[3], s[4]) for s in scored[:3]], self.folders)

    def _ranked(self, kernel_set: KernelSet, layout: Layout | None) -> list[Anchor]:
        return [a for _, a in self.alternatives(kernel_set, layout)]

    def alternatives(self, kernel_set: KernelSet, layout: Layout | None = None) -> list[tuple[Path, Anchor]]:
        """Every stored anchor of ``kernel_set`` with its file, best first (the first is what
        :meth:`find` returns); each carries its own fit report, so a passive and a harvested anchor
        of one deployment can be compared. Measurements taken on purpose (harvest, public data,
        PyTorch) come before passive ones whatever their layout: live traffic never silently
        overrides a harvest. Then the same layout, the fewest GPUs, the most points, the newest."""
        matches = [(i, p, a) for i, (p, a) in enumerate(self._anchors) if a.kernel_set.same_kernels(kernel_set)]

        def preference(item: tuple[int, Path, Anchor]) -> tuple[int, int, int, int, int, int]:
            order, _, anchor = item
            own = anchor.layout.to_layout()
            same = 0 if layout is not None and own == layout else 1
            return (method_rank(anchor), same, own.gpus, -len(anchor.points),
                    -len(anchor.steps), -order)

        return [(p, a) for _, p, a in sorted(matches, key=preference)]

    def save(self, anchor: Anchor, folder: str | Path | None = None, *, keep_previous: bool = True) -> Path:
        """Write ``anchor`` into ``folder`` (default: the first folder) and add it. A different
        anchor in its file is moved to ``replaced/`` unless ``keep_previous`` is False (see
        write_anchor_file); ``last_replaced`` says where it went."""
        if folder is None:
            if not self.folders:
                raise ValueError("this anchor store has no folder to save into; pass folder=")
            folder = self.folders[0]
        path = Path(folder) / anchor.filename()
        self.last_replaced = write_anchor_file(anchor, path, keep_previous=keep_previous)
        # Replace an entry read from the same file; otherwise the new anchor is the newest.
        self._anchors = [(p, a) for p, a in self._anchors if p.resolve() != path.resolve()]
        self._anchors.append((path, anchor))
        return path

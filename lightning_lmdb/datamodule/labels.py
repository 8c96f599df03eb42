"""``LMDBDataModule``'s classes and targets (:class:`TargetsMixin`), read through its backend before ``setup``."""

from __future__ import annotations

from typing import Any

from lightning_lmdb.options import BuildOptions
from lightning_lmdb.sources import masks
from lightning_lmdb.targets import target_kind


class TargetsMixin:
    """``LMDBDataModule``'s classes and targets: the training split's (else, without ``train_dir``, the first split's), its
    dataset's once set up, before read as cheaply as it allows (a database's metadata, a folder's class folders, a manifest's
    rows: its backend's :meth:`~lightning_lmdb.datamodule.backends.ServingBackend.split_labels`); and the build options of each split
    (:meth:`split_options`), which map val and test through training's classes."""

    @property
    def classes(self) -> list[str]:
        """Class names in target order (``[]`` for a flat folder, or a source without classes)."""
        return list(self._class_table()[0])

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to target (``{}`` for a flat folder, or a source without classes)."""
        return dict(self._class_table()[1])

    @property
    def num_classes(self) -> int:
        """Number of classes (0 for a flat folder, or a source without classes).

        A segmentation source's (target kind ``"mask"``) are the mask classes: ``source_options={"num_classes": N}`` (or
        ``classes``) when given, else the largest mask value below ``ignore_index`` plus one, which only reading every mask
        tells. Before ``setup`` that is the database's metadata: the LMDB backend builds the database for it if it is not
        built and current yet (``prepare_data``'s work, done once: ``prepare_data`` then finds it current); the raw backend
        reads its current database's, else every mask file once in this process (:meth:`ServingBackend.mask_labels`).
        """
        return len(self._class_table()[0])

    @property
    def ignore_index(self) -> int | None:
        """The mask value of unlabelled pixels of a segmentation source (target kind ``"mask"``; kept in the masks as it is,
        not a class): its database's, else ``source_options={"ignore_index": ...}``, else 255. ``None`` for the other kinds."""
        for dataset in self.datasets.values():  # type: ignore[attr-defined]
            return dataset.ignore_index
        if not target_kind(self.target_kind).in_record:  # a mask source's alone
            return None
        meta = self._backend.served_meta()[2]  # type: ignore[attr-defined]
        found = getattr(meta, "ignore_index", None) if meta is not None else self.build_options.manifest.ignore_index  # type: ignore[attr-defined]
        return masks.DEFAULT_IGNORE_INDEX if found is None else int(found)

    @property
    def target_kind(self) -> str:
        """What a sample's target is: one of :data:`~lightning_lmdb.sources.base.TARGET_KINDS`."""
        return self._target_table()[0]

    @property
    def target_names(self) -> list[str]:
        """The names of a regression target's K values (``[]`` for the other kinds)."""
        return list(self._target_table()[1])

    def _reported(self: Any) -> Any:
        """The dataset whose classes and targets the module reports: the training split's, else (no ``train_dir``) the first set
        up; ``None`` when it is not set up (``setup("test")`` alone: the training split is read instead, as before ``setup``)."""
        if "train" in self.datasets:
            return self.datasets["train"]
        return next(iter(self.datasets.values()), None) if self.sources["train"] is None else None

    def _class_table(self: Any) -> tuple[list[str], dict[str, int]]:
        dataset = self._reported()
        if dataset is not None:
            return dataset.classes, dataset.class_to_idx
        labels = self._backend.split_labels()
        if target_kind(labels.target_kind).in_record and not labels.classes:  # known from the masks: by the build, or by reading them
            labels = self._backend.mask_labels(next(s for s, d in self.sources.items() if d is not None))
        return labels.classes, labels.class_to_idx

    def _target_table(self: Any) -> tuple[str, list[str]]:
        dataset = self._reported()
        if dataset is not None:
            return dataset.target_kind, dataset.target_names
        labels = self._backend.split_labels()
        return labels.target_kind, labels.target_names

    def split_options(self: Any, split: str) -> BuildOptions:
        """The build options of ``split``'s database (and of the raw backend's scan of its source), found once by its backend
        (:meth:`~lightning_lmdb.datamodule.backends.ServingBackend.split_options`): the module's, but a val or test folder or manifest whose
        own classes would get other targets than the training split's is mapped through training's classes.

        Raises:
            SourceError: The split has a class the training split lacks; or it is a given database or a Dataset (whose targets are
                its own) that maps its classes to other targets than training (each named, with the fixes).
        """
        return self._backend.split_options(split)

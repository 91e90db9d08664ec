"""Embeddings picked up by name, as Easy Diffusion does: `Pipeline.load(..., embeddings_dir=FOLDER)`, and a prompt
that names a file's stem (`EasyNegative` for `FOLDER/EasyNegative.safetensors`) loads that file before its text is
encoded; a prompt that names none loads nothing. A file's word is its stem, as a whole word of the prompt (letters,
digits and `_` around it end the match: `EasyNegativeV2` does not name `EasyNegative`), case as the file is named.
A loaded file stays loaded for the pipeline's later calls. A named file that cannot be read is one line, raised
before any engine runs; the folder itself is checked when the pipeline loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from enginefarm.errors import ConfigError, WeightsError

SUFFIXES = (".safetensors", ".pt", ".bin", ".pth")  # what Easy Diffusion's embeddings folder holds
PICKLED = (".pt", ".bin", ".pth")


class EmbeddingFolder:
    """The files of one folder, by word; each read the first time a prompt names it."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            what = "does not exist" if not self.folder.exists() else "is a file, not a folder"
            raise ConfigError(
                f"embeddings_dir {self.folder} {what}", hint="give the folder that holds the embedding files"
            )
        self.loaded: set[str] = set()

    def files(self) -> dict[str, Path]:
        """word → file, read from the folder at each call (files added later are found too)."""
        found: dict[str, Path] = {}
        for path in sorted(self.folder.iterdir()):
            if path.suffix.lower() in SUFFIXES and path.is_file():
                if path.stem not in found or path.suffix == ".safetensors":  # a converted copy wins
                    found[path.stem] = path
        return found

    def named(self, prompts) -> list[tuple[Path, str]]:
        """(file, word) of each file a prompt names that is not loaded yet."""
        texts = [p for p in _flat(prompts) if p]
        return [
            (path, word)
            for word, path in self.files().items()
            if word not in self.loaded and any(_names(text, word) for text in texts)
        ]

    def load_named(self, prompts, read: Callable[[list], list], add: Callable[[list], None]) -> list[str]:
        """Read the files `prompts` name (`read`: items → embeddings, each checked) and add them (`add`); all or
        none. Returns the words added."""
        wanted = self.named(prompts)
        if not wanted:
            return []
        for path, _ in wanted:
            if path.suffix.lower() in PICKLED:
                raise WeightsError(
                    f"{path}: a pickled embedding ({path.suffix}) is not read (it could run code)",
                    hint="convert it to .safetensors (its tensors, same names) and put that file in the folder",
                )
        add(read(wanted))
        words = [word for _, word in wanted]
        self.loaded.update(words)
        return words


def _names(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def _flat(prompts) -> list[str]:
    out: list[str] = []
    for item in prompts:
        if isinstance(item, str):
            out.append(item)
        elif item is not None:
            out.extend(_flat(item))
    return out

"""Checkpoint: a local folder or Hugging Face repo id holding config.json and safetensors weights, read lazily."""

from __future__ import annotations

import re
from pathlib import Path

from ovbuild.errors import CheckpointError, TensorError
from ovbuild.ir.files import read_json
from ovbuild.weights.safetensors_file import SafetensorsFile
from ovbuild.weights.tensor import WeightTensor

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# A target's tokenizer as Hugging Face repos ship it (whichever of these exist); exports copy them alongside the IR.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
# What a build needs from a hub repo; nothing else is downloaded.
HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", INDEX_FILE, *TOKENIZER_FILES, "*.tiktoken"]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class Checkpoint:
    """config.json plus a name -> file map of every tensor; tensors are memory-mapped one at a time on `get`."""

    def __init__(self, folder: str | Path, source: str | None = None, revision: str | None = None):
        self.folder = Path(folder)
        self.source = source or str(self.folder)
        self.revision = revision
        self.root = _trusted_root(self.folder)
        self.config_path = self.folder / "config.json"
        self.config = read_json(self.own_file("config.json") or self.config_path)
        self._files: dict[Path, SafetensorsFile] = {}
        self._where = self._map_tensors()

    @classmethod
    def open(cls, model: str | Path, revision: str | None = None, cache_dir: str | None = None) -> Checkpoint:
        """Open a local folder, or download the needed files of hub repo `model` (config, safetensors, tokenizer)."""
        path = Path(model).expanduser()
        if path.is_dir():
            return cls(path, source=str(path.resolve()), revision=revision)
        if path.exists():
            raise CheckpointError(f"{path}: expected a checkpoint folder, found a file")
        if not _HUB_ID.match(str(model)):
            raise CheckpointError(f"{model}: no such checkpoint folder (and not a Hugging Face repo id)")
        return cls(download(str(model), revision, cache_dir), source=str(model), revision=revision)

    @property
    def tensor_names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> WeightTensor:
        """Tensor `name` as stored; `shape`, when given, is checked and a mismatch raises TensorError."""
        if name not in self._where:
            raise TensorError(f"{self.source}: tensor '{name}' is missing from the checkpoint")
        path = self._where[name]
        if path not in self._files:
            self._files[path] = SafetensorsFile(path)
        tensor = self._files[path].read(name)
        if shape is not None and tensor.shape != tuple(shape):
            raise TensorError(f"{path}: tensor '{name}' has shape {list(tensor.shape)}, expected {list(shape)}")
        return tensor

    def release(self, name: str) -> None:
        """Drop the pages of tensor `name` from this process's memory; they are read from the file again if needed."""
        path = self._where.get(name)
        if path in self._files:
            self._files[path].release(name)

    def own_file(self, name: str) -> Path | None:
        """`name` in the folder if it exists; a symlink leading outside the checkpoint raises CheckpointError (its
        target may be anything on this machine: nothing from there is read, nor copied into an export)."""
        path = self.folder / name
        if not path.exists() and not path.is_symlink():
            return None
        try:
            resolved = path.resolve(strict=True)
        except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (before Python 3.13)
            raise CheckpointError(f"{path}: a broken symlink ({e})") from e
        if not resolved.is_relative_to(self.root):
            raise CheckpointError(f"{path}: a symlink leading outside the checkpoint folder (to {resolved})")
        if not resolved.is_file():
            raise CheckpointError(f"{path}: not a regular file")
        return path

    def _map_tensors(self) -> dict[str, Path]:
        index = self.own_file(INDEX_FILE)
        if index is not None:
            return self._map_sharded(index)
        single = self.own_file(SINGLE_FILE)
        files = (
            [single]
            if single is not None
            else [self.own_file(p.name) for p in sorted(self.folder.glob("*.safetensors"))]
        )
        if not files:
            pickles = sorted(p.name for p in self.folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
            if pickles:
                raise CheckpointError(
                    f"{self.folder}: holds only pickle checkpoints ({', '.join(pickles)}); ovbuild "
                    "reads safetensors only and never unpickles: convert the weights to safetensors"
                )
            raise CheckpointError(f"{self.folder}: no safetensors weights found")
        where: dict[str, Path] = {}
        for path in files:
            for name in SafetensorsFile(path).tensors:
                if name in where:
                    raise CheckpointError(f"{path}: tensor '{name}' also appears in {where[name]}")
                where[name] = path
        return where

    def _map_sharded(self, index: Path) -> dict[str, Path]:
        """Read the shard index and check every shard against it, both ways."""
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: missing or empty 'weight_map'")
        for name, shard_name in weight_map.items():
            if not isinstance(shard_name, str) or not _plain_name(shard_name):
                raise CheckpointError(
                    f"{index}: tensor '{name}' is mapped to {_short(shard_name)}, which is not a file name in the "
                    "checkpoint folder"
                )
        where: dict[str, Path] = {}
        for shard_name in sorted(set(weight_map.values())):
            shard = self.own_file(shard_name)
            if shard is None:
                raise CheckpointError(f"{index}: shard '{shard_name}' listed in the index is missing")
            listed = {n for n, s in weight_map.items() if s == shard_name}
            present = set(SafetensorsFile(shard).tensors)
            if listed - present:
                raise CheckpointError(
                    f"{shard}: tensor '{sorted(listed - present)[0]}' is listed in {index.name} "
                    "but not stored in this shard"
                )
            if present - listed:
                raise CheckpointError(
                    f"{shard}: tensor '{sorted(present - listed)[0]}' is stored but not listed in {index.name}"
                )
            where.update(dict.fromkeys(listed, shard))
        return where


def _trusted_root(folder: Path) -> Path:
    """What symlinks in a checkpoint folder may lead into: the folder itself, or for a snapshot of the Hugging Face
    cache the repo's cache folder (snapshot files are symlinks into its blobs/)."""
    folder = folder.resolve()
    if folder.parent.name == "snapshots" and (folder.parent.parent / "blobs").is_dir():
        return folder.parent.parent
    return folder


def _plain_name(name: str) -> bool:
    """A file name without folders: no '/', no '..', not absolute (on any system)."""
    return name not in ("", ".", "..") and not any(c in name for c in "/\\\0") and Path(name).name == name


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_config(model: str | Path, revision: str | None = None, cache_dir: str | None = None) -> tuple[dict, Path]:
    """config.json of a local folder or hub repo (only that file is downloaded), and where it was read from."""
    path = Path(model).expanduser()
    if not path.is_dir():
        if path.exists() or not _HUB_ID.match(str(model)):
            raise CheckpointError(f"{model}: no such checkpoint folder (and not a Hugging Face repo id)")
        path = download(str(model), revision, cache_dir, patterns=["config.json"])
    return read_json(path / "config.json"), path / "config.json"


def download(repo_id: str, revision: str | None, cache_dir: str | None, patterns: list[str] = HUB_PATTERNS) -> Path:
    """Fetch only the files a build needs (`patterns`) from the Hugging Face Hub, or its local cache when offline."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns))
    except RepositoryNotFoundError as e:
        raise CheckpointError(f"{repo_id}: no such repository on the Hugging Face Hub") from e
    except LocalEntryNotFoundError as e:
        raise CheckpointError(
            f"{repo_id}: not in the local cache and the Hugging Face Hub is unreachable (offline?)"
        ) from e
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise CheckpointError(f"{repo_id}: download from the Hugging Face Hub failed ({e})") from e

"""The content-addressed cache: a folder of immutable entries, one per node key.

Layout under `root`:
    entries/<key[:2]>/<key>/   one committed entry: the node's output files + `.entry.json`
    tmp/<host>-<pid>-<rand>/   staging folders (same filesystem, so a commit is one rename)
    index/<sha256(node id)>.json   the inputs a node id was last built or found with (for explain)
    lock                       inter-process lock for commits, gc and clear

Entries appear only by `os.rename` of a complete, fsynced staging folder, so a reader never sees
half an entry. `.entry.json` lists every file with its size and sha256; `get` checks them and
discards an entry that no longer matches.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from synapse._fingerprint import bytes_digest, file_digest
from synapse.errors import CacheError

ENTRY_FILE = ".entry.json"
_ENTRY_SCHEMA = 1
_KEY_PATTERN = re.compile(r"[0-9a-f]{16,128}")
# Staging folders of crashed processes on other hosts cannot be probed; drop them after this.
_STALE_STAGING_S = 7 * 24 * 3600


@dataclass(frozen=True)
class CacheEntryInfo:
    key: str
    size: int  # bytes on disk, `.entry.json` included
    created: float  # unix time of the commit
    last_used: float  # unix time of the last commit or hit
    node_id: str
    kind: str
    path: Path


@dataclass(frozen=True)
class GcResult:
    removed: int
    freed_bytes: int
    kept: int
    kept_bytes: int


class Cache:
    """A content-addressed folder of build outputs, safe to share between processes.

    `verify_hashes=False` checks only sizes on `get` (for caches of many-GB weights where
    re-hashing every hit costs more than it protects). The folder is created on first write.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        verify_hashes: bool = True,
        lock_timeout_s: float = 600.0,
    ) -> None:
        self.root = Path(root)
        self.verify_hashes = verify_hashes
        self._lock_timeout_s = lock_timeout_s
        self._thread_lock = threading.RLock()
        self._host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r})"

    @property
    def _entries(self) -> Path:
        return self.root / "entries"

    @property
    def _tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def _index(self) -> Path:
        return self.root / "index"

    def entry_path(self, key: str) -> Path:
        """Where the entry for `key` lives once committed (it may not exist)."""
        if not isinstance(key, str) or not _KEY_PATTERN.fullmatch(key):
            raise CacheError(f"invalid cache key {key!r}: expected a lowercase hex digest")
        return self._entries / key[:2] / key

    # -- reading ---------------------------------------------------------------------------

    def get(self, key: str, *, on_discard: Callable[[str], None] | None = None) -> Path | None:
        """The entry folder for `key` if present and intact, else None.

        An entry whose files no longer match `.entry.json` is deleted; `on_discard` receives
        "corrupt cache entry discarded: <what was wrong>".
        """
        path = self.entry_path(key)
        if not path.is_dir():
            return None
        problem = _check_entry(path, self.verify_hashes)
        if problem is not None:
            self._remove_entries([path])
            if on_discard is not None:
                on_discard(f"corrupt cache entry discarded: {problem}")
            return None
        with contextlib.suppress(OSError):  # last_used is best effort (read-only caches)
            os.utime(path)
        return path

    def ls(self) -> list[CacheEntryInfo]:
        """Every committed entry, oldest use first."""
        infos = [_entry_info(path) for path in self._entry_paths()]
        return sorted(infos, key=lambda info: (info.last_used, info.key))

    # -- writing ---------------------------------------------------------------------------

    def staging_dir(self) -> Path:
        """A fresh empty folder under root/tmp to build an entry in before `put`."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{self._host}-{os.getpid()}-", dir=self._tmp))

    def put(self, key: str, staged_dir: str | os.PathLike[str], *, node_id="", kind="") -> Path:
        """Commit `staged_dir` as the entry for `key` and return the entry folder.

        A folder from `staging_dir()` is moved (it no longer exists afterwards); any other folder
        is copied first and left alone. If another process committed `key` first, its entry is
        kept and ours deleted: equal keys mean equal inputs, so either is right.
        """
        final = self.entry_path(key)
        staged = Path(staged_dir)
        if not staged.is_dir():
            raise CacheError(f"cannot cache {staged}: not a folder")
        if staged.resolve().parent != self._tmp.resolve():
            copy = self.staging_dir()
            shutil.copytree(staged, copy, dirs_exist_ok=True, symlinks=True)
            staged = copy
        try:
            manifest = {
                "schema": _ENTRY_SCHEMA,
                "key": key,
                "node_id": node_id,
                "kind": kind,
                "created": time.time(),
                "files": _hash_and_sync(staged),
            }
            _write_synced(staged / ENTRY_FILE, json.dumps(manifest, indent=1, sort_keys=True))
            _fsync_dir(staged)
            with self._locked():
                if final.is_dir():
                    shutil.rmtree(staged, ignore_errors=True)
                    return final
                final.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staged, final)
                _fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        with contextlib.suppress(OSError):
            os.utime(final)
        return final

    # -- explain records -------------------------------------------------------------------

    def record_inputs(self, node_id: str, record: Mapping[str, Any]) -> None:
        """Remember what `node_id` was last built or found with (key, inputs, dep keys, salt)."""
        self._index.mkdir(parents=True, exist_ok=True)
        path = self._index_path(node_id)
        text = json.dumps({"node_id": node_id, **record}, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=self._index)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def previous_inputs(self, node_id: str) -> dict[str, Any] | None:
        """The last record for `node_id`, or None if there is none (or it is unreadable)."""
        try:
            record = json.loads(self._index_path(node_id).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None
        return record if isinstance(record, dict) and record.get("node_id") == node_id else None

    def _index_path(self, node_id: str) -> Path:
        return self._index / f"{bytes_digest(node_id.encode('utf-8'))}.json"

    # -- eviction --------------------------------------------------------------------------

    def gc(self, max_bytes: int | None = None, older_than_s: float | None = None) -> GcResult:
        """Delete entries unused for `older_than_s`, then least recently used ones until the
        cache holds at most `max_bytes`. Also removes staging folders of dead processes.

        Run it between builds: an entry evicted while a concurrent build reads it as a
        dependency's output makes that build fail (never silently wrong).
        """
        with self._locked():
            entries = self.ls()  # oldest use first
            now = time.time()
            doomed = [
                e for e in entries if older_than_s is not None and now - e.last_used > older_than_s
            ]
            kept = [e for e in entries if e not in doomed]
            kept_bytes = sum(e.size for e in kept)
            while max_bytes is not None and kept_bytes > max_bytes and kept:
                evicted = kept.pop(0)
                doomed.append(evicted)
                kept_bytes -= evicted.size
            trash = [self._move_to_trash(e.path) for e in doomed]
            trash += self._stale_staging()
        for path in trash:
            shutil.rmtree(path, ignore_errors=True)
        return GcResult(
            removed=len(doomed),
            freed_bytes=sum(e.size for e in doomed),
            kept=len(kept),
            kept_bytes=kept_bytes,
        )

    def remove_stale_temporaries(self) -> int:
        """Delete staging and trash folders that no live process owns (a build killed outright
        leaves them); return how many. Every build starts with this, so a killed build's
        leftovers go at the next build. A folder's name carries its owner's host and pid: a live
        build's folders, and other hosts' (younger than 7 days), are kept."""
        stale = self._stale_staging()
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return len(stale)

    def discard(self, key: str) -> bool:
        """Delete the entry for `key` (True if there was one): for a step whose outcome was
        transient (a timeout), which must run again next time rather than be served."""
        path = self.entry_path(key)
        if not path.is_dir():
            return False
        self._remove_entries([path])
        return True

    def clear(self) -> int:
        """Delete every entry and explain record; return how many entries there were."""
        if not self.root.is_dir():
            return 0
        with self._locked():
            count = sum(1 for _ in self._entry_paths())
            trash = [self._move_to_trash(p) for p in (self._entries, self._index) if p.exists()]
            trash += self._stale_staging()
        for path in trash:
            shutil.rmtree(path, ignore_errors=True)
        return count

    def _remove_entries(self, paths: list[Path]) -> None:
        with self._locked():
            trash = [self._move_to_trash(p) for p in paths if p.exists()]
        for path in trash:
            shutil.rmtree(path, ignore_errors=True)

    def _move_to_trash(self, path: Path) -> Path:
        """Rename out of the way under the lock (instant); the caller deletes it after."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        trash = Path(tempfile.mkdtemp(prefix="trash-", dir=self._tmp))
        target = trash / path.name
        os.rename(path, target)
        return trash

    def _stale_staging(self) -> list[Path]:
        """Staging and trash folders no live process owns."""
        if not self._tmp.is_dir():
            return []
        stale = []
        now = time.time()
        for path in self._tmp.iterdir():
            host, _, rest = path.name.partition("-")
            pid = rest.partition("-")[0]
            try:
                age = now - path.stat().st_mtime
            except OSError:
                continue
            orphaned = path.name.startswith("trash-") and age > 60
            owner_dead = host == self._host and pid.isdigit() and not _pid_alive(int(pid))
            if orphaned or owner_dead or age > _STALE_STAGING_S:
                stale.append(path)
        return stale

    def _entry_paths(self) -> Iterator[Path]:
        if not self._entries.is_dir():
            return
        for shard in sorted(self._entries.iterdir()):
            if shard.is_dir():
                yield from (p for p in sorted(shard.iterdir()) if p.is_dir())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(self.root / "lock"), timeout=self._lock_timeout_s)
        with self._thread_lock:
            try:
                lock.acquire()
            except filelock.Timeout:
                raise CacheError(
                    f"cache {self.root} stayed locked for {self._lock_timeout_s:.0f}s; "
                    f"another process holds {self.root / 'lock'}"
                ) from None
            try:
                yield
            finally:
                lock.release()


def _relative_files(root: Path) -> Iterator[tuple[str, Path]]:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            yield path.relative_to(root).as_posix(), path


def _hash_and_sync(staged: Path) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for rel, path in sorted(_relative_files(staged)):
        if rel == ENTRY_FILE:
            raise CacheError(f"{path}: '{ENTRY_FILE}' is reserved for the cache's own index")
        if path.is_symlink() or not path.is_file():
            raise CacheError(f"{path}: only regular files can be cached (found a link or device)")
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        files[rel] = {"size": size, "sha256": digest}
    return files


def _check_entry(path: Path, verify_hashes: bool) -> str | None:
    """What is wrong with a committed entry, or None if it matches its `.entry.json`."""
    try:
        manifest = json.loads((path / ENTRY_FILE).read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("schema") != _ENTRY_SCHEMA or not isinstance(files, dict):
            return f"{ENTRY_FILE} has an unknown layout"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        # RecursionError: a crafted, deeply nested `.entry.json` is unreadable like any other.
        return f"{ENTRY_FILE} missing or unreadable"
    present = {rel for rel, _ in _relative_files(path)} - {ENTRY_FILE}
    if missing := sorted(set(files) - present):
        return f"file '{missing[0]}' missing"
    if extra := sorted(present - set(files)):
        return f"unexpected file '{extra[0]}'"
    for rel, meta in sorted(files.items()):
        file = path / rel
        try:
            if file.stat().st_size != meta["size"]:
                return f"file '{rel}' changed size"
            if verify_hashes and file_digest(file) != meta["sha256"]:
                return f"file '{rel}' content changed"
        except (OSError, KeyError, TypeError):
            return f"file '{rel}' unreadable"
    return None


def _entry_info(path: Path) -> CacheEntryInfo:
    try:
        manifest = json.loads((path / ENTRY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        manifest = {}
    if not isinstance(manifest, dict):
        manifest = {}
    size = 0
    for _, file in _relative_files(path):
        with contextlib.suppress(OSError):
            size += file.stat().st_size
    try:
        last_used = path.stat().st_mtime
    except OSError:
        last_used = 0.0
    return CacheEntryInfo(
        key=path.name,
        size=size,
        created=float(manifest.get("created", last_used)),
        last_used=last_used,
        node_id=str(manifest.get("node_id", "")),
        kind=str(manifest.get("kind", "")),
        path=path,
    )


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; not supported on every platform (Windows), so best effort.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

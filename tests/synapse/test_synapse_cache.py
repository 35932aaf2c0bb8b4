import os
import time

import pytest

from synapse import Cache, CacheError, bytes_digest

KEY_A, KEY_B, KEY_C = (bytes_digest(name) for name in (b"a", b"b", b"c"))


def stage(cache: Cache, files: dict[str, bytes]):
    staged = cache.staging_dir()
    for rel, data in files.items():
        (staged / rel).parent.mkdir(parents=True, exist_ok=True)
        (staged / rel).write_bytes(data)
    return staged


def test_put_moves_the_staged_folder_and_get_returns_it(tmp_path):
    cache = Cache(tmp_path / "cache")
    assert cache.get(KEY_A) is None
    assert not (tmp_path / "cache").exists()  # created lazily
    staged = stage(cache, {"module.vmfb": b"vm", "sub/params.irpa": b"pp"})
    entry = cache.put(KEY_A, staged, node_id="compile:mlp", kind="compile")
    assert not staged.exists()
    assert cache.get(KEY_A) == entry
    assert (entry / "sub" / "params.irpa").read_bytes() == b"pp"
    [info] = cache.ls()
    assert (info.key, info.node_id, info.kind) == (KEY_A, "compile:mlp", "compile")
    assert info.size > 4 and info.last_used >= info.created - 1
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_put_of_a_foreign_folder_copies_it(tmp_path):
    cache = Cache(tmp_path / "cache")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("x")
    entry = cache.put(KEY_A, outside)
    assert (outside / "f").exists() and (entry / "f").read_text() == "x"


def test_second_commit_of_a_key_keeps_the_first(tmp_path):
    cache = Cache(tmp_path / "cache")
    first = cache.put(KEY_A, stage(cache, {"f": b"first"}))
    late = stage(cache, {"f": b"second"})
    assert cache.put(KEY_A, late) == first
    assert (first / "f").read_bytes() == b"first"
    assert not late.exists()


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda e: (e / "f").write_bytes(b"tampered"), "file 'f' content changed"),
        (lambda e: (e / "f").write_bytes(b"much longer now"), "file 'f' changed size"),
        (lambda e: (e / "f").unlink(), "file 'f' missing"),
        (lambda e: (e / "stray").write_bytes(b""), "unexpected file 'stray'"),
        (lambda e: (e / ".entry.json").write_text("{"), ".entry.json missing or unreadable"),
    ],
)
def test_corrupt_entry_is_discarded(tmp_path, damage, problem):
    cache = Cache(tmp_path / "cache")
    entry = cache.put(KEY_A, stage(cache, {"f": b"original"}))
    damage(entry)
    messages = []
    assert cache.get(KEY_A, on_discard=messages.append) is None
    assert messages == [f"corrupt cache entry discarded: {problem}"]
    assert not entry.exists() and cache.ls() == []


def test_size_only_verification_misses_same_size_edits(tmp_path):
    cache = Cache(tmp_path / "cache", verify_hashes=False)
    entry = cache.put(KEY_A, stage(cache, {"f": b"original"}))
    (entry / "f").write_bytes(b"ORIGINAL")
    assert cache.get(KEY_A) == entry


def test_gc_by_size_evicts_least_recently_used_first(tmp_path):
    cache = Cache(tmp_path / "cache")
    for key in (KEY_A, KEY_B, KEY_C):
        cache.put(key, stage(cache, {"blob": b"x" * 1000}))
        time.sleep(0.02)  # file times tick coarsely
    assert cache.get(KEY_A) is not None  # A is now the most recently used
    size = {info.key: info.size for info in cache.ls()}
    result = cache.gc(max_bytes=size[KEY_A] + size[KEY_C])
    assert (result.removed, result.freed_bytes) == (1, size[KEY_B])
    assert (result.kept, result.kept_bytes) == (2, size[KEY_A] + size[KEY_C])
    assert cache.get(KEY_B) is None
    assert cache.get(KEY_A) is not None and cache.get(KEY_C) is not None
    assert cache.gc(max_bytes=0).removed == 2 and cache.ls() == []


def test_gc_by_age(tmp_path):
    cache = Cache(tmp_path / "cache")
    old = cache.put(KEY_A, stage(cache, {"f": b"1"}))
    cache.put(KEY_B, stage(cache, {"f": b"2"}))
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))  # last_used is the entry folder's mtime
    assert cache.gc(older_than_s=600).removed == 1
    assert [e.key for e in cache.ls()] == [KEY_B]


def test_gc_removes_staging_folders_of_dead_processes_only(tmp_path):
    cache = Cache(tmp_path / "cache")
    mine = cache.staging_dir()
    dead = mine.with_name(mine.name.replace(f"-{os.getpid()}-", "-999999999-"))
    dead.mkdir()
    cache.gc()
    assert mine.exists() and not dead.exists()


def test_clear_and_explain_records(tmp_path):
    cache = Cache(tmp_path / "cache")
    assert cache.clear() == 0
    cache.put(KEY_A, stage(cache, {"f": b"1"}))
    cache.record_inputs("compile:mlp", {"key": KEY_A, "inputs": {"source": "s1"}})
    assert cache.previous_inputs("compile:mlp")["inputs"] == {"source": "s1"}
    assert cache.previous_inputs("import:mlp") is None
    assert cache.clear() == 1
    assert cache.ls() == [] and cache.previous_inputs("compile:mlp") is None


def test_bad_keys_and_reserved_names_are_refused(tmp_path):
    cache = Cache(tmp_path / "cache")
    with pytest.raises(CacheError, match="invalid cache key"):
        cache.get("../../etc")
    staged = stage(cache, {".entry.json": b"{}"})
    with pytest.raises(CacheError, match="reserved"):
        cache.put(KEY_A, staged)
    assert not staged.exists() and cache.ls() == []

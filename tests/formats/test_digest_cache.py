"""The digest cache beyond reuse and rewrites (tests/formats/test_digest.py): a damaged, missing or
other-format cache only costs hashing again, a digest just taken is not trusted until the file's clock has
moved past it, and the cache file is written only when it changed."""

import hashlib
import json

import pytest

from accubisect.formats.digest import DIGESTS_FORMAT, DigestCache


def test_the_digest_is_the_files_sha256(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"\x08\x09onnx" * 1000)
    assert DigestCache(tmp_path / "digests.json").sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest()


def test_a_torn_cache_file_costs_only_hashing_again(tmp_path):
    model, store = tmp_path / "model.onnx", tmp_path / "digests.json"
    model.write_bytes(b"model")
    store.write_text('{"/some/model.onnx": [1, 2, 3')  # a write cut short
    cache = DigestCache(store)
    assert cache.sha256(model) == hashlib.sha256(b"model").hexdigest()
    cache.save()
    saved = json.loads(store.read_text())
    assert saved["format"] == DIGESTS_FORMAT and list(saved["entries"]) == [str(model.resolve())]


def test_the_cache_folder_is_created_when_first_saved(tmp_path):
    model, store = tmp_path / "model.onnx", tmp_path / "workspace" / "new" / "digests.json"
    model.write_bytes(b"model")
    cache = DigestCache(store)
    cache.sha256(model)
    cache.save()
    assert store.exists()


def test_an_unchanged_cache_is_not_written(tmp_path):
    store = tmp_path / "digests.json"
    DigestCache(store).save()
    assert not store.exists()
    store.write_text("{}")
    stamp = store.stat().st_mtime_ns
    DigestCache(store).save()
    assert store.stat().st_mtime_ns == stamp and store.read_text() == "{}"


def test_a_digest_taken_within_the_files_clock_tick_is_not_trusted(tmp_path):
    """Hashed right after the file was written, the entry cannot tell a rewrite in the same tick from no
    change: the next cache hashes the file again instead of returning what is recorded."""
    model, store, cache = _recorded(tmp_path)
    cache["entries"][str(model.resolve())][5] = "recorded"  # same stamp and hashing time: only the digest changed
    store.write_text(json.dumps(cache))
    assert DigestCache(store).sha256(model) == hashlib.sha256(b"model").hexdigest()


def test_a_file_of_another_size_is_hashed_again(tmp_path):
    model, store, cache = _recorded(tmp_path)
    cache["entries"][str(model.resolve())][4] += 10**10  # as if hashed long after the write: trusted while unchanged
    store.write_text(json.dumps(cache))
    model.write_bytes(b"a longer model")
    assert DigestCache(store).sha256(model) == hashlib.sha256(b"a longer model").hexdigest()


def _recorded(tmp_path):
    """A model file, the cache file that recorded its digest, and that file's content to edit."""
    model, store = tmp_path / "model.onnx", tmp_path / "digests.json"
    model.write_bytes(b"model")
    cache = DigestCache(store)
    cache.sha256(model)
    cache.save()
    return model, store, json.loads(store.read_text())


def test_a_cache_that_cannot_be_written_is_no_reason_to_stop(tmp_path):
    """A read-only or full workspace: the digest is still right, only not remembered."""
    model, blocked = tmp_path / "model.onnx", tmp_path / "workspace"
    model.write_bytes(b"model")
    blocked.write_text("a file where the workspace folder should be")
    cache = DigestCache(blocked / "digests.json")
    assert cache.sha256(model) == hashlib.sha256(b"model").hexdigest()
    cache.save()
    assert blocked.read_text() == "a file where the workspace folder should be"


def _trusted(model):
    """An entry the cache trusts for `model` as it is (hashed 10 s after its last change), holding another
    digest: returned only where the file it is in is read as a cache of this format."""
    stat = model.stat()
    return [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ctime_ns + 10**10, "recorded"]


@pytest.mark.parametrize(("written", "reused"), [
    (lambda path, entry: {"format": DIGESTS_FORMAT, "entries": {path: entry}}, True),  # this format: reused
    (lambda path, entry: {path: entry}, False),  # the entries alone, as before the format existed
    (lambda path, entry: {"format": 99, "entries": {path: entry}}, False),
    (lambda path, entry: {"format": DIGESTS_FORMAT, "entries": {path: [*entry[:4], "late", entry[5]]}}, False),
    (lambda path, entry: {"format": DIGESTS_FORMAT, "entries": {path: entry[:5]}}, False),
    (lambda path, entry: {"format": DIGESTS_FORMAT, "entries": [entry]}, False),
    (lambda path, entry: [path, entry], False),
], ids=["this format", "no format", "format 99", "damaged entry", "short entry", "entries not a map", "a list"])
def test_a_cache_of_another_format_or_damaged_is_discarded_and_rebuilt(tmp_path, written, reused):
    """A cache, never an error: what this version cannot read as its own is hashed again and written anew."""
    model, store = tmp_path / "model.onnx", tmp_path / "digests.json"
    model.write_bytes(b"model")
    store.write_text(json.dumps(written(str(model.resolve()), _trusted(model))))
    cache = DigestCache(store)
    assert cache.sha256(model) == ("recorded" if reused else hashlib.sha256(b"model").hexdigest())
    cache.save()
    saved = json.loads(store.read_text())
    assert saved["format"] == DIGESTS_FORMAT
    assert saved["entries"][str(model.resolve())][5] == ("recorded" if reused else hashlib.sha256(b"model").hexdigest())

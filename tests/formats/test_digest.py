"""The digest cache: a file's digest is reused only while the file provably has not changed."""

import json
import os

from accubisect.formats.digest import DigestCache


def test_a_rewritten_file_with_the_old_size_and_mtime_is_hashed_again(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"first model")
    cache = DigestCache(tmp_path / "digests.json")
    first = cache.sha256(model)
    cache.save()
    stamp = model.stat()
    model.write_bytes(b"other model")  # same size
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert model.stat().st_mtime_ns == stamp.st_mtime_ns
    assert DigestCache(tmp_path / "digests.json").sha256(model) != first


def test_an_old_unchanged_file_is_not_read_again(tmp_path):
    """The entry's ctime predates its hashing by more than the clock's slack: the cached digest is trusted."""
    model = tmp_path / "model.onnx"
    model.write_bytes(b"model")
    cache = DigestCache(tmp_path / "digests.json")
    cache.sha256(model)
    cache.save()
    cache = json.loads((tmp_path / "digests.json").read_text())
    stamp = cache["entries"][str(model.resolve())][:4]  # inode, size, mtime, ctime
    cache["entries"][str(model.resolve())] = [*stamp, stamp[3] + 10**10, "recorded"]  # hashed 10 s after the change
    (tmp_path / "digests.json").write_text(json.dumps(cache))
    assert DigestCache(tmp_path / "digests.json").sha256(model) == "recorded"

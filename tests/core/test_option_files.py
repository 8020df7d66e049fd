"""Files that a workload's options name, read under a worker's restriction: only regular
files under the allowed directories, up to a size, and the same refusal for every path
outside them whether it exists or not."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.option_files import FilePolicy, read_option_file, restricted


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    directory = tmp_path / "allowed"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "gpt2"}')
    return directory


def refusal(path: str) -> str:
    return (
        f"option config={path!r} is not a file this worker may read: it reads only regular "
        "files under the directories its owner allows (tuner worker --allow-path DIR)"
    )


def read(path: str | Path, policy: FilePolicy | None) -> bytes:
    with restricted(policy):
        return read_option_file(path, option="config", in_folder="config.json")


def test_without_a_restriction_a_path_is_read_as_given(tmp_path: Path, allowed: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text("{}")
    assert read(other, None) == b"{}"
    assert read(allowed, None) == b'{"model_type": "gpt2"}'  # a folder: its config.json


def test_files_under_the_allowed_directories_are_read(allowed: Path) -> None:
    policy = FilePolicy.of([str(allowed)])
    assert read(allowed / "config.json", policy) == b'{"model_type": "gpt2"}'
    assert read(allowed, policy) == b'{"model_type": "gpt2"}'
    inner = allowed / "inner"
    inner.mkdir()
    (inner / "link.json").symlink_to(allowed / "config.json")  # stays inside: fine
    assert read(inner / "link.json", policy) == b'{"model_type": "gpt2"}'


def test_outside_paths_are_refused_alike_whether_they_exist_or_not(
    tmp_path: Path, allowed: Path
) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (allowed / "escape.json").symlink_to(outside)
    (allowed / "zero.json").symlink_to("/dev/zero")
    policy = FilePolicy.of([str(allowed)])
    for path in (
        str(outside),
        str(tmp_path / "missing.json"),
        "/dev/zero",
        "/etc/shadow",
        f"{allowed}/../outside.json",
        f"{allowed}/../missing.json",
        str(allowed / "escape.json"),
        str(allowed / "zero.json"),
        "relative/config.json",
    ):
        with pytest.raises(WorkloadError) as refused:
            read(path, policy)
        assert refused.value.message == refusal(path)
    # No directory allowed: no file at all.
    with pytest.raises(WorkloadError, match="is not a file this worker may read"):
        read(allowed / "config.json", FilePolicy(()))


def test_fifos_and_large_files_are_refused_without_reading_them(allowed: Path) -> None:
    fifo = allowed / "fifo.json"
    os.mkfifo(fifo)
    (allowed / "big.json").write_bytes(b" " * 1025)
    policy = FilePolicy.of([str(allowed)], max_bytes=1024)
    done = threading.Event()

    def open_the_fifo() -> None:
        with pytest.raises(WorkloadError, match=r"is not a regular file$"):
            read(fifo, policy)  # no writer ever comes: opening must not wait for one
        done.set()

    reader = threading.Thread(target=open_the_fifo, daemon=True)
    reader.start()
    reader.join(timeout=5)
    assert done.is_set(), "reading the FIFO blocked"
    with pytest.raises(WorkloadError, match=r"larger than the 1 KiB this worker reads"):
        read(allowed / "big.json", policy)
    with pytest.raises(WorkloadError, match="cannot be read: No such file"):
        read(allowed / "missing.json", policy)  # inside: the owner allowed knowing that


def test_an_allowed_path_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"--allow-path .* is not a directory"):
        FilePolicy.of([str(tmp_path / "nope")])

"""The last answer to each recommendation question, kept on disk for when the service is
out of reach. Torch-free.

One small JSON file per question, named by the SHA-256 of the whole wire question
(:class:`RecommendationQuery`: workload, device, global batch, mesh, parallel mode, policy,
length, and the project it is asked in) and the service URL, so processes that ask
different questions never touch the same file. A file is written whole to a temporary name and
moved into place with ``os.replace``: a reader sees the old answer or the new one, never
half of one, even with many ranks writing at once.

Bounded in bytes, not entries: an answer's split is runs ``[[size, count], ...]``, so a file
is about 2 KiB whatever the batch (at most ``MAX_FILE_BYTES``; a larger one is neither
written nor read), and after each save the oldest files go until the directory holds at
most ``max_bytes`` (``DEFAULT_MAX_BYTES``, some 8,000 questions).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from platformdirs import user_cache_path
from pydantic import ValidationError

from tuner.core.urls import redact
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery

FORMAT_VERSION = 1
# An answer file is about 2 KiB; the rest is slack for long names and many probed speeds.
MAX_FILE_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


def default_cache_dir() -> Path:
    """``recommendations`` in the user's cache directory, e.g. ``~/.cache/microbatch-tuner``."""
    return user_cache_path("microbatch-tuner", appauthor=False) / "recommendations"


@dataclass(frozen=True)
class Question:
    """What a recommendation answers: the wire question (the project it is asked in
    included) and the service URL it is asked of."""

    service: str
    query: RecommendationQuery

    def document(self) -> dict[str, Any]:
        """The question as written into its file, the service's password left out: every
        field given (the project too, so that another project's answer is never served from
        the cache), ``tp`` left out at 1 as before meshes, so a question asked as before
        keeps its file."""
        document = self.query.model_dump(
            exclude_none=True, include=set(RecommendationQuery.model_fields)
        )
        if document.get("tp") == 1:
            del document["tp"]
        return {**document, "service": redact(self.service)}

    def digest(self) -> str:
        canonical = json.dumps(self.document(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def describe(self) -> str:
        query = self.query
        mesh = query.mesh
        ranks = f" over {mesh.world_size} ranks" if mesh.world_size > 1 else ""
        if mesh.is_mesh:
            ranks += f" as a {mesh.where()}"
        if query.parallel not in (None, "none"):
            ranks += f" under {query.parallel}"
        if query.seq_len is not None:
            ranks += f" at seq_len {query.seq_len}"
        if query.tokens_per_micro_batch is not None:
            ranks += f" packed to {query.tokens_per_micro_batch} tokens per micro batch"
        project = f" in project {query.project!r}" if query.project is not None else ""
        return (
            f"workload {query.workload!r} on device {query.device!r}, global batch "
            f"{query.global_batch_size}{ranks}, policy {query.policy}{project}"
        )


@dataclass(frozen=True)
class CachedAnswer:
    answer: RecommendationPublic
    saved_at: datetime


class AnswerCache:
    """Answers by question in ``directory`` (created on the first save), at most
    ``max_bytes`` of them: the least recently saved go first."""

    def __init__(self, directory: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    def _path(self, question: Question) -> Path:
        return self.directory / f"{question.digest()}.json"

    def save(self, question: Question, answer: RecommendationPublic) -> None:
        """Keep ``answer`` (its split as runs), then trim the directory to ``max_bytes``;
        raises ``OSError`` when the directory cannot be written."""
        document = {
            "version": FORMAT_VERSION,
            "question": question.document(),
            "saved_at": datetime.now(UTC).isoformat(),
            "answer": answer.model_dump(mode="json"),
        }
        text = json.dumps(document)
        if len(text.encode()) > MAX_FILE_BYTES:
            return  # never the case for an answer the service gives; not worth the disk
        self.directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(temporary, self._path(question))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._trim(keep=self._path(question))

    def _trim(self, *, keep: Path) -> None:
        """Remove the least recently saved answers until the directory holds at most
        ``max_bytes``. Another process may trim at the same time: a file already gone is
        fine, and a reader that loses its file answers as if nothing were cached."""
        files: list[tuple[float, int, Path]] = []
        for path in self.directory.glob("*.json"):
            try:
                stat = path.stat()
            except OSError:
                continue
            files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                return
            if path != keep:
                path.unlink(missing_ok=True)
                total -= size

    def load(self, question: Question) -> CachedAnswer | None:
        """The last answer saved for ``question``; None when there is none or it is unreadable
        (a file from another version, or damaged)."""
        path = self._path(question)
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                return None
            document = json.loads(path.read_text(encoding="utf-8"))
            if document.get("version") != FORMAT_VERSION:
                return None
            if document.get("question") != question.document():
                return None
            saved_at = datetime.fromisoformat(document["saved_at"])
            answer = RecommendationPublic.model_validate(document["answer"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ValidationError):
            return None
        return CachedAnswer(answer=answer, saved_at=saved_at)

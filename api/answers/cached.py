"""Answers kept ready to send: each question's JSON computed once per store generation.

Every training job asks for a recommendation at start-up, mostly the same few questions.
The route, its middleware and the dashboard's calculator all ask :func:`cached_or_computed`,
so a question has one answer wherever it is asked, computed by
:mod:`api.answers.recommendation` and cached under the question's key.
"""

from __future__ import annotations

import re
import time
from typing import Any, NamedTuple
from urllib.parse import quote_plus

from starlette.concurrency import run_in_threadpool

from api.answers import recommendation as answers
from api.cache import GenerationCache
from api.db import Database
from api.models import utcnow
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store.generation import DirectReader


class Answer(NamedTuple):
    """An answer ready to send: its JSON but for the age, the one part that moves.

    A tuple of bytes and a float, which the garbage collector stops tracking: tens of
    thousands of cached answers add nothing to the time of a full collection. Measured
    (``bench/fast_paths.py``): serializing the model for every request instead costs a
    new question 1.12× and a repeated one 1.45× (19 → 28 µs).
    """

    head: bytes  # the JSON object without profile_age_s and without its closing brace
    measured_at: float  # POSIX seconds

    @classmethod
    def of(cls, public: RecommendationPublic) -> Answer:
        document = public.model_dump_json(exclude={"profile_age_s"})
        return cls(document[:-1].encode(), public.profile_created_at.timestamp())

    def body(self) -> bytes:
        age = max(0.0, time.time() - self.measured_at)
        return b'%s,"profile_age_s":%s}' % (self.head, repr(age).encode())


# The order the Python client asks in (tuner.client's Question), so that its questions,
# spelled as this key spells them, are found without being parsed.
QUESTION_ORDER = (
    "workload",
    "device",
    "global_batch_size",
    "world_size",
    "policy",
    "parallel",
    "seq_len",
    "tokens_per_micro_batch",
    "tp",
)
# Left out of the key at these values, so that a question asked as before meshes keeps
# its key (and the Python client, which leaves them out too, its fast path).
_DEFAULTS_LEFT_OUT = {"tp": 1}


# The characters ``quote_plus`` leaves as they are.
_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]*")


def question_key(query: RecommendationQuery) -> bytes:
    """The question's cache key: its validated fields, query-encoded in one order.

    A question spelled another way (parameters reordered, padded with ``&``, a number
    written ``064``) has the same key, so a client cannot grow the cache by respelling one
    question; a request whose query string *is* the key (as the Python client sends it) is
    looked up before being parsed, the cached answer's fast path.
    """
    # What ``urlencode`` of the fields would give, without its cost where a value needs no
    # quoting (keys, numbers, modes: nearly every question): 15 us of a cold answer's 190.
    parts = []
    for name in QUESTION_ORDER:
        value = getattr(query, name)
        if value is None or _DEFAULTS_LEFT_OUT.get(name) == value:
            continue
        text = str(value)  # strings, whole numbers and modes (Literal strings)
        parts.append(f"{name}={text if _UNQUOTED.fullmatch(text) else quote_plus(text)}")
    return "&".join(parts).encode()


async def cached_or_computed(state: Any, query: RecommendationQuery, generation: int) -> Answer:
    """The answer to ``query``: cached under its key, or computed and cached."""
    key = question_key(query)
    cache: GenerationCache[Answer] = state.recommendations
    return cache.get(key, generation) or await computed_answer(state, query, key, generation)


async def computed_answer(
    state: Any, query: RecommendationQuery, key: bytes, generation: int
) -> Answer:
    """The answer to ``query`` from the store, kept for ``generation`` under ``key``."""
    reader: DirectReader = state.reader
    if reader.inline:
        public = reader.run(
            lambda connection: answers.recommend_on(connection, reader.dialect, query, now=utcnow())
        )
    else:
        db: Database = state.db

        def compute() -> RecommendationPublic:
            with db.session() as session:
                return answers.recommend(session, query, now=utcnow())

        public = await run_in_threadpool(compute)
    answer = Answer.of(public)
    # Read before the store was, so a write in between only makes the answer newer than
    # its generation, and the next request (seeing the new one) computes afresh.
    cache: GenerationCache[Answer] = state.recommendations
    cache.put(key, generation, answer)
    return answer

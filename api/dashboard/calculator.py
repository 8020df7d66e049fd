"""The calculator: a recommendation question read from a page's query string, answered by
the recommendation route's own code.

The page asks :func:`api.service.recommend` (what ``GET /api/v1/recommendation`` calls,
which asks :func:`tuner.answer.decide`) and shows the JSON that route sends, parsed: the
dashboard derives nothing of its own, so what a page shows and what a
training job receives for the same question cannot differ. A refusal is the route's own
message, the same one its 422, 404 or 409 carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlencode

from fastapi import Request

from api import service
from api.errors import STATUS_BY_CODE
from tuner.core import plan
from tuner.core.errors import BadInputError, TunerError
from tuner.core.parallel import PARALLEL_MODES
from tuner.core.shape import MeshShape
from tuner.core.wire.recommendation import RecommendationQuery, recommend_command

# What the calculator's form asks, in the form's order: the one question's own fields
# (``RecommendationQuery``, tested to stay so), named as the API's query parameters are, so
# that the page's URL carries the question and the API answers the same query string; but
# the project (the page's project menu) and a packing budget (a collator's setting, asked
# of the API or `tuner recommend`).
QUESTION_FIELDS = (
    "workload",
    "device",
    "global_batch_size",
    "world_size",
    "policy",
    "parallel",
    "seq_len",
    "tp",
)
NOT_ON_THE_FORM = ("project", "tokens_per_micro_batch")
POLICIES = plan.POLICIES
MODES = PARALLEL_MODES
DEFAULT_GLOBAL_BATCH = 256


@dataclass(frozen=True)
class Calculation:
    """A question as the form shows it, and the route's answer or refusal."""

    question: dict[str, str]
    answer: dict[str, Any] | None = None
    error: str | None = None
    status: int = 200  # the status GET /api/v1/recommendation gives this question
    command: str | None = None  # the `tuner recommend` command that gives the same answer

    @property
    def query_string(self) -> str:
        """The question as the API's query string (empty fields left out)."""
        return urlencode({k: v for k, v in self.question.items() if v != ""})


def default_global_batch(max_micro_batch_size: int, data_parallel: int) -> int:
    """A global batch people train with, asked before the reader asks their own.

    Global batches are hyperparameters picked from powers of two (256, 512, 1,024, ...),
    and one worth asking shows accumulation: about four of the largest micro batches on
    each data-parallel rank. So: the power of two nearest ``4 · M* · dp`` (in ratio), at
    least 256 (few recipes train on less), then rounded up to a multiple of ``dp`` so the
    question is valid. Four times ``M* · dp`` exactly (9,656 for an M* of 2,414) is a
    number no one trains with; 8,192 is.
    """
    wanted = 4 * max(1, max_micro_batch_size) * data_parallel
    below = 1 << (wanted.bit_length() - 1)  # the power of two at or below wanted
    nearest = below if wanted * wanted <= 2 * below * below else 2 * below
    chosen = max(DEFAULT_GLOBAL_BATCH, nearest)
    return -(-chosen // data_parallel) * data_parallel


def default_mesh(world_size: int, tp: int) -> MeshShape:
    """The newest run's mesh (``tp``) at the world size asked, where it is one there (the
    shape's own rule); else no mesh."""
    try:
        return MeshShape(world_size, tp)
    except BadInputError:
        return MeshShape(world_size)


def read_question(params: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """The form's fields: each as the query string gives it, else its default."""
    question = {name: str(defaults.get(name, "")) for name in QUESTION_FIELDS}
    for name in QUESTION_FIELDS:
        if name in params:
            question[name] = params[name].strip()
    return question


async def calculate(request: Request, question: dict[str, str], *, project_id: int) -> Calculation:
    """Ask the recommendation route's own code, in the reader's project; parse the JSON it
    sends."""
    asked = {name: value for name, value in question.items() if value != ""}
    try:
        query = RecommendationQuery.read(asked)
    except BadInputError as exc:
        return Calculation(question, error=exc.message, status=422)
    try:
        # As the route: in a worker thread, a few answers at a time.
        answer = await service.in_answer_thread(
            request, partial(service.recommend, project_id=project_id), request.app.state.db, query
        )
    except TunerError as exc:
        return Calculation(question, error=exc.message, status=STATUS_BY_CODE.get(exc.code, 400))
    # The rows the answer read, by key: the menus select them, and every later edit of the
    # form asks about these rows, never about whatever a name resolves to then.
    # The policy too: the menu has no blank choice, and one left unset showed none after an
    # answer; it shows the policy the answer used.
    meant = {
        **question,
        "workload": answer.workload_key,
        "device": answer.device_key,
        "policy": answer.policy,
    }
    return Calculation(
        meant, answer=answer.model_dump(mode="json"), command=recommend_command(answer)
    )

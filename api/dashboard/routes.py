"""The dashboard: server-rendered pages over the same store and tokens as the JSON API.

Pages need the ``read`` scope exactly as ``GET /api/v1/...`` does (``ReadAccess``), from the
``tuner_token`` cookie that the login form sets, or from nobody when the service runs with
public reads. A browser without either is sent to ``/login``; the JSON API keeps answering
401. The dashboard only reads: it offers no action that writes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.dashboard import calculator, failures, memory, queries
from api.dashboard.blocks import block_bars
from api.dashboard.compare import Candidate, candidates, compare, memory_parts
from api.dashboard.downloads import FORMATS, Format, download
from api.dashboard.failures import SHOWS, SINCE, SINCE_LABELS, FailureQuery, list_failures
from api.dashboard.lengths import by_device
from api.dashboard.timeline import timeline_view
from api.dashboard.variants import VariantRow, variant_rows
from api.dashboard.web import (
    STATIC,
    cookie_would_be_dropped,
    forget_token,
    is_htmx,
    login_redirect,
    remember_project,
    remember_token,
    render,
    safe_next,
    same_origin,
    stack,
)
from api.dashboard.worlds import world_sizes
from api.db import Database
from api.deps import (
    TOKEN_COOKIE,
    DatabaseDep,
    ReadAccess,
    SettingsDep,
    authorize,
    dashboard_reader,
    project_id,
)
from api.errors import STATUS_BY_CODE
from api.security import Principal, check_project_name
from api.store.tokens import authenticate
from tuner.core.errors import (
    AuthenticationError,
    BadInputError,
    NotFoundError,
    PermissionDeniedError,
    TunerError,
)
from tuner.core.results import OUTSIDE_BLOCKS
from tuner.core.wire.common import INT32_MAX, QueryInt

LOGIN_REASONS = {
    "expired": "Your token is no longer accepted (revoked or unknown): sign in with a valid one.",
}


class DashboardRoute(APIRoute):
    """Errors on a page become pages: a login redirect when the token is missing or no
    longer valid, and an HTML error page (same status as the API would give) otherwise."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                return await handler(request)
            except AuthenticationError:
                presented = TOKEN_COOKIE in request.cookies
                return login_redirect(request, reason="expired" if presented else None)
            except TunerError as exc:
                status = STATUS_BY_CODE.get(exc.code, 400)
                return render(
                    request,
                    "error.html",
                    principal=await _reader(request),
                    status_code=status,
                    status=status,
                    message=exc.message,
                )
            except RequestValidationError:
                # Only path parameters are typed here: a malformed id names nothing.
                try:
                    principal = await authorize(request, "read")
                except AuthenticationError:
                    presented = TOKEN_COOKIE in request.cookies
                    return login_redirect(request, reason="expired" if presented else None)
                return not_found(request, principal)

        return page


async def _reader(request: Request) -> Principal | None:
    """Who is reading, for the header of an error page; nobody when no token is valid."""
    try:
        return await authorize(request, "read")
    except TunerError:
        return None


router = APIRouter(route_class=DashboardRoute, include_in_schema=False)
# Registered after everything else (the API, the static files): any other path.
fallback = APIRouter(route_class=DashboardRoute, include_in_schema=False)

RowId = Annotated[QueryInt, PathParam(ge=1, le=INT32_MAX)]
# As long as the store's column (models.Workload.length_family); longer names nothing.
FamilyKey = Annotated[str, PathParam(min_length=1, max_length=64)]


def install(app: FastAPI) -> None:
    """Serve the pages and their static files (scripts, styles, vendored libraries)."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=Path(STATIC)), name="static")
    app.include_router(fallback)


def not_found(request: Request, principal: Principal | None) -> Response:
    """The styled 404 page, under the header of whoever is signed in."""
    return render(
        request,
        "error.html",
        principal=principal,
        status_code=404,
        status=404,
        message=f"there is no page at {request.url.path}: start from the links above",
    )


# Paths the JSON API owns: an unknown one there is answered in JSON, as the API answers.
_API_PATHS = ("/api/", "/docs", "/openapi.json", "/redoc", "/health", "/static/")


@fallback.get("/{unknown:path}")
async def unknown_page(request: Request) -> Response:
    """Any other path: the styled 404 page for a browser, the API's JSON 404 under /api."""
    if request.url.path.startswith(_API_PATHS):
        raise StarletteHTTPException(status_code=404, detail="Not Found")
    principal = await authorize(request, "read")
    return not_found(request, principal)


def _now() -> datetime:
    return datetime.now(UTC)


# Profiles


def _optional_id(params: Any, name: str, what: str) -> int | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= INT32_MAX:
        raise BadInputError(f"{name}={raw!r} is not a {what} id: pick one from the menu")
    return int(raw)


def _page(params: Any) -> int:
    page_text = params.get("page") or "1"
    if not (page_text.isascii() and page_text.isdigit()) or not 1 <= int(page_text) <= INT32_MAX:
        raise BadInputError(f"page={page_text!r}: pages are numbered from 1")
    return int(page_text)


def parse_list_query(params: Any) -> queries.ListQuery:
    """The list's query string, refusing what the page never produces with a clear error."""
    sort = params.get("sort") or "created"
    if sort not in queries.SORT_KEYS:
        raise BadInputError(f"sort={sort!r}: sort by one of {', '.join(queries.SORT_KEYS)}")
    order = params.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise BadInputError(f"order={order!r}: use asc or desc")
    page = _page(params)
    size_text = params.get("size") or str(queries.DEFAULT_PAGE_SIZE)
    sizes = ", ".join(str(size) for size in queries.PAGE_SIZES)
    if not (size_text.isascii() and size_text.isdigit()) or (
        int(size_text) not in queries.PAGE_SIZES
    ):
        raise BadInputError(f"size={size_text!r}: show {sizes} profiles a page")
    return queries.ListQuery(
        workload_id=_optional_id(params, "workload", "workload"),
        device_id=_optional_id(params, "device", "device"),
        latest_only=params.get("latest") in ("1", "on", "true"),
        sort=sort,
        descending=order == "desc",
        page=page,
        size=int(size_text),
    )


@router.get("/")
async def landing_page(request: Request, db: DatabaseDep, principal: ReadAccess) -> Response:
    """The question on landing: micro batch and accumulation for a global batch, answered
    by the recommendation route's own code.

    A page opened with no question goes to the reader's last one (:mod:`.memory`), so the
    URL carries it and can be shared; without one, it asks about the most profiled
    workload, at its newest profile's run and a global batch people train with
    (:func:`calculator.default_global_batch`). What the URL leaves out is that run's: the
    page's script sends only the fields the reader set, so another workload brings its own
    world size, parallel mode and mesh (tp)."""
    params = request.query_params
    given = memory.asked(params)
    if not given and not is_htmx(request):
        last = memory.recall(request, principal)
        if last is not None:
            return RedirectResponse("/?" + last, status_code=303)

    def read() -> tuple[queries.QuestionChoices, int]:
        with db.session() as session:
            choices = queries.question_choices(
                session,
                project_id=principal.project,
                workload=params.get("workload"),
                device=params.get("device"),
            )
            return choices, queries.profile_count(session, principal.project)

    choices, count = await run_in_threadpool(read)
    calc = None
    if choices.newest is not None:
        newest = choices.newest
        asked_world = params.get("world_size", "").strip()
        # A global batch the world size asked divides, when one is asked.
        world = int(asked_world) if asked_world.isdigit() and int(asked_world) > 0 else None
        # The newest run's mesh, where the world size asked (or its own) is one: left
        # blank (1) without one, so questions read as before meshes.
        mesh = calculator.default_mesh(world or newest.world_size, newest.tp)
        defaults = {
            "workload": newest.workload_key,
            "device": newest.device_key,
            "world_size": str(newest.world_size),
            "parallel": newest.parallel_mode,
            "tp": str(mesh.tp) if mesh.is_mesh else "",
            "global_batch_size": str(
                calculator.default_global_batch(newest.max_micro_batch_size, mesh.dp)
            ),
        }
        question = calculator.read_question(params, defaults)
        calc = await calculator.calculate(request, question, project_id=principal.project)
    response = render(
        request,
        "landing.html",
        principal=principal,
        calc=calc,
        given=[name for name in calculator.QUESTION_FIELDS if name in params],
        choices=choices,
        count=count,
        now=_now(),
        base_url=str(request.base_url).rstrip("/"),
    )
    if given and calc is not None and calc.answer is not None:
        # The workload as the answer read it (a key), so the question comes back about
        # the same rows even when another workload is profiled more since.
        memory.remember(response, principal, {**given, "workload": calc.question["workload"]})
    return response


@router.get("/profiles")
def profiles_page(request: Request, db: DatabaseDep, principal: ReadAccess) -> Response:
    """Stored profiles: filter by workload and device, sort, page."""
    query = parse_list_query(request.query_params)
    with db.session() as session:
        listing = queries.list_profiles(session, query, project_id=principal.project)
    return render(
        request,
        "profiles.html",
        principal=principal,
        query=query,
        listing=listing,
        page_sizes=queries.PAGE_SIZES,
        export_limit=queries.EXPORT_LIMIT,
        now=_now(),
        base_url=str(request.base_url).rstrip("/"),
    )


@router.get("/profiles.{form}")
def profiles_download(
    request: Request, form: str, db: DatabaseDep, principal: ReadAccess
) -> Response:
    """The profile list as CSV or JSON: the page's filters and sort, every page up to
    ``EXPORT_LIMIT`` rows."""
    shown = _download_format(form)
    query = replace(parse_list_query(request.query_params), page=1, size=queries.EXPORT_LIMIT)
    with db.session() as session:
        listing = queries.list_profiles(session, query, project_id=principal.project)
    return download(
        [row.record() for row in listing.rows],
        fields=queries.PROFILE_FIELDS,
        count=listing.count,
        name="profiles",
        form=shown,
    )


def _download_format(form: str) -> Format:
    for known in FORMATS:
        if form == known:
            return known
    raise NotFoundError(f"no download as .{form}: lists download as .csv or .json")


@router.get("/profiles/{profile_id}")
async def profile_page(
    request: Request, profile_id: RowId, db: DatabaseDep, principal: ReadAccess
) -> Response:
    """One profile: the calculator first (asking as this profile's run), then its memory
    and throughput charts and the breakdown at M*."""

    def read() -> tuple[queries.ProfileDetail, list[VariantRow], list[Candidate]]:
        with db.session() as session:
            detail = queries.profile_detail(session, profile_id, project_id=principal.project)
            others = candidates(
                session,
                profile_id,
                detail.profile.workload_id,
                detail.profile.device_id,
                project_id=principal.project,
            )
            group = detail.profile.variant_group
            if group is None:
                return detail, [], others
            return detail, variant_rows(session, profile_id, project_id=principal.project), others

    detail, variants, others = await run_in_threadpool(read)
    profile, probe = detail.profile, detail.at_max
    mesh = calculator.default_mesh(profile.world_size, profile.parallel.tp)
    defaults = {
        "workload": profile.workload_key,
        "device": profile.device_key,
        "world_size": str(profile.world_size),
        "parallel": profile.parallel.mode,
        # A mesh's tp; left blank (1) without one, so questions read as before.
        "tp": str(mesh.tp) if mesh.is_mesh else "",
        "global_batch_size": str(
            calculator.default_global_batch(profile.max_micro_batch_size, mesh.dp)
        ),
    }
    # The page's profile fixes the workload and the device; the form asks the rest.
    params = {k: v for k, v in request.query_params.items() if k not in ("workload", "device")}
    question = calculator.read_question(params, defaults)
    calc = (
        await calculator.calculate(request, question, project_id=principal.project)
        if profile.max_micro_batch_size > 0
        else calculator.Calculation(question)
    )
    parts = memory_parts(probe)
    breakdown = stack(parts, profile.device.capacity_bytes) if parts else []
    located = probe or profile.oversize_probe
    located_parts = located.breakdown if located is not None else None
    return render(
        request,
        "profile.html",
        principal=principal,
        detail=detail,
        profile=profile,
        probe=probe,
        breakdown=breakdown,
        blocks=block_bars(located_parts.activations_by_block_bytes if located_parts else {}),
        blocks_probe=located,
        peak_phase=located_parts.peak_phase if located_parts else None,
        outside_blocks=OUTSIDE_BLOCKS,
        variants=variants,
        compare_with=others,
        timeline=timeline_view(probe),
        calc=calc,
        now=_now(),
    )


# Comparing two profiles


def _compared_ids(params: Any) -> tuple[int, int] | None:
    """The two profiles asked: ``a`` and ``b``, or two ``p`` (the list's check boxes);
    ``None`` when the ``p`` form was used (the page redirects to its ``a``/``b`` URL)."""
    picked = params.getlist("p")
    if picked:
        if len(picked) != 2:
            raise BadInputError(
                f"{len(picked)} profile{'' if len(picked) == 1 else 's'} picked: tick two "
                "rows of the list to compare them"
            )
        return None
    a = _optional_id(params, "a", "profile")
    b = _optional_id(params, "b", "profile")
    if a is None or b is None:
        raise BadInputError(
            "compare two profiles: /compare?a=ID&b=ID, or tick two rows of the profile list"
        )
    return a, b


@router.get("/compare")
def compare_page(request: Request, db: DatabaseDep, principal: ReadAccess) -> Response:
    """Two profiles side by side: M*, the peak at M* and its breakdown with the differences,
    and both profiles' peaks against micro batch size on one chart."""
    params = request.query_params
    ids = _compared_ids(params)
    if ids is None:
        a = _optional_id({"a": params.getlist("p")[0]}, "a", "profile")
        b = _optional_id({"b": params.getlist("p")[1]}, "b", "profile")
        return RedirectResponse(f"/compare?a={a}&b={b}", status_code=303)
    with db.session() as session:
        comparison = compare(session, *ids, project_id=principal.project)
    return render(
        request,
        "compare.html",
        principal=principal,
        c=comparison,
        now=_now(),
    )


# Failures


def parse_failure_query(params: Any) -> FailureQuery:
    """The failures page's query string, refusing what the page never produces."""
    show = params.get("show") or "all"
    if show not in SHOWS:
        raise BadInputError(f"show={show!r}: show one of {', '.join(SHOWS)}")
    since = params.get("since") or "all"
    if since not in SINCE:
        raise BadInputError(f"since={since!r}: use one of {', '.join(SINCE)}")
    return FailureQuery(
        workload_id=_optional_id(params, "workload", "workload"),
        device_id=_optional_id(params, "device", "device"),
        show=show,
        since=since,
        page=_page(params),
    )


@router.get("/failures")
def failures_page(
    request: Request, db: DatabaseDep, settings: SettingsDep, principal: ReadAccess
) -> Response:
    """What went wrong, newest first: OOM reports, failed probes, failed and retried jobs,
    silent workers; by workload, device, kind and age."""
    query = parse_failure_query(request.query_params)
    now = _now()
    with db.session() as session:
        listing = list_failures(
            session,
            query,
            project_id=principal.project,
            now=now,
            silent_after=_silent_after(settings),
            limit=failures.PAGE_SIZE,
        )
    return render(
        request,
        "failures.html",
        principal=principal,
        query=query,
        listing=listing,
        shows=SHOWS,
        since_labels=SINCE_LABELS,
        page_size=failures.PAGE_SIZE,
        export_limit=queries.EXPORT_LIMIT,
        now=now,
    )


@router.get("/failures.{form}")
def failures_download(
    request: Request, form: str, db: DatabaseDep, settings: SettingsDep, principal: ReadAccess
) -> Response:
    """The failures as CSV or JSON: the page's filters, up to ``EXPORT_LIMIT`` rows."""
    shown = _download_format(form)
    query = parse_failure_query(request.query_params)
    with db.session() as session:
        listing = list_failures(
            session,
            query,
            project_id=principal.project,
            now=_now(),
            silent_after=_silent_after(settings),
            limit=queries.EXPORT_LIMIT,
            page=1,
        )
    return download(
        [row.record() for row in listing.rows],
        fields=failures.FIELDS,
        count=listing.count,
        name="failures",
        form=shown,
    )


def _silent_after(settings: Any) -> timedelta:
    # A worker claims every couple of seconds when idle and heartbeats a third of a lease
    # while busy: two leases of silence mean it is gone.
    return timedelta(seconds=2 * settings.lease_seconds)


# Workloads


@router.get("/workloads")
def workloads_page(request: Request, db: DatabaseDep, principal: ReadAccess) -> Response:
    """Every workload, most recently profiled first."""
    with db.session() as session:
        workloads = queries.list_workloads(session, principal.project)
    return render(
        request,
        "workloads.html",
        principal=principal,
        workloads=workloads,
        limit=queries.WORKLOAD_LIST_LIMIT,
        now=_now(),
        base_url=str(request.base_url).rstrip("/"),
    )


@router.get("/workloads/{workload_id}")
def workload_page(
    request: Request, workload_id: RowId, db: DatabaseDep, principal: ReadAccess
) -> Response:
    """One workload's M* and throughput on each device, side by side, and against W."""
    with db.session() as session:
        detail = queries.workload_detail(session, workload_id, project_id=principal.project)
        by_world = world_sizes(session, detail.workload)
    return render(
        request,
        "workload.html",
        principal=principal,
        detail=detail,
        worlds=by_world,
        now=_now(),
    )


@router.get("/families/{family_key}")
def length_family_page(
    request: Request, family_key: FamilyKey, db: DatabaseDep, principal: ReadAccess
) -> Response:
    """A sequence-length family: M* and tokens per micro batch against sequence length on
    each device, measured and estimated."""
    with db.session() as session:
        family = queries.length_family(session, family_key, project_id=principal.project)
        devices = by_device(family.profiles)
    return render(
        request,
        "family.html",
        principal=principal,
        family=family,
        devices=devices,
        now=_now(),
    )


@router.get("/devices")
def devices_page(request: Request, db: DatabaseDep, principal: ReadAccess) -> Response:
    """Every device: its memory, what was measured on it, and the workers that serve it."""
    with db.session() as session:
        devices = queries.list_devices(session, principal.project)
    return render(
        request,
        "devices.html",
        principal=principal,
        devices=devices,
        now=_now(),
        base_url=str(request.base_url).rstrip("/"),
    )


# Jobs and workers


@router.get("/jobs")
def jobs_page(
    request: Request, db: DatabaseDep, settings: SettingsDep, principal: ReadAccess
) -> Response:
    """Queued, running and failed jobs with their reasons; workers and their heartbeats."""
    with db.session() as session:
        overview = queries.jobs_overview(session, principal.project)
    return render(
        request,
        "jobs.html",
        principal=principal,
        overview=overview,
        silent_after_s=_silent_after(settings).total_seconds(),
        now=_now(),
        base_url=str(request.base_url).rstrip("/"),
    )


# Login


@router.get("/login")
def login_form(request: Request) -> Response:
    """The form that trades an API token for the dashboard's cookie."""
    reason = request.query_params.get("reason")
    return render(
        request,
        "login.html",
        next=safe_next(request.query_params.get("next")),
        notice=LOGIN_REASONS.get(reason or ""),
        error=None,
        insecure=cookie_would_be_dropped(request),
    )


def _check_token(db: Database, token: str) -> None:
    with db.session() as session:
        authenticate(session, token)


def _cross_site(request: Request, what: str) -> Response | None:
    """The 403 page for a form posted from another site, else None."""
    if same_origin(request):
        return None
    message = f"{what} was posted from another site, so it was refused"
    return render(request, "error.html", status_code=403, status=403, message=message)


async def _posted_form(request: Request) -> dict[str, list[str]]:
    """The posted form's fields; none when it has more than the dashboard's forms do."""
    try:
        return parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
    except ValueError:  # more fields than the form has: not our form
        return {}


@router.post("/login")
async def login(request: Request, db: DatabaseDep) -> Response:
    """Check the token as the API would, then keep it in a secure, http-only cookie."""
    refused = _cross_site(request, "this login form")
    if refused is not None:
        return refused
    form = await _posted_form(request)
    token = (form.get("token") or [""])[0].strip()
    target = safe_next((form.get("next") or ["/"])[0])
    try:
        if not token:
            raise AuthenticationError("paste an API token (it starts with mbt_)")
        await run_in_threadpool(_check_token, db, token)
    except AuthenticationError as exc:
        return render(
            request,
            "login.html",
            status_code=401,
            next=target,
            notice=None,
            error=exc.message,
            insecure=cookie_would_be_dropped(request),
        )
    response = RedirectResponse(target, status_code=303)
    remember_token(response, token)
    return response


@router.post("/project")
async def switch_project(request: Request) -> Response:
    """A token of every project: show another project (a cookie the pages read)."""
    refused = _cross_site(request, "this project switch")
    if refused is not None:
        return refused
    principal = await dashboard_reader(request)
    form = await _posted_form(request)
    name = (form.get("project") or [""])[0].strip()
    if principal.project_id is not None:
        raise PermissionDeniedError(
            f"token {principal.name!r} reads its own project only: sign in with a token of "
            "every project (`tuner token create --scope admin --all-projects`) to switch"
        )
    check_project_name(name)
    await project_id(request, name)  # a project that exists, else a 404 page that says so
    response = RedirectResponse("/", status_code=303)
    remember_project(response, name)
    return response


@router.post("/logout")
def logout(request: Request, settings: SettingsDep) -> Response:
    """Forget the cookie; with public reads the pages stay readable without it."""
    refused = _cross_site(request, "this sign-out")
    if refused is not None:
        return refused
    response = RedirectResponse("/" if settings.public_reads else "/login", status_code=303)
    forget_token(response)
    return response


__all__ = ["install", "router"]

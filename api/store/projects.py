"""Projects: a team's own part of the store. Every workload, device, job, worker and OOM
report is one project's, a profile its workload's; a token reads and writes its own
project's rows only (:mod:`api.security`)."""

from __future__ import annotations

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from api import models
from api.models import Project
from api.security import check_project_name
from tuner.core.errors import NotFoundError


def ensure_project(session: Session, name: str) -> Project:
    """The project ``name``, created if new."""
    check_project_name(name)
    found = session.scalar(select(Project).where(Project.name == name))
    if found is None:
        found = Project(name=name)
        session.add(found)
        session.flush()
    return found


def project_id_of(session: Session, name: str) -> int | None:
    """The id of the project ``name``, or None when there is none."""
    found: int | None = session.scalar(select(Project.id).where(Project.name == name))
    return found


def unknown_project(name: str) -> NotFoundError:
    """The error for a project name no project bears."""
    return NotFoundError(
        f"no project is named {name!r}: `tuner token create --project {name}` creates it"
    )


def project_names(session: Session) -> dict[int, str]:
    return {row.id: row.name for row in session.execute(select(Project.id, Project.name))}


def in_project(project_id: int) -> ColumnElement[bool]:
    """Profiles of the project's workloads (a profile belongs to its workload's project)."""
    of_project = select(models.Workload.id).where(models.Workload.project_id == project_id)
    return models.Profile.workload_id.in_(of_project)

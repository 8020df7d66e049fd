"""Request and response schemas of the REST API, one module per resource.

Pydantic only: the client imports these to read the service's answers, so nothing here may
import FastAPI, SQLAlchemy or torch.
"""

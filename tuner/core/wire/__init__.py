"""The wire contract: the request and response schemas the client, the worker and the
service speak, one module per resource.

Pydantic and the core only: the client and the worker read the service's answers with
these, and the service checks what it is sent with them, so nothing here may import
FastAPI, SQLAlchemy, torch or the service (``api``).
"""

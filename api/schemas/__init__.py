"""The recommendation's request and response schemas (``recommendation``), until they join
the answer in ``tuner``; every other resource's schemas are the wire contract in
``tuner.core.wire``, which the client and the worker speak too.

Pydantic only: the client imports these to read the service's answers, so nothing here may
import FastAPI, SQLAlchemy or torch.
"""

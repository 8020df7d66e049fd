"""The store: every read and write of the service's tables goes through these functions,
each taking a session from ``api.db.Database.session`` (which owns the transaction)."""

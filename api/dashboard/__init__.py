"""The dashboard: its queries, number and date formatting, vendored scripts, HTML
plumbing (templates, security headers, static URLs) and its routes, beside the service's
``routes/``, ``schemas/`` and ``store/``."""

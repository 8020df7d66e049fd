"""The wire contract: the request and response schemas the client, the worker and the
service speak. Torch-free; the service (``api``) imports them from here."""

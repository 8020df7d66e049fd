"""The torch-free contract every part shares: the profile schema (``results``), the
recommendation math (``plan``), the errors and their codes, byte units, and the wire
contract (``wire``): the request and response schemas the client, the worker and the
service speak.

Imports nothing else of the project, so the service, the client and the engine can all
stand on it.
"""

__version__ = "0.1.0"

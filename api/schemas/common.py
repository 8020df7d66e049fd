"""The shared field types of request and response schemas (they live in the wire contract)."""

from tuner.core.wire.common import *  # noqa: F403
from tuner.core.wire.common import (  # noqa: F401
    API_PREFIX,
)

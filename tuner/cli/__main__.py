"""``python -m tuner.cli``: the same as the ``tuner`` console script."""

import sys

from tuner.cli.main import main

sys.exit(main())

"""``python -m medheval.cli``."""

import sys

from medheval.cli.main import entry_point

sys.exit(entry_point())

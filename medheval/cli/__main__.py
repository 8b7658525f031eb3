"""``python -m medheval.cli``."""

import sys

from medheval.cli.main import main

sys.exit(main())

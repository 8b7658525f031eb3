"""``python -m medheval …``: the ``medheval`` command (:func:`medheval.cli.entry_point`), where the console
script is not on ``PATH``."""

import sys

from medheval.cli import entry_point

if __name__ == "__main__":
    sys.exit(entry_point())

"""``python -m medheval …``: the ``medheval`` command (:func:`medheval.cli.main`), where the console script is not
on ``PATH``."""

import sys

from medheval.cli import main

if __name__ == "__main__":
    sys.exit(main())

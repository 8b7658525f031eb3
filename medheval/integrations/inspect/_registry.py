"""What inspect_ai loads through our ``inspect_ai`` entry point (setup.cfg): a few import lines and the check of
our harness dependencies (:mod:`medheval.integrations.stack`, one line per problem)."""

from medheval.integrations.stack import check

check("inspect_ai")

from medheval.integrations.inspect.provider import medheval_provider  # noqa: F401  (--model medheval/<folder>)
from medheval.integrations.inspect.tasks import TASKS  # noqa: F401  (tasks medheval/<benchmark>)

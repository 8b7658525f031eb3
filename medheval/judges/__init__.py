"""LLM judges for judge-based metrics: OpenAI-compatible, Azure OpenAI, Anthropic, local transformers.

>>> from medheval.judges import make_judge, JudgeRequest
>>> judge = make_judge("openai:gpt-4o@http://127.0.0.1:8000/v1", cache_dir=False)  # doctest: +SKIP
>>> judge.run([JudgeRequest("q1", system="Score 0-5 ...", user="...")])           # doctest: +SKIP

Every judge is cached on disk, concurrent (HTTP), retries faults with backoff, validates JSON
replies with a bounded corrective budget, and refuses to send credentialed (PhysioNet) records
to a non-local endpoint without an explicit opt-in. See ``docs/judges.md`` in the
repository, and this module's submodules, for the details.
"""

from __future__ import annotations

from medheval.judges.agreement import agreement
from medheval.judges.base import Completion, Judge, JudgeError, JudgeRequest, JudgeResult
from medheval.judges.cache import JudgeCache, default_cache_dir
from medheval.judges.endpoints import CredentialedDataError, is_local_host, is_local_url
from medheval.judges.spec import backend_of, close_judges, judge_for, make_judge, parse_spec
from medheval.judges.structured import parse_json_object

__all__ = [
    "backend_of",
    "close_judges",
    "judge_for",
    "Completion",
    "CredentialedDataError",
    "Judge",
    "JudgeCache",
    "JudgeError",
    "JudgeRequest",
    "JudgeResult",
    "agreement",
    "default_cache_dir",
    "is_local_host",
    "is_local_url",
    "make_judge",
    "parse_json_object",
    "parse_spec",
]

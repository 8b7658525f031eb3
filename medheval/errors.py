"""The exceptions that mean "the user's input or setup is wrong" (shown as one message, no traceback)."""

from __future__ import annotations

from medheval.backends.base import BackendError
from medheval.data.fetch import AnnotationUnavailable, ChecksumMismatch
from medheval.data.images import ImageError
from medheval.judges import CredentialedDataError, JudgeError
from medheval.run.outputs import OutputFolderLocked, OutputFolderUnusable, UnsafeOutputPath
from medheval.run.predictions_log import CorruptLogError
from medheval.data.credentialed import CredentialedImageError
from medheval.run.distributed import RankFailed
from medheval.data.registry import NoUnitsError
from medheval.run.runner import RunError

USER_ERRORS: tuple[type[BaseException], ...] = (
    AnnotationUnavailable,
    CredentialedImageError,
    BackendError,
    ChecksumMismatch,
    CorruptLogError,
    CredentialedDataError,
    JudgeError,
    ImageError,
    OutputFolderLocked,
    OutputFolderUnusable,
    UnsafeOutputPath,
    RankFailed,
    NoUnitsError,
    RunError,
    KeyError,
    ValueError,
)

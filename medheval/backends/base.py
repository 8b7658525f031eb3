"""What every model under test looks like to the runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image


class BackendError(Exception):
    """A backend cannot produce predictions: the message says what was wrong and what to do."""


@runtime_checkable
class Backend(Protocol):
    """A model under test.

    Attributes:
        name: the model id recorded with every prediction and in results.json.
        needs_images: whether :meth:`generate` uses the images (a predictions file does
            not, so the runner can skip loading them).
        needs_volumes: optional; a 3D-capable backend sets it ``True`` and then finds each
            record's volumes, read with nibabel, in ``record["volumes"]`` ({name: 3D array}).
        per_request_seed: optional; ``True`` when ``generate_chat`` samples each request with its own
            ``"seed"`` key, so a reply never depends on the other requests of the call
            (``APIBackend``; ``HFBackend`` when sampling goes through its decoding loop, one generator
            per row). ClinHallu then sends sampled traces in whole chunks; otherwise one request per
            call while sampling.

    Optional, found by the runner when present: ``generate(records, images, overrides=...)`` (a keyword
    ``overrides`` or ``**kwargs``) receives per-call generation settings (``max_new_tokens`` … by
    benchmark / answer type, :mod:`medheval.run.generation`; the records of one call share them), and
    ``format_prompt(record, num_images) -> str`` gives the full model input recorded per prediction.
    """

    name: str
    needs_images: bool

    def generate(self, records: list[dict], images: list[list["Image.Image"]]) -> list[str]:
        """One output string per record, in the same order.

        ``images[i]`` holds the (already loaded) images of ``records[i]``; it may be
        empty lists when ``needs_images`` is false.
        """
        ...

    def settings(self) -> dict:
        """Generation settings recorded in predictions and results (JSON-serialisable, no secrets)."""
        ...


__all__ = ["Backend", "BackendError"]

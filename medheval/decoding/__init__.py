"""The shared decoding core of the mitigations (VCD, M3ID, PAI, DoLa, AvisC, DAMRO; OPERA on its own beam loop).

- :mod:`~medheval.decoding.loop` — :class:`DecodingMethod` (a ``custom_generate`` callable) and
  :func:`decode`, the one greedy/sampling loop every method plugs into;
- :mod:`~medheval.decoding.streams` — contrast streams, decoded in the clean stream's batch and
  KV cache (one forward over 2B rows per step; other prompt lengths left-padded after prefill);
- :mod:`~medheval.decoding.contrast` — the plausibility cutoff and the combination rules;
- :mod:`~medheval.decoding.hooks` — attention hooks (pre-softmax edits, attention rows);
- :mod:`~medheval.decoding.visual_tokens` — where the image tokens are, from ``input_ids``;
- :mod:`~medheval.decoding.compiled` — the decode steps on a static cache through ``torch.compile`` (CUDA
  graphs on CUDA; the default there), one graph per row and capacity bucket;
- :mod:`~medheval.decoding.internals` — the only module that names transformers' generation internals
  (the cache argument and classes, ``prepare_inputs_for_generation``, the attention interface...).
"""

from medheval.decoding.contrast import (
    DoLaContrast,
    LogitContrast,
    LogProbContrast,
    PlausibilityCutoff,
    RelativeTopFilter,
    jensen_shannon_divergence,
    m3id_weight,
)
from medheval.decoding.hooks import (
    ATTENTION_FUNCTION,
    AttentionHook,
    AttentionRowRecorder,
    ImageAttentionBoost,
    VisionCLSAttention,
    attention_hooks,
    hooks_installed,
    language_model,
    num_layers,
)
from medheval.decoding.loop import DecodingContext, DecodingMethod, decode, generate_from_folder
from medheval.decoding.streams import Stream, StreamGroup, concat_batch
from medheval.decoding.visual_tokens import (
    MissingInternalError,
    MitigationError,
    drop_image_tokens,
    image_spans,
    image_token_mask,
    remove_positions,
    visual_token_ids,
)

__all__ = [
    "ATTENTION_FUNCTION",
    "AttentionHook",
    "AttentionRowRecorder",
    "DecodingContext",
    "DecodingMethod",
    "DoLaContrast",
    "ImageAttentionBoost",
    "LogProbContrast",
    "LogitContrast",
    "MissingInternalError",
    "MitigationError",
    "PlausibilityCutoff",
    "RelativeTopFilter",
    "Stream",
    "StreamGroup",
    "VisionCLSAttention",
    "attention_hooks",
    "concat_batch",
    "decode",
    "drop_image_tokens",
    "generate_from_folder",
    "hooks_installed",
    "image_spans",
    "image_token_mask",
    "jensen_shannon_divergence",
    "language_model",
    "m3id_weight",
    "num_layers",
    "remove_positions",
    "visual_token_ids",
]

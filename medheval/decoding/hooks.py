"""Attention hooks on the language model: edit pre-softmax scores, or record attention rows.

transformers 5.x dispatches every attention call through ``ALL_ATTENTION_FUNCTIONS``
keyed by ``config._attn_implementation``. While hooks are installed, the language
model's attention implementation is switched to ``"medheval_eager"``: an eager
attention (the same arithmetic as Llama's ``eager_attention_forward``) that lets each
hooked layer

- **edit** the scores after the mask is added and before the softmax (PAI's
  ``z ← z + α|z|`` on image columns), and
- **observe** the post-softmax weights (AvisC's / OPERA's attention rows),

without keeping every layer's full attention map. A mask function is registered under
the same name (``masking_utils.eager_mask``), otherwise the function would receive
``attention_mask=None`` and lose the causal and padding masks.

:func:`attention_hooks` is a context manager: the implementation is switched and the
hooks attached on entry, and *always* restored/removed on exit, also when the forward
raises. Only the language model is switched; the vision tower keeps its own
implementation. Nothing is global: the registered function does nothing unless a layer
carries hooks.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F

from medheval.decoding import internals
from medheval.decoding.visual_tokens import MissingInternalError, MitigationError

ATTENTION_FUNCTION = "medheval_eager"
_HOOKS_ATTR = "_medheval_attention_hooks"
_registered = False


def _register_attention_function() -> None:
    global _registered
    if _registered:
        return
    internals.register_attention_function(ATTENTION_FUNCTION, medheval_attention_forward)
    _registered = True


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return states
    batch, heads, length, dim = states.shape
    return states[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


def medheval_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention with per-layer score edits and weight observers (see module docstring).

    Without hooks on ``module`` it computes exactly Llama's eager attention. transformers calls it
    through :func:`medheval.decoding.internals.register_attention_function`.
    """
    hooks = getattr(module, _HOOKS_ATTR, ())
    layer_idx = getattr(module, "layer_idx", None)
    groups = query.shape[1] // key.shape[1]
    key_states = _repeat_kv(key, groups)
    value_states = _repeat_kv(value, groups)

    scores = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key_states.shape[-2]]
    for hook in hooks:
        scores = hook.edit_scores(layer_idx, scores)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    for hook in hooks:
        hook.observe(layer_idx, weights)
    output = torch.matmul(weights, value_states).transpose(1, 2).contiguous()
    return output, weights


def language_model(model) -> torch.nn.Module:
    """The decoder stack of a (multimodal) causal LM: ``model.model.language_model`` for LLaVA-family
    models in transformers 5, else ``model.get_decoder()``; it must have ``.layers``."""
    inner = getattr(model, "model", None)
    lm = getattr(inner, "language_model", None)
    if lm is None and hasattr(model, "get_decoder"):
        lm = model.get_decoder()
    if lm is None or not hasattr(lm, "layers"):
        raise MissingInternalError(
            f"{type(model).__name__}: cannot find the language model's decoder layers "
            "(looked for model.model.language_model.layers and model.get_decoder().layers)"
        )
    return lm


def attention_modules(model) -> list[torch.nn.Module]:
    """The self-attention module of every language-model layer, in layer order."""
    modules = []
    for index, layer in enumerate(language_model(model).layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None or getattr(attn, "layer_idx", index) != index:
            raise MissingInternalError(
                f"{type(model).__name__}: language-model layer {index} has no self_attn with layer_idx={index}; "
                "attention hooks need transformers' standard decoder layers"
            )
        modules.append(attn)
    return modules


def attached_hooks(module: torch.nn.Module) -> tuple:
    """The hooks attached to an attention module now (empty outside :func:`attention_hooks`)."""
    return getattr(module, _HOOKS_ATTR, ())


def num_layers(model) -> int:
    """Number of decoder layers of the language model."""
    return len(language_model(model).layers)


class AttentionHook:
    """Base class: override :meth:`edit_scores` and/or :meth:`observe`.

    Attributes:
        layers: the layer indices the hook is attached to (``None`` = every layer).
        group: the :class:`~medheval.decoding.streams.StreamGroup` being forwarded (set by the
            decoding loop before each forward), giving e.g. its ``image_columns``.
    """

    def __init__(self, layers: Iterable[int] | None = None):
        self.layers = None if layers is None else sorted(set(int(i) for i in layers))
        self.group = None
        self.enabled = True

    def bind(self, group) -> None:
        self.group = group

    def edit_scores(self, layer_idx: int, scores: torch.Tensor) -> torch.Tensor:
        """``scores``: ``[rows, heads, q, kv]`` after the mask, before the softmax."""
        return scores

    def observe(self, layer_idx: int, weights: torch.Tensor) -> None:
        """``weights``: ``[rows, heads, q, kv]`` after the softmax."""


class ImageAttentionBoost(AttentionHook):
    r"""PAI's intervention: amplify the last query row's attention logits on image keys.

    .. math:: z_{-1,j} \leftarrow z_{-1,j} + \alpha\,|z_{-1,j}| \quad \text{for image columns } j

    on the layers given, after the mask is added and before the softmax; rows of a group
    without image tokens (a text-only stream) are untouched. Liu, Zheng, Chen, *Paying More
    Attention to Image*, ECCV 2024 (arXiv 2407.21771).
    """

    def __init__(self, alpha: float, layers: Iterable[int]):
        super().__init__(layers)
        self.alpha = float(alpha)
        self._alpha: torch.Tensor | None = None  # α as a tensor: a compiled step takes it as an input

    def bind(self, group) -> None:
        super().bind(group)
        ids = getattr(group, "input_ids", None)
        if ids is not None and (self._alpha is None or self._alpha.device != ids.device):
            self._alpha = torch.tensor(self.alpha, device=ids.device)

    def edit_scores(self, layer_idx: int, scores: torch.Tensor) -> torch.Tensor:
        if not self.enabled or self.group is None:
            return scores
        # eager: α = 0 edits nothing; compiled: no branch on α (adding 0 · |z| is exact), one graph for every α
        if not torch.compiler.is_compiling() and self.alpha == 0.0:
            return scores
        columns = self.group.image_columns(scores.shape[-1])
        if columns is None:
            return scores
        # eager: skip groups without image keys; compiled: no data-dependent branch (a zero column adds 0)
        if not torch.compiler.is_compiling() and not bool(columns.any()):
            return scores
        if columns.shape[0] != scores.shape[0]:
            raise MitigationError(
                f"attention rows ({scores.shape[0]}) do not match the stream group's rows ({columns.shape[0]})"
            )
        # compiled: α read from a tensor, so a graph serves every α (a Python float would be baked in)
        alpha = self._alpha if torch.compiler.is_compiling() and self._alpha is not None else self.alpha
        last = scores[:, :, -1, :]
        boosted = last + alpha * last.abs() * columns[:, None, :].to(last.dtype)
        scores = scores.clone()
        scores[:, :, -1, :] = boosted
        return scores


class AttentionRowRecorder(AttentionHook):
    """Record the last query row's attention weights per layer (AvisC, OPERA), reduced over heads.

    After each forward, ``rows[layer]`` is ``[rows, kv]`` (``reduce="mean"`` or ``"max"`` over
    heads). Only the last row is kept, never the full ``[heads, T, T]`` maps.
    """

    def __init__(self, layers: Iterable[int] | None = None, reduce: str = "mean"):
        super().__init__(layers)
        if reduce not in ("mean", "max"):
            raise MitigationError(f"reduce must be 'mean' or 'max', got {reduce!r}")
        self.reduce = reduce
        self.rows: dict[int, torch.Tensor] = {}

    def observe(self, layer_idx: int, weights: torch.Tensor) -> None:
        if not self.enabled:
            return
        last = weights[:, :, -1, :].float()
        self.rows[layer_idx] = last.mean(dim=1) if self.reduce == "mean" else last.amax(dim=1)


@contextlib.contextmanager
def attention_hooks(model, hooks: Sequence[AttentionHook]) -> Iterator[None]:
    """Install ``hooks`` on the language model's attention for the ``with`` block.

    Switches the language model (only) to :data:`ATTENTION_FUNCTION`, attaches each hook to
    its layers, and on exit — normal or exception — detaches them and restores the previous
    attention implementation.

    Raises:
        MissingInternalError: the model has no standard decoder layers, or a hook names a
            layer it does not have.
    """
    if not hooks:
        yield
        return
    modules = attention_modules(model)
    if any(hasattr(m, _HOOKS_ATTR) for m in modules):
        raise MitigationError(
            f"attention hooks are already installed on {type(model).__name__}: one mitigation per call "
            "(nested or concurrent hooked calls on the same model are not supported)"
        )
    for hook in hooks:
        bad = [i for i in (hook.layers or []) if not 0 <= i < len(modules)]
        if bad:
            raise MitigationError(
                f"{type(hook).__name__} asks for layers {bad}, but the language model has {len(modules)} layers"
            )
    _register_attention_function()
    previous = internals.text_attention_implementation(model)
    attached: list[torch.nn.Module] = []
    try:
        for index, module in enumerate(modules):
            mine = [h for h in hooks if h.layers is None or index in h.layers]
            if mine:
                setattr(module, _HOOKS_ATTR, tuple(mine))
                attached.append(module)
        internals.set_text_attention_implementation(model, ATTENTION_FUNCTION)
        if internals.text_attention_implementation(model) != ATTENTION_FUNCTION:
            raise MissingInternalError(
                f"{type(model).__name__} did not accept attn_implementation={ATTENTION_FUNCTION!r} for its language "
                "model: the mitigation needs eager attention it can hook (AttentionInterface)"
            )
        yield
    finally:
        for module in attached:
            if hasattr(module, _HOOKS_ATTR):
                delattr(module, _HOOKS_ATTR)
        internals.set_text_attention_implementation(model, previous)


def vision_encoder_layers(model) -> list[torch.nn.Module]:
    """The vision tower's encoder layers (``model.model.vision_tower.encoder.layers`` for CLIP in 5.x)."""
    tower = getattr(getattr(model, "model", None), "vision_tower", None) or getattr(model, "vision_tower", None)
    encoder = getattr(tower, "encoder", None) or getattr(getattr(tower, "vision_model", None), "encoder", None)
    layers = getattr(encoder, "layers", None)
    if layers is None:
        raise MissingInternalError(
            f"{type(model).__name__}: cannot find the vision encoder layers (looked for "
            "model.model.vision_tower.encoder.layers); [CLS] attention needs a ViT/CLIP-style tower"
        )
    return list(layers)


class VisionCLSAttention:
    r"""Capture the vision encoder's [CLS] attention over the patches in one layer (DAMRO).

    Forward hooks on that layer's ``q_proj`` and ``k_proj`` keep their outputs, and
    :meth:`cls_attention` computes the [CLS] query row

    .. math:: a = \mathrm{softmax}\big(q_{cls} K^\top / \sqrt{d}\big)[1:]

    over the patch tokens (CLS column dropped): ``heads="mean"`` averages the per-head rows
    (MedHEval's DAMRO), ``heads="single"`` treats the full width as one head, ``d = C``
    (DAMRO's official code). Works under any attention implementation (no attention
    weights needed). A context manager: the hooks are removed on exit, also on errors.

    Args:
        model: a LLaVA-family model with a CLIP-style tower.
        layer: encoder layer index; default: ``config.vision_feature_layer`` (the layer whose
            output the projector reads; the first one if it is a list).
    """

    def __init__(self, model, layer: int | None = None, heads: str = "mean"):
        if heads not in ("mean", "single"):
            raise MitigationError(f"heads must be 'mean' or 'single', got {heads!r}")
        layers = vision_encoder_layers(model)
        if layer is None:
            feature_layer = getattr(model.config, "vision_feature_layer", -1)
            if isinstance(feature_layer, (list, tuple)):
                feature_layer = feature_layer[0]
            # hidden_states[k] is the output of layers[k - 1] for k >= 0 (hidden_states[0] = embeddings);
            # negative indices line up with layers[k] directly
            layer = int(feature_layer) - 1 if int(feature_layer) >= 0 else int(feature_layer)
            if layer < 0 <= int(feature_layer):
                raise MissingInternalError("vision_feature_layer=0 reads the embeddings: no attention to capture")
        self.layer = int(layer)
        attn = getattr(layers[self.layer], "self_attn", None)
        if attn is None or not hasattr(attn, "q_proj") or not hasattr(attn, "k_proj"):
            raise MissingInternalError(
                f"{type(model).__name__}: vision layer {self.layer} has no self_attn.q_proj/k_proj"
            )
        self.attn = attn
        self.heads = heads
        self._q = self._k = None
        self._handles: list = []

    def __enter__(self) -> "VisionCLSAttention":
        def keep(name):
            def hook(module, args, output):
                setattr(self, name, output.detach())

            return hook

        self._handles = [self.attn.q_proj.register_forward_hook(keep("_q")),
                         self.attn.k_proj.register_forward_hook(keep("_k"))]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def cls_attention(self) -> torch.Tensor:
        """``[images(*tiles), patches]`` attention of [CLS] over the patch tokens of the last forward."""
        if self._q is None or self._k is None:
            raise MitigationError("no vision forward was captured yet")
        q, k = self._q[:, 0].float(), self._k.float()  # [N, C], [N, T, C]
        if self.heads == "single":
            scores = torch.einsum("nc,ntc->nt", q, k) / q.shape[-1] ** 0.5
            return scores.softmax(-1)[:, 1:]
        heads = getattr(self.attn, "num_heads", None) or self.attn.config.num_attention_heads
        d = q.shape[-1] // heads
        qh = q.view(q.shape[0], heads, d)
        kh = k.view(k.shape[0], k.shape[1], heads, d)
        scores = torch.einsum("nhd,nthd->nht", qh, kh) / d**0.5
        return scores.softmax(-1).mean(1)[:, 1:]


def hooks_installed(model) -> bool:
    """True while any medheval hook is attached or the language model runs medheval's attention."""
    try:
        modules = attention_modules(model)
    except MissingInternalError:
        return False
    attached = any(hasattr(m, _HOOKS_ATTR) for m in modules)
    return attached or internals.text_attention_implementation(model) == ATTENTION_FUNCTION


__all__ = [
    "ATTENTION_FUNCTION",
    "AttentionHook",
    "ImageAttentionBoost",
    "AttentionRowRecorder",
    "attention_hooks",
    "attached_hooks",
    "attention_modules",
    "hooks_installed",
    "language_model",
    "medheval_attention_forward",
    "num_layers",
    "vision_encoder_layers",
    "VisionCLSAttention",
]

"""What one model family declares (``Family``) and how its paths resolve on a model: where a block structure
keeps its blocks, per-layer norms, position table, attention, query/key projections, FFN output and LM head.
The registry of the families, keyed by ``config.model_type``: ``outlierlab.models.families``.

* ``Family.layernorms`` — the norms on the residual stream under canonical keys, the input of THE
  LayerNorm-outlier rule (``outlierlab.metrics.layernorm_rule``): ``embeddings``, per layer
  ``layer.{i}.<kind>``, ``final`` (pre-LN), ``head`` (the LM head's own norm, only when asked).  The per-layer
  *kind* says where the norm sits in the block:

  - post-LN blocks (BERT; Kovaleva et al. 2021), ``x ← LN(x + f(x))``: ``attention_output`` (after the
    attention's residual add) and ``output`` (after the FFN's — the norm Kovaleva et al. judge);
  - pre-LN blocks (GPT-2, Llama, Pythia, ModernBERT, OLMo; Xiong et al. 2020), ``x ← x + f(LN(x))``:
    ``attention_input`` and ``mlp_input``, the two norms reading the residual stream before each sublayer,
    and one ``final`` norm before the LM head;
  - reordered-norm blocks (OLMo 2 and 3: Team OLMo 2024, "2 OLMo 2 Furious", whose "reordered norm" is Swin
    V2's res-post-norm, Liu et al. 2022), ``x ← x + LN(f(x))``: ``attention_update`` and ``mlp_update``, the
    norms on each sublayer's *output* before the residual add.  Neither kind above: no norm reads or
    rewrites the residual stream inside a block (the sublayers read it raw), each norm's gain scales what its
    sublayer adds to it; one ``final`` norm before the LM head.

  Which kinds the rule judges by default: ``outlierlab.metrics.layernorm_rule.KIND_ROLES`` (docs/fidelity.md).
* ``Family.position_table``, ``Family.positions`` — a learned absolute table (GPT-2's ``wpe``,
  BERT's ``position_embeddings``) or what the model uses instead (rotary, relative, ...).
* ``Family.blocks``, ``Family.qk_projections`` (q/k where the model rotates them; ``split_qk`` for fused
  projections); the activation sites the paths give: ``outlierlab.models.hook_points.site_table``.

Paths are dotted module paths: block paths from the *base model* (``model.base_model``, so a model with or
without its LM head resolves alike), norm/projection paths from one block, ``head_norm`` from the full
model.  A path that does not resolve is an error naming it (a transformers version renamed a module), except
where a family says a norm may be absent (ModernBERT's first block has no attention norm: ``nn.Identity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from torch import Tensor, nn

__all__ = ["Family", "QKProjection", "split_qk", "base_model", "is_norm", "submodule", "usable_positions", "POST_KINDS",
           "PRE_KINDS", "REORDERED_KINDS"]

#: Per-layer norm kinds of a post-LN block, in block order (Kovaleva et al. 2021 judge ``output``).
POST_KINDS = ("attention_output", "output")
#: Per-layer norm kinds of a pre-LN block, in block order.
PRE_KINDS = ("attention_input", "mlp_input")
#: Per-layer norm kinds of a reordered-norm block (OLMo 2), in block order: the norm on each sublayer's output.
REORDERED_KINDS = ("attention_update", "mlp_update")


class QKProjection(NamedTuple):
    """Where one block computes its queries and keys.

    q, k : the modules whose *output* holds the queries / keys (the same module when fused)
    layout : ``separate`` (q and k are their own Linear layers), ``qkv`` (one output ``[q | k | v]``, each
        ``num_heads * head_dim`` wide: GPT-2 ``c_attn``, ModernBERT ``Wqkv``), ``head_qkv`` (per head
        ``[q_h | k_h | v_h]`` interleaved: GPT-NeoX ``query_key_value``), ``heads`` (separate modules whose
        outputs are already ``[..., T, H, head_dim]``: Qwen3's per-head ``q_norm``/``k_norm``), ``head_major``
        (``[B, H, T, head_dim]``: our attention's ``query_norm``/``key_norm`` and position scheme input)
    num_heads, num_kv_heads, head_dim : from the config (``num_kv_heads < num_heads``: grouped-query attention)
    clip : the model clamps q and k to ``[-clip, clip]`` before rotating them (OLMo's ``config.clip_qkv``;
        Groeneveld et al. 2024), so ``split_qk`` does too; None: no clipping
    """

    q: nn.Module
    k: nn.Module
    layout: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    clip: float | None = None


def split_qk(proj: QKProjection, q_out: Tensor, k_out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Queries ``[..., num_heads, head_dim]`` and keys ``[..., num_kv_heads, head_dim]`` from the hooked outputs.

    ``q_out`` is the output of ``proj.q``; ``k_out`` that of ``proj.k`` (ignored for fused layouts, where
    both come from ``q_out``).  Rotary embeddings, where a family has them, are applied *after* these
    projections (Su et al. 2021): what is returned is the pre-rotation q/k, clipped where the model clips them
    (``QKProjection.clip``; transformers clamps the projection's output in place, so a hook that kept it
    without a copy already sees it clipped — clipping again changes nothing).
    """
    if proj.clip is not None:
        q_out = q_out.clamp(-proj.clip, proj.clip)
        k_out = None if k_out is None else k_out.clamp(-proj.clip, proj.clip)
    h, hk, dh = proj.num_heads, proj.num_kv_heads, proj.head_dim
    lead = q_out.shape[:-1]
    if proj.layout == "separate":
        if k_out is None:
            raise ValueError("split_qk: layout 'separate' needs the key projection's output too")
        return q_out.reshape(*lead, h, dh), k_out.reshape(*k_out.shape[:-1], hk, dh)
    if proj.layout == "qkv":
        q, k = q_out[..., :h * dh], q_out[..., h * dh:(h + hk) * dh]
        return q.reshape(*lead, h, dh), k.reshape(*lead, hk, dh)
    if proj.layout == "head_qkv":
        per = q_out.reshape(*lead, h, 3 * dh)
        return per[..., :dh], per[..., dh:2 * dh]
    if proj.layout in ("heads", "head_major"):
        if k_out is None:
            raise ValueError(f"split_qk: layout {proj.layout!r} needs the key module's output too")
        if proj.layout == "head_major":
            return q_out.transpose(-3, -2), k_out.transpose(-3, -2)
        return q_out, k_out
    raise ValueError(f"unknown q/k layout {proj.layout!r}")


def submodule(root: nn.Module, path: str | None) -> nn.Module | None:
    """``root.get_submodule(path)``; None for an empty path or a missing module.  ``a|b`` tries each
    alternative in turn (the MLM heads of one family differ between model classes)."""
    for p in (path or "").split("|"):
        try:
            return root.get_submodule(p) if p else None
        except AttributeError:
            continue
    return None


def is_norm(module: nn.Module | None) -> bool:
    """A normalisation layer to judge: LayerNorm (also bias- or gain-free) or any RMSNorm class (HF writes
    its own per family, e.g. ``LlamaRMSNorm``); ``nn.Identity`` (a norm left out) is not."""
    if module is None or isinstance(module, nn.Identity):
        return False
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return True
    weight = getattr(module, "weight", None)
    return "norm" in type(module).__name__.lower() and (weight is None or weight.dim() == 1)


#: transformers model types whose position ids start after ``pad_token_id`` (their table has ``pad + 1`` rows unused).
PADDING_OFFSET_TYPES = {"roberta", "xlm-roberta", "camembert", "longformer", "data2vec-text", "xlm-roberta-xl", "mpnet"}


def usable_positions(config, rows: int) -> int:
    """The tokens a position table of ``rows`` rows takes under ``config`` (RoBERTa-style: ``PADDING_OFFSET_TYPES``)."""
    if getattr(config, "model_type", "") in PADDING_OFFSET_TYPES:
        rows -= (getattr(config, "pad_token_id", 1) or 0) + 1
    return rows


def base_model(model: nn.Module) -> nn.Module:
    """The encoder/decoder body: ``model.base_model`` of a Hugging Face model (itself for ``AutoModel``),
    ``model.roberta`` of ours."""
    if hasattr(model, "roberta") and hasattr(model, "named_layernorms"):
        return model.roberta
    return getattr(model, "base_model", model)


@dataclass(frozen=True)
class Family:
    """One block structure of the registry (see the module docstring for the paths' roots).

    ``name`` (shown in reports); ``model_types`` (the ``config.model_type`` values it covers); ``placement``: ``post``,
    ``pre`` (where the per-layer norms sit; Xiong et al. 2020) or ``reordered`` (on the sublayers' outputs before the
    residual add; OLMo 2); ``decoder``: causal (a token vector sees only its left context).

    Paths: ``blocks`` (the ``ModuleList`` of blocks, from the base model); ``norms``, ``(path in a block, kind)`` per
    per-layer norm in block order (kinds: ``POST_KINDS``, ``PRE_KINDS``, ``REORDERED_KINDS``); ``embeddings_norm``,
    ``final_norm`` (from the base model; None: none); ``head_norm`` (the LM head's own norm, from the full model);
    ``position_table`` (a learned absolute position ``nn.Embedding``, from the base model); in a block:
    ``attention``, ``q`` / ``k`` / ``v`` (the same path for a fused projection, laid out as ``qk_layout``: see
    ``QKProjection``), ``attention_out`` (its output projection: the update before dropout and the residual add),
    ``ffn_input`` (the FFN's first projection; a gated FFN: the gate's; ModernBERT: ``Wi``, input and gate side by
    side), ``ffn_up`` (a gated FFN's up projection, reading the gate's input), ``ffn_output`` (the down-projection: Bondarenko et al. 2023's ``ffn_output`` site); ``optional_norms``
    (block norms that may be ``nn.Identity``); ``qk_norms`` (query/key norms where a block has them, Qwen3's per head,
    OLMo 2's over the whole projection: the model rotates their outputs, so q/k are read there; layout
    ``qk_norm_layout``, ``heads`` or ``separate``).  Empty ``v``, ``attention_out``, ``ffn_input``: no such site.

    Words for reports: ``positions`` (what the family uses for positions), ``norm_kind`` (the norm class).
    ``qk_clip``: the config attribute holding the value q/k are clamped to before the rotation (OLMo's ``clip_qkv``;
    unset or None: no clipping).
    """

    name: str
    model_types: tuple[str, ...]
    placement: str
    decoder: bool
    blocks: str
    norms: tuple[tuple[str, str], ...]
    embeddings_norm: str | None
    final_norm: str | None
    head_norm: str | None
    position_table: str | None
    positions: str
    attention: str
    q: str
    k: str
    qk_layout: str
    ffn_output: str
    norm_kind: str
    optional_norms: tuple[str, ...] = field(default=())
    qk_norms: tuple[str, str] | None = None
    qk_norm_layout: str = "heads"
    qk_clip: str | None = None
    v: str = ""
    attention_out: str = ""
    ffn_input: str = ""
    ffn_up: str = ""

    # -- structure ------------------------------------------------------------------------------------------
    def block_list(self, model: nn.Module) -> list[nn.Module]:
        """The blocks in depth order."""
        mod = submodule(base_model(model), self.blocks)
        if not isinstance(mod, nn.ModuleList) or not len(mod):
            raise ValueError(f"{type(model).__name__} ({self.name} family) has no block list at {self.blocks!r}: "
                             "has transformers renamed it? Update outlierlab/models/families.py")
        return list(mod)

    def _required(self, root: nn.Module, path: str, what: str) -> nn.Module:
        mod = submodule(root, path)
        if mod is None:
            raise ValueError(f"{type(root).__name__} ({self.name} family) has no {what} at {path!r}: "
                             "has transformers renamed it? Update outlierlab/models/families.py")
        return mod

    def layernorms(self, model: nn.Module, include_head: bool = False) -> dict[str, nn.Module]:
        """The norms on the residual stream by canonical key, in depth order (see the module docstring); a
        declared norm that is missing (and not optional) or not a normalisation layer raises ValueError."""
        base = base_model(model)
        out: dict[str, nn.Module] = {}
        emb = submodule(base, self.embeddings_norm)
        if is_norm(emb):
            out["embeddings"] = emb
        for i, block in enumerate(self.block_list(model)):
            for path, kind in self.norms:
                mod = submodule(block, path)
                if mod is None and path not in self.optional_norms:
                    raise ValueError(f"block {i} of {type(model).__name__} ({self.name} family) has no norm at "
                                     f"{path!r}: update outlierlab/models/families.py")
                if is_norm(mod):
                    out[f"layer.{i}.{kind}"] = mod
                elif mod is not None and path not in self.optional_norms:
                    raise ValueError(f"{path!r} in block {i} is a {type(mod).__name__}, not a norm")
        final = submodule(base, self.final_norm)
        if is_norm(final):
            out["final"] = final
        if include_head:
            head = submodule(model, self.head_norm)
            if is_norm(head):
                out["head"] = head
        return out

    def position_weight(self, model: nn.Module) -> tuple[str, Tensor] | None:
        """``(parameter name, rows actually used)`` of the learned absolute position table, or None.

        RoBERTa-style tables (``padding_idx`` set) never use rows ``0..padding_idx`` (positions start at
        ``padding_idx + 1``), so those rows are dropped.
        """
        base = base_model(model)
        table = submodule(base, self.position_table)
        if not isinstance(table, nn.Embedding):
            return None
        names = {id(m): n for n, m in model.named_modules()}
        w = table.weight.detach().float().cpu()
        pad = table.padding_idx
        return f"{names.get(id(table), self.position_table)}.weight", (w[pad + 1:] if pad is not None and pad >= 0
                                                                       else w)

    def qk_projections(self, model: nn.Module) -> list[QKProjection]:
        """Each block's queries and keys where the model rotates them (``QKProjection``; outputs split by
        ``split_qk``): the projections (with the model's clip, ``qk_clip``), or a block's QK-norms where
        it has them (``qk_norms``: Qwen3 per head, OLMo 2 over the whole projection, normalise q and k with a
        learned gain *before* the rotation)."""
        cfg = getattr(model, "config", None)
        heads = int(getattr(cfg, "num_attention_heads", 0) or getattr(cfg, "n_heads", 0)
                    or getattr(cfg, "num_heads", 0) or 0)  # HF names; ours: num_heads
        kv = int(getattr(cfg, "num_key_value_heads", 0) or heads)
        hidden = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "dim", 0) or 0)
        head_dim = int(getattr(cfg, "head_dim", 0) or (hidden // heads if heads else 0))
        if not heads:
            raise ValueError(f"{type(model).__name__}: the config names no number of attention heads")
        clip = getattr(cfg, self.qk_clip, None) if self.qk_clip else None
        clip = None if clip is None else float(clip)
        out = []
        for b in self.block_list(model):
            qn, kn = (submodule(b, p) for p in self.qk_norms) if self.qk_norms else (None, None)
            if is_norm(qn) and is_norm(kn):
                out.append(QKProjection(qn, kn, self.qk_norm_layout, heads, kv, head_dim))
            else:
                out.append(QKProjection(self._required(b, self.q, "query projection"),
                                        self._required(b, self.k, "key projection"), self.qk_layout, heads, kv,
                                        head_dim, clip))
        return out

    def describe(self) -> str:
        """One line: the family, its block kind, norms and positions."""
        kind = "decoder (causal: each token vector sees only its left context)" if self.decoder else "encoder"
        norms = ", ".join(f"`{p}` ({k})" for p, k in self.norms)
        blocks = ("reordered-norm blocks (x + norm(sublayer(x)))" if self.placement == "reordered"
                  else f"{self.placement}-LN blocks")
        return (f"{self.name} family: {kind}, {blocks} with {self.norm_kind} ({norms}"
                f"{f', final `{self.final_norm}`' if self.final_norm else ''}); positions: {self.positions}")

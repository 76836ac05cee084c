"""Does a language model use word order?  *Order use* and *attention locality*.

A masked LM without positions is a bag-of-words model (self-attention without positions is permutation-equivariant). A
model *with* positions can sit at that bag-of-words loss for thousands of steps before using them -- the plateau of Chen
et al. (2024, "Sudden drops in the loss: syntax acquisition, phase transitions, and simplicity bias in MLMs", ICLR
2024); see docs/order_use.md.  A learned-vs-none comparison of two such models compares two bag-of-words models, so
every run and evaluated model reports these numbers (our definitions, docs/design.md):

* **order use** (``order_use``): the model's own loss (masked or next token) on the validation blocks with each
  block's tokens randomly permuted (special tokens, padding and position ids in place; a token moves with its
  label), minus the intact loss, in nats.  Exactly 0 (up to float summation order) for a masked LM without
  positions; > 0 for any order-dependent model, a causal LM without positions included (Haviv et al. 2022).
* **sentence-vector order change** (``pooled_order_change``): per layer, the mean over texts of 1 - cos(mean-pooled
  vector of the intact text, of its shuffled tokens), for models judged by their vectors.  Exactly 0 for an
  encoder without positions or causal mask; layer 0 is the floor an embedding LayerNorm leaves.
* **attention locality** (``attention_locality``): per layer, the mean attention mass within distance
  <= ``LOCAL_WINDOW`` of the query (itself included), against a uniform row over the same visible keys.
  Uniform attention (the bag-of-words plateau) gives mass = baseline.

Pure functions: no config, no files, no Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from outlierlab.metrics.scored_rows import logits_at

__all__ = ["LOCAL_WINDOW", "ORDER_USE_THRESHOLD", "movable_positions", "permute_block_tokens", "order_use",
           "pooled_order_change", "attention_locality", "cannot_use_order", "order_use_message",
           "masked_for_order_use", "lm_loss_sum"]

#: Keys within this distance of the query (itself included) count as local (our choice: ±1, ±2 are the offsets an
#: n-gram-like head first attends to).
LOCAL_WINDOW = 2

#: Below this many nats of order use a run is reported as "does not use token order yet".  The recipe target of
#: docs/order_use.md is 0.5 nats; a model at the bag-of-words plateau measures |order use| < 0.01 there.
ORDER_USE_THRESHOLD = 0.1


def movable_positions(input_ids: Tensor, labels: Tensor | None, attention_mask: Tensor | None,
                      special_ids: Iterable[int]) -> Tensor:
    """``Bool[B, T]``: positions whose token ``permute_block_tokens`` may move.

    Padding and special tokens stay -- unless the position carries a label: a ``<mask>`` always moves with its answer,
    so a masked LM without positions sees the same problem in another order.
    """
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    for i in special_ids:
        special |= input_ids == int(i)
    if labels is not None:
        special &= labels == -100
    movable = ~special
    if attention_mask is not None:
        movable &= attention_mask.bool()
    return movable


def permute_block_tokens(fields: Mapping[str, Tensor], movable: Tensor,
                         generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """Shuffle every per-token field (``input_ids``, ``labels``, ...) among each row's ``movable`` positions, with one
    random permutation per row shared by all fields; fixed positions keep their values.  Fields that are not ``[B, T]``
    (``masked_positions``) are dropped: they no longer apply.

    Vectorised: sorting random keys (fixed positions +inf, so they sort last, stably, onto themselves) gives each row's
    source order; the movable positions in ascending order are the destinations.
    """
    B, T = movable.shape
    keys = torch.rand(B, T, generator=generator).to(movable.device).masked_fill(~movable, float("inf"))
    source = keys.argsort(dim=1, stable=True)
    ascending = torch.arange(T, device=movable.device, dtype=torch.float).expand(B, T)
    dest = ascending.masked_fill(~movable, float("inf")).argsort(dim=1, stable=True)
    out = {}
    for name, value in fields.items():
        if not isinstance(value, Tensor) or tuple(value.shape[:2]) != (B, T) or value.ndim != 2:
            continue
        out[name] = value.clone().scatter_(1, dest, value.gather(1, source))
    return out


LossFn = Callable[[Mapping[str, Tensor]], tuple[Tensor, int]]


@torch.no_grad()
def order_use(loss_sum: LossFn, batches: Iterable[Mapping[str, Tensor]], special_ids: Sequence[int],
              seed: int = 0) -> dict[str, float]:
    """Order use of a model on ``batches``: permuted-block loss minus intact loss, per predicted token, in nats.

    ``loss_sum(batch) -> (summed loss over predicted tokens, their number)`` is the model's own objective, called once
    per intact and once per permuted batch.  ``batches``: dicts with ``input_ids``, ``labels`` (-100 = not predicted),
    optionally ``attention_mask``.  ``special_ids`` stay in place.  Permutations come from
    ``torch.Generator().manual_seed(seed)`` on the CPU, so two calls permute identically.

    Returns ``loss`` (intact), ``loss_permuted``, ``order_use`` = ``loss_permuted - loss`` and ``tokens``.
    """
    generator = torch.Generator().manual_seed(int(seed))
    intact = permuted = 0.0
    n_total = 0
    for batch in batches:
        mask = batch.get("attention_mask")
        movable = movable_positions(batch["input_ids"].cpu(), batch["labels"].cpu(),
                                    None if mask is None else mask.cpu(), special_ids)
        shuffled = permute_block_tokens({k: v.cpu() for k, v in batch.items() if isinstance(v, Tensor)}, movable,
                                        generator)
        if mask is not None:
            shuffled["attention_mask"] = mask.cpu()
        device = batch["input_ids"].device
        shuffled = {k: v.to(device) for k, v in shuffled.items()}
        loss_a, n_a = loss_sum(batch)
        loss_b, n_b = loss_sum(shuffled)
        if int(n_a) != int(n_b):  # a permutation moves labels with their tokens: the count cannot change
            raise RuntimeError(f"order use: {n_a} predicted tokens intact but {n_b} permuted")
        intact += float(loss_a)
        permuted += float(loss_b)
        n_total += int(n_a)
    if n_total == 0:
        raise ValueError("order use needs at least one predicted token in the batches")
    return {"loss": intact / n_total, "loss_permuted": permuted / n_total,
            "order_use": (permuted - intact) / n_total, "tokens": float(n_total)}


HiddenFn = Callable[[Tensor, Tensor], Sequence[Tensor]]


@torch.no_grad()
def pooled_order_change(hidden_states: HiddenFn, batches: Iterable[tuple[Tensor, Tensor]], special_ids: Sequence[int],
                        seed: int = 0) -> dict[str, Tensor | int]:
    r"""Per layer, how far shuffling a text's tokens moves its mean-pooled vector.

    .. math::  c_\ell = \frac{1}{N}\sum_{n=1}^{N} \Big(1 - \cos\big(\bar h_\ell(x_n),\ \bar h_\ell(\pi_n x_n)\big)\Big)

    ``\bar h_\ell``: mean of layer ``\ell`` over the non-special, non-padding tokens; ``\pi_n`` shuffles those tokens
    (``permute_block_tokens``).  ``hidden_states(input_ids, attention_mask)`` returns L+1 tensors [B, T, d]; ``batches``
    yields right-padded ``(input_ids, attention_mask)``; permutations from ``manual_seed(seed)`` on the CPU.

    Returns ``change`` (Tensor[L+1] float64) and ``texts``: those with at least two movable tokens (others are left
    out).
    """
    generator = torch.Generator().manual_seed(int(seed))
    total, n = None, 0
    for input_ids, attention_mask in batches:
        ids, mask = input_ids.cpu(), attention_mask.cpu()
        movable = movable_positions(ids, None, mask, special_ids)
        shuffled = permute_block_tokens({"input_ids": ids}, movable, generator)["input_ids"]
        keep = movable.sum(1) >= 2
        if not bool(keep.any()):
            continue
        weights = movable[keep].to(torch.float64)
        weights = (weights / weights.sum(1, keepdim=True))[:, :, None]  # [B', T, 1]: the mean over movable tokens
        changes = []
        for a, b in zip(hidden_states(ids, mask), hidden_states(shuffled, mask)):
            w, rows = weights.to(a.device), keep.to(a.device)  # pooled where the layer ran: only [B', d] moves
            pooled_a, pooled_b = (a[rows].double() * w).sum(1), (b[rows].double() * w).sum(1)
            changes.append((1 - torch.nn.functional.cosine_similarity(pooled_a, pooled_b, dim=-1)).sum().cpu())
        step = torch.stack(changes)
        total = step if total is None else total + step
        n += int(keep.sum())
    if n == 0:
        raise ValueError("the sentence-vector order change needs at least one text with two or more movable tokens")
    return {"change": total / n, "texts": n}


def attention_locality(attentions: Sequence[Tensor], attention_mask: Tensor | None = None, causal: bool = False,
                       window: int = LOCAL_WINDOW) -> dict[str, Tensor]:
    r"""Per layer, the mean attention mass on keys within ``window`` of the query, and its uniform baseline.

    .. math::  m_\ell = \frac{1}{|Q|}\sum_{(b,h,q)} \sum_{k:\,|k-q|\le w} A^{\ell}_{b,h,q,k}, \qquad
               u = \frac{1}{|Q|}\sum_{(b,h,q)} \frac{|\{k \text{ visible}: |k-q|\le w\}|}{|\{k \text{ visible}\}|}

    Visible keys are the non-padding ones (at or before the query if ``causal``); queries are the non-padding positions.
    The bag-of-words plateau has ``m = u`` in every layer.  ``attentions``: per layer Tensor[B, H, T, T] (or stacked [L,
    ...]); ``attention_mask``: 1 = token (None: no padding).

    Returns ``mass`` (Tensor[L] float64) and ``uniform`` (0-d float64, the same for every layer).
    """
    if len(attentions) == 0:
        raise ValueError("attention locality needs the attention probabilities of at least one layer")
    B, H, T, _ = attentions[0].shape
    device = attentions[0].device
    keys = torch.ones(B, T, dtype=torch.bool, device=device) if attention_mask is None \
        else attention_mask.to(device).bool()
    q = torch.arange(T, device=device)
    near = (q[:, None] - q[None, :]).abs() <= window  # [T, T]
    visible = keys[:, None, :].expand(B, T, T)  # [B, Tq, Tk]
    if causal:
        visible = visible & (q[None, :] <= q[:, None])[None]
    queries = keys.to(torch.float64)  # [B, T]
    n_queries = queries.sum() * H
    uniform_row = (visible & near[None]).sum(-1).double() / visible.sum(-1).clamp(min=1).double()  # [B, T]
    uniform = (uniform_row * queries).sum() * H / n_queries
    masses = []
    for attn in attentions:
        local = (attn.detach().double() * near.double()).sum(-1)  # [B, H, T]
        masses.append((local * queries[:, None, :]).sum() / n_queries)
    return {"mass": torch.stack(masses), "uniform": uniform}


def cannot_use_order(pos: str | None, causal: bool) -> bool:
    """A masked LM without positions (``pos`` the position scheme's name): permutation-equivariant, so its order
    use is 0 by construction -- unlike a causal model without positions, whose mask is an order signal."""
    return pos == "none" and not causal


def order_use_message(value: float, threshold: float = ORDER_USE_THRESHOLD, orderless: bool = False) -> str | None:
    """The one line a run (or study cell) gets when its order use is below ``threshold``; None above it.

    ``orderless`` (a masked LM without positions: order use 0 by construction) makes the line say so instead of "not
    yet".
    """
    if value >= threshold:
        return None
    if orderless:
        return (f"the model cannot use token order: a masked LM without positions is permutation-equivariant "
                f"(order use {value:.3f} nats, 0 by construction); it is the bag-of-words baseline a position "
                "scheme is compared with (docs/order_use.md)")
    return (f"the model does not use token order yet: order use {value:.3f} nats < {threshold} (permuting each "
            "block's tokens barely changes its loss; a learned-vs-none comparison at this point compares "
            "bag-of-words models, docs/order_use.md)")


def masked_for_order_use(input_ids: Tensor, attention_mask: Tensor, special_tokens_mask: Tensor, mask_id: int,
                         rate: float = 0.15, seed: int = 0) -> dict[str, Tensor]:
    """A fixed masked-LM problem on held-out text, for order use outside training (post-hoc, evaluate.py, any
    model): ``rate`` of the non-special tokens, drawn from ``seed``, replaced by ``mask_id`` (all of them: no 80/10/10,
    so two checkpoints or two models see exactly the same problem) and labelled; at least one per row."""
    g = torch.Generator().manual_seed(int(seed))
    eligible = attention_mask.bool() & ~special_tokens_mask.bool()
    pick = (torch.rand(input_ids.shape, generator=g) < rate) & eligible
    first = eligible.float().argmax(dim=1)  # a row with nothing drawn still predicts its first eligible token
    rows = (~pick.any(dim=1)) & eligible.any(dim=1)
    pick[rows.nonzero().flatten(), first[rows]] = True
    labels = torch.where(pick, input_ids, torch.full_like(input_ids, -100))
    return {"input_ids": torch.where(pick, torch.full_like(input_ids, int(mask_id)), input_ids),
            "attention_mask": attention_mask, "labels": labels}


def lm_loss_sum(model, causal: bool) -> LossFn:
    """``batch -> (summed loss, predicted tokens)`` for a language model called as Hugging Face models are
    (``model(input_ids=, attention_mask=, labels=).loss``, the mean over labelled tokens -- shifted by one inside
    the model for a causal LM): ours (``RobertaMaskedLM``) and transformers' alike."""
    def loss_sum(batch: Mapping[str, Tensor]) -> tuple[Tensor, int]:
        labels = batch["labels"]
        n = int((labels[:, 1:] != -100).sum()) if causal else int((labels != -100).sum())
        out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), labels=labels)
        return out.loss.float() * n, n
    return loss_sum


def labelled_loss_sum(model) -> LossFn:
    """``lm_loss_sum`` of a masked LM with the vocabulary projection at the labelled positions only
    (``outlierlab.metrics.scored_rows.logits_at``); the same summed cross-entropy up to float rounding.  A model whose
    head cannot be narrowed gets ``lm_loss_sum``."""
    def loss_sum(batch: Mapping[str, Tensor]) -> tuple[Tensor, int]:
        labels = batch["labels"]
        keep = labels != -100
        with logits_at(model, keep) as narrowed:
            if not narrowed:
                return lm_loss_sum(model, False)(batch)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
        targets = labels[keep].to(logits.device)
        return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum"), int(targets.numel())
    return loss_sum


def heldout_special_ids(config: Any, tokenizer: Any = None) -> set[int]:
    """The ids that stay in place when a held-out sequence is permuted: the model's ``bos``/``eos``/``pad`` and the
    tokenizer's ``cls``/``sep``/``bos``/``eos``/``pad``."""
    names = ("bos_token_id", "eos_token_id", "pad_token_id", "cls_token_id", "sep_token_id")
    ids = [getattr(config, n, None) for n in names[:3]] + [getattr(tokenizer, n, None) for n in names]
    return {int(i) for i in ids if isinstance(i, int)}


def heldout_problem(batch: Mapping[str, Tensor], causal: bool, mask_token_id: int | None) -> dict[str, Tensor]:
    """The monitors' fixed scoring problem on their held-out batch: every next token (causal), or the fixed, seeded
    15 % of ``masked_for_order_use`` (masked); the same at every step, so a curve over steps compares like with
    like (order use, the W8A8 cost)."""
    mask = batch["attention_mask"]
    if causal:
        return {"input_ids": batch["input_ids"], "attention_mask": mask,
                "labels": batch["input_ids"].masked_fill(mask == 0, -100)}
    if mask_token_id is None:
        raise ValueError("a masked LM's held-out problem needs the tokenizer's mask token (tokenizer.mask_token_id)")
    return masked_for_order_use(batch["input_ids"], mask, batch["special_tokens_mask"], mask_token_id)


def heldout_order_use(model, batch: Mapping[str, Tensor], causal: bool, special_ids: Iterable[int],
                      mask_token_id: int | None = None, attentions: Sequence[Tensor] | None = None
                      ) -> tuple[dict[str, float], dict[str, Tensor] | None]:
    """Order use and attention locality of ``model`` on the monitors' fixed held-out batch (``input_ids``,
    ``attention_mask``, ``special_tokens_mask``), scored on ``heldout_problem``.  ``attentions`` (of a forward on the
    intact batch) give the locality; None: not measured.  The post-hoc job and the loop monitors both call this, so a
    checkpoint's rows equal the live ones."""
    device = next(model.parameters()).device
    mask = batch["attention_mask"]
    problem = heldout_problem(batch, causal, mask_token_id)
    loss_sum = lm_loss_sum(model, causal) if causal else labelled_loss_sum(model)
    with torch.inference_mode():
        value = order_use(loss_sum, [{k: v.to(device) for k, v in problem.items()}], special_ids)
    local = attention_locality(attentions, mask.to(device), causal) if attentions is not None else None
    return value, local

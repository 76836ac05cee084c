"""The optimizer as a switch: ``optimizer=<name>`` on the train.py command line, one of adamw (the default), sgd,
muon, soap, adafactor, lion.

Why a switch: the optimizer is one of the causes of outlier features that the literature names. He et al. (2024,
"Understanding and Minimising Outlier Features in Transformer Training") find that Adam's small epsilon and large
learning rates raise kurtosis and that SOAP lowers it; Park et al. (2025, "Outlier-Safe Pre-Training") train without
outliers with Muon; Caples & Neuhaus (2024) see no outlier channels with SGD. Each arm is a library's optimizer
(torch's AdamW, SGD, Adafactor and Muon; pytorch-optimizer's SOAP and Lion); what is written here is only what
none of them does: Muon's split of the parameters (its authors apply it to the hidden 2-D matrices only and leave
embeddings, norms, biases and the head to AdamW; ``torch.optim.Muon`` refuses anything but 2-D parameters), as one
optimizer that Lightning, the LR scheduler and the checkpoint see as one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Callable

import torch
from torch import nn

# The two arms that need more than ``factory(groups)``: the blocks' matrices (Muon) or a fused kernel (AdamW).
FUSABLE = (torch.optim.AdamW, torch.optim.Adam)


class _States(Mapping):
    """The inner optimizers' states as one read-only mapping. Not a ``ChainMap``: reading a key through one would
    create an empty entry in the first inner ``defaultdict`` (Lightning reads every item when it moves the state to
    a device), and that optimizer's next ``state_dict`` would fail on a parameter it does not own."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.maps = [opt.state for opt in optimizers]

    def __getitem__(self, key: Any) -> Any:
        for m in self.maps:
            if key in m:
                return m[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return (k for m in self.maps for k in m)

    def __len__(self) -> int:
        return sum(len(m) for m in self.maps)


class SplitOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameter groups, stepped together as one optimizer.

    ``param_groups`` are the inner optimizers' own dicts (a scheduler scales them all); ``state`` is a view of their
    states; the state dict has torch's format over all groups, with ``split`` recording each optimizer's share, so a
    checkpoint restores each exactly.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)
        super().__init__([g for opt in self.optimizers for g in opt.param_groups], defaults={})
        self.state = _States(self.optimizers)  # type: ignore[assignment]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:  # Lightning's closure runs the forward and backward once for all inner optimizers
            with torch.enable_grad():
                loss = closure()
        for opt in self.optimizers:
            opt.step()
        return loss

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        out: dict[str, Any] = {"state": {}, "param_groups": [], "split": []}
        offset = 0
        for opt in self.optimizers:
            sd = opt.state_dict()
            out["state"].update({offset + k: v for k, v in sd["state"].items()})
            out["param_groups"] += [{**g, "params": [offset + i for i in g["params"]]} for g in sd["param_groups"]]
            out["split"].append(len(sd["param_groups"]))
            offset += sum(len(g["params"]) for g in sd["param_groups"])
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        split = state_dict.get("split")
        if split is None or len(split) != len(self.optimizers):
            raise ValueError(f"this optimizer state was not saved by a {type(self).__name__} of "
                             f"{len(self.optimizers)} parts: resume it with the optimizer it was trained with")
        groups, offset, start = state_dict["param_groups"], 0, 0
        for opt, n_groups in zip(self.optimizers, split):
            mine = groups[start:start + n_groups]
            ids = [i for g in mine for i in g["params"]]
            opt.load_state_dict({
                "state": {i - offset: state_dict["state"][i] for i in ids if i in state_dict["state"]},
                "param_groups": [{**g, "params": [i - offset for i in g["params"]]} for g in mine]})
            offset += len(ids)
            start += n_groups
        # torch's load_state_dict replaces the group dicts: point ours at the inner optimizers' new ones
        self.param_groups = [g for opt in self.optimizers for g in opt.param_groups]
        self.state = _States(self.optimizers)  # type: ignore[assignment]


class MuonWithAdamW(SplitOptimizer):
    """Muon (Jordan et al. 2024; ``torch.optim.Muon``) on the blocks' 2-D weight matrices, AdamW on everything else
    (embeddings, position tables, norms, biases, LM head) -- the split Muon's authors prescribe.

    params : parameter groups (``weight_decay_groups``); each group's ``weight_decay`` holds for both parts.
    matrices : the parameters Muon updates (``hidden_matrices``); the rest go to AdamW.
    lr : both parts' peak rate; with ``adjust_lr_fn="match_rms_adamw"`` (Liu et al. 2025, "Muon is Scalable for LLM
        Training") Muon's update is rescaled to AdamW's RMS (0.2 sqrt(max(A, B))), so one rate serves both.
    betas, eps, weight_decay : AdamW's (``weight_decay`` is Muon's too); momentum, nesterov, ns_steps, adjust_lr_fn :
        Muon's (torch's defaults but the rate rule); fused : AdamW's fused kernel (CUDA).
    """

    needs_matrices = True

    def __init__(self, params: list[dict[str, Any]], *, matrices: list[torch.Tensor], lr: float,
                 betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-6, weight_decay: float = 0.01,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 adjust_lr_fn: str | None = "match_rms_adamw", fused: bool | None = None) -> None:
        if not hasattr(torch.optim, "Muon"):
            raise RuntimeError(f"optimizer=muon needs torch >= 2.9 (torch.optim.Muon); this is torch "
                               f"{torch.__version__}: upgrade torch or choose another optimizer")
        if not matrices:
            raise ValueError("optimizer=muon found no 2-D weight matrix inside the transformer blocks to give Muon")
        chosen = {id(p) for p in matrices}
        muon_groups, adamw_groups = [], []
        for group in params:
            options = {k: v for k, v in group.items() if k != "params"}
            mats = [p for p in group["params"] if id(p) in chosen]
            rest = [p for p in group["params"] if id(p) not in chosen]
            if any(p.ndim != 2 for p in mats):
                raise ValueError("optimizer=muon: Muon takes 2-D matrices only, and a chosen parameter is not one")
            if mats:
                muon_groups.append({**options, "params": mats})
            if rest:
                adamw_groups.append({**options, "params": rest})
        muon = torch.optim.Muon(muon_groups, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                                ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                  **({"fused": fused} if fused is not None else {}))
        super().__init__([muon, adamw])


def hidden_matrices(model: nn.Module) -> list[torch.Tensor]:
    """The weight matrices of every linear map inside the transformer blocks (query, key, value, attention output,
    FFN in and out): what Muon updates. Embeddings, position tables and the LM head stay out, as Muon's authors
    prescribe (their updates are not matrix-shaped operators on the hidden state)."""
    from outlierlab.models.encoder import Encoder  # the blocks' container; imported here to keep this module light

    out: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, Encoder):
            for block in module.layer:
                out += [m.weight for m in block.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad]
    return out


def build_optimizer(factory: Callable[..., torch.optim.Optimizer], model: nn.Module, groups: list[dict[str, Any]],
                    fused: bool = False) -> torch.optim.Optimizer:
    """``factory(groups)``, plus what the chosen optimizer needs from the model: Muon the blocks' matrices, a
    fused AdamW (or Muon's AdamW part) ``fused=True``."""
    target = getattr(factory, "func", factory)
    kwargs: dict[str, Any] = {}
    if getattr(target, "needs_matrices", False):
        kwargs["matrices"] = hidden_matrices(model)
    if fused:
        kwargs["fused"] = True
    return factory(groups, **kwargs)


def can_fuse(factory: Callable[..., torch.optim.Optimizer]) -> bool:
    """Whether the factory's optimizer has a fused kernel to ask for (AdamW/Adam, or Muon's AdamW part)."""
    target = getattr(factory, "func", factory)
    return (target in FUSABLE or target is MuonWithAdamW) and "fused" not in getattr(factory, "keywords", {})

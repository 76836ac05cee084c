"""The one LayerNorm-outlier rule (Kovaleva et al. 2021; Puccetti et al. 2022), used everywhere.

The training monitor (``outlierlab.monitoring.layernorm_monitor``), ``evaluate.py``'s outliers
analysis, the ablation, the frequency and the attention-sink analyses all call ``layernorm_outliers``
with the settings of the ``ln_rule`` config group (``configs/ln_rule/``), so the same weights give the same
flagged dims everywhere.  Default (Kovaleva et al. 2021): each layer's *output* LayerNorm, dims whose gain
AND bias both lie outside mean ± 3σ of that LayerNorm; a dim is an outlier of the model when more than a
quarter of the layers flag it (Puccetti et al.'s code: more than 3 of 12).  Options: ``criterion`` gain /
bias / either, other LayerNorm kinds (``all`` per-layer ones; the embeddings', the final and the MLM head's
only when named).  Pure functions on tensors keyed by the canonical names of
``outlierlab.models.layernorms.model_layernorms``.

Pre-LN models (GPT-2, Llama, Pythia, ModernBERT, our ``model.norm_placement=pre``) have no output LayerNorm:
their two per-layer norms read the residual stream before the attention (``attention_input``) and before
the MLP (``mlp_input``).  Both play the role of Kovaleva's output LayerNorm (``KIND_ROLES``; the
choice and its sources: docs/fidelity.md), so ``layernorms=[output]`` judges both and a layer flags a dim
when either does.  OLMo 2's "reordered norm" blocks (``x ← x + RMSNorm(f(x))``) have neither: their norms sit
on each sublayer's output before the residual add (``attention_update``, ``mlp_update``) and take the same role.
Norms without a bias are judged on their gain alone, norms without gain and bias not at all (``layernorm_outliers``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import torch
from torch import Tensor

from outlierlab.metrics.layernorm import sigma_outlier_mask

__all__ = ["CRITERIA", "KIND_ROLES", "LayerNormRule", "LayerNormOutliers", "layernorm_outliers", "layernorm_kind",
           "layernorm_role", "min_layers_for"]

# ------------------------------------------------------------------------------------- the one rule
#: How gain and bias combine per dim: ``both`` (Kovaleva et al. 2021, the default), ``either``, ``gain``, ``bias``.
CRITERIA = ("both", "either", "gain", "bias")
_LAYER_RE = re.compile(r"^layer\.(\d+)\.")
#: The rule role of each per-layer norm kind that is not a role itself: pre-LN blocks' norms before the attention and
#: the MLP (Dettmers et al. 2022 and Wei et al. 2023 find pre-LN LLMs' outlier channels at the output of both; Sun et
#: al. 2024's massive activations sit in the stream both read), and reordered-norm blocks' norms on each sublayer's
#: output (OLMo 2 and 3: every write to the stream is ``γ ⊙ RMSNorm(f(x))``) take the output LayerNorm's role
#: (docs/fidelity.md).
KIND_ROLES = {"attention_input": "output", "mlp_input": "output", "attention_update": "output",
              "mlp_update": "output"}
#: What the report says the ``output`` role judged, per mapped kind.
_ROLE_NOTES = {"attention_input": "pre-LN: the norms before the attention and before the MLP",
               "mlp_input": "pre-LN: the norms before the attention and before the MLP",
               "attention_update": "reordered norm: the norms on the attention's and the MLP's outputs",
               "mlp_update": "reordered norm: the norms on the attention's and the MLP's outputs"}


def layernorm_kind(name: str) -> str:
    """Kind of a canonical LayerNorm key: ``embeddings``, ``final``, ``head``, or the part after ``layer.{i}.``
    (post-LN ``output``/``attention_output``, pre-LN ``attention_input``/``mlp_input``, reordered
    ``attention_update``/``mlp_update``)."""
    m = _LAYER_RE.match(name)
    return name[m.end():] if m else name


def layernorm_role(name: str) -> str:
    """The rule role of a canonical key: its kind, with pre-LN and reordered kinds mapped by ``KIND_ROLES``."""
    kind = layernorm_kind(name)
    return KIND_ROLES.get(kind, kind)


def min_layers_for(spec: int | float | str, num_layers: int) -> int:
    """How many layers must flag a dim for it to be an outlier of the model (Puccetti et al. 2022).

    Puccetti et al.'s code keeps dims flagged in more than 3 of BERT-base's 12 layers, i.e. at least 4.
    ``spec`` is an absolute count (int ≥ 1), a fraction in (0, 1], or a string ``"a/b"`` read as the
    fraction a/b.  A fraction is scaled to the model and rounded *up*: ``"4/12"`` gives 4 of 12, 2 of 4,
    2 of 6, 8 of 24 layers, so a 4-layer model still needs a dim in two layers (the "more than a quarter
    of the layers" reading of "more than 3 of 12").  An absolute count above ``num_layers`` is an error.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be positive, got {num_layers}")
    if isinstance(spec, bool):
        raise ValueError(f"ln_rule.min_layers must be a number or 'a/b', got {spec!r}")
    if isinstance(spec, str):
        try:
            frac = Fraction(spec.strip())
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"ln_rule.min_layers={spec!r} is not a number or a fraction like '4/12'") from None
        if frac >= 1 and frac.denominator == 1:
            spec = int(frac)
    if isinstance(spec, int) or (isinstance(spec, float) and spec >= 1 and float(spec).is_integer()):
        n = int(spec)
        if not 1 <= n <= num_layers:
            raise ValueError(f"ln_rule.min_layers={n} must lie in [1, {num_layers}] (the model's layers), "
                             "or be a fraction such as '4/12'")
        return n
    if not isinstance(spec, str):
        frac = Fraction(float(spec)).limit_denominator(1000)
    if not 0 < frac <= 1:
        raise ValueError(f"ln_rule.min_layers fraction must be in (0, 1], got {spec!r}")
    return max(1, math.ceil(frac * num_layers))


@dataclass(frozen=True)
class LayerNormRule:
    """Settings of the LayerNorm-outlier rule (``configs/ln_rule/kovaleva.yaml``; see ``layernorm_outliers``).

    ``k``: σ multiplier (3 in both papers).  ``criterion``: ``both`` (default, Kovaleva et al. 2021: gain AND bias
    outside mean ± kσ), ``either`` (gain OR bias), ``gain`` or ``bias`` alone.  ``layernorms``: the kinds judged:
    ``output`` (default, Kovaleva et al.: each layer's output LayerNorm; pre-LN and reordered blocks: both per-layer
    norms, ``KIND_ROLES``), ``attention_output``, ``attention_input`` / ``mlp_input`` (one pre-LN norm alone),
    ``attention_update`` / ``mlp_update`` (one reordered norm), ``embeddings``, ``final``, ``head`` (the MLM head's),
    or ``all`` (every per-layer norm; the embeddings', final and head's still only when named).  ``min_layers``:
    layers that must flag a dim for a model-level outlier (``min_layers_for``; default ``"4/12"``).
    """

    k: float = 3.0
    criterion: str = "both"
    layernorms: tuple[str, ...] = ("output",)
    min_layers: int | float | str = "4/12"

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", float(self.k))
        kinds = (self.layernorms,) if isinstance(self.layernorms, str) else tuple(str(x) for x in self.layernorms)
        object.__setattr__(self, "layernorms", kinds)
        if not self.k > 0:
            raise ValueError(f"ln_rule.k must be positive, got {self.k}")
        if self.criterion not in CRITERIA:
            raise ValueError(f"ln_rule.criterion={self.criterion!r}: choose from {', '.join(CRITERIA)}")
        if not kinds:
            raise ValueError("ln_rule.layernorms is empty: e.g. [output], [output,attention_output] or [all]")
        min_layers_for(self.min_layers, 10**6)  # validates the form; the range is checked per model

    @classmethod
    def from_mapping(cls, settings: Mapping | "LayerNormRule" | None) -> "LayerNormRule":
        """A rule from a plain mapping (e.g. the ``ln_rule`` config node); None gives the default rule."""
        if settings is None or isinstance(settings, cls):
            return settings or cls()
        known = {"k", "criterion", "layernorms", "min_layers"}
        extra = sorted(set(settings) - known - {"_target_"})
        if extra:
            raise ValueError(f"unknown ln_rule key(s) {extra}; valid: {sorted(known)}")
        return cls(**{key: settings[key] for key in known if key in settings})

    def selects(self, name: str) -> bool:
        """Whether the LayerNorm with canonical key ``name`` is judged by this rule."""
        kind = layernorm_kind(name)
        if kind in self.layernorms or KIND_ROLES.get(kind) in self.layernorms:
            return True
        return "all" in self.layernorms and _LAYER_RE.match(name) is not None

    def describe(self) -> str:
        what = {"both": "gain and bias", "either": "gain or bias", "gain": "gain", "bias": "bias"}[self.criterion]
        return f"{what} outside mean ± {self.k:g}σ in {'/'.join(self.layernorms)} LayerNorms"


@dataclass
class LayerNormOutliers:
    """Result of ``layernorm_outliers``."""

    rule: LayerNormRule
    dims: list[int]  # model-level outlier dims: flagged in >= min_layers layers, most layers first
    counts: dict[int, int]  # every flagged dim -> number of layers flagging it (most first)
    flagged: dict[str, list[int]]  # judged LayerNorm -> its dims meeting the criterion (largest |z| first)
    per_layer: dict[str, list[int]]  # layer (``layer.{i}``, ``embeddings``, ``head``) -> union over its LayerNorms
    min_layers: int
    unjudged: dict[str, str] = field(default_factory=dict)  # LayerNorm -> why the rule cannot judge it
    gain_only: list[str] = field(default_factory=list)  # bias-free norms (RMSNorm ...) judged on their gain alone

    @property
    def n_layers(self) -> int:
        return len(self.per_layer)

    def describe(self) -> str:
        """One line: the rule, the dims found, and what could not be judged."""
        if not self.per_layer:  # one entry per reason (a 32-layer OLMo: 64 non-parametric norms, one reason)
            by_reason: dict[str, list[str]] = {}
            for n, r in self.unjudged.items():
                by_reason.setdefault(r, []).append(n)
            why = "; ".join(f"{ns[0]}: {r}" if len(ns) == 1 else f"{len(ns)} norms ({ns[0]} … {ns[-1]}): {r}"
                            for r, ns in by_reason.items()) or "no LayerNorm of those kinds"
            return f"{self.rule.describe()}: cannot judge ({why})"
        shown = ", ".join(f"{d} ({self.counts[d]}/{self.n_layers})" for d in self.dims) or "none"
        what = self.rule.describe()
        notes = dict.fromkeys(_ROLE_NOTES[k] for n in self.flagged if (k := layernorm_kind(n)) in _ROLE_NOTES)
        if notes:
            what += f" ({'; '.join(notes)})"
        text = (f"{what}, in ≥ {self.min_layers} of {self.n_layers} layers "
                f"(Kovaleva et al. 2021; Puccetti et al. 2022): {shown}")
        if self.gain_only:
            text += (f"; {len(self.gain_only)} of the {len(self.flagged)} judged norms have no bias (RMSNorm or a "
                     "bias-free LayerNorm) and were judged on their gain alone")
        if self.unjudged:
            text += f"; not judged: {', '.join(self.unjudged)} ({next(iter(self.unjudged.values()))})"
        return text


def _unjudgeable(weight: Tensor | None, bias: Tensor | None, criterion: str) -> str | None:
    """Why a norm's parameters cannot be judged by ``criterion`` (None: they can).  A norm with a gain and no
    bias is judged on the gain under ``both``/``either`` (the caller records it as gain-only)."""
    if weight is None and bias is None:
        return "no gain and no bias (LayerNorm without affine parameters): nothing to judge"
    if criterion == "bias" and bias is None:
        return "no bias (e.g. RMSNorm): criterion 'bias' needs one; ln_rule.criterion=gain judges the gain"
    if criterion in ("both", "gain") and weight is None:
        return f"no gain: criterion {criterion!r} needs one"
    return None


def layernorm_outliers(params: Mapping[str, tuple[Tensor | None, Tensor | None]],
                       rule: LayerNormRule | Mapping | None = None) -> LayerNormOutliers:
    r"""THE LayerNorm-outlier rule (Kovaleva et al. 2021; Puccetti et al. 2022).

    For each LayerNorm the rule selects (default: every layer's output LayerNorm, never the embeddings'
    or the MLM head's unless named), a dim is flagged when

    .. math:: |\gamma_i - \bar\gamma| > k\sigma_\gamma \ \wedge\ |\beta_i - \bar\beta| > k\sigma_\beta

    (``criterion="both"``, the default; ``either`` uses ∨, ``gain``/``bias`` one side), with mean and
    population σ over that LayerNorm's d dims (``sigma_outlier_mask``).  A norm without a bias (RMSNorm,
    ModernBERT's bias-free LayerNorm) is judged on its gain alone under ``both``/``either`` — the only
    parameter where it can place an outlier — and listed in ``gain_only``.  A *layer* flags a dim if any
    of its selected LayerNorms does (the embeddings' and the head's LayerNorm are a layer each, when
    selected); a dim is an outlier of the model when at least ``min_layers_for`` ``(rule.min_layers,
    number of layers)`` layers flag it — Puccetti et al.'s "more than 3 of 12", scaled up for other depths
    (2 of 4 for a 4-layer model).

    ``params``: ``{canonical key: (gain [d] | None, bias [d] | None)}``
    (``outlierlab.models.layernorms.layernorm_tensors``); a norm without the parameters the criterion needs
    (OLMo's non-parametric LayerNorm, ``model.norm=layernorm_noaffine``; ``criterion="bias"`` on RMSNorm) is listed
    in ``unjudged`` with the reason instead of raising.  ``rule``: None is the default rule.
    """
    rule = LayerNormRule.from_mapping(rule)
    flagged: dict[str, list[int]] = {}
    unjudged: dict[str, str] = {}
    gain_only: list[str] = []
    per_layer: dict[str, set[int]] = {}
    for name, (weight, bias) in params.items():
        if not rule.selects(name):
            continue
        why = _unjudgeable(weight, bias, rule.criterion)
        if why:
            unjudged[name] = why
            continue
        masks = {p: sigma_outlier_mask(v, rule.k) for p, v in (("gain", weight), ("bias", bias)) if v is not None}
        if bias is None and rule.criterion in ("both", "either"):  # RMSNorm / bias-free LayerNorm
            gain_only.append(name)
            mask = masks["gain"]
        elif rule.criterion == "both":
            mask = masks["gain"] & masks["bias"]
        elif rule.criterion == "either":  # a norm with only a gain (RMSNorm) is judged on its gain
            mask = masks.get("gain", masks.get("bias")) | masks.get("bias", masks.get("gain"))
        else:
            mask = masks[rule.criterion]
        ref = (weight if rule.criterion != "bias" and weight is not None else bias).detach().to(torch.float64)
        dev = (ref - ref.mean()).abs()
        idx = mask.nonzero().flatten()
        flagged[name] = idx[dev[idx].argsort(descending=True, stable=True)].tolist()
        m = _LAYER_RE.match(name)
        per_layer.setdefault(f"layer.{m.group(1)}" if m else name, set()).update(flagged[name])
    layers = {n: sorted(d) for n, d in per_layer.items()}
    if not layers:
        return LayerNormOutliers(rule, [], {}, flagged, {}, 0, unjudged, gain_only)
    min_layers = min_layers_for(rule.min_layers, len(layers))
    counts = Counter(d for ds in layers.values() for d in ds)
    ordered = dict(sorted(counts.items(), key=lambda dc: (-dc[1], dc[0])))
    dims = [d for d, c in ordered.items() if c >= min_layers]
    return LayerNormOutliers(rule, dims, ordered, flagged, layers, min_layers, unjudged, gain_only)

"""``evaluate.py`` analysis ``quantization``: what a model's outliers cost under 8-bit inference.

Bondarenko et al. (2023, "Quantizable Transformers") take the W8A8 model's loss as the ground truth of what outliers
cost (BERT: 4.54 full precision, 4.66 INT8 perplexity with their fixes); Dettmers et al. (2022, "LLM.int8()") keep the
few outlier input dims in 16 bits; kurtosis or max/mean ratios do not predict the cost across optimizers (2026, "Beyond
Outliers"), so it is measured.  Rows (``quantization.csv``):

* ``full_precision`` -- the intact model's masked-LM (or next-token) loss on fixed masks;
* ``w8a8`` -- every block linear with weights per output channel and inputs per tensor in ``bits`` bits
  (``models.w8a8.quantized``: the inputs rounded by hooks at the named sites the linears read), ``layers`` =
  ``all``; with ``per_layer`` also one block at a time;
* ``w8a8_keep`` -- the same keeping the ``keep`` largest-|x| input dims in full precision (LLM.int8());
* ``delta_loss`` (loss minus full precision, either sign for a barely trained model) and ``kl`` (mean KL from the
  intact predictions, >= 0: the damage itself).

Without an LM head the rows give the last hidden states' relative error ``||h_q - h|| / ||h||`` (``objective`` =
``hidden_rel_error``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from outlierlab.datamodules.scoring_batches import masked_batches, next_token_batches
from outlierlab.evaluation.registry import AnalysisResult, EvalContext, check_texts, scored_texts, shared_mlm
from outlierlab.configuration.analysis_settings import QuantizationSettings
from outlierlab.models.lm_model import LoadedModel
from outlierlab.models.w8a8 import KeptDims, linear_layers, quantized
from outlierlab.utils.tables import md_table

#: Scores with the model's LM head where it has one (evaluate.py loads it once for every analysis that does).
LM_HEAD = True

TITLE = "## What the outliers cost in 8 bits (W8A8; Bondarenko et al. 2023, LLM.int8())"

COLUMNS = ["condition", "layers", "bits", "kept_dims", "objective", "loss", "ppl", "top1", "delta_loss", "kl",
           "rel_error", "n_masked", "most_kept"]


def quantization_rows(loaded: LoadedModel, batches: Sequence[dict], bits: int = 8, keep: int = 4,
                      per_layer: bool = True) -> list[dict]:
    """The rows of ``COLUMNS`` for ``batches`` (with ``labels``; without an LM head only ``input_ids`` and
    ``attention_mask``): each batch runs in full precision and once per condition, so ``delta_loss`` and ``kl`` compare
    the same tokens."""
    scored = loaded.has_mlm_head
    n_blocks = len({name.split(".", 1)[0] for name in linear_layers(loaded.model)})
    scopes = [("all", None)] + ([(str(i), [i]) for i in range(1, n_blocks + 1)] if per_layer else [])
    conditions = [("w8a8", 0, label, blocks) for label, blocks in scopes]
    if keep > 0:
        conditions += [("w8a8_keep", keep, label, blocks) for label, blocks in scopes]
    kept = [KeptDims() for _ in conditions]
    # per condition (index 0: full precision): loss sum, correct, KL sum, n; or squared error and squared norm
    acc = torch.zeros(len(conditions) + 1, 4, dtype=torch.float64)

    def measure(b: dict) -> torch.Tensor:
        if scored:
            sel = b["labels"] != -100
            return loaded.forward(b["input_ids"], b["attention_mask"], rows=sel).logits.float()
        out = loaded.forward(b["input_ids"], b["attention_mask"], output_hidden_states=True)
        h = out.hidden_states[-1]
        return h[b["attention_mask"].to(h.device).bool()].float()

    for b in batches:
        with torch.no_grad():
            ref = measure(b)
            if scored:
                y = b["labels"].to(ref.device)[b["labels"].to(ref.device) != -100]
                ref_logp = ref.log_softmax(-1)
            for i, (_, k, _, blocks) in enumerate([(None, 0, None, None)] + conditions):
                if i == 0:
                    got = ref
                else:
                    with quantized(loaded.model, blocks, bits, keep=k, kept=kept[i - 1]):
                        got = measure(b)
                if scored:
                    logp = got.log_softmax(-1)
                    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
                    acc[i] += torch.tensor([float(-logp.gather(1, y[:, None]).sum()), float((got.argmax(-1) == y).sum()),
                                            float(kl.sum()), float(y.numel())], dtype=torch.float64)
                else:
                    acc[i] += torch.tensor([float((got - ref).pow(2).sum()), float(ref.pow(2).sum()), 0.0,
                                            float(ref.shape[0])], dtype=torch.float64)
    objective = loaded.objective if scored else "hidden_rel_error"

    def row(i: int, condition: str, layers: str, k: int, most: str = "") -> dict:
        a = acc[i].tolist()
        loss = a[0] / a[3] if scored and a[3] else None
        base = acc[0, 0].item() / acc[0, 3].item() if scored and a[3] else None
        return {"condition": condition, "layers": layers, "bits": None if i == 0 else bits, "kept_dims": k,
                "objective": objective, "loss": loss, "ppl": math.exp(loss) if loss is not None else None,
                "top1": a[1] / a[3] if scored and a[3] else None,
                "delta_loss": loss - base if loss is not None else None,
                "kl": a[2] / a[3] if scored and a[3] else None,
                "rel_error": None if scored else (a[0] ** 0.5 / a[1] ** 0.5 if a[1] > 0 else 0.0),
                "n_masked": int(a[3]) if scored else None, "most_kept": most}

    rows = [row(0, "full_precision", "all", 0)]
    for i, (condition, k, label, _) in enumerate(conditions, start=1):
        most = ";".join(f"{d}:{share:.2f}" for d, share in kept[i - 1].top(5)) if k else ""
        rows.append(row(i, condition, label, k, most))
    return rows


def quantization_markdown(rows: Sequence[dict], notes: Sequence[str]) -> str:
    scored = rows[0]["objective"] != "hidden_rel_error"
    table = [[r["condition"], r["layers"], r["kept_dims"] or "–",
              *((f"{r['loss']:.4f}", f"{r['delta_loss']:+.4f}", f"{r['kl']:.4f}", f"{r['top1']:.4f}") if scored
                else (f"{r['rel_error']:.4f}",)), r["most_kept"].replace(";", ", ") or "–"] for r in rows]
    head = ["condition", "blocks quantized", "dims kept", *(("loss", "Δ loss", "KL from intact", "top-1") if scored
                                                              else ("relative error of the last hidden states",)),
            "dims kept most often (share of inputs)"]
    lines = [TITLE, "", md_table(head, table, cell=str), ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def check(ctx: EvalContext) -> QuantizationSettings:
    """Settings and files, before any encoding (called by evaluate.py)."""
    s = ctx.settings(QuantizationSettings)
    check_texts(s)
    return s


def run(ctx: EvalContext) -> AnalysisResult:
    """W8A8 cost of the model (settings: ``configs/quantization/default.yaml``)."""
    s = check(ctx)
    loaded = shared_mlm(ctx)
    decoder = loaded.objective == "next_token"
    texts, what, max_length, seed = scored_texts(ctx, s, loaded)
    if decoder:
        batches = next_token_batches(loaded.tokenizer, texts, max_length, s.batch_size)
    elif loaded.has_mlm_head:
        batches = masked_batches(loaded.tokenizer, texts, max_length, s.batch_size, s.mlm_probability, seed)
    else:  # no head: the hidden states of the unmasked texts
        enc = [loaded.tokenizer(texts[i:i + s.batch_size], truncation=True, max_length=max_length, padding=True,
                                return_tensors="pt") for i in range(0, len(texts), s.batch_size)]
        batches = [{"input_ids": e["input_ids"], "attention_mask": e["attention_mask"]} for e in enc]
    rows = quantization_rows(loaded, batches, s.bits, s.keep, s.per_layer)
    n_layers = len(linear_layers(loaded.model))
    notes = [f"Model: {loaded.name}; {n_layers} linear layers of the blocks quantized (weights per output channel, "
             f"inputs per tensor, symmetric absmax, {s.bits} bits); embeddings and the LM head in full precision.",
             f"Text: {what}" + (f", packed into {len(texts)} sequences of ≤ {max_length} tokens" if s.pack else "")
             + (f"; {rows[0]['n_masked']} scored tokens" if rows[0]["n_masked"] else "") + ".",
             ("Objective: next-token loss." if decoder else
              f"Objective: masked-LM loss, {s.mlm_probability:.0%} of non-special tokens masked (seed {seed}), the "
              "same tokens in every condition." if loaded.has_mlm_head else
              f"{loaded.name} has no LM head ({loaded.no_head_reason}): the relative error of its last hidden "
              "states is reported instead of a loss."),
             f"w8a8_keep: the {s.keep} largest-|x| input dimensions of every quantized input kept in full precision "
             "(chosen per input, as LLM.int8() does); 'dims kept most often' gives each dim's share of the inputs."]
    by = {(r["condition"], r["layers"]): r for r in rows}
    summary = {"objective": rows[0]["objective"], "bits": s.bits, "keep": s.keep,
               **({"full_precision_loss": by["full_precision", "all"]["loss"],
                   "w8a8_delta_loss": by["w8a8", "all"]["delta_loss"], "w8a8_kl": by["w8a8", "all"]["kl"],
                   **({"w8a8_keep_delta_loss": by["w8a8_keep", "all"]["delta_loss"],
                       "w8a8_keep_kl": by["w8a8_keep", "all"]["kl"]} if s.keep else {})}
                  if loaded.has_mlm_head else {"w8a8_rel_error": by["w8a8", "all"]["rel_error"]})}
    return AnalysisResult("quantization", rows, quantization_markdown(rows, notes), summary=summary)

"""Deterministic dynamic MLM masking: transformers' collator, seeded per batch from the block indices.

The masking itself is ``transformers.DataCollatorForLanguageModeling.torch_mask_tokens`` (BERT/RoBERTa
recipe, Devlin et al. 2019; Liu et al. 2019): each non-special token is selected with probability
``mlm_probability``; a selected token becomes ``<mask>`` with probability 0.8, a random token with 0.1 and
stays unchanged with 0.1; labels are -100 except at selected positions.

What we add: the random draws come from a generator seeded by ``hash(seed, block indices of the batch)``, so
a batch is masked identically whatever happened to the global RNG before (worker count, a resumed run, other
code drawing random numbers).  That is what makes "10 steps, resume, 10 more" equal "20 steps".  Training
batches are reshuffled every epoch (seed + epoch), so the same block gets a fresh mask each epoch (dynamic
masking); the validation order is fixed, so validation masks -- and hence validation loss -- are comparable
across evaluations.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling


def batch_seed(seed: int, indices: Sequence[int]) -> int:
    """Stable 63-bit seed from ``seed`` and the ordered block indices of a batch."""
    data = np.asarray([seed, len(indices), *indices], dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


class DeterministicMLMCollator:
    """Collate ``{"index", "input_ids", "attention_mask"}`` examples into a masked batch ``{"input_ids",
    "attention_mask", "labels"}``; special tokens and padding are never selected."""

    def __init__(self, tokenizer, mlm_probability: float = 0.15, seed: int = 0,
                 mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1) -> None:
        self.hf = DataCollatorForLanguageModeling(
            tokenizer=tokenizer, mlm=True, mlm_probability=mlm_probability,
            mask_replace_prob=mask_replace_prob, random_replace_prob=random_replace_prob, return_tensors="pt")
        self.seed = int(seed)
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        indices = [int(e["index"]) for e in examples]
        input_ids = torch.stack([torch.as_tensor(e["input_ids"]) for e in examples]).long()
        attention_mask = torch.stack([torch.as_tensor(e["attention_mask"]) for e in examples]).long()
        special = torch.isin(input_ids, self.special_ids) | (attention_mask == 0)
        seed = batch_seed(self.seed, indices)
        # The HF collator draws from `self.generator` when set; fork_rng + seeding the default generator
        # covers versions that would use the global RNG, and leaves the caller's RNG state untouched.
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            self.hf.generator = torch.Generator().manual_seed(seed)
            masked, labels = self.hf.torch_mask_tokens(input_ids.clone(), special_tokens_mask=special)
        return {"input_ids": masked, "attention_mask": attention_mask, "labels": labels}


class CausalLMCollator:
    """Collate examples into a causal-LM batch (``objective=clm``): ``labels`` = the input ids, -100 at padding,
    unshifted (the model shifts), as ``DataCollatorForLanguageModeling(mlm=False)``.  Nothing is random."""

    def __init__(self, tokenizer) -> None:
        self.hf = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False, return_tensors="pt")

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.hf([{"input_ids": torch.as_tensor(e["input_ids"]).long(),
                          "attention_mask": torch.as_tensor(e["attention_mask"]).long()} for e in examples])
        # the HF collator labels by pad *id*; a block's padding is what its mask says
        batch["labels"][batch["attention_mask"] == 0] = -100
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": batch["labels"]}

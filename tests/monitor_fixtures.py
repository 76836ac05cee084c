"""Shared helpers of the monitor tests (tests/test_monitors.py, tests/test_run_analysis.py): a byte-level BPE
tokenizer trained on the held-out sentences, layer norms with planted outlier entries, random MLM data, and a short
Lightning run with the LayerNorm and hidden-state monitors."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from outlierlab.monitoring.hidden_state_monitor import HiddenStateMonitor
from outlierlab.monitoring.layernorm_monitor import LayerNormMonitor
from outlierlab.models import EncoderConfig, RobertaMaskedLM
from outlierlab.lightning_modules.mlm_module import MLMLitModule

PLANT_GAIN = ("layer.1.output", 7, 6.0)  # LayerNorm, dim, z-score of the planted gain (+6σ)
PLANT_BIAS = ("layer.0.attention_output", 3, -5.0)  # ... of the planted bias (−5σ)


def tiny_tokenizer():
    """A real byte-level BPE tokenizer (RoBERTa specials <s>=0, <pad>=1, </s>=2) trained on held-out sentences."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import PreTrainedTokenizerFast

    from outlierlab.datamodules.eval_data import load_sentences

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(load_sentences()[:500], vocab_size=400, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    bpe.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<mask>")


def planted_row(d: int, dim: int, z: float, seed: int = 0) -> torch.Tensor:
    """d values with mean 0 whose entry ``dim`` has population z-score exactly ``z``; all others |z| < 2.

    Base values b (mean 0, population variance 1 over d−1 entries) and outlier x: the row's mean is x/d
    and σ² = (d−1 + x²)/d − x²/d², so z = (x − x/d)/σ  ⇔  x² = z²·d / (d − 1 − z²).
    """
    base = torch.linspace(-1.0, 1.0, d - 1, dtype=torch.float64)
    base = (base - base.mean()) / base.std(correction=0)
    base = base[torch.randperm(d - 1, generator=torch.Generator().manual_seed(seed))]
    x = math.copysign(math.sqrt(z * z * d / (d - 1 - z * z)), z)
    return torch.cat([base[:dim], torch.tensor([x], dtype=torch.float64), base[dim:]])


def plant_layernorms(model: RobertaMaskedLM, scale: float = 0.05) -> None:
    lns = model.named_layernorms()
    with torch.no_grad():
        name, dim, z = PLANT_GAIN
        lns[name].weight.copy_(1.0 + scale * planted_row(lns[name].weight.numel(), dim, z))
        name, dim, z = PLANT_BIAS
        lns[name].bias.copy_(scale * planted_row(lns[name].bias.numel(), dim, z, seed=1))


class RandomMLMData(L.LightningDataModule):
    """Random token blocks (<s> … </s>) with 15% of positions masked, plus a real tokenizer attribute."""

    def __init__(self, tokenizer, n_blocks: int = 160, seq_len: int = 24, batch_size: int = 8, seed: int = 0):
        super().__init__()
        self.tokenizer = tokenizer
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(5, len(tokenizer), (n_blocks, seq_len), generator=g)
        ids[:, 0], ids[:, -1] = tokenizer.bos_token_id, tokenizer.eos_token_id
        pick = torch.rand(n_blocks, seq_len, generator=g) < 0.15
        pick[:, 0] = pick[:, -1] = False
        labels = torch.where(pick, ids, torch.full_like(ids, -100))
        masked = torch.where(pick, torch.full_like(ids, tokenizer.mask_token_id), ids)
        self.originals = ids
        self.items = [{"input_ids": masked[i], "attention_mask": torch.ones(seq_len, dtype=torch.long),
                       "labels": labels[i]} for i in range(n_blocks)]
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.items, batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self):
        return DataLoader(self.items[:16], batch_size=self.batch_size, shuffle=False)


def tiny_module(vocab_size: int, planted: bool = True, seed: int = 0) -> MLMLitModule:
    torch.manual_seed(seed)
    cfg = EncoderConfig(vocab_size=vocab_size, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                        max_len=64, pos={"name": "learned"})
    module = MLMLitModule(cfg, optimizer=partial(torch.optim.AdamW, lr=3e-3), seed=seed)
    if planted:
        plant_layernorms(module.model)
    return module


def fit(root: Path, tokenizer, max_steps: int, monitors: bool = True, ckpt_path: str | None = None,
        tb_version: str = "a", seed: int = 0):
    module = tiny_module(len(tokenizer), seed=seed)
    callbacks = [ModelCheckpoint(dirpath=root / "checkpoints", filename="step{step:03d}", auto_insert_metric_name=False,
                                 every_n_train_steps=10, save_top_k=-1)]
    if monitors:
        callbacks += [LayerNormMonitor(out_dir=str(root / "monitor"), every_n_steps=5, image_every_n_steps=20),
                      HiddenStateMonitor(out_dir=str(root / "monitor"), every_n_steps=5, image_every_n_steps=20,
                                         n_sequences=8, n_pairs=200)]
    trainer = L.Trainer(default_root_dir=root, max_steps=max_steps, accelerator="cpu", devices=1,
                        logger=TensorBoardLogger(root, name="tb", version=tb_version, default_hp_metric=False),
                        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=5)
    trainer.fit(module, datamodule=RandomMLMData(tokenizer), ckpt_path=ckpt_path)
    return module

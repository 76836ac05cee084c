"""Our RoBERTa encoder with pluggable position schemes (see DESIGN.md: why it is our own code)."""

from .config import EncoderConfig
from .export import load_pretrained, save_pretrained
from .encoder import EncoderOutput, MaskedLMOutput, RobertaEncoder, RobertaMaskedLM, position_ids_from_mask
from .positions import POSITION_SCHEMES, get_scheme

__all__ = [
    "EncoderConfig",
    "EncoderOutput",
    "MaskedLMOutput",
    "POSITION_SCHEMES",
    "RobertaEncoder",
    "RobertaMaskedLM",
    "get_scheme",
    "load_pretrained",
    "position_ids_from_mask",
    "save_pretrained",
]

"""Our RoBERTa encoder with pluggable position schemes and architecture switches (see docs/design.md: why it
is our own code; docs/architectures.md: the switches)."""

from .config import EncoderConfig
from .export import hf_exportable, load_pretrained, save_pretrained
from .encoder import EncoderOutput, MaskedLMOutput, RobertaEncoder, RobertaMaskedLM, position_ids_from_mask
from .positions import POSITION_SCHEMES, get_scheme

__all__ = ["EncoderConfig", "EncoderOutput", "MaskedLMOutput", "POSITION_SCHEMES", "RobertaEncoder", "RobertaMaskedLM",
           "get_scheme", "hf_exportable", "load_pretrained", "position_ids_from_mask", "save_pretrained"]

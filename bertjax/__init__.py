"""bertjax: pre-train BERT (masked LM + next sentence prediction) in JAX/Flax, from raw text to checkpoints."""

from bertjax.hf import from_pretrained, save_pretrained
from bertjax.model import BertConfig, BertForPreTraining, BertOutput, config_for_size

__all__ = ["BertConfig", "BertForPreTraining", "BertOutput", "config_for_size", "from_pretrained",
           "save_pretrained"]
__version__ = "0.1.0"

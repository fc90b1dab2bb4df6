"""What a BERT is, without the code that computes it: the config dataclass (bert_config.json's fields) and
its named sizes.

Plain dataclasses and the standard library only: the config schema (config.py), record preparation and
every Beam worker read architectures without importing Flax or JAX. models/bert/model.py builds the Flax module
from a `BertConfig`.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from typing import Any, ClassVar

from bertjax.models.options import (  # noqa: F401  (re-exported: architecture.DTYPE_NAMES, ...)
    ACTIVATION_NAMES,
    ATTENTION_IMPLEMENTATIONS,
    DTYPE_NAMES,
    REMAT_POLICY_NAMES,
)

# Fields of google-research/bert's bert_config.json (and of Hugging Face's BertConfig).
CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
)
# Hugging Face config.json fields with the value BERT has; any other value changes what the weights compute
# (relative positions, causal self-attention, cross-attention layers), which bertjax does not implement.
FIXED_HF_FIELDS = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}
# Settings of training, not of the function the params compute: a run may resume, or start from weights,
# with other values (dropout 0 for a fused attention kernel, say).
TRAINING_ONLY_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The architecture; field names are those of bert_config.json."""

    model_type: ClassVar[str] = "bert"  # the family (models.get)
    has_nsp_head: ClassVar[bool] = True  # next-sentence prediction (config.data.next_sentence_prediction)
    scans_layers: ClassVar[bool] = True  # whether config.model.scan_layers applies (nn.scan over identical layers)
    init_from_may_change: ClassVar[tuple[str, ...]] = ()  # what an init_from run may change from its checkpoint

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12

    def __post_init__(self):
        self.validate()

    def validate(self, source: str = "the model config") -> None:
        """Raises one clear ValueError for an architecture that cannot be built."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{source}: {name}={value!r} must be a positive integer.")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{source}: hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}; choose a head count that divides it."
            )
        if self.hidden_act not in ACTIVATION_NAMES:
            raise ValueError(f"{source}: hidden_act={self.hidden_act!r} is not one of {sorted(ACTIVATION_NAMES)}.")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not (isinstance(getattr(self, name), numbers.Real) and 0.0 <= getattr(self, name) < 1.0):
                raise ValueError(f"{source}: {name}={getattr(self, name)} must be in [0, 1).")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def layer_windows(self) -> tuple[None, ...]:
        """Each layer's attention window (None: global), as every family says it (aot's splash count)."""
        return (None,) * self.num_hidden_layers

    @classmethod
    def from_dict(cls, d: dict, source: str = "the model config") -> "BertConfig":
        """Builds from a bert_config.json / HF config.json dict, ignoring fields BERT does not use."""
        missing = [f for f in CONFIG_FIELDS if f not in d and f != "layer_norm_eps"]
        if missing:
            raise ValueError(f"{source}: missing BERT config field(s) {missing}.")
        try:
            return cls(**{f: d[f] for f in CONFIG_FIELDS if f in d})
        except ValueError as e:  # validate() names the field; say which file it came from
            raise ValueError(str(e).replace("the model config", source, 1)) from None

    @classmethod
    def from_json_file(cls, path: str) -> "BertConfig":
        """Reads bert_config.json / HF config.json, refusing settings under which the same weights compute
        something other than BERT's encoder (they would load, then silently give wrong outputs)."""
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(
                f"{path} is not valid JSON ({e}); restore the config.json the checkpoint came with."
            ) from None
        if not isinstance(d, dict):
            raise ValueError(
                f"{path} holds a JSON {type(d).__name__}, not an object of BERT config fields; "
                "restore the config.json the checkpoint came with."
            )
        if d.get("model_type", "bert") != "bert":
            raise ValueError(
                f"{path}: model_type={d['model_type']!r} is not BERT; bertjax loads BERT "
                'checkpoints only (model_type "bert").'
            )
        for field, bert_value in FIXED_HF_FIELDS.items():
            if d.get(field, bert_value) != bert_value:
                raise ValueError(
                    f"{path}: {field}={d[field]!r} is not supported; bertjax implements only BERT's "
                    f"encoder ({field}={bert_value!r}), so load this checkpoint with transformers."
                )
        return cls.from_dict(d, source=path)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def differences(self, other: dict) -> list[str]:
        """'field: theirs there, mine here' for each field (of a saved config dict) that would make the same
        params compute a different function; training-only fields may differ."""
        return [
            f"{f}: {other.get(f)} there, {getattr(self, f)} here"
            for f in CONFIG_FIELDS
            if f not in TRAINING_ONLY_FIELDS and other.get(f) != getattr(self, f)
        ]


# Model sizes from the BERT paper and the "Well-Read Students" compact models.
SIZES: dict[str, tuple[int, int, int]] = {  # name: (layers, hidden, heads)
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def config_for_size(size: str, **overrides) -> BertConfig:
    """BERT of a named size: intermediate = 4 × hidden, vocab 30522, 512 positions, 2 token types."""
    if size not in SIZES:
        raise ValueError(f"model size {size!r} is not one of {list(SIZES)}.")
    layers, hidden, heads = SIZES[size]
    fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden)
    fields.update(overrides)
    return BertConfig(**fields)


def from_model_config(cfg: Any) -> BertConfig:
    """`config.model` (config.ModelConfig) → the architecture; an unset vocab_size (before the job resolves
    it, or without data) is BERT's 30,522. Fields BERT does not use (ModernBERT's) are ignored."""
    fields = dataclasses.asdict(cfg)
    fields["vocab_size"] = cfg.vocab_size or BertConfig.vocab_size
    return BertConfig.from_dict(fields, source="config.model")


def model_config_fields(config: BertConfig) -> dict:
    """`config.model`'s fields for this architecture (fine-tuning writes init_from's into its config)."""
    return dict(config.to_dict(), family="bert")


def from_fingerprint(d: dict) -> BertConfig:
    """The architecture a checkpoint saved (`to_dict()`)."""
    return BertConfig(**d)


def with_finetuning_choices(config: BertConfig, model_config: Any) -> BertConfig:
    """A checkpoint's architecture as a fine-tuning run uses it: BERT's heads have no choices of their own."""
    del model_config
    return config

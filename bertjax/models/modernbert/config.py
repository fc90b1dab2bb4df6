"""What a ModernBERT is, without the code that computes it: the config dataclass, its named sizes, and both
spellings of Hugging Face's config.json (transformers' legacy `global_rope_theta` / `local_rope_theta` /
`global_attn_every_n_layers`, and `layer_types` + `rope_parameters`).

Plain dataclasses and the standard library only, as bert/config.py is for BERT: the config schema and record
preparation read it without importing JAX. models/modernbert/model.py builds the Flax module from it.

The traps the model must keep (Warner et al. 2024; transformers' modeling_modernbert.py): the sliding window
is `local_attention // 2` tokens on each side (so `local_attention` must be even); the first layer has no
attention norm; global and local layers rotate with different RoPE bases; norms and linears have no bias by
default; the MLM head is dense → activation → norm → the tied decoder with its own bias.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from typing import Any, ClassVar

from bertjax.models import options

FULL, SLIDING = "full_attention", "sliding_attention"
ACTIVATION_NAMES = options.ACTIVATION_NAMES
POOLINGS = ("cls", "mean")
# Settings of training, not of the function the params compute (a run may resume with other values).
TRAINING_ONLY_FIELDS = (
    "embedding_dropout",
    "attention_dropout",
    "mlp_dropout",
    "classifier_dropout",
    "initializer_range",
    "initializer_cutoff_factor",
)


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    """The architecture; field names are those of transformers' ModernBertConfig."""

    model_type: ClassVar[str] = "modernbert"  # the family (models.get)
    has_nsp_head: ClassVar[bool] = False  # MLM only
    scans_layers: ClassVar[bool] = False  # whether config.model.scan_layers applies (nn.scan over identical layers)
    # What an init_from run may change from its checkpoint: context extension raises the RoPE bases and the
    # longest position on the same weights (configs/modernbert.py:phase=2). Resuming changes nothing.
    init_from_may_change: ClassVar[tuple[str, ...]] = (
        "global_rope_theta",
        "local_rope_theta",
        "max_position_embeddings",
    )

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    decoder_bias: bool = True
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    classifier_pooling: str = "cls"
    local_attention: int = 128  # the whole window: local layers see local_attention // 2 tokens each side
    layer_types: tuple[str, ...] = ()  # FULL or SLIDING per layer; () = global every 3rd layer, from layer 0
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    mlp_dropout: float = 0.0
    classifier_dropout: float = 0.0
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    pad_token_id: int = 50283
    bos_token_id: int = 50281
    eos_token_id: int = 50282
    cls_token_id: int = 50281
    sep_token_id: int = 50282

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", layer_types_every(self.num_hidden_layers, 3))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self.validate()

    def validate(self, source: str = "the model config") -> None:
        """Raises one ValueError naming the field for an architecture that cannot be built."""
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
            "local_attention",
        ):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{source}: {name}={value!r} must be a positive integer.")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{source}: hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; choose a head count that divides it."
            )
        if self.local_attention % 2:
            raise ValueError(
                f"{source}: local_attention={self.local_attention} is not even; it is the whole "
                "sliding window, local_attention // 2 tokens on each side (ModernBERT uses 128)."
            )
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {FULL, SLIDING}:
            raise ValueError(
                f"{source}: layer_types={list(self.layer_types)} must give each of the "
                f"{self.num_hidden_layers} layers {FULL!r} or {SLIDING!r}."
            )
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in ACTIVATION_NAMES:
                raise ValueError(f"{source}: {name}={getattr(self, name)!r} is not one of {sorted(ACTIVATION_NAMES)}.")
        if self.classifier_pooling not in POOLINGS:
            raise ValueError(
                f"{source}: classifier_pooling={self.classifier_pooling!r} is not one of {list(POOLINGS)}."
            )
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(
                    f"{source}: {name}={getattr(self, name)} is outside the vocab (vocab_size="
                    f"{self.vocab_size}); set the special token ids of the tokenizer in use."
                )
        for name in ("embedding_dropout", "attention_dropout", "mlp_dropout", "classifier_dropout"):
            if not (isinstance(getattr(self, name), numbers.Real) and 0.0 <= getattr(self, name) < 1.0):
                raise ValueError(f"{source}: {name}={getattr(self, name)} must be in [0, 1).")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def attention_probs_dropout_prob(self) -> float:
        """BERT's name for the attention dropout, which attention.choose reads for every family."""
        return self.attention_dropout

    @property
    def sliding_window(self) -> int:
        """Tokens a local layer's query sees on each side (transformers' `config.sliding_window`)."""
        return self.local_attention // 2

    def is_global(self, layer: int) -> bool:
        return self.layer_types[layer] == FULL

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window, tokens each side (None: global)."""
        return tuple(None if self.is_global(i) else self.sliding_window for i in range(self.num_hidden_layers))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["layer_types"] = list(self.layer_types)
        return d

    def differences(self, other: dict) -> list[str]:
        """'field: theirs there, mine here' for each field that would make the same params compute another function."""
        mine = self.to_dict()
        return [
            f"{f}: {other.get(f)} there, {mine[f]} here"
            for f in mine
            if f not in TRAINING_ONLY_FIELDS and other.get(f) != mine[f]
        ]


def layer_types_every(num_layers: int, every: int) -> tuple[str, ...]:
    """transformers' default: layer i is global when i % every == 0 (layers 0, 3, 6, ...), else sliding."""
    if not isinstance(every, numbers.Integral) or every < 1:
        raise ValueError(f"global_attn_every_n_layers={every!r} must be a positive integer.")
    return tuple(FULL if i % every == 0 else SLIDING for i in range(num_layers))


# --- Named sizes (configs/modernbert.py:size=...) ----------------------------------------------------------

SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(num_hidden_layers=4, hidden_size=128, intermediate_size=192, num_attention_heads=2),
    "base": dict(num_hidden_layers=22, hidden_size=768, intermediate_size=1152, num_attention_heads=12),
    "large": dict(num_hidden_layers=28, hidden_size=1024, intermediate_size=2624, num_attention_heads=16),
}


def config_for_size(size: str, **overrides: Any) -> ModernBertConfig:
    if size not in SIZES:
        raise ValueError(f"ModernBERT size {size!r} is not one of {list(SIZES)}.")
    return ModernBertConfig(**{**SIZES[size], **overrides})


def from_model_config(cfg: Any) -> ModernBertConfig:
    """`config.model` (config.ModelConfig) → the architecture. config.model keeps BERT's names where the two
    mean the same (hidden_act, layer_norm_eps, the two dropouts) and transformers' for the rest; special token
    ids left at -1 are 0 until the job sets them from the vocab ([PAD], [CLS], [SEP])."""

    def token(name: str) -> int:
        return max(getattr(cfg, name), 0)

    try:
        return ModernBertConfig(
            vocab_size=cfg.vocab_size or ModernBertConfig.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            hidden_activation=cfg.hidden_act,
            max_position_embeddings=cfg.max_position_embeddings,
            norm_eps=cfg.layer_norm_eps,
            classifier_pooling=cfg.classifier_pooling,
            local_attention=cfg.local_attention,
            layer_types=layer_types_every(cfg.num_hidden_layers, cfg.global_attn_every_n_layers),
            global_rope_theta=cfg.global_rope_theta,
            local_rope_theta=cfg.local_rope_theta,
            embedding_dropout=cfg.hidden_dropout_prob,
            mlp_dropout=cfg.hidden_dropout_prob,
            classifier_dropout=cfg.hidden_dropout_prob,
            attention_dropout=cfg.attention_probs_dropout_prob,
            initializer_range=cfg.initializer_range,
            pad_token_id=token("pad_token_id"),
            cls_token_id=token("cls_token_id"),
            bos_token_id=token("cls_token_id"),
            sep_token_id=token("sep_token_id"),
            eos_token_id=token("sep_token_id"),
        )
    except ValueError as e:
        raise ValueError(
            str(e)
            .replace("the model config:", "config.model:", 1)
            .replace("global_attn_every_n_layers=", "config.model.global_attn_every_n_layers=")
        ) from None


def model_config_fields(config: ModernBertConfig) -> dict:
    """The inverse of `from_model_config`: `config.model`'s fields for this architecture (fine-tuning writes
    init_from's architecture into its config this way)."""
    every = next(
        (
            n
            for n in range(1, config.num_hidden_layers + 1)
            if layer_types_every(config.num_hidden_layers, n) == config.layer_types
        ),
        None,
    )
    fixed = {
        name: getattr(config, name)
        for name in (
            "norm_bias",
            "attention_bias",
            "mlp_bias",
            "decoder_bias",
            "classifier_bias",
            "classifier_activation",
        )
    }
    unusual = {name: value for name, value in fixed.items() if value != getattr(ModernBertConfig, name)}
    if unusual:
        raise ValueError(
            f"this ModernBERT sets {unusual}, which config.model cannot express (it keeps ModernBERT's "
            "defaults); fine-tune it with transformers."
        )
    if every is None:
        raise ValueError(
            f"layer_types={list(config.layer_types)} is not a global layer every n layers from layer "
            "0, which is all config.model.global_attn_every_n_layers can say; bertjax fine-tunes "
            "ModernBERTs of that pattern only."
        )
    return dict(
        family="modernbert",
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        hidden_act=config.hidden_activation,
        max_position_embeddings=config.max_position_embeddings,
        layer_norm_eps=config.norm_eps,
        classifier_pooling=config.classifier_pooling,
        local_attention=config.local_attention,
        global_attn_every_n_layers=every,
        global_rope_theta=config.global_rope_theta,
        local_rope_theta=config.local_rope_theta,
        hidden_dropout_prob=config.mlp_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        initializer_range=config.initializer_range,
        pad_token_id=config.pad_token_id,
        cls_token_id=config.cls_token_id,
        sep_token_id=config.sep_token_id,
        scan_layers=False,
    )


def from_fingerprint(d: dict) -> ModernBertConfig:
    """The architecture a checkpoint saved (`to_dict()`)."""
    return ModernBertConfig(**{**d, "layer_types": tuple(d["layer_types"])})


# --- Hugging Face config.json, both spellings ---------------------------------------------------------------

_HF_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(ModernBertConfig)
    if f.name not in ("layer_types", "global_rope_theta", "local_rope_theta")
)


def _rope_theta(d: dict, kind: str, legacy: str, default: float, source: str) -> float:
    params = (d.get("rope_parameters") or {}).get(kind)
    if params is None:
        return float(d.get(legacy, default))
    if params.get("rope_type", "default") != "default":
        raise ValueError(
            f"{source}: rope_parameters.{kind}.rope_type={params['rope_type']!r} is not supported; "
            "bertjax implements ModernBERT's default RoPE only."
        )
    return float(params.get("rope_theta", d.get(legacy, default)))


def from_hf_dict(d: dict, source: str = "config.json") -> ModernBertConfig:
    """A transformers ModernBertConfig dict (either spelling) → ModernBertConfig."""
    if d.get("model_type") != "modernbert":
        raise ValueError(f"{source}: model_type={d.get('model_type')!r} is not 'modernbert'.")
    fields = {k: d[k] for k in _HF_FIELDS if k in d and d[k] is not None}
    layers = d.get("num_hidden_layers", ModernBertConfig.num_hidden_layers)
    fields["layer_types"] = (
        tuple(d["layer_types"])
        if d.get("layer_types")
        else layer_types_every(layers, d.get("global_attn_every_n_layers", 3))
    )
    fields["global_rope_theta"] = _rope_theta(d, FULL, "global_rope_theta", 160_000.0, source)
    fields["local_rope_theta"] = _rope_theta(d, SLIDING, "local_rope_theta", 10_000.0, source)
    try:
        return ModernBertConfig(**fields)
    except ValueError as e:
        raise ValueError(str(e).replace("the model config", source, 1)) from None


def from_json_file(path: str) -> ModernBertConfig:
    with open(path, encoding="utf-8") as f:
        return from_hf_dict(json.load(f), source=path)


def to_hf_dict(config: ModernBertConfig, architectures: tuple[str, ...] = ("ModernBertForMaskedLM",)) -> dict:
    """config.json in both spellings: `layer_types` + `rope_parameters` for transformers 5, and the legacy
    fields older releases read (global_attn_every_n_layers only when the layers follow that pattern)."""
    d = {k: v for k, v in config.to_dict().items() if k in _HF_FIELDS}
    d.update(
        model_type="modernbert",
        architectures=list(architectures),
        layer_types=list(config.layer_types),
        rope_parameters={
            FULL: {"rope_type": "default", "rope_theta": config.global_rope_theta},
            SLIDING: {"rope_type": "default", "rope_theta": config.local_rope_theta},
        },
        global_rope_theta=config.global_rope_theta,
        local_rope_theta=config.local_rope_theta,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    for every in range(1, config.num_hidden_layers + 1):
        if layer_types_every(config.num_hidden_layers, every) == config.layer_types:
            d["global_attn_every_n_layers"] = every
            break
    return d


def with_finetuning_choices(config: ModernBertConfig, model_config: Any) -> ModernBertConfig:
    """A checkpoint's architecture as a fine-tuning run uses it: the classifier's pooling is config.model's
    choice (transformers' classifier_pooling), not the checkpoint's."""
    return dataclasses.replace(config, classifier_pooling=model_config.classifier_pooling)

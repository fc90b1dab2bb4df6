"""The Hugging Face PyTorch reference, and inputs that exercise padding and both segments."""

import jax
import numpy as np
import torch
import transformers

from bertjax.models.bert import model as model_lib


def hf_config(config: model_lib.BertConfig) -> transformers.BertConfig:
    return transformers.BertConfig(**config.to_dict(), attn_implementation="eager")


def random_hf_model(config: model_lib.BertConfig, seed: int = 0) -> transformers.BertForPreTraining:
    """HF model with every tensor perturbed, so LayerNorm scales and biases are not 1s and 0s."""
    torch.manual_seed(seed)
    model = transformers.BertForPreTraining(hf_config(config)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def random_params(model: model_lib.BertForPreTraining, seed: int = 0) -> dict:
    """bertjax params with every tensor perturbed."""
    params = model_lib.init_params(model, jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    return jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def batch(
    config: model_lib.BertConfig, batch_size: int = 3, seq_len: int = 24, predictions: int = 5, seed: int = 0
) -> dict[str, np.ndarray]:
    """Rows with no padding, some padding and heavy padding; segment B on the second half of the tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(seq_len, seq_len // 3, batch_size).astype(int)
    input_mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32)
    input_ids = rng.integers(5, config.vocab_size, (batch_size, seq_len)).astype(np.int32) * input_mask
    segment_ids = ((np.arange(seq_len)[None, :] >= lengths[:, None] // 2) * input_mask).astype(np.int32)
    positions = np.stack([rng.choice(n, predictions, replace=False) for n in lengths]).astype(np.int32)
    return dict(input_ids=input_ids, segment_ids=segment_ids, input_mask=input_mask, masked_lm_positions=positions)


def hf_outputs(hf_model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(inputs["input_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
            output_hidden_states=True,
        )
    return dict(
        mlm_logits=out.prediction_logits.numpy(),
        nsp_logits=out.seq_relationship_logits.numpy(),
        sequence_output=out.hidden_states[-1].numpy(),
    )

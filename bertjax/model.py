"""BERT's Flax model, at the path code written before the models package imports it from
(`from bertjax import model`); it lives in bertjax/models/bert.py."""

from bertjax.models.bert import *  # noqa: F401,F403
from bertjax.models.bert import _layer_norm  # noqa: F401  (tests hold LayerNorm to PyTorch's)

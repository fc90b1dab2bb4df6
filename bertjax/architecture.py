"""BERT's config dataclass and the option names, at the path code written before the models package imports
them from (`from bertjax import architecture`); they live in bertjax/models/bert_config.py and options.py."""

from bertjax.models.bert_config import *  # noqa: F401,F403
from bertjax.models.options import *  # noqa: F401,F403

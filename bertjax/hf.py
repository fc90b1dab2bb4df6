"""BERT's Hugging Face interop, at the path code written before the models package imports it from
(`from bertjax import hf`); it lives in bertjax/models/bert_hf.py and models/hf_files.py."""

from bertjax.models.bert_hf import *  # noqa: F401,F403
from bertjax.models.hf_files import CONFIG_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME  # noqa: F401
from bertjax.models.hf_files import get_path as _get, set_path as _set  # noqa: F401

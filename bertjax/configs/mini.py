"""BERT-mini (L4/H256/A4). Same arguments as default.py, e.g. `configs/mini.py:phase=2`."""

import pathlib
import runpy

_default = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config(arg: str | None = None):
    return _default["for_size"]("mini", arg)

"""BERT-medium (L8/H512/A8). Same arguments as default.py, e.g. `configs/medium.py:phase=2`."""

import pathlib
import runpy

_default = runpy.run_path(str(pathlib.Path(__file__).with_name("default.py")))


def get_config(arg: str | None = None):
    return _default["for_size"]("medium", arg)

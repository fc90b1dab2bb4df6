"""The config files that ship with bertjax; `--config=configs/NAME.py` finds them from any directory.

Each file is loaded by path (ml_collections' config_flags, `bertjax.cli`), never imported as a module;
this file only makes them part of the installed package. In a clone, `configs/` links here.
"""

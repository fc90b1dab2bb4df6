"""The config: schema.py (one frozen dataclass per section, each validating its own fields) and convert.py
(the one strict converter from an ml_collections ConfigDict, renamed settings, typed overrides). The files
users pass as --config=configs/NAME.py are data, in bertjax/configs/. No JAX is imported here."""

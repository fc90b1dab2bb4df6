"""From a mapping to the config's typed dataclasses: `convert` (field by field, strict, errors naming
`config.section.key`), `Sections` (a whole config in from a ConfigDict or a run's config.json, out as a dict),
and `parse_arg`, the typed arguments of config files (`configs/large.py:phase=2`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import types
import typing
from typing import Any, Mapping, Optional

# Settings renamed since runs wrote them to config.json: from_saved reads the old name as the new one.
RENAMED = {"config.optim.decay": "config.optim.schedule"}
Rules = tuple[tuple[str, Any], ...]  # config.mesh.logical_axis_rules
RateOrSchedule = typing.Union[float, str]  # config.data.masked_lm_prob: a rate, or rates by step ('0:0.3;9000:0.15')


class ConfigError(ValueError):
    """A config mistake (a field, a value, fields that disagree): the command exits with status 2, as for a
    mistake on its command line, since nothing ran."""


def bad_value(path: str, value: Any, why: str) -> ValueError:
    return ConfigError(f"{path}={value!r} {why}")


# --- The one converter ------------------------------------------------------------------------------


def convert(cls: type, section: Any, path: str) -> Any:
    """A mapping → dataclass `cls`, field by field, by the field's type; errors name `path.key`."""
    given = dict(section.items()) if hasattr(section, "items") else None
    if given is None:
        raise bad_value(path, section, "must be a section of settings (a ConfigDict).")
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    for key in given:
        if f"{path}.{key}" in RENAMED:
            raise ConfigError(f"{path}.{key} is now {RENAMED[path + '.' + key]}; rename it in your config.")
        if key not in hints:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {path}.{close[0]}?" if close else f"; the settings there are {fields}."
            raise ConfigError(f"{path}.{key} is not a setting{hint}")
    for key in fields:
        if key not in given:
            raise ConfigError(
                f"{path}.{key} is missing; start the config from configs/default.py, which sets every field."
            )
    return cls(**{key: _coerce(given[key], hints[key], f"{path}.{key}") for key in fields})


def _coerce(value: Any, kind: Any, path: str) -> Any:
    if dataclasses.is_dataclass(kind):
        return convert(kind, value, path)
    if kind == Optional[bool]:  # None: the default chosen where the job runs (model.scan_layers)
        if value is None or isinstance(value, bool):
            return value
        raise bad_value(path, value, "must be True, False or None (the platform's choice).")
    if kind == RateOrSchedule:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value.strip()  # a schedule: DataConfig.validate reads it
        raise bad_value(path, value, "must be a number or a schedule such as '0:0.3;9000:0.15'.")
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise bad_value(path, value, "must be True or False.")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad_value(path, value, "must be an integer.")
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise bad_value(path, value, "must be a number.")
    if kind is str:
        if isinstance(value, str):
            return value
        raise bad_value(path, value, "must be a string.")
    if kind == tuple[int, ...]:
        if isinstance(value, (list, tuple)):
            return tuple(_coerce(v, int, f"{path}[{i}]") for i, v in enumerate(value))
        raise bad_value(path, value, "must be a tuple of integers, e.g. (-1, 1, 1).")
    if kind == Rules:
        try:
            return tuple((str(name), tuple(axes) if isinstance(axes, (list, tuple)) else axes) for name, axes in value)
        except (TypeError, ValueError):
            raise bad_value(path, value, "must be (logical axis, mesh axis or tuple of them or None) pairs.") from None
    raise TypeError(f"{path}: no conversion for the type {kind}")  # a schema bug, not a user error


# --- Config-file arguments --------------------------------------------------------------------------

_TRUE, _FALSE = ("", "1", "true", "yes"), ("0", "false", "no")


def parse_arg(arg: Optional[str], **spec: Any) -> types.SimpleNamespace:
    """`"phase=2,runlocal"` → namespace(phase=2, runlocal=True) for spec `phase=1, runlocal=False`.

    Each value takes the type of its default; a bare name sets a boolean. An unknown name or a value of
    the wrong type is one ValueError (big_vision's `parse_arg`, made strict)."""
    values = dict(spec)
    for item in filter(None, (s.strip() for s in (arg or "").split(","))):
        key, has_value, raw = (s.strip() for s in item.partition("="))
        if key not in spec:
            raise ConfigError(
                f"config argument {key!r} is not known; this config file takes "
                f"{', '.join(f'{k}={v!r}' for k, v in spec.items()) or 'no arguments'}."
            )
        default = spec[key]
        if isinstance(default, bool):
            if raw.lower() not in _TRUE + _FALSE:
                raise ConfigError(f"config argument {key}={raw!r} must be true or false.")
            values[key] = raw.lower() in _TRUE
        elif not has_value:
            raise ConfigError(f"config argument {key!r} needs a value ({key}=...).")
        else:
            try:
                values[key] = type(default)(raw)
            except ValueError:
                raise ConfigError(f"config argument {key}={raw!r} must be of type {type(default).__name__}.") from None
    return types.SimpleNamespace(**values)


# --- A whole config: its sections, in from a ConfigDict or a run's config.json, out as a dict ------------


class Sections:
    """What a whole config (pre-training's or fine-tuning's) does with its sections."""

    @classmethod
    def from_configdict(cls, config: Any) -> Any:
        """A ConfigDict (or nested mapping) → this config, strictly, then validated."""
        job = convert(cls, config, "config")
        job.validate()
        return job

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any]) -> Any:
        """The config a run wrote to its workdir (config.json); settings added to the schema since (say
        config.model.family) take their defaults, so older runs still predict, export and resume."""

        def merged(default: dict, given: Mapping[str, Any]) -> dict:
            return {
                **default,
                **{
                    k: merged(default[k], v) if isinstance(default.get(k), dict) and isinstance(v, Mapping) else v
                    for k, v in given.items()
                },
            }

        saved = json.loads(json.dumps(saved))  # a deep copy to rename in
        for old, new in RENAMED.items():
            (*old_sections, old_key), (*new_sections, new_key) = old.split(".")[1:], new.split(".")[1:]
            section = functools.reduce(lambda d, k: d.get(k, {}), old_sections, saved)
            if old_key in section:
                functools.reduce(lambda d, k: d.setdefault(k, {}), new_sections, saved)[new_key] = section.pop(old_key)
        return cls.from_configdict(merged(cls().to_dict(), saved))

    def validate(self) -> None:
        raise NotImplementedError

    def replace(self, **sections: Mapping[str, Any]) -> Any:
        """A copy with fields of sections changed: `job.replace(data={"vocab_file": v})`."""
        return dataclasses.replace(
            self, **{name: dataclasses.replace(getattr(self, name), **fields) for name, fields in sections.items()}
        )

    def to_dict(self) -> dict:
        """Plain JSON-able dict, in the config file's layout (written as workdir/config.json)."""
        return dataclasses.asdict(self)

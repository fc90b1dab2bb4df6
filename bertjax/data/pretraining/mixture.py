"""Data mixtures and their schedules by step: which source each training row comes from, and the masking rate.

`config.data.mixture` names the sources and their weights (`web=fineweb/*.parquet:0.6,code=code/*:auto`),
`config.data.mixture_schedule` changes the weights from a step on (`0:web=0.6,code=0.4;9000:web=0.3,code=0.7`;
an entry names only what changes, `T=` the temperature), `config.data.mixture_temperature` sets the sources
weighted `auto` ∝ size^(1/T) (sizes: the record sets' token counts), and `config.data.masked_lm_prob` may be
a schedule of rates (`0:0.3;9000:0.15`). No TensorFlow, no JAX: the config, the pipeline and the metrics
share these functions.

Which source a row comes from is decided inside the input pipeline (`mixing.Mixing.draws`, TensorFlow ops): a
function of the seed, the pipeline batch (the step, or the micro-batch with batch warmup) and the row's position
in the global batch, so it is the same for any number of processes and after any restart. `resumed` says what a
resumed run may change: the weights after the step it stopped at, never before.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from typing import Mapping, Optional, Sequence

import numpy as np

log = logging.getLogger(__name__)
AUTO = "auto"
TEMPERATURE = "T"  # the temperature's name in a schedule entry
INTERPOLATIONS = ("step", "linear")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_SUM_TOLERANCE = 1e-3


class MixtureError(ValueError):
    """A mixture, schedule or temperature that cannot be used: one sentence naming the setting and the fix."""


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MixtureError(f"{what} {text!r} is not a number; write e.g. 0.3.") from None
    if not math.isfinite(value):
        raise MixtureError(f"{what} is {text.strip()!r}, not a finite number; write a number such as 0.3.")
    return value


def _step(text: str, what: str) -> int:
    if not text.strip().isdigit():
        raise MixtureError(f"{what}: {text.strip()!r} is not a step (a whole number ≥ 0) before the ':'.")
    return int(text)


# --- Parsing ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    spec: str  # a corpus spec (anything config.data.corpus takes) or a record-set glob
    weight: Optional[float]  # None: `auto` (by size and temperature)


def parse_mixture(text: str, what: str = "config.data.mixture") -> tuple[Source, ...]:
    """`name=spec:weight,...` → sources. The weight is the last `:` field when it is a number or `auto`, so a
    spec may hold colons (`hf:DIR:SPLIT`, `tfds:NAME`); without one the weight is left to the schedule."""
    sources: list[Source] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, eq, rest = item.partition("=")
        name = name.strip()
        if not eq or not rest.strip():
            raise MixtureError(f"{what} entry {item!r} is not NAME=SPEC:WEIGHT; write e.g. web=web/*.parquet:0.6.")
        if not _NAME.match(name) or name == TEMPERATURE:
            raise MixtureError(
                f"{what} source name {name!r} must be a letter then letters, digits or _ (it names metrics such "
                f"as mix_{name}), and not {TEMPERATURE!r} (the temperature's name in a schedule)."
            )
        if any(s.name == name for s in sources):
            raise MixtureError(f"{what} names the source {name!r} twice; give each source one entry.")
        spec, colon, last = rest.rpartition(":")
        weight: Optional[float] = None
        if colon and last.strip() == AUTO:
            weight = None
        elif colon and re.fullmatch(r"\s*([-+0-9.eE]+|[-+]?(nan|inf|infinity))\s*", last, re.IGNORECASE):
            weight = _number(last, f"{what} weight of {name!r}")
            if weight < 0:
                raise MixtureError(f"{what} weight of {name!r} is {weight:g}; weights must be ≥ 0.")
        else:
            spec, weight = rest, float("nan")  # no weight here: the schedule's first entry must give one
        if not spec.strip():
            raise MixtureError(f"{what} source {name!r} has no corpus or record files before its weight.")
        sources.append(Source(name, spec.strip(), weight))
    if not sources:
        raise MixtureError(f"{what} names no source; write e.g. web=web/*.parquet:0.6,wiki=wiki/*.jsonl:0.4.")
    return tuple(sources)


@dataclasses.dataclass(frozen=True)
class Entry:
    step: int
    weights: tuple[tuple[str, Optional[float]], ...]  # the sources it changes (None: auto)
    temperature: Optional[float] = None  # changed from this step on


def parse_schedule(text: str, names: Sequence[str], what: str = "config.data.mixture_schedule") -> tuple[Entry, ...]:
    """`step:name=weight,...;step:...` → entries in step order; `T=` sets the temperature from that step."""
    entries: list[Entry] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        head, colon, body = part.partition(":")
        if not colon:
            raise MixtureError(f"{what} entry {part!r} is not STEP:NAME=WEIGHT,...; write e.g. 9000:web=0.4,code=0.6.")
        step = _step(head, f"{what} entry {part!r}")
        weights, temperature = [], None
        for item in (i.strip() for i in body.split(",")):
            if not item:
                continue
            name, eq, value = (s.strip() for s in item.partition("="))
            if not eq:
                raise MixtureError(f"{what} at step {step}: {item!r} is not NAME=WEIGHT (or {TEMPERATURE}=T).")
            if name == TEMPERATURE:
                temperature = _temperature(
                    _number(value, f"{what} temperature at step {step}"), f"{what} at step {step}"
                )
                continue
            if name not in names:
                raise MixtureError(
                    f"{what} names {name!r} at step {step}, which config.data.mixture does not define (its sources: "
                    f"{', '.join(names)}); add it to the mixture or fix the name."
                )
            weight = None if value == AUTO else _number(value, f"{what} weight of {name!r} at step {step}")
            if weight is not None and weight < 0:
                raise MixtureError(f"{what} gives {name!r} the weight {weight:g} at step {step}; weights must be ≥ 0.")
            weights.append((name, weight))
        if entries and step <= entries[-1].step:
            raise MixtureError(
                f"{what} has step {step} after step {entries[-1].step}; list its entries in increasing step order."
            )
        entries.append(Entry(step, tuple(weights), temperature))
    return tuple(entries)


def _temperature(value: float, what: str) -> float:
    if value <= 0:
        raise MixtureError(f"{what}: the temperature {value:g} must be > 0 (1 = by size, larger = flatter).")
    return value


# --- Resolved weights by step ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """The mixture resolved against the sources' sizes: a weight vector from each entry's step on."""

    names: tuple[str, ...]
    steps: tuple[int, ...]  # entry steps, increasing, the first 0
    weights: tuple[tuple[float, ...], ...]  # per entry, summing to 1
    interpolation: str = "step"  # linear: weights move linearly from one entry to the next
    notes: tuple[str, ...] = ()  # what resolving did that the log should say (normalised weights)

    def weights_at(self, step: int) -> np.ndarray:
        i = int(np.searchsorted(self.steps, step, side="right")) - 1
        here = np.asarray(self.weights[i], np.float64)
        if self.interpolation == "linear" and i + 1 < len(self.steps):
            a, b = self.steps[i], self.steps[i + 1]
            here = here + (np.asarray(self.weights[i + 1]) - here) * (step - a) / (b - a)
        return here

    def used(self) -> np.ndarray:
        """Whether each source has a weight above 0 at some step."""
        return np.asarray(self.weights).max(axis=0) > 0

    def to_json(self) -> dict:
        return {
            "names": list(self.names),
            "steps": list(self.steps),
            "weights": [list(w) for w in self.weights],
            "interpolation": self.interpolation,
        }

    def first_difference(self, saved: Mapping, before: int) -> Optional[int]:
        """The first step below `before` at which this plan's weights differ from a saved plan's (`to_json`), or None.

        Both are piecewise (constant or linear), so comparing them at every entry step of either and just before
        each (a linear ramp's end) covers every step."""
        other = _plan_of(saved)
        if other.names != self.names:
            return 0
        points = sorted({s for s in self.steps + other.steps for s in (s - 1, s) if 0 <= s < before} | {0})
        for step in points:
            if not np.allclose(self.weights_at(step), other.weights_at(step), rtol=0, atol=1e-9):
                return step
        return None

    def describe(self) -> str:
        def one(w):
            return ", ".join(f"{n} {x:.3f}" for n, x in zip(self.names, w))

        return "; ".join(f"from step {s}: {one(w)}" for s, w in zip(self.steps, self.weights))


def resolve(
    sources: Sequence[Source],
    entries: Sequence[Entry],
    sizes: Mapping[str, float],
    temperature: float = 1.0,
    interpolation: str = "step",
    normalize: bool = False,
) -> Plan:
    """Weights per entry: each entry changes the sources it names (and T); `auto` sources share what the fixed
    weights leave ∝ size^(1/T). Weights must sum to 1 (within 0.001) unless `normalize`."""
    if interpolation not in INTERPOLATIONS:
        raise MixtureError(f"config.data.mixture_interpolation={interpolation!r} is not one of {list(INTERPOLATIONS)}.")
    _temperature(temperature, "config.data.mixture_temperature")
    names = [s.name for s in sources]
    current = {s.name: s.weight for s in sources}
    if entries and entries[0].step == 0:
        steps_entries = list(entries)
    else:
        steps_entries = [Entry(0, ())] + list(entries)
    plan_steps, plan_weights, notes = [], [], []
    t = temperature
    for entry in steps_entries:
        current.update(dict(entry.weights))
        t = entry.temperature or t
        where = "config.data.mixture" if entry.step == 0 and not entry.weights else f"the schedule at step {entry.step}"
        missing = [n for n, w in current.items() if w is not None and math.isnan(w)]
        if missing and not entries:
            raise MixtureError(
                f"config.data.mixture gives {', '.join(missing)} no weight; add :WEIGHT (e.g. :0.5) or :{AUTO} after "
                "its files, or give it one in a step-0 entry of config.data.mixture_schedule."
            )
        if missing:
            raise MixtureError(
                f"config.data.mixture gives {', '.join(missing)} no weight, and config.data.mixture_schedule has "
                f"none for it at step {entry.step}; add :WEIGHT (or :{AUTO}) to the source, or give it one in the "
                "schedule's step-0 entry."
            )
        vector, note = _resolve_one(current, sizes, t, normalize, f"{where}")
        if note:
            notes.append(note)
        plan_steps.append(entry.step)
        plan_weights.append(tuple(vector[n] for n in names))
    return Plan(tuple(names), tuple(plan_steps), tuple(plan_weights), interpolation, tuple(notes))


def _resolve_one(
    weights: Mapping[str, Optional[float]], sizes: Mapping[str, float], t: float, normalize: bool, where: str
) -> tuple[dict[str, float], Optional[str]]:
    fixed = {n: w for n, w in weights.items() if w is not None}
    auto = [n for n, w in weights.items() if w is None]
    total = sum(fixed.values())
    note = None
    if auto:
        if total > 1 - _SUM_TOLERANCE and not normalize:
            raise MixtureError(
                f"the weights of {where} sum to {total:.4g} without the {AUTO} source(s) {', '.join(auto)}, leaving "
                f"them nothing; lower the fixed weights below 1 or give {', '.join(auto)} a number."
            )
        mass = 1.0 - total if total < 1 else 0.0
        scaled = {n: max(float(sizes.get(n, 0)), 0.0) ** (1.0 / t) for n in auto}
        if sum(scaled.values()) <= 0:
            raise MixtureError(f"the {AUTO} source(s) {', '.join(auto)} of {where} hold no tokens to weigh by.")
        out = dict(fixed, **{n: mass * v / sum(scaled.values()) for n, v in scaled.items()})
    else:
        out = dict(fixed)
    s = sum(out.values())
    if s <= 0:
        raise MixtureError(f"every weight of {where} is 0; give at least one source a weight above 0.")
    if abs(s - 1) > _SUM_TOLERANCE:
        if not normalize:
            raise MixtureError(
                f"the weights of {where} sum to {s:.4g}, not 1; make them sum to 1, or set "
                "config.data.mixture_normalize=true to divide them by their sum."
            )
        note = f"the weights of {where} sum to {s:.4g}; divided by it (config.data.mixture_normalize)"
    return {n: w / s for n, w in out.items()}, note


# --- A value scheduled by step (the masking rate) ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RateSchedule:
    """`0:0.3;9000:0.15`: piecewise constant from each step on; a plain number is a constant."""

    steps: tuple[int, ...]
    values: tuple[float, ...]

    @classmethod
    def parse(cls, value: float | str, what: str = "config.data.masked_lm_prob") -> "RateSchedule":
        if not isinstance(value, str):
            return cls((0,), (float(value),))
        text = value.strip()
        if ":" not in text:
            return cls((0,), (_number(text, what),))
        steps, values = [], []
        for part in (p.strip() for p in text.split(";") if p.strip()):
            head, _, body = part.partition(":")
            step = _step(head, f"{what} entry {part!r}")
            if steps and step <= steps[-1]:
                raise MixtureError(f"{what} has step {step} after step {steps[-1]}; list it in increasing step order.")
            steps.append(step)
            values.append(_number(body, f"{what} at step {step}"))
        if steps[0] != 0:
            raise MixtureError(f"{what} starts at step {steps[0]}; its first entry must be at step 0 (e.g. 0:0.3;…).")
        return cls(tuple(steps), tuple(values))

    @property
    def constant(self) -> bool:
        return len(self.values) == 1

    def at(self, step: int) -> float:
        return self.values[int(np.searchsorted(self.steps, step, side="right")) - 1]

    def first_difference(self, other: "RateSchedule", before: int) -> Optional[int]:
        for step in sorted({s for s in self.steps + other.steps if s < before} | {0}):
            if self.at(step) != other.at(step):
                return step
        return None


# --- Resuming: the future may change, the past may not -------------------------------------------------------

# Steps ahead of a stop whose batches the input pipeline may already have drawn, masked and buffered (its draws are
# made 16 batches at a time, ≤ 8 batches are parsed at once, 2 prefetched): a schedule changed on resume applies
# from this many steps after the stop, so that the batches saved with the position stay exactly as they were.
HORIZON = 32


def _plan_of(saved: Mapping) -> Plan:
    return Plan(
        tuple(saved["names"]),
        tuple(saved["steps"]),
        tuple(map(tuple, saved["weights"])),
        saved.get("interpolation", "step"),
    )


def _joined_plan(old: Plan, new: Plan, at: int) -> Plan:
    """old's weights before step `at`, new's from it (an entry at at−1 keeps a linear ramp of old's exact)."""
    before = [(s, tuple(old.weights_at(s))) for s in old.steps if s < at - 1] + [
        (at - 1, tuple(old.weights_at(at - 1)))
    ]
    after = [(at, tuple(new.weights_at(at)))] + [(s, tuple(new.weights_at(s))) for s in new.steps if s > at]
    entries = [e for e in before if e[0] >= 0] + after
    return Plan(new.names, tuple(s for s, _ in entries), tuple(w for _, w in entries), new.interpolation)


def resumed(
    saved: Mapping, plan: Optional[Plan], rates: Optional[RateSchedule], step: int
) -> tuple[Optional[Plan], Optional[RateSchedule]]:
    """The plan and masking rates a pipeline restored at `step` (steps before it trained) runs with: the saved
    ones up to HORIZON steps after the stop, this run's from there (logged when they differ). A schedule that
    differs from the saved one before `step` rewrites what was trained: a MixtureError naming the step."""
    switch = step + HORIZON
    if plan is not None and saved.get("mixture") is not None:
        then = _plan_of(saved["mixture"])
        at = plan.first_difference(saved["mixture"], step)
        if at is not None:
            raise MixtureError(
                f"config.data.mixture_schedule gives other weights at step {at} than the run that saved this position, "
                f"which has trained up to step {step}; change only entries from step {step} on (a branch_from run "
                "may carry its own schedule from its branch step on), or start a new workdir"
            )
        if plan.first_difference(saved["mixture"], 2**62) is not None:
            plan = _joined_plan(then, plan, switch)
            log.info(
                "mixture: the schedule after step %d differs from the saved one; the batches up to step %d were drawn "
                "before the stop, so it applies from step %d: %s",
                step,
                switch - 1,
                switch,
                plan.describe(),
            )
    if rates is not None and saved.get("masking") is not None:
        then = RateSchedule(tuple(saved["masking"]["steps"]), tuple(saved["masking"]["values"]))
        at = rates.first_difference(then, step)
        if at is not None:
            raise MixtureError(
                f"config.data.masked_lm_prob masks {rates.at(at):g} at step {at} where the run that saved this "
                f"position masked {then.at(at):g}, and it has trained up to step {step}; change only entries "
                f"from step {step} on, or start a new workdir"
            )
        if rates.first_difference(then, 2**62) is not None:
            kept = [(s, v) for s, v in zip(then.steps, then.values) if s < switch]
            new = [(switch, rates.at(switch))] + [(s, v) for s, v in zip(rates.steps, rates.values) if s > switch]
            rates = RateSchedule(tuple(s for s, _ in kept + new), tuple(v for _, v in kept + new))
            log.info("masking: the rate schedule after step %d changed; from step %d: %s", step, switch, rates)
    return plan, rates


# --- The whole setting ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mixture:
    """config.data's mixture settings, parsed; `resolve(sizes)` once the sources' sizes are known."""

    sources: tuple[Source, ...]
    entries: tuple[Entry, ...] = ()
    temperature: float = 1.0
    interpolation: str = "step"
    normalize: bool = False

    @classmethod
    def parse(
        cls,
        text: str,
        schedule: str = "",
        temperature: float = 1.0,
        interpolation: str = "step",
        normalize: bool = False,
    ) -> "Mixture":
        sources = parse_mixture(text)
        entries = parse_schedule(schedule, [s.name for s in sources]) if schedule.strip() else ()
        out = cls(sources, entries, temperature, interpolation, normalize)
        out.resolve({s.name: 1.0 for s in sources})  # every sentence about the weights before any data work
        return out

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def resolve(self, sizes: Mapping[str, float]) -> Plan:
        return resolve(self.sources, self.entries, sizes, self.temperature, self.interpolation, self.normalize)

"""Tuning database: the best measured tile config per kernel structure, shape, dtype, device and TileLang version.

Autotuning on the GPU is costly, so what it finds persists in a committed per-device JSON
file (``benchmarks/tuning/<device>.json``). A key names everything that decides which config
is fastest, and nothing else:

- the plan's *structure*: a hash of its kernel IR (ops, buffers, grid and loop axes) with the
  tile values removed (tuning spaces, defaults), so re-planning the same graph finds it again;
- the axis sizes, the dtype, the device, the TileLang version and the renderer generation
  (``target.layout.GENERATION``: the same plan renders to different code across generations).

An entry also records the loop form of each kernel it was measured under, with that form's
version (``plan.schedule.plan_forms``); a lookup ignores an entry whose forms differ from the
plan's now, so a kernel that starts rendering as an asynchronous loop, or a form whose code
changed, is planned by the model and re-tuned instead of trusted at a time its old code measured.
Entries without the record (older files) are taken as they are.

The runner uses a tuned config by default; the planner's estimate prefers a measured time;
``benchmarks/gpu_run.py`` writes new results into a copy of the file under ``$OUT``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyrunner.errors import UserError
from pyrunner.log.results import UNNAMED_BACKEND
from pyrunner.plan.schedule import plan_forms
from pyrunner.plan.schema import Plan, axis_sizes, canonical_json
from pyrunner.target.device import DEFAULT_DEVICE, Device, device_key_of, device_named
from pyrunner.target.layout import staged_loop_loads

ROOT = Path(__file__).resolve().parents[2]
TUNING_DIR = ROOT / "benchmarks" / "tuning"
FORMAT = 1

Config = dict[str, dict[str, int]]


def measured_forms(plan: Plan) -> str:
    """The loop forms a time of ``plan`` is measured under (``plan.schedule.plan_forms``), with the
    kernels whose synchronous loop loads are staged in registers marked."""
    tensors = {t.name: t for t in plan.tensors}
    staged = frozenset(k.name for k in plan.kernels if staged_loop_loads(k, tensors))
    return plan_forms(plan.kernels, staged)


def device_key(name: str) -> str:
    """Key and file-name form of a device name: the known device it names (``target.device.device_key_of``:
    'NVIDIA A100-SXM4-80GB', 'NVIDIA A100 80GB PCIe' and 'A100' -> 'a100'), so a time measured on a GPU is found
    again by the planner of its device; any other GPU's name made a file name ('NVIDIA B200' -> 'b200',
    'NVIDIA H100 PCIe' -> 'h100_pcie'): its times are kept apart, under a key no plan is made for."""
    known = device_key_of(name)
    if known is not None:
        return known
    s = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.I).lower()
    return re.sub(r"[^a-z0-9]+", "_", s).strip("_") or "unknown"


def tilelang_version() -> str:
    """The installed TileLang's version without importing it (the planner must stay light)."""
    try:
        from importlib.metadata import version

        return version("tilelang")
    except Exception:  # noqa: BLE001 - not installed as a distribution: ask the module
        try:
            import tilelang

            return str(getattr(tilelang, "__version__", "unknown"))
        except Exception:  # noqa: BLE001
            return "unknown"


def structure_hash(plan: Plan) -> str:
    """Hash of the plan's kernel IR without tile values: same code shape <=> same hash."""
    kernels = [k.model_dump(mode="json", exclude={"params", "defaults", "fused_rules"}) for k in plan.kernels]
    tensors = [{"name": t.name, "axes": t.axes, "role": t.role} for t in plan.tensors]
    text = canonical_json({"kernels": kernels, "tensors": tensors})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


HOPPER_BACKEND = UNNAMED_BACKEND
"""The backend every entry without a backend field in its key was measured with (keys name another
backend as a seventh field, so two backends timed on one GPU keep their entries apart)."""


def tuning_key(plan: Plan, device: str, tl_version: str | None = None, backend: str = HOPPER_BACKEND) -> str:
    """The entry key: structure, sizes, dtype, device, TileLang version, renderer generation and, for any
    backend other than TileLang's Hopper one (whose committed entries predate the field), the backend."""
    sizes = ",".join(f"{a}={n}" for a, n in sorted(axis_sizes(plan).items()))
    from pyrunner.target.layout import GENERATION

    version = tl_version or tilelang_version()
    key = (f"{structure_hash(plan)}|{sizes}|{plan.dtype}|{device_key(device)}|tilelang-{version}"
           f"|renderer-{GENERATION}")
    return key if backend == HOPPER_BACKEND else f"{key}|{backend}"


@dataclass
class Entry:
    """The best config measured for one key, with what it measured and how it was found."""

    workload: str
    config: Config
    time_us: float
    tried: int = 1
    default_us: float | None = None
    plan_hash: str = ""
    extra: dict = field(default_factory=dict)


def widened(plan: Plan, config: Config) -> Plan:
    """The plan with each kernel's parameter lists holding ``config``'s integer values too.

    A config tuned outside the space the planner emits (the planner's space drops values whose
    combinations do not all fit; ``benchmarks/probes/config_probe.py`` widens a plan this way to
    time such configs) stays reachable; values of unknown parameters or of the wrong type are left for
    ``_valid`` to refuse."""
    kernels = []
    for k in plan.kernels:
        tuned = config.get(k.name) if isinstance(config.get(k.name), dict) else {}
        params = {p: sorted({*vals, tuned[p]}) if type(tuned.get(p)) is int else list(vals)
                  for p, vals in k.params.items()}
        kernels.append(k.model_copy(update={"params": params}))
    return plan.model_copy(update={"kernels": kernels})


def _fits_device(plan: Plan, config: Config, device: Device) -> bool:
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.target.fit import fits

    values = resolve_config(plan, config)
    sizes = axis_sizes(plan)
    return all(fits(k, values[k.name], sizes, device) is None for k in plan.kernels)


def _reachable_widened(plan: Plan, config: Config, device: Device) -> Plan | None:
    """For a ``config`` outside the plan's space: the plan widened by it where the config passes the value
    rules and fits ``device``, the one the plan is made for; None otherwise."""
    wide = widened(plan, config)
    return wide if _valid(wide, config) and _fits_device(wide, config, device) else None


def _valid(plan: Plan, config: Config) -> bool:
    from pyrunner.plan.analysis import resolve_config
    from pyrunner.plan.validate import check_values

    try:
        check_values(plan, resolve_config(plan, config))
    except UserError:
        return False
    return set(config) == {k.name for k in plan.kernels}


def stale(new: Entry, old: Entry) -> bool:
    """Whether ``old`` was measured under other code than ``new`` (the kernels' loop forms differ; an
    entry without them is taken as current)."""
    forms = new.extra.get("forms")
    return forms is not None and old.extra.get("forms", forms) != forms


def supersedes(new: Entry, old: Entry | None) -> bool:
    """Whether ``new`` replaces ``old`` under one key: nothing stored, stored under other code, slower,
    or the same config measured again (the newer time stands)."""
    return old is None or stale(new, old) or new.time_us < old.time_us or new.config == old.config


def tuning_path(device: str = DEFAULT_DEVICE, directory: Path | None = None) -> Path:
    """The tuning file of ``device`` (``<device key>.json``) in ``directory``, else in the folder
    ``SUPEROPT_TUNING_DIR`` names, else in the committed ``benchmarks/tuning``."""
    d = Path(directory or os.environ.get("SUPEROPT_TUNING_DIR") or TUNING_DIR)
    return d / f"{device_key(device)}.json"


class TuningDB:
    """One device's tuning file in memory: lookup, record (keep the faster), save (deterministic JSON)."""

    def __init__(self, path: Path, entries: dict[str, Entry] | None = None) -> None:
        self.path = Path(path)
        self.entries: dict[str, Entry] = entries or {}

    @classmethod
    def load(cls, path: Path | str) -> TuningDB:
        path = Path(path)
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text())
            entries = {k: Entry(**v) for k, v in data.get("entries", {}).items()}
        except (ValueError, TypeError) as e:
            raise UserError(f"tuning database {path} is not valid: {e}") from None
        return cls(path, entries)

    @classmethod
    def for_device(cls, device: str = DEFAULT_DEVICE, directory: Path | None = None) -> TuningDB:
        return cls.load(tuning_path(device, directory))

    def lookup(self, plan: Plan, device: str = DEFAULT_DEVICE, tl_version: str | None = None,
               backend: str = HOPPER_BACKEND, fit: Device | None = None) -> Entry | None:
        """The tuned entry for this plan's structure and shapes on ``device`` with ``backend``, if any and
        still valid: its config in the plan's space, or outside it and fitting ``fit``, the device the plan is
        made for (default: the known device ``device`` names; UserError for an unknown one)."""
        e = self.entries.get(tuning_key(plan, device, tl_version, backend))
        if e is None:
            return None
        if not _valid(plan, e.config) and _reachable_widened(plan, e.config, fit or device_named(device)) is None:
            return None
        if "forms" in e.extra and e.extra["forms"] != measured_forms(plan):
            return None  # measured under other code: stale
        return e

    def record(self, plan: Plan, config: Config, time_us: float, device: str, *, tried: int = 1,
               default_us: float | None = None, tl_version: str | None = None, extra: dict | None = None,
               backend: str = HOPPER_BACKEND) -> bool:
        """Keep (config, time) for this plan if it beats what is stored; True when the entry changed."""
        if not _valid(plan, config):
            raise UserError(f"tuning record for {plan.workload}: config {config} is not in the plan's space")
        key = tuning_key(plan, device, tl_version, backend)
        old = self.entries.get(key)
        new = Entry(workload=plan.workload, config=config, time_us=round(float(time_us), 3), tried=tried,
                    default_us=default_us, plan_hash=plan.provenance.plan_hash or "",
                    extra={**(extra or {}), "forms": measured_forms(plan)})
        if old is not None and not supersedes(new, old):
            old.tried += tried
            return False
        if old is not None and not stale(new, old):  # what was tried under the same code adds up
            new.tried += old.tried
        self.entries[key] = new
        return True

    def to_json(self) -> str:
        data = {"format": FORMAT, "entries": {k: asdict(self.entries[k]) for k in sorted(self.entries)}}
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    def save(self, path: Path | None = None) -> Path:
        out = Path(path or self.path)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, out)
        return out


def committed_tuning(device: str = DEFAULT_DEVICE) -> TuningDB:
    """The committed tuning database of ``device`` (``benchmarks/tuning/<device>.json``, or the folder
    ``SUPEROPT_TUNING_DIR`` names): what the ``superopt`` command and the GPU benchmarks plan with.

    The planner's library calls take a database only when given one (``planner.search``'s ``tuning``),
    so a test's plan does not change when GPU timings are merged into the committed file."""
    return TuningDB.for_device(device)


def apply_tuned(plan: Plan, entry: Entry, device: Device) -> Plan:
    """The plan with its kernels' defaults set to the tuned config (the runner's default).

    A kernel whose space lacked a tuned value gets it added, and its space is pruned again
    around the tuned config so that every config it offers still fits ``device``, the one the plan is
    made for (an A100 plan against the A100's shared memory, never the default target's)."""
    from pyrunner.target.fit import FitModel, fitting_space

    wide = plan if _valid(plan, entry.config) else widened(plan, entry.config)
    if wide is not plan and not _valid(wide, entry.config):
        raise UserError(f"tuned config {entry.config} is not reachable from plan {plan.workload!r}")
    sizes = axis_sizes(plan)
    kernels = []
    for old, k in zip(plan.kernels, wide.kernels, strict=True):
        tuned = {**k.defaults, **entry.config[k.name]}
        params = k.params
        if params != old.params:  # widened: this kernel's fit check, once, also prunes its space
            model = FitModel(k, sizes, device)
            if model.why_not(tuned) is not None:
                raise UserError(f"tuned config {entry.config[k.name]} of kernel {k.name!r} does not fit the "
                                f"{device.name}")
            params = fitting_space(params, tuned, lambda cfg, model=model: model.why_not(cfg) is None)
        kernels.append(k.model_copy(update={"defaults": tuned, "params": params}))
    return plan.model_copy(update={"kernels": kernels})

"""Plans and derivations kept on disk between processes, opt-in (``use``): planning a GPU call need not repeat.

Planning a training case takes 50-80 s a variant on the GPU host (run 173: most of its 8.7 minutes went to
planning, compiling and checking six variants). A plan is a function of the graph, the dtype, the device
planned for and whether the TileLang lowering gate ran, given the package source, the committed tuning
database of that device and the planner switches. Entries are filed under a fingerprint of those three, so a
change to any opens a fresh folder and nothing goes stale, and keyed by the first four; plans made on a CPU
machine (``benchmarks/grad_bench.py --plan-only``) are found by the GPU host running the same tree.

Entries are untrusted files like any plan: an entry holds its own key, which must equal the one asked for;
a plan read back passes ``plan.validate`` (its hash recomputed) and a derivation is replayed from its record
(``plan.backward_of.replay``). An entry that fails is reported once and planned again, never used. Writes are
whole files (``files.write_text_atomic``), so a killed process leaves no half entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import cache
from pathlib import Path

from pyrunner.errors import GraphError, PlanError, UserError
from pyrunner.ir.grad import Backward
from pyrunner.plan.schema import BackwardOf, Plan, canonical_json, plan_document

log = logging.getLogger(__name__)
ROOT: Path | None = None
"""The store's folder; None (the default): no store, every process plans afresh."""
PACKAGE = Path(__file__).resolve().parents[1]


def use(root: str | os.PathLike | None) -> None:
    """Keep plans under ``root`` (a path or a string) from now on in this process (None: stop)."""
    global ROOT
    ROOT = None if root is None else Path(root)


@cache
def _source_digest() -> str:
    """The package's Python source, every file by its path inside the package: what planning runs."""
    h = hashlib.sha256()
    for p in sorted(PACKAGE.rglob("*.py")):
        h.update(p.relative_to(PACKAGE).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def fingerprint(device: str) -> str:
    """The folder of entries valid now for ``device``: source, that device's tuning database, the switches."""
    from pyrunner.switches import state
    from pyrunner.target.tuning import tuning_path

    db = tuning_path(device)
    tuning = _file_digest(db, *_stamp(db)) if db.is_file() else "none"
    return hashlib.sha256(f"{_source_digest()}|{device}|{tuning}|{state()}".encode()).hexdigest()[:20]


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


@cache
def _file_digest(path: Path, mtime_ns: int, size: int) -> str:
    """A file's content hash, read once per version of it (each lookup and store asks for the fingerprint)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _entry(kind: str, key: dict) -> Path | None:
    if ROOT is None:
        return None
    name = hashlib.sha256(canonical_json(key).encode()).hexdigest()[:32]
    return ROOT / fingerprint(key["device"]) / kind / f"{name}.json"


def _read(path: Path, key: dict) -> object | None:
    """The value of the entry at ``path`` if it is one for ``key``; None (logged) for anything else."""
    from pyrunner.ir.graph_json import read_json_file

    if not path.is_file():
        return None
    try:
        data = read_json_file(path, "plan store entry", UserError)
    except UserError as e:
        log.warning("plan store: %s; planning again", e)
        return None
    if not isinstance(data, dict) or data.get("key") != json.loads(json.dumps(key)) or "value" not in data:
        log.warning("plan store: %s is not the entry for this graph; planning again", path)
        return None
    return data["value"]


def _write(path: Path, key: dict, value: object) -> None:
    from pyrunner.files import write_text_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"key": key, "value": value}), "plan store entry")
    except (OSError, UserError) as e:  # a store that cannot be written costs a re-plan, nothing else
        log.warning("plan store: cannot write %s: %s", path, e)


def plan_key(graph_json: dict, dtype: str, device: str, lower_check: bool) -> dict:
    return {"graph": graph_json, "dtype": dtype, "device": device, "lower_check": lower_check}


def load_plan(key: dict) -> Plan | None:
    """The stored plan for ``key`` (``plan_key``), validated as a plan file is; None when there is none."""
    from pyrunner.plan.validate import validate_plan

    path = _entry("plans", key)
    value = None if path is None else _read(path, key)
    if value is None:
        return None
    try:
        return validate_plan(value)
    except PlanError as e:
        log.warning("plan store: %s holds no valid plan (%s); planning again", path, e)
        return None


def save_plan(key: dict, plan: Plan) -> None:
    path = _entry("plans", key)
    if path is not None:
        _write(path, key, plan_document(plan))


def load_derivation(key: dict) -> Backward | None:
    """The stored derivation for ``key`` (the forward graph, dtype and device its saves were chosen for),
    replayed; None when there is none or it is not a derivation of that graph."""
    from pyrunner.ir.graph_json import graph_to_json
    from pyrunner.plan.backward_of import replay

    path = _entry("derivations", key)
    value = None if path is None else _read(path, key)
    if value is None:
        return None
    try:
        bwd = replay(BackwardOf.model_validate(value, strict=True))
    except (PlanError, GraphError, ValueError) as e:
        log.warning("plan store: %s holds no valid derivation (%s); deriving again", path, e)
        return None
    if bwd.source is None or graph_to_json(bwd.source) != key["graph"]:
        log.warning("plan store: %s derives another graph; deriving again", path)
        return None
    return bwd


def save_derivation(key: dict, bwd: Backward) -> None:
    from pyrunner.plan.backward_of import record

    path = _entry("derivations", key)
    if path is None:
        return
    try:
        value = record(bwd).model_dump()
    except GraphError as e:  # a derivation its record cannot name is used, not stored
        log.warning("plan store: derivation of %r not stored: %s", bwd.graph.name, e)
        return
    _write(path, key, value)

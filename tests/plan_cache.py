"""One plan cache for the tests: ``search`` with the planner's own signature, answered from disk when the
same graph was already planned with the same options by the same planner source.

Why: many test files plan the same catalog and corpus graphs with the same options, and the search is
deterministic (same graph, dtype and options give the same plan bytes; tests/test_search_determinism.py
checks that by planning for real). Planning them once per test run, not once per file, is most of the
fast tier's time. Tests of the search itself (determinism, budgets, explain, tuning) keep calling
``pyrunner.planner.search``.

The key is everything the search reads: the graph's canonical JSON, the dtype, ``top``, ``naive``, the
device, the Python and pydantic versions, and a hash of every file of the ``pyrunner`` package (a planner
change invalidates every entry). Calls with a calibration file, a work budget (a mutable object the caller
reads back) or a tuning database go to the planner uncached. Entries are JSON files written atomically
(safe under pytest-xdist's workers); a loaded plan is checked against its stored hash. A test that uses
``monkeypatch`` (it may patch what the planner reads) plans for real. The warnings the planner logged while
planning (``pyrunner`` loggers: a "planner bug" that skipped a plan) are stored with the entry and logged
again on every hit, so a test that fails on them (tests/test_certificate.py) sees them from the cache too.

``SUPEROPT_TEST_PLAN_CACHE``: ``off`` plans every call for real; ``check`` plans for real and fails on any
difference from the cached plan (a way to test the cache itself).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from functools import cache
from pathlib import Path

import pydantic

import pyrunner
from pyrunner.ir.graph import Graph
from pyrunner.ir.graph_json import graph_to_json
from pyrunner.plan.schema import Plan, canonical_json, plan_hash

ENV = "SUPEROPT_TEST_PLAN_CACHE"
_DIR: list[Path] = []
_ON = [True]


def enable(on: bool) -> None:
    """Off for a test that patches the planner's surroundings (tests/conftest.py: any test using
    ``monkeypatch``), so a patched search is never answered from, or stored into, the cache."""
    _ON[0] = on


def configure(root: Path | None) -> None:
    """Where entries live (tests/conftest.py: pytest's cache folder); None keeps them in this process."""
    _DIR[:] = [] if root is None else [root / source_hash()]


def prune(root: Path) -> None:
    """Remove the entries of other planner sources (run once per session, by the controlling process)."""
    keep = source_hash()
    for d in root.iterdir() if root.is_dir() else []:
        if d.is_dir() and d.name != keep:
            for f in d.iterdir():
                f.unlink(missing_ok=True)
            d.rmdir()


@cache
def source_hash() -> str:
    """Hash of the pyrunner package's files (names and bytes) and the interpreter that runs it."""
    root = Path(pyrunner.__file__).resolve().parent
    h = hashlib.sha256(f"{platform.python_version()} pydantic {pydantic.VERSION}\n".encode())
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:20]


_MEMORY: dict[str, str] = {}
FORMAT = 2
"""Entry format (part of the key): 2 stores the planner's warnings beside the plans."""


class _Warnings(logging.Handler):
    """Collects the WARNING-and-above records of the ``pyrunner`` loggers during one real search."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.got: list[list] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.got.append([record.name, record.levelno, record.getMessage()])


def search(graph: Graph, dtype: str = "fp16", *, top: int = 1, naive: bool = False, calibration=None,
           budget=None, tuning=None, device=None) -> list[Plan]:
    """``pyrunner.planner.search``, from the cache where the call is cacheable (see the module's text)."""
    from pyrunner.planner import search as real

    def plan() -> list[Plan]:
        return real(graph, dtype, top=top, naive=naive, calibration=calibration, budget=budget, tuning=tuning,
                    device=device)

    def plan_logged() -> tuple[list[Plan], list[list]]:
        handler, logger = _Warnings(), logging.getLogger("pyrunner")
        logger.addHandler(handler)
        try:
            return plan(), handler.got
        finally:
            logger.removeHandler(handler)

    mode = os.environ.get(ENV, "on")
    if mode == "off" or not _ON[0] or calibration is not None or budget is not None or tuning not in (None, False):
        return plan()
    key = _key(graph, dtype, top, naive, device)
    cached = _load(key)
    if cached is not None and mode != "check":
        plans, warnings = cached
        for name, level, message in warnings:
            logging.getLogger(name).log(level, "%s", message)
        return plans
    plans, warnings = plan_logged()
    if cached is not None:
        assert [p.model_dump(mode="json") for p in cached[0]] == [p.model_dump(mode="json") for p in plans], \
            f"{ENV}=check: the cached plans of {graph.name!r} differ from the planner's"
        assert cached[1] == warnings, f"{ENV}=check: the cached warnings of {graph.name!r} differ from the planner's"
    _store(key, plans, warnings)
    return plans


def _key(graph: Graph, dtype: str, top: int, naive: bool, device) -> str:
    text = canonical_json({"graph": graph_to_json(graph), "float32_io": sorted(graph.float32_io),  # not in the JSON
                           "dtype": dtype, "top": top, "naive": naive,
                           "device": repr(device), "source": source_hash(), "format": FORMAT})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _load(key: str) -> tuple[list[Plan], list[list]] | None:
    text = _MEMORY.get(key)
    if text is None and _DIR:
        try:
            text = (_DIR[0] / f"{key}.json").read_text()
        except (FileNotFoundError, OSError):
            return None
    if text is None:
        return None
    entry = json.loads(text)
    plans = [Plan.model_validate(d) for d in entry["plans"]]
    if any(p.provenance.plan_hash != plan_hash(p) for p in plans):
        return None  # a damaged entry: plan again
    _MEMORY[key] = text
    return plans, entry["warnings"]


def _store(key: str, plans: list[Plan], warnings: list[list]) -> None:
    text = json.dumps({"plans": [p.model_dump(mode="json") for p in plans], "warnings": warnings})
    if [Plan.model_validate(d) for d in json.loads(text)["plans"]] != plans:
        return  # does not survive the round trip: never cached
    _MEMORY[key] = text
    if not _DIR:
        return
    _DIR[0].mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=_DIR[0], prefix=f".{key}-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, _DIR[0] / f"{key}.json")

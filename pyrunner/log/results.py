"""Results log: JSON Lines, one validated record per run.

Both planners read this log to re-rank candidates and calibrate their cost
models, so it must survive a run killed at any moment: each record is one
``os.write`` of a whole line on an ``O_APPEND`` descriptor, then fsync; a
reader skips a trailing line without its newline (the only thing a kill can
leave behind).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pyrunner.errors import UserError
from pyrunner.files import open_append, read_bounded

RECORD_VERSION = 1
TOOL_VERSION = "0.1.0"
Status = Literal["ok", "failed-verification", "failed-compile", "failed-launch", "skipped"]
PRIMARY_BASELINE = "torch_compile"
"""The baseline the headline speedup (and the report's geomean) is taken against."""
UNNAMED_BACKEND = "tilelang-hopper"
"""The backend of a record whose ``extra`` names none: every record made before a second backend existed is
TileLang's Hopper backend's (``target.tuning.HOPPER_BACKEND`` keys tuning entries the same way)."""
_BACKEND_WORD = re.compile(r"[a-z][a-z0-9]*-[a-z0-9]+")


def record_backend(extra: Mapping) -> str:
    """The backend a record's ``extra`` names, in any form its writers use: ``tilelang-ampere`` (the runner),
    ``tilelang-ampere (sm_80)`` (the GPU sweep), ``a100 (tilelang-ampere, sm_80)`` (``backend.describe``, as
    gpu_run's own records say it): the first hyphenated word, else the first word; ``UNNAMED_BACKEND`` for a
    record that names none. One reading, so a Hopper record with the field and one without are one case."""
    text = str(extra.get("backend") or "").strip().lower()
    found = _BACKEND_WORD.search(text)
    return found.group(0) if found else (text.split() or [UNNAMED_BACKEND])[0]


class LogError(UserError):
    """A results log that cannot be read (bad record in the middle of the file)."""


class RunRecord(BaseModel):
    """One run of one plan. Times are microseconds (medians); None = not measured.

    ``predicted_us``/``bound`` are the plan's cost-model estimate and its dominant
    kernel's bound, which the planner's calibration compares with ``plan_us``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # make_record turns them into null

    record_version: Literal[1] = RECORD_VERSION
    timestamp: str = Field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat())
    tool_version: str = TOOL_VERSION
    plan_hash: str
    workload: str
    graph_hash: str
    shapes: dict[str, int]
    dtype: str
    device: str
    status: Status
    message: str = ""
    seed: int | None = None
    config: dict[str, dict[str, int]] = {}
    kernel_times_us: dict[str, float] = {}
    plan_us: float | None = None
    predicted_us: float | None = None
    bound: str | None = None
    baselines_us: dict[str, float | None] = {}
    speedups: dict[str, float] = {}
    best_baseline: str | None = None
    speedup_vs_best: float | None = None
    error: float | None = None
    error_bound: float | None = None
    extra: dict = {}

    @model_validator(mode="after")
    def _no_negative_measures(self) -> "RunRecord":
        """Times, errors and extents are never negative (a log line saying so is not a valid record)."""
        singles = {"plan_us": self.plan_us, "predicted_us": self.predicted_us, "error": self.error,
                   "error_bound": self.error_bound}
        singles |= {f"kernel_times_us[{k!r}]": v for k, v in self.kernel_times_us.items()}
        singles |= {f"baselines_us[{k!r}]": v for k, v in self.baselines_us.items()}
        for name, v in singles.items():
            if v is not None and v < 0:
                raise ValueError(f"{name} is negative ({v})")
        for a, n in self.shapes.items():
            if n < 0:
                raise ValueError(f"shapes[{a!r}] is negative ({n})")
        return self


def speedups(plan_us: float | None, baselines_us: dict[str, float | None]) -> tuple[
        dict[str, float], str | None, float | None]:
    """Speedup of the plan over each measured baseline, and over the fastest one."""
    measured = {k: v for k, v in baselines_us.items() if v is not None and v > 0 and math.isfinite(v)}
    if plan_us is None or plan_us <= 0 or not measured:
        return {}, (min(measured, key=measured.get) if measured else None), None
    per = {k: v / plan_us for k, v in measured.items()}
    best = min(measured, key=measured.get)
    return per, best, measured[best] / plan_us


def finite_json(x: object) -> object:
    """``x`` with every NaN/inf float replaced by its name as a string ("nan", "inf", "-inf"):
    strict JSON can carry it, and a failing run's record is never lost to a serialisation error."""
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x


_FLOAT_FIELDS = ("error", "error_bound", "plan_us", "predicted_us")


def make_record(**fields) -> RunRecord:
    """A record with speedups derived from ``plan_us`` and ``baselines_us``.

    A non-finite number in a typed field (an infinite error from a NaN output, say) is stored
    as null with its name in ``extra.nonfinite``, so the record keeps its true status.
    """
    extra = dict(fields.get("extra") or {})
    nonfinite = {}
    for f in _FLOAT_FIELDS:
        v = fields.get(f)
        if isinstance(v, float) and not math.isfinite(v):
            nonfinite[f] = repr(v)
            fields[f] = None
    for f in ("kernel_times_us", "baselines_us"):  # a bad time: dropped (kernels) or null (baselines)
        d = dict(fields.get(f) or {})
        for k, v in list(d.items()):
            if isinstance(v, float) and not math.isfinite(v):
                nonfinite[f"{f}.{k}"] = repr(v)
                if f == "baselines_us":
                    d[k] = None
                else:
                    del d[k]
        if f in fields:
            fields[f] = d
    if nonfinite:
        extra["nonfinite"] = nonfinite
    fields["extra"] = finite_json(extra)
    rec = RunRecord(**fields)
    per, best, vs_best = speedups(rec.plan_us, rec.baselines_us)
    return rec.model_copy(update={"speedups": per, "best_baseline": best, "speedup_vs_best": vs_best})


def _needs_newline(fd: int) -> bool:
    """True when the file ends in a partial line a killed writer left behind."""
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def append_record(path: str | os.PathLike, record: RunRecord) -> None:
    """Append one record atomically (one write of the whole line), then fsync."""
    p = Path(path)
    data = finite_json(record.model_dump(mode="json"))
    line = (json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n").encode()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LogError(f"cannot write results log {str(p)!r}: {e.strerror or e}") from None
    fd = open_append(p, "results log", LogError)
    try:
        if _needs_newline(fd):
            line = b"\n" + line  # end the torn line so it stays one bad line, not two
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"short write to {p}: {written} of {len(line)} bytes")
        os.fsync(fd)
    except OSError as e:
        raise LogError(f"cannot write results log {str(p)!r}: {e.strerror or e}") from None
    finally:
        os.close(fd)


MAX_LOG_BYTES = 256 * 1024 * 1024
"""Largest results log read (about a million records)."""


def read_log_counted(path: str | os.PathLike, strict: bool = False) -> tuple[list[RunRecord], int]:
    """All complete records of a log, oldest first, and how many lines were skipped as invalid.

    A trailing line without a newline (a torn append) is skipped silently (a kill leaves it). Any
    other line that does not validate is counted, or raises LogError when ``strict``. A missing log
    reads as empty; a log that is a folder, a device or too big is a LogError.
    """
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return [], 0
    data = read_bounded(p, "results log", LogError, MAX_LOG_BYTES)
    lines = data.split(b"\n")
    complete = lines[:-1]  # the last element is b"" or a torn line
    out: list[RunRecord] = []
    skipped = 0
    for no, raw in enumerate(complete, 1):
        if not raw.strip():
            continue
        try:
            out.append(RunRecord.model_validate_json(raw))
        except ValidationError as e:
            if strict:
                first = e.errors()[0]
                where = ".".join(str(x) for x in first["loc"]) or "record"
                msg = " ".join(str(first["msg"]).split())[:200]
                raise LogError(f"{p}:{no}: invalid record ({where}: {msg})") from None
            skipped += 1
    return out, skipped


def read_log(path: str | os.PathLike, strict: bool = False) -> list[RunRecord]:
    """All complete records of a log, oldest first (see ``read_log_counted``)."""
    return read_log_counted(path, strict)[0]

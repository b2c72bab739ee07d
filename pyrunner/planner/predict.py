"""``python -m pyrunner.planner.predict [LOG.jsonl ...]``: how well the cost model predicts measured kernels.

Prints ``calibration.prediction_report`` (median absolute percentage error of predicted kernel
times before and after per-structure calibration) for the given results logs, by default every
``benchmarks/results/*.jsonl``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyrunner.planner.calibration import prediction_report
from pyrunner.planner.search import Planner


def main(argv: list[str] | None = None) -> int:
    logs = list(sys.argv[1:] if argv is None else argv)
    if not logs:
        logs = sorted(str(p) for p in Path("benchmarks/results").glob("*.jsonl"))
    for k, v in prediction_report(logs, Planner).items():
        print(f"{k}: {round(v, 1) if isinstance(v, float) else v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

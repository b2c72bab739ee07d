"""Which GPU sweep cases a planner switch changes: each case planned with the switch off and on in one process.

``benchmarks/changed_cases.py`` compares two trees (a checkout each, every case planned and lowered twice);
a switch needs no second tree: ``benchmarks/switches.py`` flips it between two searches of one process.
For every case ``gpu_sweep.py`` would collect (its options after ``--``), this plans the top plan as the
sweep does (``gpu_sweep.plan_case``: the committed tuning database; TileLang's lowering gate only with
``--lower-check``, and then only for the cases whose top plans differ) with every named switch off, then
once more per switch with that one on (skipped where the first search never read the switch at a decision:
``switches.Probe``), renders each plan (the renderer reads ``ASYNC_PARTIAL_TILES`` too) and compares the
sources, plan hash, config-space listing and cost estimate masked (``changed_cases.masked``): what the GPU
compiles at the default config (a source that differs only in the asynchronous form's guard, which the
default config decides alike under both settings, builds the same kernels and is not listed).
Writes, per switch, the ids that differ to ``OUT_DIR/<switch>.txt`` (one per line, for
``gpu_sweep.py --cases @FILE --switch <switch>=1``) and one JSON line per case and switch to
``OUT_DIR/switch_cases.jsonl`` (both plans' kernels and modelled microseconds)::

    python benchmarks/switch_cases.py --switch fit.ASYNC_PARTIAL_TILES,cost.PHASED_BLOCKS \\
        --out-dir /tmp/switch_cases --jobs 2 -- --shapes small,real --random 0

Runs on the CPU; deterministic (the search is bounded by work, never by time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import switches  # noqa: E402


def _plan(case, backend, lower_check: bool):
    """The case's plan under the switches as they are set, or the error that stopped it."""
    from gpu_sweep import plan_case

    try:
        return plan_case(case, backend, {}, lower_check=lower_check)[0]
    except Exception as e:  # noqa: BLE001 - a case that plans on one side only is a change
        return e


def _rendered(plan, backend) -> dict:
    """A plan rendered under the switches as they are set: its masked source, kernels and modelled time."""
    from changed_cases import masked

    from pyrunner.backend.tilelang.render import render

    if isinstance(plan, Exception):
        return {"source": f"error: {type(plan).__name__}: {plan}", "full": "", "kernels": [], "us": None}
    try:
        src = render(plan, backend.target).replace(plan.provenance.plan_hash, "PLAN")
    except Exception as e:  # noqa: BLE001
        return {"source": f"error: {type(e).__name__}: {e}", "full": "", "kernels": [], "us": None}
    return {"source": masked(src), "full": src, "kernels": [k.name for k in plan.kernels],
            "us": round(plan.cost.total_us, 2), "config": {k.name: k.defaults for k in plan.kernels}}


def compare_case(case, keys: list[str], device: str, lower_check: bool) -> list[dict]:
    """One record per switch of ``keys``: the case with every switch of ``keys`` off, and with that one on.

    The off search runs with ``switches.Probe`` for each switch; the on search of a switch whose probe no
    decision read would walk the same branches, so the off plan stands for it (``searched``: False) and is
    only rendered again with the switch on (the renderer reads ``ASYNC_PARTIAL_TILES`` itself).
    ``lower_check``: a case whose top plans differ is planned again through TileLang's lowering gate on
    both sides (what the sweep hands out; ``lowered``: True); one whose top plans agree is taken to agree
    through the gate too (it lowers the same top plan first)."""
    from pyrunner.backend.tilelang.backend import backend_for

    t0 = time.monotonic()
    out = _compare(case, keys, backend_for(device), False)
    if lower_check and any(r["changed"] for r in out):
        gated = {r["switch"]: r for r in _compare(case, [r["switch"] for r in out if r["changed"]],
                                                  backend_for(device), True)}
        out = [{**gated[r["switch"]], "lowered": True} if r["switch"] in gated else r for r in out]
    seconds = round(time.monotonic() - t0, 2)
    for rec in out:
        rec["seconds"] = seconds
    return out


def _compare(case, keys: list[str], backend, lower_check: bool) -> list[dict]:
    """``compare_case``'s records, every plan made with or without the lowering gate."""
    off_settings = dict.fromkeys(keys, False)
    with switches.probed(keys) as probes:
        off_plan = _plan(case, backend, lower_check)
    with switches.switched(off_settings):
        off = _rendered(off_plan, backend)
    out = []
    for key in keys:
        searched = probes[key].read or isinstance(off_plan, Exception)
        with switches.switched({**off_settings, key: True}):
            on_plan = _plan(case, backend, lower_check) if searched else off_plan
            on = _rendered(on_plan, backend)
        changed = on["source"] != off["source"]
        guard_only = changed and guard_only_change(off_plan, on_plan, key, backend, off_settings)
        errors = [a["source"] for a in (off, on) if a["source"].startswith("error")]
        out.append({
            "id": case.id, "switch": key, "changed": changed and not guard_only, "guard_only": guard_only,
            "space_only": on["source"] == off["source"] and on["full"] != off["full"], "searched": searched,
            "off": {k: v for k, v in off.items() if k not in ("source", "full")},
            "on": {k: v for k, v in on.items() if k not in ("source", "full")},
            **({"error": errors[0]} if errors else {}),
        })
    return out


def guard_only_change(off_plan, on_plan, key: str, backend, off_settings: dict[str, bool]) -> bool:
    """Whether switching ``key`` on (from ``off_settings``) changes only the guard of the asynchronous form
    that the default config decides alike: a switch the renderer reads as that guard alone
    (``switches.GUARD_SWITCHES``), the same plan, and the same rendered form of every kernel
    (``_branches``). The two arms then build the same kernels."""
    return key in switches.GUARD_SWITCHES and _same_plan(off_plan, on_plan) and \
        _branches(off_plan, backend, off_settings) == _branches(on_plan, backend, {**off_settings, key: True})


def _same_plan(a, b) -> bool:
    """The same kernels and configs (the cost estimate and provenance aside)."""
    if isinstance(a, Exception) or isinstance(b, Exception):
        return False
    return a is b or a.model_dump(exclude={"cost", "provenance"}) == b.model_dump(exclude={"cost", "provenance"})


def _branches(plan, backend, settings: dict[str, bool]) -> list[bool]:
    """Whether each kernel takes its asynchronous form at its default config under ``settings``: the rendered
    guard's verdict (``FitModel.renders_async``; tests/test_async_schedule.py holds them equal). A source that
    differs only in that guard builds the same kernels where these agree, and is not listed (``guard_only``)."""
    from pyrunner.plan.schema import axis_sizes
    from pyrunner.target.fit import FitModel

    sizes = axis_sizes(plan)
    with switches.switched(settings):
        return [FitModel(k, sizes, backend.device).renders_async(k.defaults) for k in plan.kernels]


def _compare_star(job: tuple) -> list[dict]:
    return compare_case(*job)


def changed_cases(cases: list, keys: list[str], device: str, lower_check: bool = False, jobs: int = 1,
                  progress=None) -> list[dict]:
    """``compare_case`` of every case, in case order (``jobs`` processes; each case's arms in one)."""
    work = [(c, keys, device, lower_check) for c in cases]
    records: list[dict] = []
    if jobs <= 1:
        results = map(_compare_star, work)
    else:
        pool = ProcessPoolExecutor(jobs)
        results = pool.map(_compare_star, work, chunksize=1)
    try:
        for recs in results:
            records += recs
            if progress:
                progress(recs)
    finally:
        if jobs > 1:
            pool.shutdown()
    return records


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    sweep_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", action="append", required=True, metavar="NAME",
                    help=f"switch(es) to flip, repeatable or comma-separated: {', '.join(switches.SWITCHES)}")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/switch_cases"),
                    help="folder for <switch>.txt (changed case ids) and switch_cases.jsonl")
    ap.add_argument("--jobs", type=int, default=1, help="planning processes (each plans whole cases)")
    ap.add_argument("--lower-check", action="store_true",
                    help="cases whose top plans differ planned again through TileLang's lowering gate, as the "
                         "sweep plans them (needs TileLang; seconds per such case)")
    args = ap.parse_args(argv)
    try:
        keys = list(dict.fromkeys(switches.resolve(n) for spec in args.switch for n in spec.split(",") if n.strip()))
    except ValueError as e:
        ap.error(str(e))
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    import gpu_sweep

    sweep = gpu_sweep.parser().parse_args(sweep_argv)
    if sweep.switch:
        ap.error("give the switches to flip before '--', not as the sweep's --switch")
    cases = gpu_sweep.collect(sweep)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log = open(args.out_dir / "switch_cases.jsonl", "w")

    def progress(recs: list[dict]) -> None:
        for r in recs:
            log.write(json.dumps(r, default=str) + "\n")
            if r["changed"]:
                print(f"{r['switch']:26s} {r['id']:48s} {r['off']['us']} -> {r['on']['us']} us modelled, "
                      f"{len(r['off']['kernels'])} -> {len(r['on']['kernels'])} kernel(s)", flush=True)
        log.flush()

    with log:
        records = changed_cases(cases, keys, sweep.device, args.lower_check, args.jobs, progress)
    for key in keys:
        ids = [r["id"] for r in records if r["switch"] == key and r["changed"]]
        (args.out_dir / f"{key}.txt").write_text("".join(f"{i}\n" for i in ids))
        space = sum(r["space_only"] for r in records if r["switch"] == key)
        guard = sum(r["guard_only"] for r in records if r["switch"] == key)
        print(f"{key}: {len(ids)} of {len(cases)} case(s) change ({guard} more change only a rendered guard their "
              f"default config decides alike, {space} only their config space) -> {args.out_dir / (key + '.txt')}",
              file=sys.stderr)
    print(f"planned {len(cases)} case(s) x {1 + len(keys)} setting(s) in {time.monotonic() - t0:.0f} s "
          f"({args.jobs} process(es))", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m pyrunner``: the command line.

Commands::

    python -m pyrunner PLAN.json [--config K=V ...] [--log FILE] [--small] [--out DIR] [--autotune N]
                                 [--baselines LIST | --no-baselines] [--seed N] [--budget S] [--quiet]
        validate, render, compile, check and time a plan: the flags become one typed
        ``pyrunner.run.runner.RunOptions`` for ``run_plan_file``; same as ``python -m pyrunner run PLAN.json``
    python -m pyrunner validate PLAN.json [--config K=V ...]
        schema and semantic checks only
    python -m pyrunner superopt [WORKLOAD] [--graph FILE.json] [--shape AXIS=N ...] [--dtype fp16|bf16]
                                [--naive] [--top K] [--explain] [--calibrate LOG.jsonl] [--out FILE]
                                [--device NAME] [--tuning FILE.json | --no-tuning] [--no-lower-check]
                                [--backward | --with-saves]
        search for the best plan(s): stdout gets the plan as JSON (with --top K, a JSON list of K);
        --backward plans the derived backward graph (``ir.grad``; the plan records the derivation in
        ``provenance.backward_of``), --with-saves the forward that also writes the tensors the backward
        reads (which ones: ``planner.saves``, by the cost model)
    python -m pyrunner report --out DIR [--log FILE] [--all]   (pyrunner.log.report.main(argv))
    python -m pyrunner schema [--out FILE]
    python -m pyrunner workloads
    python -m pyrunner export PLAN.json --out kernel.py [--device NAME]   (a standalone TileLang + torch module)

Choices made here: the default dtype is fp16; ``--explain`` writes the explanation to
stderr so stdout stays pure JSON (pipe-able into a file); with ``--graph`` the graph comes
from the file and a WORKLOAD name, if given, is ignored (with a note). A config key is
``PARAM`` (every kernel that has it) or ``KERNEL.PARAM``. Every ``UserError`` prints one
``error: ...`` line on stderr and exits 2; argparse usage errors also exit 2. Files are
written atomically (temp file + rename), so a failed run leaves no half-written output.
The runner and planner are imported by the commands that use them: ``validate`` starts fast.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pyrunner.errors import UserError
from pyrunner.files import write_text_atomic
from pyrunner.target.device import DEFAULT_DEVICE, DEFAULT_GPU_NAME, DEVICES

COMMANDS = ("run", "validate", "superopt", "report", "schema", "workloads", "export")
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
DEFAULT_DTYPE = "fp16"
SCHEMA_FILE = Path(__file__).parent / "schema" / "plan.schema.json"


# --- helpers ---------------------------------------------------------------------

def parse_assignments(items: Sequence[str] | None, flag: str, what: str) -> dict[str, int]:
    """``["a=1", "b=2"]`` -> ``{"a": 1, "b": 2}``; UserError naming the bad item."""
    out: dict[str, int] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UserError(f"{flag} {item!r}: expected {what}=N")
        try:
            n = int(value.strip())
        except ValueError:
            raise UserError(f"{flag} {item!r}: {value.strip()!r} is not an integer") from None
        if n <= 0:
            raise UserError(f"{flag} {item!r}: the value must be a positive integer")
        if key in out:
            raise UserError(f"{flag}: {key!r} is given twice")
        out[key] = n
    return out


def schema_text() -> str:
    """The plan JSON Schema exactly as committed in pyrunner/schema/plan.schema.json."""
    from pyrunner.plan.schema import json_schema

    return json.dumps(json_schema(), indent=2) + "\n"


def _plan_json(data: object) -> str:
    return json.dumps(data, indent=2) + "\n"


def _note(msg: str) -> None:
    print(msg, file=sys.stderr)


# --- commands --------------------------------------------------------------------

def run_options(args: argparse.Namespace):
    """The ``run`` flags as the runner's typed options (unknown baselines: UserError)."""
    from pyrunner.run.runner import BASELINES, MAX_AUTOTUNE_CONFIGS, RunOptions

    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise UserError(f"--seed must be an integer from 0 to 2**63 - 1, got {args.seed}")
    if args.autotune is not None and args.autotune < 0:
        raise UserError(f"--autotune must be at least 0, got {args.autotune}")
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        raise UserError(f"--budget must be a positive number of seconds, got {args.budget}")
    opts = RunOptions(
        autotune=min(args.autotune or 0, MAX_AUTOTUNE_CONFIGS),
        baselines=() if args.no_baselines else
        (tuple(b for b in args.baselines.split(",") if b) if args.baselines else BASELINES),
        seed=args.seed,
        config=parse_assignments(args.config, "--config", "PARAM"),
        deadline=None if args.budget is None else time.monotonic() + args.budget,
        quiet=args.quiet,
        force_cpu=args.cpu, backend=getattr(args, "device", DEFAULT_DEVICE),
    )
    if args.results:
        opts.results = Path(args.results)
    if args.out:
        opts.out_dir = Path(args.out)
    return opts


def cmd_run(args: argparse.Namespace) -> int:
    from pyrunner.run.runner import run_plan_file

    return run_plan_file(args.plan, run_options(args))


def cmd_validate(args: argparse.Namespace) -> int:
    from pyrunner.plan.validate import check_config, load_plan

    plan = load_plan(args.plan)
    values = check_config(plan, parse_assignments(args.config, "--config", "K"))
    kernels = ", ".join(f"{k}({', '.join(f'{p}={v}' for p, v in vals.items()) or 'no params'})"
                        for k, vals in values.items())
    print(f"plan {str(args.plan)!r} is valid: workload {plan.workload}, {plan.dtype}, "
          f"{len(plan.kernels)} kernel(s): {kernels}")
    return 0


def _load_graph(args: argparse.Namespace):
    from pyrunner.ir import catalog as workloads
    from pyrunner.ir.graph_json import load_graph_file

    shapes = parse_assignments(args.shape, "--shape", "AXIS")
    if args.graph:
        if args.workload:
            _note(f"note: --graph given; ignoring workload name {args.workload!r}")
        return load_graph_file(args.graph).with_sizes(shapes)
    if not args.workload:
        raise UserError("superopt needs a WORKLOAD name (see `python -m pyrunner workloads`) "
                        "or --graph FILE.json")
    return workloads.get(args.workload, shapes)


def cmd_superopt(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise UserError(f"--top must be at least 1, got {args.top}")
    calibration = None
    if args.calibrate:
        calibration = Path(args.calibrate)
        if not calibration.is_file():
            raise UserError(f"--calibrate: results log {str(calibration)!r} does not exist")
        from pyrunner.log.results import read_log

        read_log(calibration, strict=True)  # a malformed record is one error line, never silently used
    from pyrunner.backend.tilelang.backend import backend_for
    from pyrunner.pipeline import best_plan
    from pyrunner.planner import explain

    backend = backend_for(args.device)
    graph = _load_graph(args)
    if args.backward or args.with_saves:  # reverse-mode derivation (ir.grad): plan a derived graph instead
        from pyrunner.planner.saves import choose_saves

        derived = choose_saves(graph, DTYPES[args.dtype], calibration, backend.device)
        graph = derived.graph if args.backward else derived.forward
        _note(f"note: planning {graph.name!r}; the backward reads saved forward outputs "
              f"{', '.join(derived.saved) or '(none)'} and cotangents {', '.join(derived.cotangents)}"
              + "".join(f"; {g} is {c} (no kernel)" for g, c in derived.aliases.items()))
    lower_check = args.lower_check and os.environ.get("SUPEROPT_NO_LOWER_CHECK", "") in ("", "0")
    tuning = _tuning(args, backend.device.name)
    plans = best_plan(graph, DTYPES[args.dtype], backend=backend, tuning=tuning, top=args.top,
                      naive=args.naive, calibration=calibration, lower_check=lower_check, notes=_say)
    if args.backward:  # the plan records its derivation: its checks draw saved tensors that belong to the inputs
        from pyrunner.plan.backward_of import with_backward_of

        plans = [with_backward_of(p, derived) for p in plans]
    if args.explain:
        for i, p in enumerate(plans):
            if len(plans) > 1:
                _note(f"--- plan {i + 1} of {len(plans)} ---")
            _note(explain(p).rstrip("\n"))
    from pyrunner.plan.schema import plan_document

    data = [plan_document(p) for p in plans]
    text = _plan_json(data if args.top > 1 else data[0])
    if args.out:
        write_text_atomic(args.out, text)
        _note(f"wrote {len(plans)} plan(s) to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def _tuning(args: argparse.Namespace, device: str = DEFAULT_DEVICE):
    """The tuning database ``superopt`` plans with: ``--tuning FILE``, none with ``--no-tuning``, else the
    committed one of ``device`` (the known device ``--device`` named, never the raw string)."""
    from pyrunner.target.tuning import TuningDB, committed_tuning

    if args.no_tuning:
        return None
    if args.tuning:
        path = Path(args.tuning)
        if not path.is_file():
            raise UserError(f"--tuning: tuning database {str(path)!r} does not exist")
        return TuningDB.load(path)
    return committed_tuning(device)


def _say(note) -> None:
    """Print a ``pipeline.Note`` on stderr the way ``superopt`` words it."""
    if note.kind == "checking":
        _note(f"{note.text}; --no-lower-check skips this")
    elif note.kind == "fewer":
        _note(f"note: --{note.text}")  # "top K asked for, ..."
    else:
        _note(f"note: {note.text}")


def cmd_report(args: argparse.Namespace) -> int:
    if args.model_error:  # the cost model against the committed records (pyrunner.planner.model_report)
        from pyrunner.planner.model_report import main as model_report

        return model_report(["--results", str(args.log)] if args.log else [])
    if args.tables:  # measured tables from the committed records (pyrunner.log.tables)
        from pyrunner.log.tables import write_tables

        return write_tables(args.log, args.out, DEFAULT_GPU_NAME)
    from pyrunner.log.report import main as report_main

    argv = [*(["--log", str(args.log)] if args.log else []), *(["--out", str(args.out)] if args.out else []),
            *(["--all"] if args.all else [])]
    return int(report_main(argv) or 0)


def cmd_schema(args: argparse.Namespace) -> int:
    text = schema_text()
    if args.out:
        write_text_atomic(args.out, text)
        _note(f"wrote the plan JSON Schema to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pyrunner.backend.tilelang.limits import size_problem
    from pyrunner.plan.validate import load_plan

    plan = load_plan(args.plan)  # a bad plan is refused before the backend (TileLang, torch) is imported
    too_big = size_problem(plan)  # as `run` refuses before rendering: what TileLang is not asked to lower
    if too_big is not None:
        raise UserError(f"{args.plan}: {too_big}")
    from pyrunner.backend.tilelang.backend import resolve_backend
    from pyrunner.backend.tilelang.compile import check_fits
    from pyrunner.frontend.export import export_source

    backend = resolve_backend(args.device)  # unknown device: one error line
    check_fits(plan, device=backend.device)  # as `run` checks before rendering: what cannot fit is not exported
    write_text_atomic(args.out, export_source(plan, args.device))
    _note(f"wrote a standalone TileLang + torch module to {args.out} (call its forward(...))")
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    from pyrunner.ir.catalog import listing

    sys.stdout.write(listing())
    return 0


# --- parser ----------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line plus usage, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}\n")


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN.json", help="kernel plan to run")
    p.add_argument("--config", metavar="K=V", action="append",
                   help="override a tuning parameter (PARAM=N or KERNEL.PARAM=N); repeatable")


def build_parser() -> argparse.ArgumentParser:
    top = _Parser(prog="python -m pyrunner",
                  description="Superopt runner. `python -m pyrunner PLAN.json` runs a plan; the other "
                              "commands are below.")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("run", help="validate, render, compile, check and time a plan (the default)")
    _run_args(p)
    p.add_argument("--log", metavar="FILE", dest="results",
                   help="results log (JSON Lines) to append to (default results/results.jsonl)")
    p.add_argument("--out", metavar="DIR", help="folder for rendered sources (default results/)")
    p.add_argument("--small", action="store_true", dest="cpu",
                   help="skip the GPU: run the plan's tiled algorithm on the CPU at scaled-down shapes")
    p.add_argument("--autotune", type=int, metavar="N", help="time up to N sampled tile configs, keep the best")
    p.add_argument("--baselines", metavar="LIST", help="comma-separated baselines to time beside the plan")
    p.add_argument("--no-baselines", action="store_true", help="time no baselines")
    p.add_argument("--seed", type=int, help="seed of the random inputs (default: fresh)")
    p.add_argument("--budget", type=float, metavar="SECONDS", help="time budget of the run")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--device", default=DEFAULT_DEVICE, metavar="NAME",
                   help=f"the backend to compile for ({', '.join(DEVICES)})")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="check a plan (schema and semantics) without running it")
    _run_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("superopt", help="search for the best plan of a workload or graph file")
    p.add_argument("workload", nargs="?", metavar="WORKLOAD", help="catalog workload (see `workloads`)")
    p.add_argument("--graph", metavar="FILE.json", help="graph file; WORKLOAD is then ignored")
    p.add_argument("--shape", metavar="AXIS=N", action="append", help="resize an axis; repeatable")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=DEFAULT_DTYPE,
                   help=f"compute dtype of inputs and outputs (default {DEFAULT_DTYPE})")
    p.add_argument("--device", default=DEFAULT_DEVICE, metavar="NAME",
                   help=f"the GPU to plan for ({', '.join(DEVICES)})")
    p.add_argument("--naive", action="store_true", help="no rewrites: one kernel per op")
    p.add_argument("--top", type=int, default=1, metavar="K", help="print the K best plans as a JSON list")
    p.add_argument("--explain", action="store_true", help="explain the plan(s) on stderr")
    p.add_argument("--calibrate", metavar="LOG.jsonl", help="calibrate the cost model from a results log")
    tuned = p.add_mutually_exclusive_group()
    tuned.add_argument("--tuning", metavar="FILE.json",
                       help="tuning database of measured configs (default: the committed one of the device)")
    tuned.add_argument("--no-tuning", action="store_true", help="plan with the cost model alone")
    p.add_argument("--out", metavar="FILE", help="write the JSON to FILE instead of stdout")
    grad = p.add_mutually_exclusive_group()
    grad.add_argument("--backward", action="store_true",
                      help="plan the graph's derived backward graph (input gradients from output gradients)")
    grad.add_argument("--with-saves", action="store_true",
                      help="plan the forward graph extended with the saved tensors its backward reads")
    p.add_argument("--no-lower-check", dest="lower_check", action="store_false",
                   help="hand out the best plan without lowering it with TileLang first "
                        "(by default a plan TileLang cannot build is skipped for the next-ranked one)")
    p.set_defaults(func=cmd_superopt)

    p = sub.add_parser("report", help="summarise the results log")
    p.add_argument("--log", metavar="FILE", help="results log to read")
    p.add_argument("--out", metavar="DIR", help="folder for report.md and speedups.png (required)")
    p.add_argument("--all", action="store_true", help="every record, not only the latest per workload")
    p.add_argument("--tables", action="store_true", help="write RESULTS.md from a folder of logs "
                   "(--log, default benchmarks/results; --out, default the folder above it)")
    p.add_argument("--model-error", action="store_true", help="the cost model's error over the --log folder's records")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("schema", help="export the plan JSON Schema")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("export", help="write a plan as one standalone TileLang + torch module")
    p.add_argument("plan", metavar="PLAN.json", help="kernel plan to export")
    p.add_argument("--out", metavar="FILE.py", required=True, help="module to write")
    p.add_argument("--device", metavar="NAME",
                   help=f"the backend to render for ({', '.join(DEVICES)}; default: this GPU's)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("workloads", help="list the workload catalog")
    p.set_defaults(func=cmd_workloads)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 bad input)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] not in COMMANDS and not args_list[0].startswith("-"):
        args_list.insert(0, "run")  # `python -m pyrunner PLAN.json`
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
        if not getattr(args, "func", None):
            parser.print_usage(sys.stderr)
            _note("error: give a PLAN.json to run, or a command: " + ", ".join(COMMANDS))
            return 2
        return args.func(args)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except UserError as e:
        _note(f"error: {' '.join(str(e).split())}")
        return e.exit_code
    except KeyboardInterrupt:
        _note("interrupted")
        return 130


def entry() -> None:
    """Console-script entry point (``superopt-py``)."""
    sys.exit(main())

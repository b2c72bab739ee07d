"""Issue 46's re-probe classes, generated from fixed seeds and driven through the real command line
(``python -m pyrunner`` in a child process) and the Python entry points (slow tier).

Kinds, each a few generated cases (the plan mutations of kind (b) are tests/test_plan_mutations.py):

(a) writes outside ``--out``: symbolic links, dangling links, hard links and linked folders planted at the
    names each command writes in its output folder, pointing outside it;
(c) blowups from small inputs: an unterminated run of escaped quotes, a deep mixed softmax/doubling DAG,
    a plan of 4,096-wide expressions, ``report`` on 20,000 records with a 5 MB workload name;
(d) tracebacks: control characters and lone surrogates in a plan's free text, too-deep expressions,
    too many axes, 5,000-digit integers and 100,000-deep nesting wherever a file or flag takes a number,
    malformed ``load(plan, config=...)``, ``optimize`` on odd callables and shapes, odd backend options;
(e) coerced fields: lax values at a plan's numbers and shapes, relabelled provenance, unknown rule names,
    a dtype the frontend does not plan in.

Every command must end with exit 0, or its documented code (2: bad input, one ``error:`` line; ``run``'s 1:
a failed plan, recorded) without a traceback, within ``LIMIT_S`` CPU seconds and ``LIMIT_KB`` of peak
memory (the child's own rusage from ``os.wait4``), and must leave everything outside its output folder as
it was (a snapshot of the folder around it, links not followed).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SEED = 46
LIMIT_S = 60.0
LIMIT_KB = 2 * 1024 * 1024
GUARD_BYTES = 4 << 30
"""Address-space cap of each child: a regression fails the memory bound without taking the machine."""
GUARD_CPU_S = int(LIMIT_S) + 5
"""CPU-time cap of each child (SIGXCPU past it): a regression fails the time bound within a minute."""
ENV = {k: v for k, v in os.environ.items() if k != "SUPEROPT_NO_LOWER_CHECK"}

pytestmark = pytest.mark.slow


# --- the command line in a child, measured ----------------------------------------------------------

@dataclass
class Ran:
    argv: list[str]
    code: int
    err: str
    cpu_s: float
    rss_kb: int


def _guard() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (GUARD_BYTES, GUARD_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (GUARD_CPU_S, GUARD_CPU_S + 5))


def cli(*argv: str | Path, timeout: float = 20 * LIMIT_S) -> Ran:
    """``python -m pyrunner ARGV`` in a child: exit code, stderr, and the child's own CPU time and peak
    memory (``os.wait4``; the wall-clock timeout is generous for a loaded machine, the bound is on CPU)."""
    args = [str(a) for a in argv]
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-m", "pyrunner", *args], cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_guard)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            _, status, use = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    return Ran(args, p.returncode, text, use.ru_utime + use.ru_stime, use.ru_maxrss)


def sane(r: Ran, codes: tuple[int, ...] = (0, 2)) -> Ran:
    """Exit 0 or a documented code; exit 2 is one ``error:`` line; no traceback; within the bounds."""
    what = " ".join(a[:60] for a in r.argv)
    assert "Traceback" not in r.err, f"{what}: {r.err[-3000:]}"
    assert r.code in codes, f"{what}: exit {r.code}: {r.err[-2000:]}"
    if r.code == 2:
        errors = [line for line in r.err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, f"{what}: {r.err[-2000:]}"
    assert r.cpu_s <= LIMIT_S, f"{what}: {r.cpu_s:.1f} CPU-s"
    assert r.rss_kb <= LIMIT_KB, f"{what}: {r.rss_kb} KB"
    return r


def refused(r: Ran, words: str = "") -> str:
    """Exit 2 with one ``error:`` line holding ``words``; returns that line."""
    sane(r, (2,))
    line = next(x for x in r.err.splitlines() if x.startswith("error:"))
    assert words.lower() in line.lower(), line
    return line


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple]:
    """Every entry under ``root`` but ``skip``, links not followed: kind, size, mtime, inode, link target,
    content hash (a write through a link or into a linked folder shows here)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if skip is not None and (d == skip or skip in d.parents):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = d / name
            if skip is not None and p == skip:
                continue
            st = p.lstat()
            link = os.readlink(p) if p.is_symlink() else ""
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, st.st_nlink,
                                            link, digest)
    return out


# --- plans and graphs to edit --------------------------------------------------------------------------

_DOCS: dict[str, dict] = {}

EW_GRAPH = {"name": "Ew", "axes": {"m": 64, "n": 64}, "inputs": {"X": ["m", "n"]},
            "nodes": [{"name": "e", "op": "exp", "args": ["X"]}, {"name": "Y", "op": "mul", "args": ["e", "e"]}],
            "outputs": ["Y"]}


def doc(name: str) -> dict:
    """A real planner plan's JSON document: ``matmul`` (64 cubed) or ``ew`` (``EW_GRAPH``), cached."""
    if name not in _DOCS:
        from pyrunner.ir import catalog
        from pyrunner.ir.graph_json import graph_from_json
        from pyrunner.plan.schema import plan_document
        from pyrunner.planner import search

        g = catalog.get("Matmul", {"m": 64, "d": 64, "n": 64}) if name == "matmul" else graph_from_json(EW_GRAPH)
        _DOCS[name] = plan_document(search(g, "fp16", tuning=False)[0])
    return copy.deepcopy(_DOCS[name])


def unhashed(d: dict) -> dict:
    d["provenance"]["plan_hash"] = ""  # known by its recomputed hash: only the checks stand
    return d


def write(path: Path, data: object | str) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    assert path.stat().st_size < 1 << 20 or path.name.startswith("big"), path
    return path


def record_line(workload: str = "W0", **kw) -> str:
    from pyrunner.log.results import make_record

    base = dict(plan_hash="0123456789abcdef", workload=workload, graph_hash="g", shapes={"m": 8}, dtype="float16",
                device="H200", status="ok", plan_us=10.0, baselines_us={"torch_compile": 20.0})
    return make_record(**{**base, **kw}).model_dump_json()


# --- (a) writes outside --out through planted links --------------------------------------------------

def _link_cases() -> list[tuple[str, str, str]]:
    """(command, planted name, link kind): each command's output names, each with a link kind drawn from
    the seed (a dangling link would create its target; a linked folder would take the files)."""
    rng = random.Random(SEED)
    files = ("symlink", "hardlink", "dangling")
    names = [("report", "report.md"), ("report", "speedups.png"), ("report", ".speedups.png.tmp.png"),
             ("superopt", "plan.json"), ("schema", "schema.json"), ("export", "module.py"),
             ("run", "HASH/WORKLOAD.py"), ("run", "HASH")]
    cases = [(c, n, "folder" if n == "HASH" else rng.choice(files)) for c, n in names]
    cases.append(("run", "HASH/KERNEL.cu", rng.choice(files)))  # after lowering: the one costly case
    return cases


def _plant(at: Path, kind: str, victim: Path, victim_dir: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        at.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, at)
    elif kind == "dangling":
        at.symlink_to(victim.parent / "created_through_the_link")
    else:
        at.symlink_to(victim_dir, target_is_directory=True)


@pytest.mark.parametrize(("command", "name", "kind"), _link_cases(), ids=lambda x: x)
def test_no_write_through_a_planted_link(command: str, name: str, kind: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = write(tmp_path / "victim.txt", "precious")
    victim_dir = tmp_path / "victim_dir"
    victim_dir.mkdir()
    write(victim_dir / "kept.txt", "kept")
    inputs = tmp_path / "in"
    inputs.mkdir()
    d = doc("matmul")
    plan = write(inputs / "plan.json", d)
    log = write(inputs / "r.jsonl", "\n".join(record_line(f"W{i}") for i in range(3)) + "\n")
    graph = write(inputs / "g.json", EW_GRAPH)
    name = name.replace("HASH", d["provenance"]["plan_hash"]).replace("WORKLOAD", d["workload"])
    name = name.replace("KERNEL", d["kernels"][0]["name"])
    _plant(out / name, kind, victim, victim_dir)
    before = snapshot(tmp_path, skip=out)
    argv = {"report": ["report", "--log", log, "--out", out],
            "superopt": ["superopt", "--graph", graph, "--no-lower-check", "--out", out / name],
            "schema": ["schema", "--out", out / name],
            "export": ["export", plan, "--out", out / name, "--device", "h200"],
            "run": ["run", plan, "--small", "--no-baselines", "--quiet", "--seed", "1", "--log", out / "r.jsonl",
                    "--out", out]}[command]
    sane(cli(*argv), (0, 1, 2) if command == "run" else (0, 2))
    assert snapshot(tmp_path, skip=out) == before, "something outside the output folder changed"
    assert victim.read_text() == "precious" and not (tmp_path / "created_through_the_link").exists()


# --- (c) blowups from small inputs ---------------------------------------------------------------

def test_an_unterminated_run_of_escaped_quotes_is_read_in_linear_time(tmp_path: Path) -> None:
    """The JSON pre-scan's string regex retried from every quote (100 KB took minutes)."""
    rng = random.Random(SEED)
    for i in range(2):
        prefix = rng.choice(['[', '{"name": ', '{"nodes": [{"name": ', '{"a": [[{"b": '])
        text = prefix + '"' + '\\"' * rng.randint(100_000, 200_000)
        f = write(tmp_path / f"q{i}.json", text)
        refused(cli("superopt", "--graph", f, "--no-lower-check"))
        refused(cli("validate", f))


def _deep_dag(rng: random.Random, n: int) -> dict:
    """A chain of n nodes, each a softmax, a doubling ``add(x, x)``, an exp, or a sum of the last two:
    the softmax chains and doubling DAGs of the re-probe, mixed."""
    nodes: list[dict] = []
    prev = ["X", "X"]
    for i in range(n):
        kind = rng.choice(["softmax", "double", "exp", "pair"])
        node = {"softmax": {"op": "softmax", "args": [prev[-1]], "axis": "n"},
                "double": {"op": "add", "args": [prev[-1], prev[-1]]},
                "exp": {"op": "exp", "args": [prev[-1]]},
                "pair": {"op": "add", "args": [prev[-1], prev[-2]]}}[kind]
        nodes.append({"name": f"v{i}", **node})
        prev.append(f"v{i}")
    return {"name": "DeepDag", "axes": {"m": 64, "n": 64}, "inputs": {"X": ["m", "n"]}, "nodes": nodes,
            "outputs": [prev[-1]]}


def test_superopt_on_a_deep_mixed_dag_is_bounded(tmp_path: Path) -> None:
    """200 nodes (the size at which both the softmax chain and the doubling DAG were over the limits),
    planned as a user runs it: with the lowering check."""
    f = write(tmp_path / "g.json", _deep_dag(random.Random(SEED), 200))
    sane(cli("superopt", "--graph", f, "--out", tmp_path / "plan.json"))


def _wide(rng: random.Random, leaves: int, bufs: list[str]) -> dict:
    """A balanced expression tree over buffer references (no constant: the certificate check passes it)."""
    level: list[dict] = [{"kind": "ref", "buf": rng.choice(bufs)} for _ in range(leaves)]
    while len(level) > 1:
        fn = rng.choice(["add", "sub", "max", "min"])
        level = [{"kind": "call", "fn": fn, "args": [a, b]} for a, b in zip(level[0::2], level[1::2], strict=True)]
    return level[0]


def test_a_plan_of_wide_expressions_is_refused_before_lowering(tmp_path: Path) -> None:
    """Three 4,096-leaf trees (760 KB of plan) took 140 CPU-s in ``run --small`` (TileLang's lowering and the
    CPU check); the lowering limits count expression nodes. The plan validates: only the size is refused."""
    rng = random.Random(SEED)
    d = unhashed(doc("ew"))
    k = d["kernels"][0]
    bufs = [b["name"] for b in k["buffers"]]
    dst = next(op["dst"] for op in k["prologue"] if op["op"] == "map")
    k["prologue"] += [{"op": "map", "dst": dst, "expr": _wide(rng, 4096, bufs)} for _ in range(rng.randint(2, 3))]
    f = write(tmp_path / "wide.json", d)
    sane(cli("validate", f), (0,))
    refused(cli("run", f, "--small", "--no-baselines", "--quiet", "--log", tmp_path / "r.jsonl", "--out",
                tmp_path / "out"), "expression nodes")
    refused(cli("export", f, "--out", tmp_path / "m.py", "--device", "h200"), "expression nodes")
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "m.py").exists()


def test_report_on_20000_records_and_a_5mb_name_is_bounded(tmp_path: Path) -> None:
    """Was 330 s and 9.2 GB (a 20,000-bar plot); a 5 MB workload name ended in a FreeType traceback."""
    from pyrunner.log.report import MAX_CELL

    line = record_line("W0")
    rng = random.Random(SEED)
    lines = [line.replace('"W0"', f'"W{rng.randrange(10**9)}"') for _ in range(20_000)]
    lines.insert(rng.randrange(len(lines)), record_line("![x](http://e/x.png)" + "N" * 5_000_000))
    log = write(tmp_path / "big.jsonl", "\n".join(lines) + "\n")
    for extra in ([], ["--all"]):
        out = tmp_path / f"out{len(extra)}"
        sane(cli("report", "--log", log, "--out", out, *extra), (0,))
        text = (out / "report.md").read_text()
        assert len(text) < 2_000_000 and "N" * (MAX_CELL + 1) not in text and "![x](" not in text


# --- (d) tracebacks -----------------------------------------------------------------------------

def _bad_char(rng: random.Random) -> str:
    return rng.choice([chr(rng.randrange(0, 32)), "\x7f", chr(rng.randrange(0xD800, 0xE000))])


def test_control_characters_in_free_text_are_one_error_at_export(tmp_path: Path) -> None:
    """A NUL or lone surrogate in a step's ``at`` passed ``validate`` and crashed ``export``."""
    rng = random.Random(SEED)
    for i in range(3):
        d = unhashed(doc("matmul"))
        field = rng.choice(["at", "result", "planner", "version"])
        text = "x" * rng.randrange(0, 40)
        pos = rng.randrange(len(text) + 1)
        text = text[:pos] + _bad_char(rng) + text[pos:]
        if field in ("planner", "version"):
            d["provenance"][field] = text
        else:
            d["derivation"] = [{"rule": "matmul_assoc", "at": "Y", "result": "Y", field: text}]
        f = write(tmp_path / f"p{i}.json", d)  # ensure_ascii: a surrogate travels as \\udXXX
        refused(cli("export", f, "--out", tmp_path / f"m{i}.py", "--device", "h200"), "character")
        refused(cli("validate", f), "character")
        assert not (tmp_path / f"m{i}.py").exists()


def test_a_too_deep_expression_is_one_error(tmp_path: Path) -> None:
    """A 240-deep expression validated, then exported as a module Python cannot parse."""
    from pyrunner.plan.claims import MAX_EXPR_DEPTH

    rng = random.Random(SEED)
    d = unhashed(doc("ew"))
    k = d["kernels"][0]
    dst = next(op["dst"] for op in k["prologue"] if op["op"] == "map")
    e: dict = {"kind": "ref", "buf": dst}
    for _ in range(rng.randint(MAX_EXPR_DEPTH + 1, 400)):
        e = {"kind": "call", "fn": rng.choice(["neg", "exp", "abs", "relu", "tanh", "sigmoid"]), "args": [e]}
    k["prologue"].append({"op": "map", "dst": dst, "expr": e})
    f = write(tmp_path / "deep.json", d)
    refused(cli("validate", f), "deep")
    refused(cli("export", f, "--out", tmp_path / "m.py", "--device", "h200"), "deep")


def test_too_many_axes_are_one_error(tmp_path: Path) -> None:
    """A rank-70 graph was planned, then numpy refused 70 dimensions in the CPU check with a traceback."""
    from pyrunner.ir.graph_json import MAX_RANK
    from pyrunner.plan.claims import MAX_TENSOR_RANK

    rng = random.Random(SEED)
    rank = rng.randint(MAX_RANK + 1, 70)
    axes = {f"a{i}": 1 for i in range(rank - 2)} | {"m": 4, "n": 8}
    g = {"name": "Wide", "axes": axes, "inputs": {"X": list(axes)},
         "nodes": [{"name": "P", "op": "softmax", "args": ["X"], "axis": "n"}], "outputs": ["P"]}
    refused(cli("superopt", "--graph", write(tmp_path / "g.json", g), "--no-lower-check"), "axes")
    d = unhashed(doc("ew"))
    rank = rng.randint(MAX_TENSOR_RANK + 1, 70)
    d["tensors"][0]["axes"] = [f"x{i}" for i in range(rank)]
    d["tensors"][0]["shape"] = [1] * rank
    refused(cli("run", write(tmp_path / "p.json", d), "--small", "--no-baselines", "--quiet", "--log",
                tmp_path / "r.jsonl", "--out", tmp_path / "out"), "axes")


def _digits(rng: random.Random) -> str:
    """A whole number of 4,301 to 6,000 digits, as text (past Python's str-to-int limit)."""
    return str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(rng.randint(4300, 5999)))


def _huge(rng: random.Random) -> int:
    return 10 ** rng.randint(4300, 6000) + rng.randrange(10**6)


def test_5000_digit_integers_are_one_error(tmp_path: Path) -> None:
    """Wherever a flag or a file takes a whole number (past Python's 4,300-digit str-to-int limit)."""
    rng = random.Random(SEED)
    n = _digits(rng)
    g = dict(EW_GRAPH, axes={"m": 64, "n": 64})
    plan = write(tmp_path / "p.json", doc("matmul"))
    graph = write(tmp_path / "g.json", EW_GRAPH)
    places = {
        "graph axis": lambda: ["superopt", "--graph", write(tmp_path / "g1.json", json.dumps(g).replace(
            '"m": 64', f'"m": {n}', 1)), "--no-lower-check"],
        "plan default": lambda: ["validate", write(tmp_path / "p1.json", json.dumps(unhashed(doc("matmul"))).replace(
            '"threads": 128', f'"threads": {n}', 1))],
        "--shape": lambda: ["superopt", "--graph", graph, "--shape", f"m={n}", "--no-lower-check"],
        "--config": lambda: ["validate", plan, "--config", f"block_m={n}"],
        "--seed": lambda: ["run", plan, "--small", "--seed", n, "--log", tmp_path / "r.jsonl"],
        "--top": lambda: ["superopt", "--graph", graph, "--top", n, "--no-lower-check"],
    }
    for where in rng.sample(sorted(places), 4):
        refused(cli(*places[where]()))


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_100000_deep_nesting_is_one_error(tmp_path: Path) -> None:
    """In a graph file, a plan file, a results log, a tuning database, a calibration log."""
    rng = random.Random(SEED)
    deep = _nest(rng.randint(100_000, 150_000))
    graph = write(tmp_path / "g.json", EW_GRAPH)
    places = {
        "graph": lambda: ["superopt", "--graph", write(tmp_path / "g1.json", '{"name": "G", "axes": ' + deep + "}")],
        "plan": lambda: ["validate", write(tmp_path / "p1.json", json.dumps(unhashed(doc("matmul"))).replace(
            '"derivation": []', f'"derivation": {deep}', 1))],
        "tuning": lambda: ["superopt", "--graph", graph, "--no-lower-check", "--tuning",
                           write(tmp_path / "t.json", '{"entries": ' + deep + "}")],
        "calibrate": lambda: ["superopt", "--graph", graph, "--no-lower-check", "--calibrate",
                              write(tmp_path / "c.jsonl", record_line().replace('"extra": {}', f'"extra": {deep}'))],
        "report": lambda: ["report", "--log", write(tmp_path / "r.jsonl", record_line() + "\n" + deep + "\n"),
                           "--out", tmp_path / "out"],
    }
    for where in rng.sample(sorted(places), 3):
        sane(cli(*places[where]()))


def _malformed_config(rng: random.Random, kernel: str) -> object:
    nest: list = []
    inner = nest
    for _ in range(rng.randint(100_000, 120_000)):
        inner.append([])
        inner = inner[0]
    value = rng.choice([_huge(rng), nest, "64", 64.0, True, None, -rng.randrange(1, 99), {"a": 1}])
    return rng.choice([[1, 2], "block_m=64", {"block_m": value}, {kernel: {"block_m": value}},
                       {kernel: [value]}, {rng.randrange(9): 1}])


def test_load_with_a_malformed_config_is_one_plan_error() -> None:
    from pyrunner.errors import PlanError
    from pyrunner.frontend.load import load
    from pyrunner.plan.validate import validate_plan

    plan = validate_plan(doc("matmul"))
    rng = random.Random(SEED)
    for _ in range(8):
        config = _malformed_config(rng, plan.kernels[0].name)
        with pytest.raises(PlanError) as e:
            load(plan, config=config)
        assert "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)[:400]


def test_optimize_on_odd_callables_and_shapes_works_or_says_why_in_one_line() -> None:
    """Each generated (callable, example) pair either runs and agrees with the function, or is one
    FrontendError/UserError line: never another exception."""
    torch = pytest.importorskip("torch")
    import functools

    from pyrunner.errors import UserError
    from pyrunner.frontend.errors import FrontendError
    from pyrunner.frontend.optimize import optimize

    class Scale:
        def __call__(self, x):
            return torch.exp(x) * 2

    def f(x):
        return torch.exp(x) * 2

    fns = [f, torch.exp, functools.partial(torch.mul, other=2.0), Scale(), lambda *a: a[0] * 2, torch.nn.ReLU(), 3,
           None, "exp"]
    shapes = [(0, 16), (), (1,), (3, 5), (1, 1, 1, 1), (2, 0, 3), (31, 33)]
    rng = random.Random(SEED)
    for _ in range(10):
        fn, shape = rng.choice(fns), rng.choice(shapes)
        dtype = rng.choice([torch.bfloat16, torch.float16, torch.float32, torch.float64])
        x = torch.randn(shape).to(dtype)
        torch._dynamo.reset()
        try:
            opt = optimize(fn, x, executor="plan", progress=False)
        except (FrontendError, UserError) as e:
            assert "\n" not in str(e), (fn, shape, str(e))
            assert not callable(fn), (fn, shape, str(e))  # every callable here runs (its ops left to PyTorch)
            continue
        assert torch.equal(opt(x), fn(x)), (fn, shape)


def test_backend_options_and_shapes_never_fail_the_model(caplog: pytest.LogCaptureFixture) -> None:
    """Unknown keys, fallbacks and executors no one has, values of the wrong type, 0-size inputs: the
    compiled function agrees with the model, at most one log line per graph says what went to inductor."""
    torch = pytest.importorskip("torch")
    import pyrunner.frontend  # noqa: F401 - registers the backend

    def f(x):
        return torch.exp(x) * 2

    rng = random.Random(SEED)
    word = "".join(rng.choice("abcdefghij_") for _ in range(6))
    options = [{word: 1}, {"fallback": word}, {"executor": word}, {"dtype": rng.choice(["float64", "int8", 16])},
               {"verify": rng.choice(["no", 0, None])}, {"bucket": word}, {"device": word}, {}]
    for opts in rng.sample(options, 5):
        shape = rng.choice([(0, 16), (8, 16), (8, 0)])
        x = torch.randn(shape, dtype=rng.choice([torch.float32, torch.bfloat16]))
        torch._dynamo.reset()
        caplog.clear()
        with caplog.at_level("WARNING", logger="pyrunner.frontend"):
            got = torch.compile(f, backend="superopt", options=opts)(x)
        assert torch.allclose(got.float(), f(x).float()), opts
        lines = [r.getMessage() for r in caplog.records if "goes to inductor" in r.getMessage()]
        assert len(lines) <= 1 and all("\n" not in x for x in lines), (opts, lines)
        assert (len(lines) == 1) == bool(opts), (opts, lines)


# --- (e) coerced fields --------------------------------------------------------------------------------

LAX = ["1_0", True, " 2.5 ", "nan", "inf", -3.0, "64", 64.5, None, [64], "1e3", False]
"""Values pydantic's lax mode would read as numbers, or numbers no cost or shape may be."""


def _numeric_paths(d: dict) -> list[tuple]:
    """Paths of the plan's cost numbers, tensor shapes and kernel defaults."""
    paths: list[tuple] = [("cost", "total_us"), ("cost", "launches")]
    paths += [("cost", "kernels", i, f) for i in range(len(d["cost"]["kernels"]))
              for f in ("flops", "bytes", "time_us")]
    paths += [("tensors", i, "shape", j) for i, t in enumerate(d["tensors"]) for j in range(len(t["shape"]))]
    paths += [("tensors", i, "shape") for i in range(len(d["tensors"]))]
    paths += [("kernels", 0, "defaults", p) for p in d["kernels"][0]["defaults"]]
    return paths


def _set(d: dict, path: tuple, value: object) -> dict:
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return d


def test_lax_values_are_refused_on_the_command_line(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    base = unhashed(doc("matmul"))
    paths = _numeric_paths(base)
    for i in range(6):
        path, value = rng.choice(paths), rng.choice(LAX)
        if path[-1] == "shape" and isinstance(value, list):
            value = [str(x) for x in base["tensors"][path[1]]["shape"]]  # a shape of strings
        f = write(tmp_path / f"p{i}.json", _set(copy.deepcopy(base), path, value))
        refused(cli("validate", f))
    text = json.dumps(base).replace('"total_us": ', '"total_us": 1e400, "x": ', 1)  # parses as inf
    refused(cli("validate", write(tmp_path / "inf.json", text)))


def test_unchecked_provenance_is_refused(tmp_path: Path) -> None:
    """A relabelled workload, a graph_hash set to anything else, rule names the registry lacks."""
    from pyrunner.ir import catalog

    rng = random.Random(SEED)
    token = "".join(rng.choice("abcdef0123456789") for _ in range(16))
    edits = [
        lambda d: d.update(workload=rng.choice([w for w in catalog.CATALOG if w != d["workload"]])),
        lambda d: d["provenance"].update(graph_hash=rng.choice([token, "/etc/passwd", token.upper()])),
        lambda d: d.update(derivation=[{"rule": f"rule_{token}", "at": "Y", "result": "Y"}]),
        lambda d: d["kernels"][0].update(fused_rules=[f"rule_{token}"]),
    ]
    for i, edit in enumerate(edits):
        d = unhashed(doc("matmul"))
        edit(d)
        refused(cli("validate", write(tmp_path / f"p{i}.json", d)))


def test_a_dtype_the_frontend_does_not_plan_in_is_refused() -> None:
    torch = pytest.importorskip("torch")
    from pyrunner.frontend.errors import FrontendError
    from pyrunner.frontend.optimize import optimize

    rng = random.Random(SEED)
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    for dtype in rng.sample(["float64", "int8", "float32", "fp16", " bfloat16", 16, "", torch.bfloat16], 4):
        with pytest.raises(FrontendError, match="dtype"):
            optimize(lambda x: x * 2, x, executor="plan", progress=False, dtype=dtype)

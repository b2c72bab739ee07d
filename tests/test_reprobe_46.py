"""Issue 46's re-probe, the library calls it listed as tracebacks that no other test drove through the
public API: ``load(plan, config=...)`` with a config that is not a mapping (a list, a ``"k=v"`` string)
or holds a 5,000-digit integer or 100,000-deep nesting. Each is one ``PlanError`` of one short line.
(tests/test_hostile_46.py drives ``resolve_config`` with the same values; ``load`` reached the runner's
``resolve`` first, which called ``.values()`` on the list and raised AttributeError.)
"""

from __future__ import annotations

import pytest

from pyrunner.errors import PlanError
from pyrunner.frontend.load import load
from pyrunner.ir import catalog
from pyrunner.planner import search
from pyrunner.planner.search import Budget


@pytest.fixture(scope="module")
def plan():
    return search(catalog.get("Matmul", {"m": 64, "d": 64, "n": 64}), "fp16", tuning=False, budget=Budget(4000))[0]


def _deep() -> list:
    nest: list = []
    inner = nest
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]
    return nest


@pytest.mark.parametrize("kind", ["list", "string", "digits", "deep", "kernel digits", "kernel deep"])
def test_load_with_a_malformed_config_is_one_plan_error(plan, kind: str) -> None:
    k = plan.kernels[0].name
    config = {"list": lambda: [1, 2], "string": lambda: "block_m=64",
              "digits": lambda: {"block_m": 10 ** 5000}, "deep": lambda: {"block_m": _deep()},
              "kernel digits": lambda: {k: {"block_m": 10 ** 5000}},
              "kernel deep": lambda: {k: {"block_m": _deep()}}}[kind]()
    with pytest.raises(PlanError) as e:
        load(plan, config=config)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg


@pytest.mark.parametrize("axes", [{"x": 5}, ["t", "d"], {"x": [1, 2]}, {3: "td"}])
def test_optimize_with_malformed_axes_is_one_frontend_error(axes) -> None:
    """``optimize(fn, x, axes={"x": 5})`` raised ``TypeError: 'int' object is not iterable``."""
    torch = pytest.importorskip("torch")
    from pyrunner.frontend.errors import FrontendError
    from pyrunner.frontend.optimize import optimize

    x = torch.randn(32, 64, dtype=torch.bfloat16)
    with pytest.raises(FrontendError, match="axes") as e:
        optimize(lambda x: torch.exp(x) * 2, x, axes=axes, executor="plan", progress=False)
    assert "\n" not in str(e.value)


def test_an_optimized_function_called_with_a_list_is_one_frontend_error() -> None:
    """A tensor argument given as a list reached the user's code through dynamo (torch's TypeError)."""
    torch = pytest.importorskip("torch")
    from pyrunner.frontend.errors import FrontendError
    from pyrunner.frontend.optimize import optimize

    def f(x):
        return torch.exp(x) * 2

    x = torch.randn(32, 64, dtype=torch.bfloat16)
    opt = optimize(f, x, executor="plan", progress=False)
    assert torch.equal(opt(x), f(x))
    for call in (lambda: opt([1.0, 2.0]), lambda: opt(x=[1.0])):  # by position or by keyword
        with pytest.raises(FrontendError, match="argument 'x' was a torch.Tensor when optimized, called with list"):
            call()
    with pytest.raises(FrontendError, match="f: "):
        opt(x, x)  # more arguments than f takes: one line, not dynamo's traceback


def _inductor_lines(options: dict, caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    """Compiles a small function with the superopt backend under ``options``; checks the result equals
    eager's and returns the log lines containing ``words``."""
    torch = pytest.importorskip("torch")
    import pyrunner.frontend  # noqa: F401 - registers the backend

    def f(x):
        return torch.exp(x) * 2

    x = torch.randn(8, 16)
    torch._dynamo.reset()
    with caplog.at_level("WARNING", logger="pyrunner.frontend"):
        got = torch.compile(f, backend="superopt", options=options)(x)
    assert torch.allclose(got, f(x))
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


@pytest.mark.parametrize("options", [{"bogus": 1}, {"fallback": "nope"}, {"executor": "warp"}])
def test_backend_options_it_cannot_take_leave_the_graph_to_inductor_in_one_line(
        options: dict, caplog: pytest.LogCaptureFixture) -> None:
    """``torch.compile(backend="superopt", options={"bogus": 1})`` raised a TypeError that dynamo wrapped in
    BackendCompilerFailed with its traceback; now the graph goes to inductor, saying why in one line."""
    from pyrunner.frontend.backend import LAST_REPORTS

    lines = _inductor_lines(options, caplog, "goes to inductor")
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert str(next(iter(options))) in lines[0] or str(next(iter(options.values()))) in lines[0]
    assert LAST_REPORTS[-1].fallbacks and not LAST_REPORTS[-1].regions


@pytest.mark.parametrize(("kw", "words"), [
    ({"dtype": "float64"}, "dtype 'float64'"), ({"dtype": "int8"}, "dtype 'int8'"), ({"dtype": 16}, "dtype 16"),
    ({"dtype": ""}, "dtype ''"), ({"verify": "no"}, "verify 'no'"), ({"backward": 0}, "backward 0"),
])
def test_optimize_refuses_a_dtype_or_flag_it_would_coerce(kw: dict, words: str) -> None:
    """``dtype="float64"`` was refused region by region after capture (``dtype=""`` read as none),
    ``verify="no"`` read as true: each is now one FrontendError before anything is captured."""
    torch = pytest.importorskip("torch")
    from pyrunner.frontend.errors import FrontendError
    from pyrunner.frontend.optimize import optimize

    x = torch.randn(8, 16, dtype=torch.bfloat16)
    with pytest.raises(FrontendError, match=words) as e:
        optimize(lambda x: x * 2, x, executor="plan", progress=False, **kw)
    assert "\n" not in str(e.value)


def test_optimize_of_something_not_callable_is_one_frontend_error() -> None:
    """Before: dynamo's ``AssertionError: A callable function is expected``, with its traceback."""
    torch = pytest.importorskip("torch")
    from pyrunner.frontend.errors import FrontendError
    from pyrunner.frontend.optimize import optimize

    with pytest.raises(FrontendError, match="not int"):
        optimize(3, torch.randn(8, 16), executor="plan", progress=False)


@pytest.mark.parametrize("options", [{"dtype": "float64"}, {"bucket": "x"}, {"verify": 1}, {"device": "tpu"}])
def test_backend_options_of_the_wrong_value_name_the_problem(options: dict, caplog: pytest.LogCaptureFixture) -> None:
    """The whole graph goes to inductor, its one line naming the option (a device no backend has said
    only 'a bad option', after an empty node list)."""
    lines = _inductor_lines(options, caplog, "inductor")
    key, value = next(iter(options.items()))
    assert len(lines) == 1 and "\n" not in lines[0] and f"{key}" in lines[0] and repr(value) in lines[0], lines
    assert "PyTorch: :" not in lines[0]

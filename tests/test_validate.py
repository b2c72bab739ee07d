"""Plan validation: schema errors name the field, semantic errors name the kernel and op."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_mutation import json_values, mutated_documents

from pyrunner.errors import PlanError, UserError
from pyrunner.ir import catalog as workloads
from pyrunner.ir.graph_json import graph_to_json
from pyrunner.plan.schema import (
    Buffer,
    Call,
    Const,
    CostEstimate,
    Fill,
    Gemm,
    GlobalTensor,
    GridAxis,
    Kernel,
    KernelCost,
    Load,
    Map,
    Plan,
    Provenance,
    Reduce,
    Ref,
    Step,
    Store,
    StreamLoop,
)
from pyrunner.plan.validate import check_config, load_plan, validate_plan
from pyrunner.planner.aliases import graph_hash

F16 = "float16"


def _plan(graph, kernels: list[Kernel], tensors: list[GlobalTensor], steps: list[Step] = ()) -> Plan:
    cost = CostEstimate(total_us=1.0, launches=len(kernels), model={},
                        kernels=[KernelCost(kernel=k.name, flops=1.0, bytes=1.0, time_us=1.0, bound="memory")
                                 for k in kernels])
    return Plan(workload=graph.name, dtype=F16, graph=graph_to_json(graph), derivation=list(steps),
                tensors=tensors, kernels=kernels, cost=cost,
                provenance=Provenance(planner="hand", version="0", graph_hash=graph_hash(graph)))


def _tensor(graph, name: str, axes: list[str], role: str, dtype: str = F16) -> GlobalTensor:
    return GlobalTensor(name=name, axes=axes, shape=[graph.sizes[a] for a in axes], dtype=dtype, role=role)


def attention_plan() -> Plan:
    """The online-softmax kernel of plan_semantics' worked example, at small sizes."""
    g = workloads.get("Attention", {"h": 2, "t_q": 32, "t_kv": 32, "d": 16})
    ref = Ref
    log2e = Const(value=1.4426950408889634)

    def call(fn: str, *args) -> Call:
        return Call(fn=fn, args=list(args))

    k = Kernel(
        name="attention",
        grid=[GridAxis(axis="h", block=1), GridAxis(axis="t_q", block="block_t_q"), GridAxis(axis="d", block=16)],
        loop=StreamLoop(axis="t_kv", block="block_t_kv", stages="stages"),
        threads="threads",
        buffers=[
            Buffer(name="Q_s", axes=["t_q", "d"], scope="shared", dtype=F16),
            Buffer(name="K_s", axes=["t_kv", "d"], scope="shared", dtype=F16),
            Buffer(name="V_s", axes=["t_kv", "d"], scope="shared", dtype=F16),
            Buffer(name="S", axes=["t_q", "t_kv"], scope="fragment", dtype="float32"),
            Buffer(name="m", axes=["t_q"], scope="fragment", dtype="float32", state=True),
            Buffer(name="m_prev", axes=["t_q"], scope="fragment", dtype="float32"),
            Buffer(name="scale", axes=["t_q"], scope="fragment", dtype="float32"),
            Buffer(name="l", axes=["t_q"], scope="fragment", dtype="float32", state=True),
            Buffer(name="rs", axes=["t_q"], scope="fragment", dtype="float32"),
            Buffer(name="P16", axes=["t_q", "t_kv"], scope="fragment", dtype=F16),
            Buffer(name="acc", axes=["t_q", "d"], scope="fragment", dtype="float32", state=True),
            Buffer(name="out", axes=["t_q", "d"], scope="fragment", dtype="float32"),
        ],
        prologue=[Load(src="Q", dst="Q_s"), Fill(dst="m", value="-inf"), Fill(dst="l", value=0.0),
                  Fill(dst="acc", value=0.0)],
        body=[
            Load(src="K", dst="K_s"),
            Load(src="V", dst="V_s"),
            Gemm(a="Q_s", b="K_s", c="S", contract="d", clear=True),
            Map(dst="m_prev", expr=ref(buf="m")),
            Reduce(fn="max", src="S", dst="m", axis="t_kv", accumulate=True),
            Map(dst="scale", expr=call("exp2", call("mul", call("sub", ref(buf="m_prev"), ref(buf="m")), log2e))),
            Map(dst="S", expr=call("exp2", call("mul", call("sub", ref(buf="S"), ref(buf="m")), log2e))),
            Reduce(fn="sum", src="S", dst="rs", axis="t_kv", accumulate=False),
            Map(dst="l", expr=call("add", call("mul", ref(buf="l"), ref(buf="scale")), ref(buf="rs"))),
            Map(dst="acc", expr=call("mul", ref(buf="acc"), ref(buf="scale"))),
            Map(dst="P16", expr=ref(buf="S")),
            Gemm(a="P16", b="V_s", c="acc", contract="t_kv", clear=False),
        ],
        epilogue=[Map(dst="out", expr=call("div", ref(buf="acc"), ref(buf="l"))), Store(src="out", dst="O")],
        reads=["Q", "K", "V"],
        writes=["O"],
        params={"block_t_q": [16, 32], "block_t_kv": [8, 16, 32], "stages": [1, 2], "threads": [128, 256]},
        defaults={"block_t_q": 16, "block_t_kv": 16, "stages": 2, "threads": 128},
        fused_rules=["online_softmax_rescale"],
    )
    tensors = [_tensor(g, "Q", ["h", "t_q", "d"], "input"), _tensor(g, "K", ["h", "t_kv", "d"], "input"),
               _tensor(g, "V", ["h", "t_kv", "d"], "input"), _tensor(g, "O", ["h", "t_q", "d"], "output")]
    return _plan(g, [k], tensors)  # hand-built: no derivation, so no certificate to replay


def rmsnorm_plan() -> Plan:
    """Two kernels: row scales S to an intermediate, then (X * S) @ W."""
    g = workloads.get("RMSNorm", {"m": 32, "d": 64, "n": 32})
    f32 = "float32"
    k1 = Kernel(
        name="row_scale",
        grid=[GridAxis(axis="m", block="bm")],
        loop=StreamLoop(axis="d", block=16),
        buffers=[Buffer(name="X_s", axes=["m", "d"], scope="shared", dtype=F16),
                 Buffer(name="sq", axes=["m", "d"], scope="fragment", dtype=f32),
                 Buffer(name="ss", axes=["m"], scope="fragment", dtype=f32, state=True),
                 Buffer(name="s_out", axes=["m"], scope="fragment", dtype=f32)],
        prologue=[Fill(dst="ss", value=0.0)],
        body=[Load(src="X", dst="X_s"), Map(dst="sq", expr=Call(fn="square", args=[Ref(buf="X_s")])),
              Reduce(fn="sum", src="sq", dst="ss", axis="d", accumulate=True)],
        epilogue=[Map(dst="s_out", expr=Call(fn="rsqrt", args=[
            Call(fn="add", args=[Call(fn="mul", args=[Ref(buf="ss"), Const(value=1 / 64)]), Const(value=1e-6)])])),
            Store(src="s_out", dst="S")],
        reads=["X"], writes=["S"], params={"bm": [8, 16]}, defaults={"bm": 16})
    k2 = Kernel(
        name="scaled_matmul",
        grid=[GridAxis(axis="m", block="bm"), GridAxis(axis="n", block="bn")],
        loop=StreamLoop(axis="d", block="bd", stages=2),
        buffers=[Buffer(name="s_f", axes=["m"], scope="fragment", dtype=f32),
                 Buffer(name="X_s", axes=["m", "d"], scope="shared", dtype=F16),
                 Buffer(name="Xn", axes=["m", "d"], scope="fragment", dtype=F16),
                 Buffer(name="W_s", axes=["d", "n"], scope="shared", dtype=F16),
                 Buffer(name="acc", axes=["m", "n"], scope="fragment", dtype=f32, state=True),
                 Buffer(name="out", axes=["m", "n"], scope="fragment", dtype=F16)],
        prologue=[Load(src="S", dst="s_f"), Fill(dst="acc", value=0.0)],
        body=[Load(src="X", dst="X_s"), Load(src="W", dst="W_s"),
              Map(dst="Xn", expr=Call(fn="mul", args=[Ref(buf="X_s"), Ref(buf="s_f")])),
              Gemm(a="Xn", b="W_s", c="acc", contract="d", clear=False)],
        epilogue=[Map(dst="out", expr=Ref(buf="acc")), Store(src="out", dst="Y")],
        reads=["S", "X", "W"], writes=["Y"],
        params={"bm": [16, 32], "bn": [16, 32], "bd": [16, 32, 64]}, defaults={"bm": 16, "bn": 16, "bd": 32})
    tensors = [_tensor(g, "X", ["m", "d"], "input"), _tensor(g, "W", ["d", "n"], "input"),
               _tensor(g, "S", ["m"], "intermediate", "float32"), _tensor(g, "Y", ["m", "n"], "output")]
    return _plan(g, [k1, k2], tensors)


PLANS: dict[str, Callable[[], Plan]] = {"attention": attention_plan, "rmsnorm": rmsnorm_plan}


def doc(name: str = "attention") -> dict:
    return PLANS[name]().model_dump(mode="json")


def reject(data: object, *fragments: str) -> str:
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    msg = str(e.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg
    return msg


# --- valid plans ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PLANS))
def test_hand_built_plans_validate(name: str, tmp_path) -> None:
    data = doc(name)
    assert validate_plan(data) == PLANS[name]()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    assert load_plan(path) == PLANS[name]()


# --- file and schema level ----------------------------------------------------------

def test_file_errors(tmp_path) -> None:
    with pytest.raises(PlanError, match="does not exist"):
        load_plan(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1,')
    with pytest.raises(PlanError, match=r"not valid JSON: .* line 1 column"):
        load_plan(bad)
    bad.write_text('{"a": NaN}')
    with pytest.raises(PlanError, match="NaN is not valid JSON"):
        load_plan(bad)
    bad.write_text('{"a": 1, "a": 2}')
    with pytest.raises(PlanError, match="duplicate key 'a'"):
        load_plan(bad)
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(PlanError, match="not UTF-8"):
        load_plan(bad)
    bad.write_text("[" * 100000)
    with pytest.raises(PlanError, match="nested too deeply|not valid JSON"):
        load_plan(bad)


def test_not_an_object() -> None:
    reject([1, 2], "a plan must be a JSON object, got list")


@pytest.mark.parametrize("version", [2, 0, "1", True, None])
def test_schema_version(version) -> None:
    data = doc()
    data["schema_version"] = version
    reject(data, "schema_version", "is not supported", "reads schema_version 1")


def test_missing_field_names_path_and_counts_others() -> None:
    data = doc()
    del data["kernels"][0]["body"][2]["c"]
    del data["cost"]
    assert reject(data) == "invalid plan: kernels[0].body[2].c: required field is missing [and 1 other error]"
    data = doc()
    del data["cost"]
    assert reject(data) == "invalid plan: cost: required field is missing"


def test_extra_field() -> None:
    data = doc()
    data["kernels"][0]["buffers"][3]["colour"] = "red"
    reject(data, "kernels[0].buffers[3].colour: unknown field")


def test_wrong_types() -> None:
    data = doc()
    data["kernels"][0]["body"][2]["dst"] = 3
    reject(data, "kernels[0].body[2].dst: unknown field")  # gemm has no dst
    data = doc()
    data["kernels"][0]["body"][0]["dst"] = 3
    reject(data, "kernels[0].body[0].dst: Input should be a valid string (got 3)")
    data = doc()
    data["kernels"][0]["grid"][1]["block"] = 1.5
    reject(data, "kernels[0].grid[1].block: matches no allowed form", "integer", "string", "(got 1.5)")
    data = doc()
    data["kernels"][0]["body"][3]["expr"]["kind"] = "lambda"
    reject(data, "kernels[0].body[3].expr: Input tag 'lambda'")
    data = doc()
    data["kernels"][0]["body"][1]["op"] = "copy"
    reject(data, "kernels[0].body[1]: Input tag 'copy'", "'load'")
    data = doc()
    data["tensors"][0]["shape"][0] = -2
    reject(data, "tensors[0].shape[0]", "greater than 0")
    data = doc()
    data["kernels"][0]["defaults"]["stages"] = 3
    reject(data, "kernels[0]", "default stages=3 is not in its space")


# --- semantics --------------------------------------------------------------------

def _mut(fn: Callable[[dict], None], name: str = "attention") -> dict:
    data = doc(name)
    fn(data)
    return data


def _k(data: dict, i: int = 0) -> dict:
    return data["kernels"][i]


def _rename_buffer(kernel: dict, i: int, name: str) -> None:
    """Rename buffer ``i`` and every op's reference to it (the rest of the kernel stays consistent)."""
    old = kernel["buffers"][i]["name"]
    text = json.dumps({k: kernel[k] for k in ("buffers", "prologue", "body", "epilogue") if k in kernel})
    kernel.update(json.loads(text.replace(f'"{old}"', f'"{name}"')))


SEMANTIC_CASES: list[tuple[str, str, Callable[[dict], None], tuple[str, ...]]] = [
    ("attention", "graph", lambda d: d["graph"]["nodes"][0].update(op="conv"), ("graph: ", "unknown op 'conv'")),
    ("attention", "dup tensor", lambda d: d["tensors"].append(d["tensors"][0]), ("tensors[4] 'Q'", "already")),
    ("attention", "tensor axis", lambda d: d["tensors"][0].update(axes=["h", "t_q", "e"]), ("unknown axis 'e'",)),
    ("attention", "tensor extent", lambda d: d["tensors"][0]["shape"].__setitem__(1, 64),
     ("tensors[0] 'Q'", "extent 64", "graph says 32")),
    ("attention", "tensor dtype", lambda d: d["tensors"][3].update(dtype="bfloat16"),
     ("tensors[3] 'O'", "must have dtype float16")),
    ("rmsnorm", "intermediate dtype", lambda d: d["tensors"][2].update(dtype="bfloat16"),
     ("role intermediate must have dtype float32 or float16",)),
    ("attention", "missing input", lambda d: d["tensors"].pop(2), ("graph input 'V' has no tensor",)),
    ("attention", "extra output", lambda d: d["tensors"].append({**d["tensors"][3], "name": "O2"}),
     ("'O2' has role output", "['O']")),
    ("attention", "output axes order", lambda d: d["tensors"][3].update(axes=["h", "d", "t_q"], shape=[2, 16, 32]),
     ("output 'O' has axes", "['h', 't_q', 'd']")),
    ("attention", "block param", lambda d: _k(d)["grid"][1].update(block="bq"),
     ("kernels[0] 'attention': grid[1].block names parameter 'bq'",)),
    ("attention", "threads param", lambda d: _k(d).update(threads="nthreads"), ("threads names parameter",)),
    ("attention", "grid axis", lambda d: _k(d)["grid"][0].update(axis="b"), ("grid[0] names unknown axis 'b'",)),
    ("attention", "grid dup", lambda d: _k(d)["grid"][2].update(axis="h"), ("repeats grid axis 'h'",)),
    ("attention", "loop divides", lambda d: (_k(d)["params"]["block_t_kv"].append(24),
                                             _k(d)["defaults"].update(block_t_kv=24)),
     ("loop block 24", "does not divide", "masks nothing past the end")),
    ("attention", "loop is grid", lambda d: _k(d)["loop"].update(axis="t_q"), ("both a grid axis and the loop",)),
    ("attention", "dup buffer", lambda d: _k(d)["buffers"][1].update(name="Q_s"), ("buffers[1] 'Q_s'", "already")),
    ("attention", "buffer named like a tensor", lambda d: _rename_buffer(_k(d), 1, "V"),
     ("buffers[1] 'V'", "may not have the name of the global tensor 'V'")),
    ("attention", "axis size", lambda d: _k(d)["body"][5]["expr"]["args"][0]["args"].__setitem__(
        1, {"kind": "size", "axis": "e"}), ("body[5] (map): size of unknown axis 'e'",)),
    ("attention", "indexed buffer axis", lambda d: _k(d)["buffers"][5].update(axes=["h"]),
     ("axis 'h' is an indexed grid axis",)),
    ("attention", "foreign buffer axis", lambda d: _k(d)["buffers"][5].update(axes=["x"]),
     ("axis 'x' is not an axis of this kernel",)),
    ("attention", "unknown buffer", lambda d: _k(d)["body"][3]["expr"].update(buf="M"),
     ("kernels[0] 'attention' body[3] (map)", "unknown buffer 'M'")),
    ("attention", "unknown tensor", lambda d: _k(d)["body"][0].update(src="K2"), ("body[0] (load)", "'K2'")),
    ("attention", "load axes", lambda d: _k(d)["buffers"][1].update(axes=["d", "t_kv"]),
     ("body[0] (load): dst buffer 'K_s' has axes ['d', 't_kv']", "['t_kv', 'd']")),
    ("attention", "store axes", lambda d: _k(d)["buffers"][11].update(axes=["d", "t_q"]),
     ("epilogue[1] (store): src buffer 'out'",)),
    ("attention", "loop axis outside body", lambda d: _k(d)["prologue"].insert(0, {"op": "load", "src": "K",
                                                                                  "dst": "K_s"}),
     ("prologue[0] (load)", "only be accessed in the loop body")),
    ("attention", "tensor axis not in kernel", lambda d: _k(d)["grid"].pop(0),
     ("prologue[0] (load)", "axis 'h', which is neither a grid axis nor the loop axis")),
    ("attention", "store to input", lambda d: _k(d)["epilogue"][1].update(dst="Q"),
     ("epilogue[1] (store)", "'Q', which is a graph input")),
    ("attention", "gemm rank", lambda d: _k(d)["body"][2].update(contract="t_q"),
     ("body[2] (gemm): operand b 'K_s' must be 2-D holding the contracted axis 't_q'",)),
    ("attention", "gemm dtype", lambda d: _k(d)["buffers"][0].update(dtype="float32"),
     ("body[2] (gemm): operand a 'Q_s' has dtype float32", "compute dtype float16")),
    ("attention", "gemm b scope", lambda d: _k(d)["buffers"][1].update(scope="fragment"),
     ("operand b 'K_s' must be in shared memory",)),
    ("attention", "gemm c axes", lambda d: _k(d)["buffers"][3].update(axes=["t_kv", "t_q"]),
     ("accumulator c 'S' has axes ['t_kv', 't_q']", "['t_q', 't_kv']")),
    ("attention", "gemm c dtype", lambda d: _k(d)["buffers"][10].update(dtype="float16"),
     ("accumulator c 'acc' must be a float32 fragment",)),
    ("attention", "map subset", lambda d: _k(d)["body"][3].update(expr={"kind": "ref", "buf": "S"}),
     ("body[3] (map): operand 'S' has axes ['t_q', 't_kv']", "not a subset", "'t_kv'")),
    ("attention", "call fn", lambda d: _k(d)["body"][5]["expr"].update(fn="exp10"),
     ("kernels[0].body[5].expr.fn", "(got 'exp10')")),  # the schema lists the op table's functions
    ("attention", "call arity", lambda d: _k(d)["body"][5]["expr"]["args"].append({"kind": "const", "value": 1}),
     ("body[5] (map): function 'exp2' takes 1 argument(s), got 2",)),
    ("attention", "reduce axis", lambda d: _k(d)["body"][4].update(axis="d"),
     ("body[4] (reduce): reduces over axis 'd'",)),
    ("attention", "reduce dst", lambda d: _k(d)["body"][7].update(dst="acc"),
     ("body[7] (reduce): dst 'acc' has axes ['t_q', 'd']",)),
    ("attention", "read before write", lambda d: _k(d)["prologue"].pop(3),
     ("body[9] (map): reads buffer 'acc' before anything writes it",)),
    ("attention", "state not initialised", lambda d: (_k(d)["prologue"].pop(3),
                                                      _k(d)["body"].insert(0, {"op": "fill", "dst": "acc",
                                                                               "value": 0})),
     ("state buffer 'acc' is not initialised in the prologue",)),
    ("attention", "carried value not state", lambda d: _k(d)["buffers"][7].update(state=False),
     ("body[8] (map): buffer 'l' carries its value across loop iterations", "state=true")),
    ("attention", "reads list", lambda d: _k(d).update(reads=["Q", "K"]), ("loads 'V', but reads does not list",)),
    ("attention", "writes list", lambda d: _k(d).update(writes=["O", "Q"]),
     ("writes lists 'Q', but the kernel never stores it",)),
    ("attention", "unknown listed tensor", lambda d: _k(d).update(reads=["Q", "K", "V", "Z"]),
     ("reads lists unknown tensor 'Z'",)),
    ("rmsnorm", "read before written", lambda d: d["kernels"].reverse(),
     ("kernels[0] 'scaled_matmul': reads 'S' (role intermediate) before any earlier kernel writes it",)),
    ("rmsnorm", "output never written", lambda d: d["kernels"].pop(1),
     ("output 'Y' is never written",)),
]


@pytest.mark.parametrize("name,case,fn,fragments", SEMANTIC_CASES, ids=[c[1] for c in SEMANTIC_CASES])
def test_semantic_errors(name: str, case: str, fn, fragments: tuple[str, ...]) -> None:
    reject(_mut(fn, name), *fragments)


def test_racing_store() -> None:
    """A row-sum kernel whose grid also tiles the summed axis: blocks would race on the store."""
    data = doc("rmsnorm")
    k = _k(data)
    k["grid"].append({"axis": "d", "block": 16})
    k["loop"] = None
    k["prologue"], k["body"] = [], k["prologue"] + k["body"]
    for b in k["buffers"]:
        b["state"] = False
    reject(data, "epilogue[1] (store): blocks race on 'S': grid axis 'd' has 4 tiles")


def test_second_store_in_one_kernel() -> None:
    """One kernel storing its output twice (its writes list naming it once, so the plan-wide
    single-writer check cannot see it): the kernel check rejects the second store."""
    data = doc("attention")
    epilogue = _k(data)["epilogue"]
    assert epilogue[1] == {"op": "store", "src": "out", "dst": "O"}
    epilogue.append(dict(epilogue[1]))
    reject(data, "kernels[0] 'attention' epilogue[2] (store): stores 'O' a second time; a global tensor has "
                 "one writer (one store in one kernel)")


def test_block_equal_to_size_is_one_tile_not_a_race() -> None:
    data = doc("rmsnorm")
    k = _k(data)
    k["grid"].append({"axis": "d", "block": 64})
    k["loop"] = None
    k["body"][1]["expr"] = {"kind": "call", "fn": "square", "args": [{"kind": "ref", "buf": "X_s"}]}
    validate_plan(data)


def test_check_config() -> None:
    plan = attention_plan()
    values = check_config(plan, {"block_t_kv": 32, "attention.stages": 1})
    assert values == {"attention": {"block_t_q": 16, "block_t_kv": 32, "stages": 1, "threads": 128}}
    with pytest.raises(PlanError, match=r"block_t_kv=7 for kernel 'attention': allowed values are \[8, 16, 32\]"):
        check_config(plan, {"block_t_kv": 7})
    with pytest.raises(PlanError, match="no kernel has a parameter 'bk'"):
        check_config(plan, {"bk": 16})
    with pytest.raises(PlanError, match="kernel 'attention' has no parameter 'bk'"):
        check_config(plan, {"attention.bk": 16})
    two = rmsnorm_plan()
    values = check_config(two, {"bm": 8, "scaled_matmul.bm": 32})
    assert values["row_scale"]["bm"] == 8 and values["scaled_matmul"]["bm"] == 32


def test_check_config_rechecks_tile_rules() -> None:
    data = doc("rmsnorm")
    _k(data)["params"]["bm"] = [16, 1]
    plan = validate_plan(data)
    with pytest.raises(PlanError, match="axis 'm' is an indexed grid axis .*with the given config"):
        check_config(plan, {"row_scale.bm": 1})


# --- property: only UserError escapes ------------------------------------------------

_BASES = {n: doc(n) for n in PLANS}
_NAMES = ["attention", "Q", "K", "S", "t_q", "t_kv", "d", "gemm", "map", "load", "block_t_q", "float16"]


def mutated_plans() -> st.SearchStrategy:
    return mutated_documents(list(_BASES.values()), _NAMES)


@settings(max_examples=900, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_plans())
def test_mutated_plans_raise_only_user_errors(data: object) -> None:
    try:
        validate_plan(data)
    except UserError as e:
        assert "\n" not in str(e) and str(e)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_random_json_is_rejected_cleanly(data: object) -> None:
    with pytest.raises(UserError):
        validate_plan(data)


def test_loop_visible_with_a_wrong_arity_is_a_plan_error() -> None:
    """A mask predicate whose comparison has three arguments: one clear PlanError, never a traceback."""
    from pyrunner.ir import catalog
    from pyrunner.planner import search

    plan = search(catalog.get("CausalAttention", {"h": 1, "t_q": 1024, "t_kv": 1024, "d": 64}), "bf16")[0]
    doc = plan.model_dump(mode="json")
    loop = next(k["loop"] for k in doc["kernels"] if k.get("loop") and k["loop"].get("visible"))
    calls = [loop["visible"]]
    while calls[-1]["kind"] == "call" and calls[-1]["fn"] not in ("lt", "le"):
        calls.append(next(a for a in calls[-1]["args"] if a["kind"] == "call"))
    calls[-1]["args"].append(calls[-1]["args"][0])
    with pytest.raises(PlanError, match=r"loop.visible calls '(lt|le)' with 3 argument\(s\); it takes 2"):
        validate_plan(doc)

"""Hypothesis strategies for malformed JSON documents, shared by the validator tests:
random JSON, and valid documents damaged at 1-3 random places."""

from __future__ import annotations

import copy

from hypothesis import strategies as st

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=False, width=32) | st.text(max_size=6),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12,
)


def paths(x: object, prefix: tuple = ()) -> list[tuple]:
    """Every key/index path into a JSON value."""
    out = [prefix]
    if isinstance(x, dict):
        for k, v in x.items():
            out += paths(v, prefix + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out += paths(v, prefix + (i,))
    return out


ACTIONS = ["drop", "rename", "name", "json", "move", "swap_type", "duplicate"]


@st.composite
def mutated_documents(draw, bases: list[object], names: list[str]) -> object:
    """A deep copy of one of `bases` with 1-3 fields dropped, renamed, retyped or replaced;
    `names` are plausible identifiers (axes, ops, tensors) to swap in."""
    data = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 3))):
        where = [p for p in paths(data) if p]
        if not where:
            break
        path = draw(st.sampled_from(where))
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        key = path[-1]
        action = draw(st.sampled_from(ACTIONS))
        if action == "drop":
            del parent[key]
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from(names + [f"{key}_"]))] = parent.pop(key)
        elif action == "name":
            parent[key] = draw(st.sampled_from(names))
        elif action == "move" and isinstance(parent, list) and len(parent) > 1:
            parent.insert(draw(st.integers(0, len(parent) - 1)), parent.pop(key))
        elif action == "swap_type":
            v = parent[key]
            parent[key] = [v] if not isinstance(v, list) else (v[0] if v else {})
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
        else:
            parent[key] = draw(json_values)
    return data

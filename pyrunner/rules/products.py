"""Products in one canonical factor order: commutativity and associativity as a normal form.

``elementwise_mul_comm`` and ``elementwise_mul_assoc`` (registry) would blow the search up if
saturated (n factors have n! orders and Catalan(n) shapes). Instead every product tree is
flattened and rebuilt once, left-nested, in an order fixed by its factors and its consumer:
the factors carrying the axis that a matmul or sum consuming the product reduces come first,
the rest after them, so the reduction can take them out (``matmul_row_scale_commute``).
"""

from __future__ import annotations

import hashlib

from pyrunner.ir.axes import axes_of
from pyrunner.ir.brief import brief
from pyrunner.ir.graph import Graph, Term
from pyrunner.plan.schema import Step
from pyrunner.rules.certify import rewrite_step
from pyrunner.rules.replay import Inst, left_product


def _is_binary(t: Term, fn: str) -> bool:
    return t.op == "binary" and t.fn == fn


def _digests(terms: list[Term]) -> dict[Term, str]:
    """A structural key per term, independent of the hash seed (operands first, so linear)."""
    out: dict[Term, str] = {}
    for t in terms:
        head = repr((t.op, t.fn, t.axis, t.name, t.axes, t.value))
        out[t] = hashlib.sha1((head + "".join(out[a] for a in t.args)).encode()).hexdigest()[:16]
    return out


def _uses(g: Graph, terms: list[Term]) -> dict[Term, list[Term]]:
    users: dict[Term, list[Term]] = {t: [] for t in terms}
    for t in terms:
        for a in t.args:
            users[a].append(t)
    return users


def _factors(root: Term, inner: set[Term]) -> tuple[list[Term], bool, list[tuple[int, ...]]]:
    """The factors of a product tree, left to right, through single-use inner products;
    whether the tree was left-nested (((f1 * f2) * f3) ...); and each factor's path below root."""
    out: list[Term] = []
    paths: list[tuple[int, ...]] = []
    left_nested = True
    stack: list[tuple[Term, tuple[int, ...]]] = [(root, ())]
    while stack:
        t, path = stack.pop()
        if t is root or t in inner:
            a, b = t.args
            if b in inner:
                left_nested = False
            stack.extend(((b, path + (1,)), (a, path + (0,))))
        else:
            out.append(t)
            paths.append(path)
    return out, left_nested, paths


def _permutation(order: list[Term], factors: list[Term]) -> tuple[int, ...]:
    """Indices into ``factors`` giving ``order`` (equal factors matched left to right)."""
    used: set[int] = set()
    out: list[int] = []
    for f in order:
        k = next(i for i, g in enumerate(factors) if i not in used and g == f)
        used.add(k)
        out.append(k)
    return tuple(out)


def _left_paths(n: int) -> tuple[tuple[int, ...], ...]:
    """The factor paths of a left-nested product of n factors (((f0 * f1) * f2) ...)."""
    return ((0,) * (n - 1),) + tuple((0,) * (n - 1 - k) + (1,) for k in range(1, n))


def _rebuild_steps(at: str, old: Term, factors: list[Term], paths: list[tuple[int, ...]], perm: tuple[int, ...],
                   left_nested: bool) -> tuple[Term, list[Step]]:
    """old's product tree rebuilt left-nested in the order ``perm``: regrouped first where it was not
    left-nested (``elementwise_mul_assoc``), then its factors reordered (``elementwise_mul_comm``)."""
    steps: list[Step] = []
    cur = old
    if not left_nested:
        mid = left_product(factors)
        if mid != cur:
            steps.append(rewrite_step("elementwise_mul_assoc", cur, mid, Inst(factors=tuple(paths)), at))
            cur = mid
    if perm != tuple(range(len(factors))):
        new = left_product([factors[k] for k in perm])
        if new != cur:
            inst = Inst(factors=_left_paths(len(factors)) if cur is not old else tuple(paths), choice=perm)
            steps.append(rewrite_step("elementwise_mul_comm", cur, new, inst, at))
            cur = new
    return cur, steps


def _ordered(factors: list[Term], axes: tuple[str, ...], ctx: str | None, key: dict[Term, str]) -> list[Term] | None:
    """Canonical order: factors carrying the consumer's reduced axis ``ctx`` first, then the ones
    without it (so a matmul or sum can take them out), each group by rank then structure; a factor
    with exactly the product's axes goes first when needed to keep the axis order."""
    def canon(fs: list[Term]) -> list[Term]:
        return sorted(fs, key=lambda f: (-len(axes_of(f)), key[f]))

    if ctx is None:
        order = canon(factors)
    else:
        order = canon([f for f in factors if ctx in axes_of(f)]) + canon([f for f in factors if ctx not in axes_of(f)])
    if _product_axes(order) != axes:
        full = [f for f in order if axes_of(f) == axes]
        if not full:
            return None
        order.remove(full[0])
        order.insert(0, full[0])
    return order if _product_axes(order) == axes else None


def _product_axes(factors: list[Term]) -> tuple[str, ...]:
    out: list[str] = []
    for f in factors:
        out.extend(a for a in axes_of(f) if a not in out)
    return tuple(out)


def canonical_products(g: Graph) -> tuple[Graph, list[Step]] | None:
    """g with every product tree in canonical factor order, and the steps citing the rules.

    Products are flattened through single-use inner products and rebuilt left-nested in
    one canonical order (``_ordered``), so ``((X * S) * g) @ W`` and ``((X * g) * S) @ W``
    become the same graph. Applying commutativity and associativity this way, once, keeps
    the search from saturating them. None when no product changes.
    """
    terms = g.terms()
    users = _uses(g, terms)
    outs = {t for _, t in g.outputs}
    inner = {t for t in terms if _is_binary(t, "mul") and t not in outs and len(users[t]) == 1
             and _is_binary(users[t][0], "mul")}
    key = _digests(terms)
    mapping: dict[Term, Term] = {}
    steps: list[Step] = []
    for t in terms:
        args = tuple(mapping[a] for a in t.args)
        new = t if args == t.args else t.replace_args(args)
        if _is_binary(t, "mul") and t not in inner:
            factors, left_nested, paths = _factors(t, inner)
            ctx = {u.axis for u in users[t] if u.op in ("matmul", "reduce")}
            order = _ordered(factors, axes_of(t), next(iter(ctx)) if len(ctx) == 1 else None, key)
            if order is not None and (order != factors or not left_nested):
                rebuilt, rebuild = _rebuild_steps(brief(t), new, [mapping[f] for f in factors], paths,
                                                  _permutation(order, factors), left_nested)
                if rebuilt != new:
                    new = rebuilt
                    steps.extend(rebuild)
        mapping[t] = new
    if not steps:
        return None
    labels: dict[Term, str] = {}
    for t, name in g.labels.items():
        labels.setdefault(mapping.get(t, t), name)
    return Graph(g.name, g.sizes, tuple((n, mapping[t]) for n, t in g.outputs), labels), steps

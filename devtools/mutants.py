"""The mutants of a module: small changes to its AST (a comparison flipped or moved to its
boundary, an operator swapped, a constant moved, a string blanked, a call or a `raise`
dropped, a return value replaced), generated in source order so that two runs on the
same tree try the same mutants. devtools/mutate.py runs the tests against them."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

_CMP_SYMBOLS: dict[type[ast.cmpop], str] = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
# Each comparison gets its off-by-one boundary and its negation.
_CMP_SWAPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
_BINOP_SYMBOLS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
_CALL_SWAPS = {"min": "max", "max": "min", "all": "any", "any": "all"}


@dataclass(frozen=True)
class Mutant:
    module: str  # relative to the project root, '/'-separated
    line: int
    description: str
    source: str  # the whole mutated module

    def label(self) -> str:
        return f"{self.module}:{self.line}: {self.description}"


# --- generating mutants -----------------------------------------------------------------


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _code(node: ast.AST, source: str) -> str:
    """The code a mutant changes, as written, short enough for one report line."""
    text = ast.get_source_segment(source, node) or ast.unparse(node)
    # One line: a call split over lines reads `f(a, b)`, not `f( a, b, )`.
    text = re.sub(r"\s*\n\s*", " ", text)
    text = re.sub(r"([(\[{]) ", r"\1", re.sub(r",? ([)\]}])", r"\1", text))
    return repr(text if len(text) <= 50 else text[:47] + "...")


def _constant_changes(value: object) -> list[tuple[str, bool | int | float | str]]:
    if isinstance(value, bool):
        return [(f"{value} -> {not value}", not value)]
    changes: list[int | float | str]
    if isinstance(value, int):
        changes = [value + 1, value - 1]
    elif isinstance(value, float):
        changes = [value * 2 if value else 1.0, value + 1]
    elif isinstance(value, str):
        changes = ["" if value else "mutant"]
    else:
        return []
    return [(f"{_show(value)} -> {_show(new)}", new) for new in changes if new != value]


def _candidates(node: ast.AST, source: str) -> list[tuple[str, ast.AST]]:
    """(description, replacement) for each mutant of `node` itself."""
    found: list[tuple[str, ast.AST]] = []
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            for new_op in _CMP_SWAPS.get(type(op), ()):
                ops = [*node.ops[:index], new_op(), *node.ops[index + 1 :]]
                change = f"'{_CMP_SYMBOLS[type(op)]}' -> '{_CMP_SYMBOLS[new_op]}'"
                mutated = ast.Compare(left=node.left, ops=ops, comparators=node.comparators)
                found.append((f"{change} in {_code(node, source)}", mutated))
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BINOP_SWAPS:
        old, new = type(node.op), _BINOP_SWAPS[type(node.op)]
        description = f"'{_BINOP_SYMBOLS[old]}' -> '{_BINOP_SYMBOLS[new]}' in {_code(node, source)}"
        if isinstance(node, ast.BinOp):
            found.append((description, ast.BinOp(left=node.left, op=new(), right=node.right)))
        else:
            found.append((description, ast.AugAssign(node.target, new(), node.value)))
    elif isinstance(node, ast.BoolOp):
        new_bool: ast.boolop = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        names = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        description = f"'{names[0]}' -> '{names[1]}' in {_code(node, source)}"
        found.append((description, ast.BoolOp(op=new_bool, values=node.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
        symbol = "not" if isinstance(node.op, ast.Not) else "-"
        found.append((f"'{symbol}' removed in {_code(node, source)}", node.operand))
    elif isinstance(node, ast.Constant):
        for description, value in _constant_changes(node.value):
            found.append((description, ast.Constant(value)))
    elif isinstance(node, ast.JoinedStr):
        found.append(("f-string -> ''", ast.Constant("")))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        swapped = _CALL_SWAPS.get(node.func.id)
        if swapped is not None:
            call = ast.Call(
                func=ast.Name(swapped, ast.Load()), args=node.args, keywords=node.keywords
            )
            found.append((f"{node.func.id}() -> {swapped}() in {_code(node, source)}", call))
    elif isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            description = f"return value {_code(node.value, source)} -> None"
            found.append((description, ast.Return(ast.Constant(None))))
    elif isinstance(node, ast.Raise):
        found.append(("raise removed", ast.Pass()))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        found.append((f"call to {ast.unparse(node.value.func)}() removed", ast.Pass()))
    elif (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Await)
        and isinstance(node.value.value, ast.Call)
    ):
        # The store's steps are awaited calls (`await tx.execute("raise_epoch_floor", ...)`):
        # named with their arguments, which say which step it is.
        found.append((f"awaited call {_code(node.value.value, source)} removed", ast.Pass()))
    return found


def _is_plain_condition(node: ast.AST) -> bool:
    """A truth test that no other mutant already negates (`if x:`, not `if a < b:`)."""
    if isinstance(node, ast.Compare | ast.BoolOp):
        return False
    return not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))


@dataclass
class _Site:
    parent: ast.AST
    field: str
    index: int | None
    replacement: ast.AST
    description: str
    line: int

    def put(self, node: ast.AST) -> None:
        if self.index is None:
            setattr(self.parent, self.field, node)
        else:
            getattr(self.parent, self.field)[self.index] = node


def _slots(node: ast.AST) -> Iterator[tuple[str, int | None, ast.AST]]:
    """The children of `node` worth mutating, with where each sits."""
    for field, value in ast.iter_fields(node):
        # Annotations are not evaluated (PEP 563) and decorators declare rather than decide.
        if field in ("annotation", "returns", "decorator_list", "format_spec"):
            continue
        # An f-string's literal parts are mutated as one (the whole f-string -> '').
        if isinstance(node, ast.JoinedStr):
            continue
        if isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, ast.AST):
                    yield field, index, item
        elif isinstance(value, ast.AST):
            yield field, None, value
    if isinstance(node, ast.JoinedStr):
        for index, part in enumerate(node.values):
            if isinstance(part, ast.FormattedValue):
                yield "values", index, part


def _find_sites(parent: ast.AST, source: str, sites: list[_Site]) -> None:
    for field, index, child in _slots(parent):
        # Docstrings and bare constants do nothing; asserts only narrow types here.
        if isinstance(child, ast.Assert):
            continue
        if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
            continue
        line = getattr(child, "lineno", getattr(parent, "lineno", 0))
        for description, replacement in _candidates(child, source):
            sites.append(_Site(parent, field, index, replacement, description, line))
        is_test = field == "test" and isinstance(parent, ast.If | ast.IfExp | ast.While)
        is_test = is_test or (field == "ifs" and isinstance(parent, ast.comprehension))
        if is_test and isinstance(child, ast.expr) and _is_plain_condition(child):
            negated = ast.UnaryOp(ast.Not(), child)
            description = f"condition {_code(child, source)} negated"
            sites.append(_Site(parent, field, index, negated, description, line))
        _find_sites(child, source, sites)


def generate_mutants(module: str, source: str) -> list[Mutant]:
    """Every distinct mutant of `source`, in source order."""
    tree = ast.parse(source)
    sites: list[_Site] = []
    _find_sites(tree, source, sites)
    seen = {ast.unparse(tree)}
    mutants = []
    for site in sorted(sites, key=lambda s: s.line):
        original = getattr(site.parent, site.field)
        if site.index is not None:
            original = original[site.index]
        site.put(site.replacement)
        try:
            mutated = ast.unparse(tree)
        finally:
            site.put(original)
        if mutated in seen:  # same program as the original or as an earlier mutant
            continue
        seen.add(mutated)
        compile(mutated, module, "exec")
        mutants.append(Mutant(module, site.line, site.description, mutated))
    return mutants


# --- running the tests against each mutant ----------------------------------------------

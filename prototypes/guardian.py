"""The PersistenceGuardian: a static audit of method source before it is compiled or run.

It walks the AST once, collects *every* finding, and raises one ``AuditRejected`` that lists
them all, so the whole list can go back to the model that wrote the code. Two policies:

**Safety.** Only AST node types on an allow-list pass; a node type the guardian does not know
(new syntax in a later Python, ``match``, ``with``, classes, generators, ``async``) is rejected,
never ignored. A method is one top-level ``def SELECTOR(self, ...)`` (plus optional imports of
allow-listed modules and a docstring): nothing else may run when the method is loaded, so
decorators and non-literal default values are refused. No name or attribute may start with
``_``; frame, traceback, generator and coroutine internals, ``mro`` and ``str.format`` are
refused; builtins that reach outside the sandbox (``eval``, ``open``, ``type``, ``setattr``…)
are refused; ``except:``/``except BaseException`` and ``finally`` are refused because they
could swallow or outlive the sandbox's time limit.

**The persistence covenant.** A slot assignment ``self.x = value`` marks the receiver changed
(``UvmObject.__setattr__``). A change *inside* a container held in a slot does not. The rule:
a method that changes a container of one of ``self``'s slots in place — item assignment or
deletion, augmented assignment of an item, or a call of a mutating method such as ``append``,
``update``, ``pop`` — directly (``self.items.append(x)``) or through a local name bound to the
slot (``items = self.items``), must assign that slot again (``self.items = items``) later in
the same method. The trial run checks the same covenant dynamically (see ``kernel``).

This is an audit, not a security boundary: ``sandbox`` enforces the policy at run time.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from batos import metrics
from batos.errors import AuditRejected

#: Longest method source accepted, in characters.
MAX_SOURCE_CHARS = 20_000
#: Modules a method may import; each is exposed as a curated, read-only namespace.
ALLOWED_IMPORTS: dict[str, frozenset[str]] = {
    "math": frozenset(
        "pi e tau inf nan sqrt isqrt floor ceil trunc fabs gcd lcm log log2 log10 exp "
        "sin cos tan asin acos atan atan2 hypot degrees radians isclose isfinite isinf "
        "isnan copysign fsum dist fmod modf factorial comb perm".split()
    ),
    "statistics": frozenset("mean median mode fmean pstdev stdev pvariance variance".split()),
    "json": frozenset(["dumps", "loads"]),
    "string": frozenset(
        "ascii_letters ascii_lowercase ascii_uppercase digits punctuation whitespace".split()
    ),
    "collections": frozenset(["Counter", "OrderedDict", "defaultdict", "deque"]),
    "itertools": frozenset(
        "accumulate chain combinations groupby islice pairwise permutations product "
        "zip_longest".split()
    ),
    "functools": frozenset(["reduce"]),
    "datetime": frozenset(["date", "datetime", "timedelta"]),
}
#: Builtins a method may name (the sandbox provides exactly these).
ALLOWED_BUILTINS = frozenset(
    "None True False abs all any bool chr dict divmod enumerate filter float frozenset "
    "getattr hasattr hex bin oct int isinstance iter len list map max min next ord pow "
    "print range repr reversed round set slice sorted str sum tuple zip callable "
    "ArithmeticError AssertionError AttributeError Exception IndexError KeyError LookupError "
    "NotImplementedError OverflowError RuntimeError StopIteration TypeError ValueError "
    "ZeroDivisionError".split()
)
#: Names that would leave the sandbox; refused even as local variables, to keep intent clear.
DENIED_NAMES = frozenset(
    "eval exec compile open input breakpoint globals locals vars dir type object super "
    "setattr delattr memoryview bytearray bytes classmethod staticmethod property help "
    "exit quit copyright credits license BaseException SystemExit KeyboardInterrupt "
    "GeneratorExit format".split()
)
#: Attributes refused on any object: interpreter internals and format-string traversal.
DENIED_ATTRIBUTES = frozenset(
    "tb_frame tb_next f_back f_builtins f_code f_generator f_globals f_locals f_trace "
    "co_code gi_frame gi_code gi_yieldfrom cr_await cr_frame cr_code cr_origin ag_await "
    "ag_frame ag_code mro format format_map func_globals func_code im_func im_self "
    "subclasses".split()
)
#: Methods of list/dict/set that change the container they are called on.
MUTATING_METHODS = frozenset(
    "append extend insert pop remove clear update setdefault popitem add discard sort "
    "reverse difference_update intersection_update symmetric_difference_update".split()
)

#: Builtins whose attribute-name argument is checked, so they may only be called by name.
_CHECKED_CALLS = frozenset({"getattr", "hasattr"})

# Node types a method may contain; anything else is a finding.
_ALLOWED_NODES: tuple[type[ast.AST], ...] = (
    ast.Module,
    ast.FunctionDef,
    ast.arguments,
    ast.arg,
    ast.Return,
    ast.Delete,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.For,
    ast.While,
    ast.If,
    ast.Raise,
    ast.Try,
    ast.ExceptHandler,
    ast.Assert,
    ast.Import,
    ast.ImportFrom,
    ast.alias,
    ast.Expr,
    ast.Pass,
    ast.Break,
    ast.Continue,
    ast.BoolOp,
    ast.NamedExpr,
    ast.BinOp,
    ast.UnaryOp,
    ast.Lambda,
    ast.IfExp,
    ast.Dict,
    ast.Set,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.comprehension,
    ast.Compare,
    ast.Call,
    ast.keyword,
    ast.FormattedValue,
    ast.JoinedStr,
    ast.Constant,
    ast.Attribute,
    ast.Subscript,
    ast.Starred,
    ast.Name,
    ast.List,
    ast.Tuple,
    ast.Slice,
    ast.Load,
    ast.Store,
    ast.Del,
    ast.And,
    ast.Or,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.Mod,
    ast.Pow,
    ast.LShift,
    ast.RShift,
    ast.BitOr,
    ast.BitXor,
    ast.BitAnd,
    ast.FloorDiv,
    ast.Invert,
    ast.Not,
    ast.UAdd,
    ast.USub,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Is,
    ast.IsNot,
    ast.In,
    ast.NotIn,
)


@dataclass
class AuditReport:
    """What the guardian concluded about one method source."""

    selector: str
    findings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "rejected" if self.findings else "approved"

    def as_dict(self) -> dict[str, object]:
        return {"verdict": self.verdict, "findings": list(self.findings)}


class PersistenceGuardian(ast.NodeVisitor):
    """Collects every safety and covenant finding in one method's source."""

    def __init__(self, selector: str) -> None:
        self.selector = selector
        self.findings: list[str] = []
        self._function_depth = 0
        self._modules: dict[str, str] = {}  # local name -> allow-listed module imported
        self._called: set[int] = set()  # getattr/hasattr names in call position

    # -- entry ----------------------------------------------------------------------------

    def audit(self, source: str) -> AuditReport:
        report = AuditReport(self.selector, self.findings)
        if not self.selector.isidentifier() or self.selector.startswith("_"):
            self._add(None, f"selector {self.selector!r} must be a public identifier")
        if len(source) > MAX_SOURCE_CHARS:
            self._add(None, f"source is {len(source)} characters; the limit is {MAX_SOURCE_CHARS}")
            return report
        try:
            tree = ast.parse(source, mode="exec")
        except SyntaxError as exc:
            # a NUL byte is a SyntaxError with no line ("source code cannot contain null bytes")
            where = f"line {exc.lineno}: " if exc.lineno is not None else ""
            self._add(None, f"{where}syntax error: {exc.msg}")
            return report
        except (ValueError, RecursionError, MemoryError) as exc:
            self._add(None, f"source cannot be parsed: {type(exc).__name__}")
            return report
        try:
            self._check_module(tree)
            self.visit(tree)
        except RecursionError:
            # The visitor recurses once per level: a 600-term 'a+a+…' is deeper than the
            # interpreter's stack allows. Such code is refused, never a crash of the audit.
            self._add(
                None,
                "the code is nested too deeply to audit (a very long expression or deeply "
                "nested blocks): split it into shorter statements",
            )
        return report

    def _add(self, node: ast.AST | None, message: str) -> None:
        where = f"line {node.lineno}: " if node is not None and hasattr(node, "lineno") else ""
        finding = where + message
        if finding not in self.findings:
            self.findings.append(finding)

    # -- shape of the module --------------------------------------------------------------

    def _check_module(self, tree: ast.Module) -> None:
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.Import, ast.ImportFrom)):
                continue
            if (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                continue
            self._add(
                node,
                f"{type(node).__name__} outside the function: a method's source is "
                f"one 'def {self.selector}(self, ...)' (imports allowed), because code "
                "outside it would run when the method is loaded",
            )
        if [d.name for d in defs] != [self.selector]:
            names = ", ".join(d.name for d in defs) or "none"
            self._add(
                None,
                f"define exactly one top-level function named {self.selector!r} (found: {names})",
            )
            return
        fn = defs[0]
        first = (fn.args.posonlyargs + fn.args.args)[:1]
        if not first or first[0].arg != "self":
            self._add(fn, f"the first parameter of {self.selector!r} must be 'self'")
        self._check_covenant(fn)

    # -- safety policy --------------------------------------------------------------------

    def generic_visit(self, node: ast.AST) -> None:
        if not isinstance(node, _ALLOWED_NODES):
            self._add(node, f"{type(node).__name__} is not allowed in a method")
            return
        super().generic_visit(node)

    def _check_signature(self, node: ast.FunctionDef | ast.Lambda) -> None:
        args = node.args
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            if not _is_literal(default):
                self._add(
                    default, "default values must be literals (they run when the method is defined)"
                )
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                self._check_name(arg, arg.arg)
                if arg.annotation is not None and not _is_type_hint(arg.annotation):
                    self._add(
                        arg,
                        "parameter annotations may only name types, like 'int' or "
                        "'list[str]' (they run when the method is defined)",
                    )

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.decorator_list:
            self._add(node, "decorators are not allowed (they run when the method is defined)")
        if node.returns is not None and not _is_type_hint(node.returns):
            self._add(
                node,
                "return annotations may only name types, like 'int' or "
                "'dict[str, int]' (they run when the method is defined)",
            )
        self._check_name(node, node.name)
        self._check_signature(node)
        self._function_depth += 1
        for statement in node.body:
            self.visit(statement)
        self._function_depth -= 1

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._check_signature(node)
        self.visit(node.body)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._add(node, "annotated assignments are not allowed; write 'name = value'")

    def visit_Name(self, node: ast.Name) -> None:
        self._check_name(node, node.id)
        if node.id in _CHECKED_CALLS and id(node) not in self._called:
            # 'g = getattr' then 'g(self, "_p_jar")' would pass the literal-name check below.
            self._add(
                node,
                f"{node.id} may only be called directly, as {node.id}(obj, 'name'), "
                "not passed around or renamed",
            )

    def _check_name(self, node: ast.AST, name: str) -> None:
        if name.startswith("_") and name != "_":  # a lone '_' is the usual throwaway name
            self._add(node, f"name {name!r} starts with '_'; private names are not reachable")
        elif name in DENIED_NAMES:
            hint = " (use an f-string)" if name == "format" else ""
            self._add(node, f"{name!r} is not available in the sandbox{hint}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            self._add(
                node,
                f"attribute {node.attr!r} starts with '_'; private and dunder "
                "attributes are not reachable",
            )
        elif node.attr in DENIED_ATTRIBUTES:
            hint = "; use an f-string instead" if node.attr.startswith("format") else ""
            self._add(node, f"attribute {node.attr!r} is not allowed{hint}")
        elif isinstance(node.value, ast.Name) and node.value.id in self._modules:
            module = self._modules[node.value.id]
            if node.attr not in ALLOWED_IMPORTS[module]:
                self._add(
                    node,
                    f"{module}.{node.attr} is not available; use one of "
                    f"{', '.join(sorted(ALLOWED_IMPORTS[module]))}",
                )
        self.visit(node.value)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, bytes):
            self._add(node, "bytes literals are not allowed")

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in _CHECKED_CALLS:
            self._called.add(id(node.func))
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                self._add(node, f"{node.func.id}() needs a literal attribute name")
            elif name.value.startswith("_") or name.value in DENIED_ATTRIBUTES:
                self._add(node, f"{node.func.id}() of {name.value!r} is not allowed")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS:
                self._add(
                    node,
                    f"import of {alias.name!r} is not allowed; allowed modules: "
                    f"{', '.join(sorted(ALLOWED_IMPORTS))}",
                )
            else:
                self._modules[alias.asname or alias.name] = alias.name
            if alias.asname:
                self._check_name(node, alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or module not in ALLOWED_IMPORTS:
            self._add(
                node,
                f"import from {module!r} is not allowed; allowed modules: "
                f"{', '.join(sorted(ALLOWED_IMPORTS))}",
            )
            return
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS[module]:
                self._add(
                    node,
                    f"{module}.{alias.name} is not available; use one of "
                    f"{', '.join(sorted(ALLOWED_IMPORTS[module]))}",
                )
            self._check_name(node, alias.asname or alias.name)

    def visit_Try(self, node: ast.Try) -> None:
        if node.finalbody:
            self._add(node, "'finally' is not allowed (it could outlive the time limit)")
        for handler in node.handlers:
            caught = handler.type
            if caught is None:
                self._add(
                    handler,
                    "bare 'except:' is not allowed; catch a specific error such "
                    "as 'except ValueError:'",
                )
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._check_name(node, node.name)
        self.generic_visit(node)

    # -- the persistence covenant -----------------------------------------------------------

    def _check_covenant(self, fn: ast.FunctionDef) -> None:
        reassigned_after: dict[str, int] = {}
        for node in _walk_in_order(fn):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AugAssign):
                targets = [node.target]
            for target in targets:
                slot = _self_slot(target)
                if slot is not None:
                    reassigned_after[slot] = node.lineno  # type: ignore[attr-defined]  # an assignment
        mutated: dict[str, ast.AST] = {}
        for change in in_place_slot_changes(fn):
            mutated[change.slot] = change.node
        for slot, node in mutated.items():
            if reassigned_after.get(slot, -1) < getattr(node, "lineno", 0):
                self._add(
                    node,
                    f"persistence covenant: self.{slot} is changed in place but "
                    f"never assigned again, so the change would be lost on reload; "
                    f"change a copy and assign it back: '{slot} = list(self.{slot})' for "
                    f"a list or '{slot} = dict(self.{slot})' for a dict, change '{slot}', "
                    f"then 'self.{slot} = {slot}'",
                )


@dataclass(frozen=True)
class InPlaceChange:
    """One place where a method changes a slot's container in place."""

    slot: str
    #: The node that changes it: the ``c[k] = v`` statement or the ``c.append(x)`` call.
    node: ast.AST
    #: How the code names the container there: ``self.slot`` or a local bound to it.
    via: str


def in_place_slot_changes(fn: ast.FunctionDef) -> list[InPlaceChange]:
    """Every in-place change of a slot's container in ``fn``, in source order: through
    ``self.slot`` or through a local name last bound to ``self.slot``.

    The covenant's audit and the kernel's rewrite of such changes both read this one walk,
    so what the audit reports is exactly what the rewrite can mend.
    """
    aliases: dict[str, str] = {}
    changes: list[InPlaceChange] = []
    for node in _walk_in_order(fn):
        for target in _in_place_targets(node):
            slot = _self_slot(target)
            if slot is not None:
                changes.append(InPlaceChange(slot, node, f"self.{slot}"))
            elif isinstance(target, ast.Name) and target.id in aliases:
                changes.append(InPlaceChange(aliases[target.id], node, target.id))
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    source_slot = _self_slot(node.value)
                    if source_slot is not None:
                        aliases[target.id] = source_slot
                    else:
                        aliases.pop(target.id, None)
    return changes


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return not isinstance(node.value, bytes)
    if isinstance(node, ast.Tuple):
        return all(_is_literal(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _is_literal(node.operand)
    return False


def _is_type_hint(node: ast.AST) -> bool:
    """A name, a string, None, ``X[Y, ...]`` or ``X | Y`` of those: nothing that calls."""
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, str)
    if isinstance(node, ast.Subscript):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return _is_type_hint(node.value) and all(_is_type_hint(e) for e in inner)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_type_hint(node.left) and _is_type_hint(node.right)
    return False


def _self_slot(node: ast.AST) -> str | None:
    """'x' for ``self.x``, else None."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def _in_place_targets(node: ast.AST) -> list[ast.AST]:
    """The containers ``node`` changes in place (the ``c`` of ``c[k] = v``, ``c.append()``)."""
    found: list[ast.AST] = []
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = node.targets
        for target in targets:
            if isinstance(target, ast.Subscript):
                found.append(target.value)
    elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript):
        found.append(node.target.value)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in MUTATING_METHODS
    ):
        found.append(node.func.value)
    return found


def _walk_in_order(fn: ast.FunctionDef) -> list[ast.AST]:
    """Every node of ``fn``'s body in source order (line, column)."""
    nodes = [n for n in ast.walk(fn) if hasattr(n, "lineno") and n is not fn]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))  # type: ignore[attr-defined]


def audit(selector: str, source: str) -> AuditReport:
    """The guardian's report on ``source`` as the method ``selector`` (never raises)."""
    return PersistenceGuardian(selector).audit(source)


def check(selector: str, source: str) -> AuditReport:
    """Audit ``source``; raise ``AuditRejected`` listing every finding if there is any."""
    report = audit(selector, source)
    metrics.count("guardian_verdicts", verdict="rejected" if report.findings else "approved")
    if report.findings:
        raise AuditRejected(
            f"the PersistenceGuardian rejected method {selector!r} "
            f"({len(report.findings)} finding(s))",
            report.findings,
            hint="fix every finding listed and submit the method again",
        )
    return report

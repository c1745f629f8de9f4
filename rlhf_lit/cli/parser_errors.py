"""jsonargparse's error reports, read into one problem and told in one line.

jsonargparse reports a wrong value under ``--model`` as a tree: a failed Union of every type the
option accepts ("Does not validate against any of the Union subtypes"), with the stage's own error
several levels down ("Problem with given class_path 'rlhf_lit.stages.PPOModule': Group 'ppo' does
not accept option 'epochz'"). :func:`read_report` turns the text into a tree of :class:`Node`,
:func:`find_problem` walks it to the one alternative that says what is wrong (a class that was
chosen beats "Expected a <class 'NoneType'>") and returns a :class:`ParserProblem`: its kind, the
full key path the user can type (``model.init_args.ppo.epochz``) and the cause.
:func:`describe` tells it, with the nearest valid option (:func:`nearest_option`) or class, and
where it was given (a command-line option or a config file's line, :mod:`rlhf_lit.cli.option_sources`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rlhf_lit.callable_specs import import_class
from rlhf_lit.cli.option_names import known_subclasses, nearest_option
from rlhf_lit.cli.option_sources import Where, config_named, locate

ProblemKind = Literal["unknown_key", "unknown_class", "bad_value", "other"]


@dataclass
class Node:
    """One line of a jsonargparse report (``- `` item marks removed) and the lines indented under it."""

    text: str
    children: list[Node] = field(default_factory=list)


def read_report(message: str) -> list[Node]:
    """The report's lines as a tree, by indentation (a ``- item``'s continuation lines are its children)."""
    roots: list[Node] = []
    stack: list[tuple[int, Node]] = []
    for line in message.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        node = Node(line.strip().removeprefix("- ").strip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        (stack[-1][1].children if stack else roots).append(node)
        stack.append((indent, node))
    return roots


@dataclass(frozen=True)
class ParserProblem:
    """What is wrong, where in the config: ``path`` is the full key path (``("model", "init_args", "ppo", "epochz")``).

    ``scope`` is the part of ``path`` above the options of ``scope_class`` (the stage, data module,
    logger or dataclass whose options the key is looked up among; None: the command's own options).
    ``value`` is the class path of an ``unknown_class``, the value given for a ``bad_value``;
    ``expected`` is the type a ``bad_value`` needs, or the base class an ``unknown_class`` must derive from.
    """

    kind: ProblemKind
    path: tuple[str, ...]
    cause: str
    scope: tuple[str, ...] = ()
    scope_class: str | None = None
    value: str | None = None
    expected: str | None = None


_PARSER_KEY = re.compile(r'Parser key "([^"]+)":\s*(.*)')
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)':\s*(.*)")
_UNION = "Does not validate against any of the Union subtypes"
_IMPORT_FAILURE = re.compile(
    r"has no attribute|No module named|Expected a dot import path|not a subclass|Unable to import"
)
_UNINFORMATIVE = re.compile(r"Expected a path but |Expected a <class '(NoneType|bool)'>|Given value|Subtypes:|Errors:")


def _is_plain_group(class_path: str) -> bool:
    """Whether a class's options sit directly under its key (a dataclass), not under ``init_args``."""
    return dataclasses.is_dataclass(import_class(class_path))


def _leaf(
    text: str, path: tuple[str, ...], scope: tuple[str, ...], scope_class: str | None
) -> tuple[int, ParserProblem]:
    """A cause line, scored by how much it tells the user (0: an alternative nobody chose)."""
    unknown = (
        re.match(r"unrecognized arguments: --([^\s=]+)", text)
        or re.match(r"Option '([^']+)' is not accepted", text)
        or re.match(r"Group '([^']+)' does not accept option '([^']+)'", text)
    )
    if unknown:
        key = tuple(".".join(unknown.groups()).split("."))
        return 3, ParserProblem("unknown_key", path + key, text, scope, scope_class)
    dotted = re.match(r"Expected a dot import path string: (\S+)", text)
    if dotted:
        return 3, ParserProblem("unknown_class", path, text, scope, scope_class, value=dotted.group(1))
    expected = re.match(r"(?:Expected an? |Not a valid subclass of )(.+?)\. Got value: (.*)", text, re.S)
    if expected and not _UNINFORMATIVE.match(text):
        value, wanted = expected.group(2).strip(), expected.group(1)
        return 2, ParserProblem("bad_value", path, text, scope, scope_class, value, wanted)
    return (0 if _UNINFORMATIVE.match(text) else 1), ParserProblem("other", path, text, scope, scope_class)


def _base_class(subtypes_line: str) -> str | None:
    """The first class a Union accepts (``Subtypes: [<class 'a.B'>, ...]`` or ``[list[a.B], ...]``)."""
    match = re.search(r"<class '([\w.]+)'>|\[([\w.]+)\]", subtypes_line)
    return (match.group(1) or match.group(2)) if match else None


def _best(nodes: list[Node], path, scope, scope_class, base=None) -> tuple[int, ParserProblem | None]:
    """The most telling problem among sibling nodes (a Union's alternatives are the children of ``Errors:``)."""
    union = subtypes = given = None
    if any(n.text.startswith(_UNION) for n in nodes):
        subtypes = next((n.text.removeprefix("Subtypes:").strip() for n in nodes if n.text.startswith("Subtypes:")), "")
        given = next(
            (n.text.removeprefix("Given value:").strip() for n in nodes if n.text.startswith("Given value:")), None
        )
        base, union = _base_class(subtypes) or base, True
        errors = next((n.children for n in nodes if n.text.startswith("Errors:")), [])
        others = [n for n in nodes if not n.text.startswith((_UNION, "Subtypes:", "Errors:", "Given value"))]
        nodes = errors + others
    best: tuple[int, ParserProblem | None] = (-1, None)
    for node in nodes:
        found = _explain(node, path, scope, scope_class, base)
        if found[0] > best[0]:
            best = found
    chosen = any(_CLASS_PATH.match(n.text) for n in nodes)
    if union and not chosen and best[0] <= 1 and given is not None:  # plain types: "expected int or null, got 1.5"
        problem = ParserProblem("bad_value", path, "", scope, scope_class, given, subtypes.strip("[]"))
        return 2, problem
    return best


def _explain(node: Node, path, scope, scope_class, base) -> tuple[int, ParserProblem | None]:
    """The problem one node (and what is under it) reports."""
    key = _PARSER_KEY.match(node.text)
    if key:
        inner = path + tuple(key.group(1).split("."))
        if key.group(2):
            return _best([Node(key.group(2), node.children)], inner, scope, scope_class, base)
        return _best(node.children, inner, scope, scope_class, base)
    chosen = _CLASS_PATH.match(node.text)
    if chosen:
        class_path, rest = chosen.groups()
        content = [Node(rest, node.children)] if rest else node.children
        if any(_IMPORT_FAILURE.search(n.text) for n in content):
            cause = content[0].text if content else node.text
            return 3, ParserProblem("unknown_class", path, cause, scope, scope_class, value=class_path, expected=base)
        inner = path if _is_plain_group(class_path) else (*path, "init_args")
        return _best(content, inner, inner, class_path)
    if node.children and not node.text.startswith(_UNION):
        score, problem = _best(node.children, path, scope, scope_class, base)
        if score >= 2:
            return score, problem
    score, problem = _leaf(node.text, path, scope, scope_class)
    if problem.kind == "unknown_class":
        problem = dataclasses.replace(problem, expected=base)
    return score, problem


def find_problem(message: str) -> ParserProblem:
    """The one problem a jsonargparse error message reports (kind ``other`` with its first line when unknown)."""
    score, problem = _best(read_report(message), (), (), None)
    if problem is None or score < 1 and problem.kind == "other":
        first = next((line.strip() for line in message.splitlines() if line.strip()), message)
        return ParserProblem("other", (), first)
    return problem


# ------------------------------------------------------------------------------------ the one line


def _top_level_parts(text: str) -> list[str]:
    """``a, list[b, c], d`` -> ``["a", "list[b, c]", "d"]``: a Union's subtypes as jsonargparse lists them."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "[(") - (char in "])")
        if char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()] if text.strip() else parts


def readable_type(expected: str) -> str:
    """``<class 'int'>`` -> ``int``, ``typing.Literal['a', 'b']`` -> ``one of 'a', 'b'``; a Union's subtypes
    (``<class 'int'>, <class 'NoneType'>``) -> ``int or null``."""
    parts = _top_level_parts(expected)
    if len(parts) > 1:
        return " or ".join(readable_type(part) for part in parts)
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", expected.strip())
    if literal:
        return f"one of {literal.group(1)}"
    text = re.sub(r"<class '(?:[\w.]*\.)?(\w+)'>", r"\1", expected).replace("typing.", "")
    if text.startswith("mapping "):  # "Expected a mapping of X's options": the article was read as the pattern's
        return f"a {text}"
    return "null" if text == "NoneType" else re.sub(r"\b(?:[a-z_]\w*\.)+(?=[A-Z])", "", text)  # a.b.Logger -> Logger


def _shown(text: str | None) -> str:
    """A given value as typed (quoted only when it would not show: empty or padded)."""
    text = text or ""
    return text if text.strip() == text and text else repr(text)


def describe(
    problem: ParserProblem, where: Where | None = None, options_in: Callable[[str | None], list[str]] | None = None
) -> str:
    """One line: where the key was given, what is wrong with it, and the nearest valid choice.

    ``where`` None or a plain option: ``option --model.init_args.ppo.epochs: ...``; a config file:
    ``ppo.yaml, line 3: model.init_args.ppo.epochs: ...``; an option given a YAML list or mapping:
    ``option --model.init_args.reward.sources: [1].weight: ...``. ``options_in(scope_class)`` lists the
    keys a class takes (None: the command's own options), among which the suggestion is looked up.
    """
    key = ".".join(problem.path)
    if where is not None and where.file:
        head, shown = f"{where.file}{f', line {where.line}' if where.line else ''}: ", where.key or key
    elif where is not None and where.option and where.key:
        head, shown = f"option --{where.option}: ", where.key
    else:
        head, shown = "", None
    if problem.kind == "unknown_key":
        relative = problem.path[len(problem.scope) :]
        nearest = nearest_option(relative, options_in(problem.scope_class)) if options_in else None
        if shown is not None:  # the wrong part (the key's last segments) replaced, list indexes kept
            mean = ".".join([*shown.split(".")[: -len(relative) or None], nearest]) if nearest else None
            return f"{head}unknown key {shown}" + (f"; did you mean {mean}?" if mean else "")
        scope = ".".join(problem.scope)
        if nearest:
            return f"unknown option --{key}; did you mean --{scope + '.' if scope else ''}{nearest}?"
        owner = problem.scope_class.rsplit(".", 1)[-1] if problem.scope_class else None
        owner = f" ({owner} takes no {'.'.join(relative)})" if owner else ""
        return f"unknown option --{key}{owner}"
    head = f"{head}{shown}:" if shown is not None else f"option --{key}:"
    if problem.kind == "unknown_class":
        choices = known_subclasses(problem.expected, problem.value)
        short = {c.rsplit(".", 1)[-1]: c for c in choices}
        given = problem.value or "?"
        near = difflib.get_close_matches(given.rsplit(".", 1)[-1], list(short), n=1, cutoff=0.6)
        text = f"{head} no class {given}" + (f"; did you mean {short[near[0]]}?" if near else "")
        return text + (f" (choices: {', '.join(choices)})" if choices else " (a class path or a mapping of arguments)")
    if problem.kind == "bad_value":
        expected = readable_type(problem.expected or "")
        choices = re.findall(r"'([^']*)'", expected) if expected.startswith("one of") else []
        near = difflib.get_close_matches(problem.value or "", choices, n=1, cutoff=0.6)
        text = f"{head} expected {expected}, got {_shown(problem.value)}"
        return text + (f"; did you mean {near[0]!r}?" if near else "")
    cause = problem.cause.splitlines()[0].strip()
    return f"{head} {cause}" if problem.path else cause


def condense_parser_error(
    message: str, given_args: Sequence[str] = (), options_in: Callable[[str | None], list[str]] | None = None
) -> str:
    """One line for a jsonargparse error: the key (where it was given), what is wrong, the nearest valid choice.

    ``given_args`` is the command line, where the key is looked for (:func:`locate`: an option or a
    config file's line); ``options_in(class_path)`` lists the keys a class takes (None: the command's
    own), for the suggestion. A YAML syntax error (named by :mod:`rlhf_lit.cli.jsonargparse_fixes`)
    gets the config's path as given.
    """
    syntax = re.match(r"Problems parsing config: (.*)", message.strip())
    if syntax:
        return f"--config {config_named(syntax.group(1), given_args)}"
    problem = find_problem(message)
    where = None
    if problem.kind == "unknown_class":  # the class_path line of a config file (or the option that names it)
        where = locate((*problem.path, "class_path"), given_args, problem.value)
    if where is None and problem.path:
        where = locate(problem.path, given_args, problem.value)
    return describe(problem, where, options_in)

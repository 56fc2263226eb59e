"""Parse IR text back into a Graph: print -> parse -> print is the identity."""
from __future__ import annotations

import itertools
import json
import re

import numpy as np

from bendc.errors import SourceLoc
from bendc.ir.graph import Graph
from bendc.ir.types import TensorType


class ParseError(ValueError):
    """IR text that does not parse; names the line."""


_NUMBER = re.compile(r"-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)")
_WORDS = {"True": True, "False": False, "None": None}


def parse_value(text: str, pos: int = 0):
    """Parse one attribute value starting at ``pos``; returns (value, new pos)."""
    while text[pos] == " ":
        pos += 1
    char = text[pos]
    if char == "(":
        items = []
        pos += 1
        while True:
            while text[pos] == " ":
                pos += 1
            if text[pos] == ")":
                return tuple(items), pos + 1
            item, pos = parse_value(text, pos)
            items.append(item)
            while text[pos] == " ":
                pos += 1
            if text[pos] == ",":
                pos += 1
    if char == '"':
        end = pos + 1
        while text[end] != '"':
            end += 2 if text[end] == "\\" else 1
        return json.loads(text[pos:end + 1]), end + 1
    for word, value in _WORDS.items():
        if text.startswith(word, pos):
            return value, pos + len(word)
    match = _NUMBER.match(text, pos)
    if not match:
        raise ParseError(f"bad attribute value at {text[pos:]!r}")
    token = match.group(0)
    if re.fullmatch(r"-?\d+", token):
        return int(token), match.end()
    return float(np.float32(float(token))), match.end()


def parse_attrs(text: str) -> dict:
    """``perm=(1,0), keepdim=False`` -> dict."""
    attrs = {}
    pos = 0
    while pos < len(text):
        match = re.compile(r"\s*(\w+)=").match(text, pos)
        if not match:
            raise ParseError(f"bad attributes {text!r}")
        value, pos = parse_value(text, match.end())
        attrs[match.group(1)] = value
        while pos < len(text) and text[pos] in ", ":
            pos += 1
    return attrs


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _matching_bracket(text: str, start: int) -> int:
    depth, in_string, escaped = 0, False, False
    for pos in range(start, len(text)):
        char = text[pos]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return pos
    raise ParseError(f"unbalanced brackets in {text!r}")


# Function names may be any non-space text without "(" (a lambda is "<lambda>").
_HEADER = re.compile(r"func @([^\s(]+)\((.*)\) -> \((.*)\) \{$")
# "[k3] " (the fused kernel), then "vjp of %3 (file.py:12)", "vjp of %3" or "file.py:12";
# file names may hold spaces.
_COMMENT_KERNEL = re.compile(r"\[k(\d+)\]\s*(.*)")
_COMMENT_VJP = re.compile(r"vjp of %(\d+)(?: \((.+):(\d+)\))?")
_COMMENT_LOC = re.compile(r"(.+):(\d+)")


def _parse_comment(comment: str) -> tuple[SourceLoc | None, int | None, int | None]:
    """(loc, vjp_of, kernel) from ``[k3] vjp of %12 (mlp.py:36)`` and its shorter forms."""
    comment = comment.strip()
    kernel = None
    match = _COMMENT_KERNEL.fullmatch(comment)
    if match:
        kernel, comment = int(match.group(1)), match.group(2).strip()
        if not comment:
            return None, None, kernel
    match = _COMMENT_VJP.fullmatch(comment)
    if match:
        vjp_of = int(match.group(1))
        loc = SourceLoc(match.group(2), int(match.group(3))) if match.group(2) else None
        return loc, vjp_of, kernel
    match = _COMMENT_LOC.fullmatch(comment)
    if not match:
        raise ParseError(f"bad comment {comment!r}")
    return SourceLoc(match.group(1), int(match.group(2))), None, kernel


def parse_graph(text: str) -> Graph:
    """Parse the text of one function; a ParseError names the offending line."""
    lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise ParseError("empty IR text: expected 'func @name(...) -> (...) {'")
    graph: Graph | None = None
    names: dict[str, int] = {}
    for number, stripped in lines:
        try:
            if graph is None:
                # parameters take the smallest ids the body leaves free: below their users' ids (a
                # lifted constant is made mid-trace), so the body prints back in the same order
                body = {int(m.group(1)) for _, line in lines if (m := re.match(r"%(\d+) = ", line))}
                graph = _parse_header(stripped, number, names, body)
                continue
            if stripped == "}":
                break
            if stripped.startswith("return"):
                operands = stripped[len("return"):].strip()
                graph.outputs = [_lookup(names, o, number) for o in _split_top(operands)]
                continue
            _parse_node(graph, names, stripped, number)
        except ParseError as error:
            if str(error).startswith("line "):
                raise
            raise ParseError(f"line {number}: {error}") from None
        except (ValueError, IndexError, KeyError, AssertionError) as error:
            raise ParseError(f"line {number}: {error or type(error).__name__} in {stripped!r}") from None
    return graph


def _parse_header(stripped: str, number: int, names: dict[str, int], body: set[int]) -> Graph:
    header = _HEADER.match(stripped)
    if not header:
        raise ParseError(f"line {number}: bad function header {stripped!r}")
    graph = Graph(header.group(1))
    free = (id for id in itertools.count() if id not in body)
    for param in _split_top(header.group(2)):
        match = re.fullmatch(r"%(\w+): (\S+)( leaf| const=([0-9a-f]+))?", param)
        if not match:
            raise ParseError(f"line {number}: bad parameter {param!r}")
        type = TensorType.parse(match.group(2))
        name = match.group(1)
        attrs = {"name": name, "leaf": match.group(3) == " leaf", "dtype": type.dtype, "shape": type.shape}
        if match.group(4) is not None:  # a lifted constant, named by the hash of its values
            attrs["const"] = match.group(4)
        node = graph.add("param", (), attrs, type, id=next(free))
        names[name] = node.id
    return graph


def _parse_node(graph: Graph, names: dict[str, int], stripped: str, number: int) -> None:
    match = re.match(r"%(\d+) = (\w+)", stripped)
    if not match:
        raise ParseError(f"line {number}: bad node {stripped!r}")
    id, op = int(match.group(1)), match.group(2)
    if id in graph:
        raise ParseError(f"line {number}: %{id} is defined twice")
    rest = stripped[match.end():]
    attrs = {}
    if rest.startswith("["):
        end = _matching_bracket(rest, 0)
        attrs = parse_attrs(rest[1:end])
        rest = rest[end + 1:]
    comment = ""
    if "#" in rest:
        rest, comment = rest.split("#", 1)
    operand_text, colon, type_text = rest.rpartition(":")
    if not colon:
        raise ParseError(f"line {number}: missing ': type' in {stripped!r}")
    inputs = [_lookup(names, o, number) for o in _split_top(operand_text)]
    loc, vjp_of, kernel = _parse_comment(comment) if comment.strip() else (None, None, None)
    type = TensorType.parse(type_text)
    graph.add(op, inputs, attrs, type, loc=loc, vjp_of=vjp_of, kernel=kernel, id=id)
    names[str(id)] = id


def _lookup(names: dict[str, int], operand: str, number: int) -> int:
    operand = operand.strip()
    if not operand.startswith("%") or operand[1:] not in names:
        raise ParseError(f"line {number}: undefined value {operand!r}")
    return names[operand[1:]]

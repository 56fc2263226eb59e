"""Parse IR text back into a Graph: print -> parse -> print is the identity."""
from __future__ import annotations

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
    depth, in_string = 0, False
    for pos in range(start, len(text)):
        char = text[pos]
        if in_string:
            in_string = char != '"' or text[pos - 1] == "\\"
        elif char == '"':
            in_string = True
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return pos
    raise ParseError(f"unbalanced brackets in {text!r}")


_HEADER = re.compile(r"func @(\w+)\((.*)\) -> \((.*)\) \{$")
_COMMENT = re.compile(r"(?:\[k(\d+)\])?\s*(?:vjp of %(\d+))?\s*\(?(?:([^\s()]+):(\d+))?\)?$")


def _parse_comment(comment: str) -> tuple[SourceLoc | None, int | None, int | None]:
    """(loc, vjp_of, kernel) from ``[k3] vjp of %12 (mlp.py:36)``."""
    match = _COMMENT.fullmatch(comment.strip())
    if not match:
        raise ParseError(f"bad comment {comment!r}")
    kernel = int(match.group(1)) if match.group(1) else None
    vjp_of = int(match.group(2)) if match.group(2) else None
    loc = SourceLoc(match.group(3), int(match.group(4))) if match.group(3) else None
    return loc, vjp_of, kernel


def parse_graph(text: str) -> Graph:
    """Parse the text of one function."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    header = _HEADER.match(lines[0].strip())
    if not header:
        raise ParseError(f"line 1: bad function header {lines[0]!r}")
    graph = Graph(header.group(1))
    names: dict[str, int] = {}
    for index, param in enumerate(_split_top(header.group(2))):
        match = re.fullmatch(r"%(\w+): (\S+)( leaf)?", param)
        if not match:
            raise ParseError(f"line 1: bad parameter {param!r}")
        type = TensorType.parse(match.group(2))
        name = match.group(1)
        node = graph.add("param", (), {"name": name, "leaf": bool(match.group(3)),
                                       "dtype": type.dtype, "shape": type.shape}, type)
        names[name] = node.id
    for number, line in enumerate(lines[1:], start=2):
        stripped = line.strip()
        if stripped == "}":
            break
        if stripped.startswith("return"):
            operands = stripped[len("return"):].strip()
            graph.outputs = [_lookup(names, o, number) for o in _split_top(operands)]
            continue
        match = re.match(r"%(\d+) = (\w+)", stripped)
        if not match:
            raise ParseError(f"line {number}: bad node {stripped!r}")
        id, op = int(match.group(1)), match.group(2)
        rest = stripped[match.end():]
        attrs = {}
        if rest.startswith("["):
            end = _matching_bracket(rest, 0)
            attrs = parse_attrs(rest[1:end])
            rest = rest[end + 1:]
        comment = ""
        if "#" in rest:
            rest, comment = rest.split("#", 1)
        operand_text, _, type_text = rest.rpartition(":")
        inputs = [_lookup(names, o, number) for o in _split_top(operand_text)]
        loc, vjp_of, kernel = _parse_comment(comment) if comment.strip() else (None, None, None)
        type = TensorType.parse(type_text)
        graph.add(op, inputs, attrs, type, loc=loc, vjp_of=vjp_of, kernel=kernel, id=id)
        names[str(id)] = id
    return graph


def _lookup(names: dict[str, int], operand: str, number: int) -> int:
    operand = operand.strip()
    if not operand.startswith("%") or operand[1:] not in names:
        raise ParseError(f"line {number}: undefined value {operand!r}")
    return names[operand[1:]]

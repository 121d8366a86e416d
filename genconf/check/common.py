"""What every checker reports (a Problem: file, line, message) and where a key sits in JSON text."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


@dataclass(frozen=True, slots=True)
class CheckResult:
    files: tuple[str, ...]
    """Files that were checked."""
    problems: tuple[Problem, ...]


def json_key_lines(text: str) -> dict[tuple, int]:
    """1-based line of every object key in JSON text, by its path (array elements by index)."""
    out: dict[tuple, int] = {}
    stack: list[list] = []  # [kind, current key or element index]
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            k = j + 1
            while k < n and text[k] in " \t\r":
                k += 1
            if k < n and text[k] == ":" and stack and stack[-1][0] == "obj":
                try:
                    stack[-1][1] = json.loads(text[i:j + 1])
                except ValueError:
                    stack[-1][1] = text[i + 1:j]
                out.setdefault(tuple(frame[1] for frame in stack), line)
            line += text.count("\n", i, j + 1)
            i = j + 1
            continue
        elif c == "{":
            stack.append(["obj", None])
        elif c == "[":
            stack.append(["arr", 0])
        elif c in "}]" and stack:
            stack.pop()
        elif c == "," and stack and stack[-1][0] == "arr":
            stack[-1][1] += 1
        i += 1
    return out


def json_line(text: str, *keys: str) -> int | None:
    """1-based line of the key path `keys` (or of its nearest present ancestor) in JSON text."""
    lines = json_key_lines(text)
    for n in range(len(keys), 0, -1):
        if keys[:n] in lines:
            return lines[keys[:n]]
    return None


def load_json(name: str, text: str) -> tuple[object, list[Problem]]:
    try:
        return json.loads(text), []
    except json.JSONDecodeError as exc:
        return None, [Problem(name, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")]


def as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

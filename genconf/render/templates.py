"""The jinja2 environment of templates/ (StrictUndefined: a missing value is an error) and its filters. Every value
that reaches a shell script goes through `shquote` (or, on #SBATCH lines, which sbatch parses itself, through
`sbatch_quote`/`sbatch_token`), so a name or path with spaces or `$(...)` runs nothing."""

from __future__ import annotations

import shlex

import jinja2

from genconf.catalog.files import resource_dir
from genconf.plan.cpu_time import format_training_time
from genconf.plan.errors import GenconfError


def shquote(value: object) -> str:
    """A POSIX-shell single word for any value: shlex.quote of its text."""
    return shlex.quote(str(value))


def sbatch_quote(value: object) -> str:
    """A double-quoted #SBATCH argument. sbatch (not a shell) reads these lines; inside quotes it takes every
    character literally except a backslash escape, so `\\` and `"` are escaped. Newlines cannot be expressed
    and are refused (a newline would end the comment and start a shell line)."""
    text = str(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise GenconfError(f"control character in an #SBATCH value: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_path(directory: object, pattern: str) -> str:
    """An #SBATCH --output/--error path: `%` in the directory doubled (Slurm filename patterns), the pattern
    (`%j`, the job id) kept, the whole quoted."""
    return sbatch_quote(str(directory).replace("%", "%%") + "/" + pattern)


def sbatch_token(value: object) -> str:
    """A plain #SBATCH token (numbers, validated names and times); anything else is a bug, refused."""
    text = str(value)
    if not text or any(not (c.isalnum() or c in "._:-") for c in text):
        raise GenconfError(f"not a plain #SBATCH value: {text!r}")
    return text


def comment(value: object) -> str:
    """Text for a `#` comment line: control characters (a newline would end the comment) become spaces."""
    return "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in str(value))


def thousands(value: object) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) else str(value)


def training_time(time_s: object, num_gpus: object) -> str:
    """The README's training time as the plan's text gives it (genconf.plan.cpu_time.format_training_time)."""
    if isinstance(time_s, bool) or isinstance(num_gpus, bool):
        raise TypeError(f"training.time_s {time_s!r} and cluster.num_gpus {num_gpus!r} must be numbers")
    return format_training_time(time_s, num_gpus)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
                             undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(shquote=shquote, sbatch_quote=sbatch_quote, sbatch_path=sbatch_path, sbatch_token=sbatch_token,
                       comment=comment, thousands=thousands, training_time=training_time)
    return env

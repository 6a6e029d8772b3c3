"""Load the math RL data sets from local files or the Hugging Face hub into :class:`MathProblem` records.

Each registered data set (:data:`DATASETS`) knows the schemas its public copies come in
(the original hub columns, open-r1's processed copy, slime's chat-list copy, the DAPO
eval parquet, the DeepScaleR JSON, AReaL's jsonl, ...).  :func:`load` picks the schema
from a file's columns, normalises every row to ``MathProblem(dataset, source_id,
problem, answer, metadata)`` and accounts for every row it read in a
:class:`LoadReport`: kept, or skipped with a reason ("empty problem", "no answer",
"duplicate problem", "not an object", ...).  Templated prompts (DAPO's instruction
around the problem) are stripped back to the bare problem, so any recipe template can
be applied later (:mod:`april_bench.data.templates`).

Nothing heavy is imported here: ``pyarrow`` (parquet) and ``datasets`` (hub) are imported
inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.data.boxed import last_boxed
from april_bench.data.records import LoadedDataset, LoadReport, MathProblem
from april_bench.data.specs import DATASETS, DatasetSpec
from april_bench.data.templates import TEMPLATES

__all__ = ["DATASETS", "DataError", "DatasetSpec", "MissingDependencyError", "load", "repair_latex"]


class DataError(ConfigError):
    """A data file or data set cannot be used as given; the message names the file and the fix."""


class MissingDependencyError(ImportError, ConfigError):
    """An optional package is missing; the message names how to install it or how to do without."""


# --------------------------------------------------------------------------------------------------
# LaTeX repair
# --------------------------------------------------------------------------------------------------

# A LaTeX command written into a JSON (or Python) string without doubling its backslash loses
# "\f", "\b", "\t", "\r", "\n" (and in Python also "\a", "\v") to a control character: "\frac" becomes
# form feed + "rac".  Form feed, backspace, bell and vertical tab never belong in problem text, so
# any of them directly before a letter is repaired.  Tab and carriage return are legitimate
# whitespace, so they are repaired only when they and the letters after them spell a known command
# exactly ("\t" + "imes" -> "\times", but not tab + "equal").  Commands whose tail is also a common
# word ("\tan" / "an", "\to" / "o", "\rm" / "m") are left alone.  Newline is never touched: "\nu",
# "\ne", "\neq", "\not", "\ni" are indistinguishable from a line break before "u", "e", "eq", ...
_ALWAYS_MANGLED = {"\x07": "a", "\x08": "b", "\x0b": "v", "\x0c": "f"}
# fmt: off
_WHITESPACE_COMMANDS = {
    "\t": frozenset({
        "triangle", "triangleq", "triangleleft", "triangleright", "times", "text", "textbf", "textit",
        "textrm", "textsf", "texttt", "textup", "textsc", "textnormal", "textstyle", "textdollar",
        "textdegree", "textcircled", "theta", "tau", "tfrac", "tbinom", "tilde", "top", "therefore",
        "tanh", "tiny",
    }),
    "\r": frozenset({
        "right", "rightarrow", "rightleftharpoons", "rightharpoonup", "rho", "rangle", "rfloor", "rceil",
        "rbrace", "rbrack", "rvert", "rVert", "rmoustache", "restriction",
    }),
}
# fmt: on
_ALWAYS_RE = re.compile("([\x07\x08\x0b\x0c])(?=[A-Za-z])")
_WHITESPACE_RE = re.compile(r"([\t\r])([A-Za-z]+)")


def _repair_whitespace(match: re.Match[str]) -> str:
    char, tail = match.group(1), match.group(2)
    letter = "t" if char == "\t" else "r"
    if letter + tail in _WHITESPACE_COMMANDS[char]:
        return "\\" + letter + tail
    return match.group(0)


def repair_latex(text: str) -> str:
    """Undo LaTeX commands mangled into control characters by an unescaped backslash.

    Repaired: form feed, backspace, bell or vertical tab before a letter (``\\x0crac`` ->
    ``\\frac``, ``\\x08oxed`` -> ``\\boxed``); tab or carriage return before letters that complete
    a known command (``\\ttriangle``-style: tab + ``riangle`` -> ``\\triangle``, CR + ``ight`` ->
    ``\\right``).  Not repaired: newlines (``\\nu`` vs a line break before ``u`` is ambiguous) and
    tab/CR before anything else.  Text without control characters comes back unchanged.
    """
    if not any(c in text for c in "\x07\x08\x0b\x0c\t\r"):
        return text
    text = _ALWAYS_RE.sub(lambda m: "\\" + _ALWAYS_MANGLED[m.group(1)], text)
    return _WHITESPACE_RE.sub(_repair_whitespace, text)


# --------------------------------------------------------------------------------------------------
# Row conversion
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Parsed:
    problem: Any
    answer: Any
    source_id: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


_Converter = Callable[[dict[str, Any], int, str], "_Parsed | str"]
_NOT_TEMPLATED = "instruction template not recognised: whole prompt kept"
_BY_PATTERN = "instruction stripped by pattern (not an exact known template)"
_INSTRUCTION_RE = re.compile(
    r"^Solve the following math problem step by step\.[^\n]*\n\n(?P<problem>.*?)"
    r"(?:\n\nRemember to put your answer on its own line after \"Answer:\"[^\n]*)?$",
    re.DOTALL,
)


def _strip_instruction(content: str) -> tuple[str, tuple[str, ...]]:
    """The bare problem inside a templated user message, and a note when it was not an exact template."""
    for template in TEMPLATES.values():
        inner = template.strip(content)
        if inner:
            return inner, ()
    match = _INSTRUCTION_RE.match(content)
    if match and match.group("problem").strip():
        return match.group("problem"), (_BY_PATTERN,)
    return content, (_NOT_TEMPLATED,)


def _user_content(prompt: Any) -> str | None:
    """The last user message of a chat list (or the prompt itself when it is a string)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1].get("content"), str):
            return users[-1]["content"]
    return None


def _get(row: Mapping[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _id(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (brace counting), or ``None``."""
    return last_boxed(text, fbox=False)


def _chat_ground_truth(row: dict[str, Any], index: int, dataset: str) -> _Parsed | str:
    """Original hub / verl parquet form: templated chat ``prompt`` + ``reward_model.ground_truth``."""
    content = _user_content(row.get("prompt"))
    if content is None:
        return "prompt has no user message"
    raw = _get(row, "extra_info.raw_problem")
    problem, notes = (raw, ()) if isinstance(raw, str) and raw.strip() else _strip_instruction(content)
    meta = {k: row[k] for k in ("data_source", "ability") if row.get(k) is not None}
    if _get(row, "reward_model.style") is not None:
        meta["reward_style"] = _get(row, "reward_model.style")
    return _Parsed(
        problem, _get(row, "reward_model.ground_truth"), _id(_get(row, "extra_info.index")), meta, notes
    )


def _chat_label(row: dict[str, Any], index: int, dataset: str) -> _Parsed | str:
    """slime form: templated chat ``prompt`` + ``label``."""
    content = _user_content(row.get("prompt"))
    if content is None:
        return "prompt has no user message"
    problem, notes = _strip_instruction(content)
    meta = {k: row[k] for k in ("data_source", "metadata") if row.get(k) is not None}
    return _Parsed(problem, row.get("label"), _id(row.get("id")), meta, notes)


def _openr1(row: dict[str, Any], index: int, dataset: str) -> _Parsed | str:
    """open-r1/DAPO-Math-17k-Processed form: bare ``prompt`` text + ``solution`` (the answer)."""
    problem, answer = row.get("prompt"), row.get("solution")
    if answer is None:
        answer = _get(row, "reward_model.ground_truth")
    notes: tuple[str, ...] = ()
    source = _user_content(row.get("source_prompt"))
    if isinstance(problem, str) and source is not None and _strip_instruction(source)[0] != problem:
        notes = ("source_prompt is not a known template around prompt",)
    meta = {k: row[k] for k in ("data_source", "ability") if row.get(k) is not None}
    return _Parsed(problem, answer, _id(_get(row, "extra_info.index")), meta, notes)


_PROBLEM_KEYS = ("problem", "question", "Problem")
_ANSWER_KEYS = ("answer", "final_answer", "Answer")
_ID_KEYS = ("unique_id", "id", "ID")
_R1 = re.compile(r"^r1_solution_\d+$")
_ROMAN = {1: "I", 2: "II"}


def _record(row: dict[str, Any], index: int, dataset: str) -> _Parsed | str:
    """Flat form: ``problem``/``question`` + ``answer``/``final_answer`` (or a ``\\boxed{}`` solution)."""
    problem_key = next((k for k in _PROBLEM_KEYS if k in row), None)
    problem = row.get(problem_key) if problem_key else None
    answer_key = next((k for k in _ANSWER_KEYS if k in row), None)
    answer = row.get(answer_key) if answer_key else None
    notes: tuple[str, ...] = ()
    if answer_key is None and isinstance(row.get("solution"), str):
        answer = _boxed(row["solution"])
        notes = ("answer taken from \\boxed{} in solution",)
    used = {problem_key, answer_key}
    source_id = None
    if dataset != "deepscaler":  # DeepScaleR rows have no id: its source_id is the row index
        id_key = next((k for k in _ID_KEYS if _id(row.get(k)) is not None), None)
        if id_key is not None:
            source_id, used = _id(row[id_key]), used | {id_key}
        elif all(isinstance(row.get(k), int) for k in ("year", "aime_number", "problem_number")):
            roman = _ROMAN.get(row["aime_number"], str(row["aime_number"]))
            source_id = f"{row['year']}-{roman}-{row['problem_number']}"
    meta: dict[str, Any] = {}
    chars = []
    for key, value in row.items():
        if key in used or (key != problem_key and value == problem):
            continue
        if _R1.match(key):  # multi-KB R1 traces: keep only their lengths
            chars.append((int(key.rsplit("_", 1)[1]), len(value) if isinstance(value, str) else 0))
        else:
            meta[key] = value
    if chars:
        meta["r1_solution_chars"] = [n for _, n in sorted(chars)]
    return _Parsed(problem, answer, source_id, meta, notes)


@dataclass(frozen=True, slots=True)
class _Schema:
    name: str
    #: Each entry is a set of alternatives, one of which the columns must contain.
    required: tuple[tuple[str, ...], ...]
    convert: _Converter

    def matches(self, columns: set[str]) -> bool:
        return all(any(c in columns for c in alternatives) for alternatives in self.required)

    def describe(self) -> str:
        return f"{self.name} ({', '.join('|'.join(a) for a in self.required)})"


_OPENR1 = _Schema("open-r1 processed", (("prompt",), ("solution",)), _openr1)
_HUB_CHAT = _Schema(
    "templated chat prompt + reward_model", (("prompt",), ("reward_model",)), _chat_ground_truth
)
_SLIME = _Schema("slime chat prompt + label", (("prompt",), ("label",)), _chat_label)
_FLAT = _Schema("problem + answer", (("problem", "question", "Problem"), ("answer", "Answer")), _record)
_BOXED_SOLUTION = _Schema("problem + \\boxed{} solution", (("problem", "question"), ("solution",)), _record)
_DEEPMATH = _Schema("question + final_answer", (("question",), ("final_answer",)), _record)

_SCHEMAS: Mapping[str, tuple[_Schema, ...]] = {
    "dapo-math-17k": (_OPENR1, _HUB_CHAT, _SLIME),
    "deepscaler": (_FLAT, _HUB_CHAT),
    "deepmath-103k": (_DEEPMATH, _HUB_CHAT),
    "aime-2024": (_HUB_CHAT, _FLAT, _BOXED_SOLUTION, _SLIME),
    "aime-2025": (_HUB_CHAT, _FLAT, _BOXED_SOLUTION, _SLIME),
    "math-500": (_HUB_CHAT, _FLAT, _BOXED_SOLUTION, _SLIME),
}


def _detect(dataset: str, columns: set[str], source: str) -> _Schema:
    for schema in _SCHEMAS[dataset]:
        if schema.matches(columns):
            return schema
    expected = "; ".join(s.describe() for s in _SCHEMAS[dataset])
    raise DataError(
        f"{source}: columns {sorted(columns)} match no known {dataset} schema; expected one of: {expected}. "
        f"Rename the columns, or load the file under the data set it belongs to."
    )


# --------------------------------------------------------------------------------------------------
# Reading rows
# --------------------------------------------------------------------------------------------------

_SUFFIXES = (".parquet", ".json", ".jsonl")


class _Invalid:
    """A line that is not valid JSON (counted as skipped, not raised)."""


_INVALID = _Invalid()


def _json_lines(lines: Iterator[str]) -> Iterator[Any]:
    for line in lines:
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            yield _INVALID


def _json_rows(path: Path) -> Iterator[Any]:
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            yield from _json_lines(f)
        return
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":  # not a single document: read it as JSON lines
            raise DataError(
                f"{path}: not valid JSON ({exc}); expected an array, columns or JSON lines"
            ) from exc
        yield from _json_lines(iter(text.splitlines()))
        return
    if isinstance(data, list):
        yield from data
    elif isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise DataError(
                f"{path}: a JSON object of columns needs equal-length columns, got lengths {lengths}"
            )
        keys = list(data)
        for values in zip(*data.values(), strict=True):
            yield dict(zip(keys, values, strict=True))
    else:
        raise DataError(
            f"{path}: expected a JSON array of objects, a JSON object of equal-length column lists, or JSON "
            f"lines; got a JSON {type(data).__name__}"
        )


def _parquet_rows(path: Path) -> Iterator[Any]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
        yield from batch.to_pylist()


def _files(path: Path) -> list[Path]:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if path.is_file():
        if path.suffix not in _SUFFIXES:
            raise DataError(f"{path}: unsupported file type {path.suffix!r}; use .parquet, .json or .jsonl")
        return [path]
    found = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and p.suffix in _SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    if not found:
        raise FileNotFoundError(f"{path}: no .parquet, .json or .jsonl files in this directory")
    return found


def _local_rows(path: Path) -> Iterator[tuple[str, Any]]:
    for file in _files(path):
        rows = _parquet_rows(file) if file.suffix == ".parquet" else _json_rows(file)
        try:
            for row in rows:
                yield str(file), row
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{file}: not UTF-8 text (byte {exc.start}); is it a {file.suffix} file?"
            ) from None
        except Exception as exc:
            if type(exc).__module__.startswith("pyarrow"):  # ArrowInvalid and friends: a bad parquet file
                raise DataError(f"{file}: not a readable parquet file ({exc})") from None
            if isinstance(exc, OSError):
                raise DataError(f"{file}: cannot be read ({exc})") from None
            raise


def _hub_rows(dataset: str, hub_id: str, split: str) -> Iterator[tuple[str, Any]]:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependencyError(
            f"loading {dataset!r} from the hub ({hub_id}) needs the `datasets` package: "
            f"pip install 'april-bench[hub]' (or pip install datasets), or pass a local `path` "
            f"(a .parquet/.json/.jsonl file or a directory of them)"
        ) from exc
    repo, _, config = hub_id.partition(":")
    try:
        ds = datasets.load_dataset(repo, config or None, split=split)
    except Exception as exc:  # offline, unreachable, gated or renamed: datasets raises many kinds
        raise DataError(
            f"{dataset}: the hub copy {hub_id} [{split}] cannot be loaded ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else 'no detail'}); offline, pass the file with "
            f"--data-path {dataset}=FILE (`python -m april_bench data stats {dataset} --path FILE` checks it)"
        ) from None
    source = f"hub:{hub_id}[{split}]"
    for row in ds:
        yield source, row


# --------------------------------------------------------------------------------------------------
# load()
# --------------------------------------------------------------------------------------------------


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f"unknown data set {name!r}; known data sets: {', '.join(DATASETS)}") from None


def _as_text(value: Any) -> str | None:
    """Strings as they are, numbers as their decimal text; anything else is not usable text."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def load(
    name: str,
    path: str | os.PathLike[str] | None = None,
    *,
    hub_id: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    repair: bool = True,
    dedupe: bool | None = None,
) -> LoadedDataset:
    """Load data set ``name`` from ``path`` (a file or directory) or, without one, from the hub.

    Args:
        name: a key of :data:`DATASETS`.
        path: a ``.parquet``, ``.json`` (array of objects, object of columns, or JSON lines) or
            ``.jsonl`` file, or a directory whose such files (recursively, sorted) are all read.
        hub_id: overrides the data set's hub id (``"owner/name"`` or ``"owner/name:config"``).
        split: hub split (default: the data set's).
        limit: keep only the first ``limit`` problems (reading stops there).
        repair: apply :func:`repair_latex` to problem and answer (counted in ``report.repaired``).
        dedupe: drop repeated problem texts, counted as "duplicate problem" (default: the data set's).
    """
    spec = _spec(name)
    if limit is not None and limit < 1:
        raise DataError(f"limit must be a positive number of problems, got {limit}")
    if path is not None and hub_id is not None:
        raise DataError("pass either a local `path` or a `hub_id`, not both")
    if path is not None:
        local = Path(path)
        rows = _local_rows(local)
        report = LoadReport(source=str(local))
        hub, used_split = None, None
    else:
        hub, used_split = hub_id or spec.hub_id, split or spec.split
        rows = _hub_rows(name, hub, used_split)
        report = LoadReport(source=f"hub:{hub}[{used_split}]")
    problems = _normalise(
        spec, rows, report, limit=limit, repair=repair, dedupe=spec.dedupe if dedupe is None else dedupe
    )
    return LoadedDataset(
        name, problems, report, path=None if path is None else str(path), hub_id=hub, split=used_split
    )


def _normalise(
    spec: DatasetSpec,
    rows: Iterator[tuple[str, Any]],
    report: LoadReport,
    *,
    limit: int | None,
    repair: bool,
    dedupe: bool,
) -> list[MathProblem]:
    problems: list[MathProblem] = []
    seen: dict[str, str] = {}
    schemas: dict[str, _Schema] = {}
    for source, row in rows:
        index = report.rows_read
        report.rows_read += 1
        if not isinstance(row, dict):
            report.skip("invalid JSON" if row is _INVALID else "not an object")
            continue
        if source not in schemas:
            schemas[source] = _detect(spec.name, set(row), source)
        schema = schemas[source]
        report.schemas[schema.name] = report.schemas.get(schema.name, 0) + 1
        parsed = schema.convert(row, index, spec.name)
        if isinstance(parsed, str):
            report.skip(parsed)
            continue
        problem, answer = _as_text(parsed.problem), _as_text(parsed.answer)
        if problem is None or not problem.strip():
            report.skip("empty problem")
            continue
        if answer is None or not answer.strip():
            report.skip("no answer")
            continue
        fixed_problem, fixed_answer = (
            (repair_latex(problem), repair_latex(answer)) if repair else (problem, answer)
        )
        if dedupe:
            if fixed_problem in seen:
                same = seen[fixed_problem] == fixed_answer
                report.skip("duplicate problem" if same else "duplicate problem (different answer)")
                continue
            seen[fixed_problem] = fixed_answer
        if (fixed_problem, fixed_answer) != (problem, answer):
            report.repaired += 1
        for remark in parsed.notes:
            report.note(remark)
        source_id = parsed.source_id if parsed.source_id is not None else str(index)
        problems.append(MathProblem(spec.name, source_id, fixed_problem, fixed_answer, parsed.metadata))
        report.kept += 1
        if limit is not None and report.kept >= limit:
            break
    return problems

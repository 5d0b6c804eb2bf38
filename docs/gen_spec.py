"""Writes the key tables of docs/spec.md from offloadlab/spec.py's pydantic models: each key's type, default
and the docstring under its field, so the page cannot drift from the code. The prose around the tables is
the page's own; only the part between the two markers is rewritten.

    python docs/gen_spec.py            # rewrite docs/spec.md
    python docs/gen_spec.py --check    # exit 1 if docs/spec.md is not what this would write
"""

from __future__ import annotations

import ast
import inspect
import sys
import types
import typing
from pathlib import Path

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from offloadlab.spec import (
    AioSettings,
    DataSpec,
    DeepSpeedStrategy,
    FSDP2Strategy,
    ModelSpec,
    RunSpec,
    TorchAOStrategy,
    ZenFlowSettings,
)

PAGE = Path(__file__).resolve().parent / "spec.md"
START = "<!-- The tables below are written by docs/gen_spec.py from offloadlab/spec.py: edit the docstrings there. -->"
END = "<!-- End of the generated tables. -->"

SECTIONS = (
    ("Top level", "Keys outside any table.", RunSpec),
    ("`[model]`", "One of `preset`, `hf_model`, `hf_config`, or all four of the shape keys.", ModelSpec),
    ("`[data]`", "Where the tokens come from.", DataSpec),
    ('`[[strategy]]` with `engine = "deepspeed"`', "DeepSpeed ZeRO-1/2/3 and its offloads.", DeepSpeedStrategy),
    ("`[strategy.aio]`", "DeepSpeed's aio settings, for a strategy that swaps to NVMe.", AioSettings),
    ("`[strategy.zenflow]`", 'ZenFlow (needs `offload_optimizer = "cpu"` and `grad_accum = 1`).', ZenFlowSettings),
    ('`[[strategy]]` with `engine = "fsdp2"`', "PyTorch FSDP2 (`fully_shard`).", FSDP2Strategy),
    (
        '`[[strategy]]` with `engine = "torchao"`',
        "torchao's CPUOffloadOptimizer on one CUDA GPU (`pip install 'offloadlab[torchao]'`).",
        TorchAOStrategy,
    ),
)

_SCALARS = {bool: "bool", int: "int", float: "float", str: "string", Path: "path"}
_BOUNDS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="))
_BOUNDS += ((annotated_types.Lt, "lt", "<"), (annotated_types.Le, "le", "<="))


def _toml(value) -> str:
    """A value as a spec writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:_}"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _type(annotation) -> str:
    """A field's type in TOML's words."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args if a is not type(None))
    if origin is typing.Literal:
        return " or ".join(_toml(a) for a in args)
    if origin is tuple:
        return f"[{', '.join(_type(a) for a in args)}]"
    if origin is list:
        return "array of tables"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _bounds(field) -> str:
    said = []
    for kind, attribute, sign in _BOUNDS:
        said += [f"{sign} {_toml(getattr(m, attribute))}" for m in field.metadata if isinstance(m, kind)]
    return f" ({', '.join(said)})" if said else ""


def _default(field) -> str:
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "-"
    if isinstance(field.default, BaseModel):
        return "its defaults"
    return f"`{_toml(field.default)}`"


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each field of the model and its bases, read from their source (pydantic's own
    `use_attribute_docstrings` would read it at every import of the spec: 30 ms of each CLI and TUI start)."""
    docs: dict[str, str] = {}
    for cls in reversed([c for c in model.__mro__ if c.__module__ == model.__module__]):
        body = ast.parse(inspect.getsource(cls)).body[0].body
        for field, after in zip(body, body[1:]):
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and isinstance(doc, str):
                docs[field.target.id] = inspect.cleandoc(doc)
    return docs


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(model: type[BaseModel]) -> str:
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    docs = field_docs(model)
    for name, field in model.model_fields.items():
        kind = _type(field.annotation) + _bounds(field)
        rows.append(f"| `{name}` | {_cell(kind)} | {_default(field)} | {_cell(docs.get(name, ''))} |")
    return "\n".join(rows)


def generated() -> str:
    parts = [START]
    for title, intro, model in SECTIONS:
        parts += [f"### {title}", intro, table(model)]
    return "\n\n".join([*parts, END])


def render(page: str) -> str:
    """The page with the part between the markers written anew."""
    head, found, rest = page.partition(START)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"{PAGE} lacks the markers the tables go between")
    return head + generated() + tail


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    new = render(page)
    if "--check" in argv:
        if new != page:
            print(f"{PAGE} is out of date: run python docs/gen_spec.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Launch options declared once. A command's flag names a settings field
(clip_gateway/config/settings.py), and that field is the one place its type, default and
environment variable are declared: the flag wins when given, else the environment variable,
else the field's default. A flag carries no default of its own, so an unset flag can never
hide the environment (what ``GATEWAY_PORT=9000 clip-gateway serve`` relies on)."""

from __future__ import annotations

import inspect
import json
import re
import textwrap
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import click
from click.core import ParameterSource
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from clip_gateway.config.settings import (
    LaunchSettings,
    RepositorySettings,
    ServerSettings,
    Settings,
)

F = TypeVar("F", bound=Callable[..., Any])
Section = Literal["server", "repository", "launch"]
SECTIONS: dict[Section, type[BaseSettings]] = {
    "server": ServerSettings,
    "repository": RepositorySettings,
    "launch": LaunchSettings,
}


@dataclass(frozen=True)
class Flag:
    """A command-line flag for one settings field (``--port`` for ``server.port``)."""

    section: Section
    field: str
    #: the flag's name when it is not the field's (``grpc-port`` for ``triton_grpc_port``)
    name: str | None = None

    @property
    def flag(self) -> str:
        return "--" + (self.name or self.field).replace("_", "-")

    @property
    def param(self) -> str:
        return (self.name or self.field).replace("-", "_")

    @property
    def info(self) -> FieldInfo:
        return SECTIONS[self.section].model_fields[self.field]

    @property
    def env(self) -> str:
        return env_var(self.section, self.field)


def env_var(section: Section, field: str) -> str:
    return f"{SECTIONS[section].model_config.get('env_prefix', '')}{field}".upper()


def show(value: Any) -> str:
    """A default as an environment variable would spell it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return json.dumps(list(value)) if value else "none"
    return str(value)


def _literals(annotation: Any) -> tuple[str, ...] | None:
    """The values of a ``Literal`` (or a union of them), else None."""
    if get_origin(annotation) is Literal:
        return tuple(str(value) for value in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        parts = [_literals(arm) for arm in get_args(annotation)]
        if all(part is not None for part in parts):
            return tuple(value for part in parts for value in part or ())
    return None


def _click_type(annotation: Any) -> click.ParamType[Any]:
    choices = _literals(annotation)
    if choices is not None:
        return click.Choice(choices)
    if get_origin(annotation) is tuple:
        return click.STRING  # a list given as the environment variable spells it: a,b
    arms = set(get_args(annotation)) - {type(None)} or {annotation}
    if arms == {Path}:
        return click.Path(path_type=Path)
    if arms == {int}:
        return click.INT
    if arms == {float}:
        return click.FLOAT
    if arms == {str}:
        return click.STRING
    raise TypeError(f"no flag type for {annotation}")


def flag_option(flag: Flag) -> Callable[[F], F]:
    """The click option for ``flag``: no default (None: not given), its help the field's
    meaning (docs/CONFIGURATION.md) with the environment variable and the field's default."""
    info = flag.info
    meaning = field_docs(SECTIONS[flag.section]).get(flag.field, "")
    text = f"{meaning}  [env var: {flag.env}; default: {show(info.default)}]"
    if info.annotation is bool:
        negative = "--no-" + flag.flag[2:]
        return click.option(f"{flag.flag}/{negative}", flag.param, default=None, help=text)
    return click.option(flag.flag, flag.param, type=_click_type(info.annotation), default=None,
                        show_default=False, help=text)  # fmt: skip


def flag_options(flags: Sequence[Flag]) -> Callable[[F], F]:
    def decorate(command: F) -> F:
        for flag in reversed(flags):
            command = flag_option(flag)(command)
        return command

    return decorate


def given(ctx: click.Context, flags: Sequence[Flag]) -> dict[Section, dict[str, Any]]:
    """The flags given on the command line, by section: the settings' init arguments."""
    sections: dict[Section, dict[str, Any]] = {"server": {}, "repository": {}, "launch": {}}
    for flag in flags:
        if ctx.get_parameter_source(flag.param) is ParameterSource.COMMANDLINE:
            sections[flag.section][flag.field] = ctx.params[flag.param]
    return sections


def resolve(ctx: click.Context, flags: Sequence[Flag]) -> Settings:
    """The settings: the given flags over the environment over the defaults. A value that
    does not validate is a usage error naming the flag or environment variable it came from."""
    sections = given(ctx, flags)
    try:
        return Settings.from_env(**sections)
    except ValidationError as exc:
        section = next(name for name, model in SECTIONS.items() if model.__name__ == exc.title)
        named = {f.field: f.flag for f in flags if f.section == section}
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else None
            if field is None:  # a rule across fields (a model validator)
                where = exc.title
            elif field in sections[section]:
                where = named[field]
            else:
                where = env_var(section, field)
            problems.append(f"{where}: {error['msg']}")
        raise click.UsageError("; ".join(problems)) from exc


def field_docs(model: type[BaseSettings]) -> dict[str, str]:
    """Each field's meaning: the ``#:`` comment lines right above it in the class's source
    (the convention Sphinx autodoc reads), joined, reStructuredText code marks made Markdown's."""
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in textwrap.dedent(inspect.getsource(model)).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r" {4}(\w+)\s*:", line)
        if match and match.group(1) in model.model_fields and pending:
            docs[match.group(1)] = " ".join(pending).replace("``", "`")
        pending = []
    return docs

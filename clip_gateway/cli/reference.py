"""docs/CONFIGURATION.md, generated from the settings classes: every field's environment
variable, default and meaning (its ``#:`` comment), and the flags that set it. ``clip-gateway
config`` prints it; a test holds the committed page to it, so the two cannot drift."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clip_gateway.cli.options import SECTIONS, Flag, env_var, field_docs, show

TITLES = {
    "server": "The HTTP server",
    "repository": "How Triton serves the model",
    "launch": "The launch: the model, Triton's process, stop and start-up",
}
HEADER = """\
# Configuration

Every setting of the gateway, read once at start into one settings object
(`clip_gateway/config/settings.py`) and passed down. Each is an environment variable; the ones a
command takes as a flag name the command. **A flag given wins over the environment variable, the
environment variable over the default**: `GATEWAY_PORT=9000 clip-gateway serve` listens on 9000,
`GATEWAY_PORT=9000 clip-gateway serve --port 9001` on 9001. Flags carry no defaults of their own.

`clip-gateway serve --verbose` (logs on the terminal instead of the log file) is the one flag
that is not a setting. Values are read by pydantic-settings: a list is a JSON list
(`GATEWAY_MODEL_ALIASES='["gpt-clip"]'`), a boolean `true`/`false`.

This page is generated: `clip-gateway config > docs/CONFIGURATION.md` (a test fails when it is
stale).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def page(commands: Mapping[str, Sequence[Flag]]) -> str:
    """The Markdown page; ``commands`` maps each command to the flags it takes."""
    flags: dict[tuple[str, str], list[str]] = {}
    for command, declared in commands.items():
        for flag in declared:
            flags.setdefault((flag.section, flag.field), []).append(f"`{flag.flag}` ({command})")
    out = [HEADER]
    for section, model in SECTIONS.items():
        prefix = model.model_config.get("env_prefix", "")
        docs = field_docs(model)
        out += [f"\n## {TITLES[section]} (`{model.__name__}`, `{prefix}`)\n"]
        out += ["| environment variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
        for name, info in model.model_fields.items():
            given = ", ".join(flags.get((section, name), [])) or "—"
            default = show(info.default)
            default = default if default in ("unset", "none") else f"`{default}`"
            row = (f"`{env_var(section, name)}`", given, default, _cell(docs.get(name, "")))
            out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"

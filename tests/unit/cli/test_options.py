"""Every launch option declared once (clip_gateway/cli/options.py): for each flag of ``clip-gateway
serve``, its environment variable alone takes effect, the flag beats the variable, and with
neither the settings' default holds. Run through the real ``clip-gateway`` root command; the
one seam is what receives the resolved settings (``obj``) instead of starting the supervisor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from clip_gateway.cli.main import cli, main
from clip_gateway.cli.options import SECTIONS, Flag
from clip_gateway.cli.reference import page
from clip_gateway.cli.serve import SERVE_FLAGS
from clip_gateway.cli.tools import COMMAND_FLAGS
from clip_gateway.config.settings import Settings

ROOT = Path(__file__).resolve().parents[3]

#: For each of serve's settings: (environment value, flag value), each parsed as the settings
#: read it. Both differ from each other and from the default, so each assertion can fail.
CASES: dict[str, tuple[str, str]] = {
    "host": ("127.0.0.2", "127.0.0.3"),
    "port": ("9000", "9001"),
    "model": ("ViT-B-16", "RN50"),
    "weights": ("random", "/checkpoints/clip.bin"),
    "tokenizer": ("/env/tokenizer", "/flag/tokenizer"),
    "model_dir": ("/env/export", "/flag/export"),
    "profile": ("cuda", "tensorrt"),
    "cache_dir": ("/env/cache", "/flag/cache"),
    "log_file": ("/env/serve.log", "/flag/serve.log"),
    "immich": ("true", "false"),
    "immich_upstream": ("http://ml-a:3003,http://ml-b:3003", "http://ml-c:3003"),
}


@pytest.fixture(autouse=True)
def no_gateway_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("GATEWAY_")] + ["CLIP_GATEWAY_CACHE"]:
        monkeypatch.delenv(name, raising=False)


def serve(*args: str, **env: str) -> Settings:
    """The settings ``clip-gateway serve ARGS`` would launch with under ``env``."""
    launched: list[Settings] = []

    def capture(settings: Settings) -> int:
        launched.append(settings)
        return 0

    done = CliRunner().invoke(cli, ["serve", *args], obj=capture, env=env, catch_exceptions=False)
    assert done.exit_code == 0, done.output
    (settings,) = launched
    return settings


def value(settings: Settings, flag: Flag) -> Any:
    return getattr(getattr(settings, flag.section), flag.field)


def parsed(flag: Flag, text: str) -> Any:
    """``text`` as the settings field reads it."""
    return value(Settings.from_env(**{flag.section: {flag.field: text}}), flag)


def flag_args(flag: Flag, text: str) -> list[str]:
    if flag.info.annotation is bool:
        return [flag.flag if text == "true" else "--no-" + flag.flag[2:]]
    return [flag.flag, text]


def test_every_serve_flag_has_a_case() -> None:
    assert set(CASES) == {flag.field for flag in SERVE_FLAGS}


@pytest.mark.parametrize("flag", SERVE_FLAGS, ids=lambda flag: flag.flag)
def test_the_environment_alone_takes_effect(flag: Flag) -> None:
    env_value, _ = CASES[flag.field]
    expected = parsed(flag, env_value)
    assert expected != flag.info.default
    assert value(serve(**{flag.env: env_value}), flag) == expected


@pytest.mark.parametrize("flag", SERVE_FLAGS, ids=lambda flag: flag.flag)
def test_the_flag_beats_the_environment(flag: Flag) -> None:
    env_value, flag_value = CASES[flag.field]
    expected = parsed(flag, flag_value)
    assert expected != parsed(flag, env_value)
    assert value(serve(*flag_args(flag, flag_value), **{flag.env: env_value}), flag) == expected


@pytest.mark.parametrize(
    "flag", [f for f in SERVE_FLAGS if f.field != "log_file"], ids=lambda flag: flag.flag
)
def test_with_neither_the_settings_default_holds(flag: Flag) -> None:
    assert value(serve(), flag) == flag.info.default


def test_the_log_file_defaults_into_the_cache_the_environment_names(tmp_path: Path) -> None:
    settings = serve(GATEWAY_CACHE_DIR=str(tmp_path))
    assert settings.launch.log_file == tmp_path / "logs" / "serve.log"
    assert not (tmp_path / "logs").exists()  # made by the launch, not by resolving
    assert serve("--verbose", GATEWAY_LOG_FILE=str(tmp_path / "x.log")).launch.log_file is None


def test_a_bad_value_names_the_flag_or_variable_it_came_from(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port: Input should be less than or equal to 65535" in capsys.readouterr().err
    monkeypatch.setenv("GATEWAY_PORT", "nine")
    assert main(["serve"]) == 2
    assert "GATEWAY_PORT: Input should be a valid integer" in capsys.readouterr().err
    assert main(["serve", "--profile", "gpu"]) == 2
    assert "'gpu' is not one of" in capsys.readouterr().err


def test_the_configuration_page_is_generated_from_the_settings() -> None:
    committed = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    assert committed == page(COMMAND_FLAGS), "stale: clip-gateway config > docs/CONFIGURATION.md"
    rows = [line for line in committed.splitlines() if line.startswith("| `GATEWAY_")]
    names = [row.split("`")[1] for row in rows]
    assert len(names) == len(set(names)) == sum(len(m.model_fields) for m in SECTIONS.values())
    for row in rows:  # every setting says what it means
        assert len(row.rsplit("|", 2)[1].split()) >= 3, row
    for flag in SERVE_FLAGS:
        assert f"`{flag.flag}` (serve)" in committed


def test_the_maintenance_commands_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("serve", "config", "timings", "render", "triton", "imaging"):
        assert f"  {command} " in out


def test_without_the_server_extra_the_client_commands_run_and_serve_says_what_it_needs() -> None:
    """What `pip install clip-gateway` gets (tests/client runs it for real): the server's
    packages absent, the root still lists every command and each server one names its extra."""
    code = (
        "import sys\n"
        "for name in ('pydantic', 'pydantic_settings', 'litestar', 'uvicorn', 'tritonclient'):\n"
        "    sys.modules[name] = None  # import fails, as where it is not installed\n"
        "from clip_gateway.cli.main import main\n"
        "assert main(['--help']) == 0 and main(['embed', '--help']) == 0\n"
        "sys.exit(main(['serve', '--port', '9000']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "serve needs the server extra (pydantic is missing)" in done.stderr
    assert "pip install 'clip-gateway[server]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert "serve    Run the gateway" in done.stdout and "--out FILE" in done.stdout


def test_export_only_makes_or_finds_the_export_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make serve`` runs ``serve --export-only`` while Triton's environment installs: the same
    settings find the same export (a baked one as it is), and nothing is started."""
    baked = tmp_path / "export"
    baked.mkdir()
    (baked / "manifest.json").write_text("{}")
    log_file = str(tmp_path / "serve.log")
    assert main(["serve", "--model-dir", str(baked), "--log-file", log_file,
                 "--export-only"]) == 0  # fmt: skip
    missing = str(tmp_path / "none")
    assert main(["serve", "--model-dir", missing, "--log-file", log_file, "--export-only"]) == 2
    out = capsys.readouterr()
    assert "tritonserver" not in out.out + out.err and "ready" not in out.out
    assert f"{missing} is not an export" in out.err

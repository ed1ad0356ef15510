"""The command line's contract: --version, help on every argument, `--json [PATH]` meaning the same
in every subcommand, and exit codes that tell the user's errors (1) from qfuse's bugs (3)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import qfuse
from qfuse.compiler import cli
from qfuse.compiler.cli import build_parser, main
from qfuse.examples.zoo import model_path


@pytest.fixture(scope="module")
def vgg() -> Path:
    return model_path("vgg", quantized=True)


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"qfuse {qfuse.__version__}"


def test_every_argument_has_help_and_exit_codes_are_listed() -> None:
    parser = build_parser()
    assert "exit codes" in parser.format_help() and "internal error" in parser.format_help()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"qfuse {name} {action.dest}: no help text"


@pytest.mark.parametrize("command", [["compile"], ["inspect"],
                                     ["compare", "--emulate", "onednn"]])
def test_bare_json_prints_only_json(vgg: Path, command: list[str], capsys) -> None:
    assert main([command[0], str(vgg), *command[1:], "--json"]) == 0
    json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout


@pytest.mark.parametrize("command", [["compile"], ["inspect"],
                                     ["compare", "--emulate", "onednn"]])
def test_json_path_writes_the_file_and_prints_text(vgg: Path, tmp_path: Path,
                                                   command: list[str], capsys) -> None:
    dest = tmp_path / "out.json"
    assert main([command[0], str(vgg), *command[1:], "--json", str(dest)]) == 0
    out = capsys.readouterr().out
    assert json.loads(dest.read_text())
    assert f"wrote {dest}" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_bench_json_and_bad_iters(vgg: Path, tmp_path: Path, capsys) -> None:
    assert main(["bench", str(vgg), "--compare", "unfused", "--iters", "2", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["engines"]) == {"fused", "unfused"}
    assert main(["bench", str(vgg), "--compare", "unfused", "--iters", "0"]) == 1
    assert "--iters must be at least 1" in capsys.readouterr().err


def test_compare_engine_choices_are_checked(vgg: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", str(vgg), "--compare", "unfused,tensorrt"])
    assert exit_.value.code == 2
    assert "unknown engine(s) ['tensorrt']" in capsys.readouterr().err


def test_user_error_is_one_line_exit_1(tmp_path: Path, capsys) -> None:
    assert main(["compile", str(tmp_path / "missing.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("qfuse compile: ") and "\n" not in err and "Traceback" not in err


def test_bug_is_internal_error_exit_3(vgg: Path, monkeypatch, capsys) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise ValueError("a bug")

    monkeypatch.setattr(cli, "_cmd_compile", broken)
    assert main(["compile", str(vgg)]) == 3
    err = capsys.readouterr().err
    assert "qfuse compile: internal error: ValueError: a bug" in err and "Traceback" not in err
    assert main(["-v", "compile", str(vgg)]) == 3
    assert "Traceback" in capsys.readouterr().err

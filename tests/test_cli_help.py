"""The command line as its users meet it (issue 46): every option of the three programs has help
text, which shows the option's default; a missing optional extra is one line naming the fix."""

import argparse

import pytest

from txl_lib import bench_steps, cli, generate_cli
from txl_lib.__main__ import PROGRAMS
from txl_lib.training import DEFAULT_LR, train

PARSE = {
    "train": cli.parse_args,
    "generate": generate_cli.parse_args,
    "bench": bench_steps.parse_args,
}


def parser_of(parse_args, monkeypatch) -> argparse.ArgumentParser:
    "The parser a program's `parse_args` builds, caught as it reads `--help`."
    seen = []
    read = argparse.ArgumentParser.parse_args

    def recording(self, *args, **kwargs):
        seen.append(self)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", recording)
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    return seen[0]


@pytest.mark.parametrize("program", PARSE)
def test_every_option_has_help_that_shows_its_default(program, monkeypatch, capsys):
    parser = parser_of(PARSE[program], monkeypatch)
    formatter = parser._get_formatter()
    options = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert options and set(PARSE) == set(PROGRAMS)
    for action in options:
        assert action.help, f"{action.option_strings}: no help"
        shown = formatter._expand_help(action)
        if not (action.default is None or action.default is False or action.default == []):
            assert f"(default: {action.default})" in shown, (action.option_strings, shown)


def test_one_default_learning_rate():
    assert cli.parse_args([]).lr == DEFAULT_LR == train.__defaults__[0]


@pytest.mark.parametrize("flag, package", [("--plot", "matplotlib"), ("--train", "transformers")])
def test_a_missing_extra_is_one_line_naming_the_install(flag, package, monkeypatch, tmp_path):
    "bench --plot / --train without the extra: `error: ...pip install 'txl-lib[...]'`, status 1."
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n == package else found(n))
    argv = ["--quick", flag] + ([str(tmp_path / "speed.png")] if flag == "--plot" else [])
    with pytest.raises(SystemExit) as stopped:
        cli.main(PROGRAMS["bench"], argv)
    message = str(stopped.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert f"{flag} needs {package}" in message and "pip install 'txl-lib[" in message

"""Start-up (issue 29): `inferasim --help` imports no command module and none of numpy, pydantic,
httpx or the emulator; a command imports its own module only; the table of commands `--help`
lists matches the commands' own help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferasim.cli.main import COMMANDS, build_parser

HEAVY = ("numpy", "pydantic", "httpx", "yaml", "inferasim.emulator", "inferasim.harvest.client",
         "inferasim.model.steptime", "inferasim.search.tune", "inferasim.sim.api")


def _imported_after(code: str) -> set[str]:
    """The modules of HEAVY and inferasim.cli.* a fresh interpreter holds after running `code`."""
    probe = (f"import sys\n{code}\n"
             "print('MODULES:', *(m for m in sys.modules if m.startswith('inferasim.cli.') or m in "
             f"{HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    line = out.stdout.splitlines()[-1]
    assert line.startswith("MODULES:"), out.stdout
    return set(line.split()[1:])


def test_help_imports_no_command_and_no_numpy() -> None:
    code = ("from inferasim.cli.main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    got = _imported_after(code)
    assert not got & set(HEAVY), got
    assert got <= {"inferasim.cli.main"}, got


def test_a_command_imports_its_own_module_only() -> None:
    got = _imported_after("from inferasim.cli.main import build_parser\nbuild_parser(['tune', 'spec.yaml'])")
    commands = {m for m in got if m.startswith("inferasim.cli.")} - {"inferasim.cli.main", "inferasim.cli.tune"}
    # What tune's module builds on (its arguments and output helpers), never another command.
    assert not commands - {"inferasim.cli.args", "inferasim.cli.usage"}, commands
    assert not got & {"httpx", "inferasim.emulator", "inferasim.harvest.client"}, got


def test_the_search_does_not_import_the_http_client() -> None:
    got = _imported_after("import inferasim.search.tune")
    assert "httpx" not in got and "inferasim.harvest.client" not in got


def test_command_table_matches_the_commands_own_help() -> None:
    full = build_parser()  # every command's module
    sub = next(a for a in full._actions if isinstance(a, type(full._subparsers._group_actions[0])))  # type: ignore[union-attr]
    listed = [(a.dest, a.help) for a in sub._choices_actions]
    assert listed == [(name, text) for name, (_, text) in COMMANDS.items()]


@pytest.mark.parametrize("argv", [["--help"], ["tune", "--help"], ["bogus"]])
def test_help_and_errors_still_work(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from inferasim.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    if argv[0] == "bogus":
        assert exc.value.code == 2 and "invalid choice: 'bogus'" in out.err and "tune" in out.err
    else:
        assert exc.value.code == 0 and "usage: inferasim" in out.out
        if argv[0] == "tune":
            assert "--manifest" in out.out


def test_version_is_worked_out_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    from inferasim.cli.main import main
    from inferasim.model.steptime import STEP_MODEL_REVISION

    with pytest.raises(SystemExit):
        main(["--version"])
    assert STEP_MODEL_REVISION in capsys.readouterr().out

"""`dociq engine serve|retrain` reach their modules through dociq.cli.engine."""
import pytest

from dociq.cli.engine import main


@pytest.mark.parametrize("command, usage", [("retrain", "usage: dociq engine retrain"),
                                            ("serve", "usage: dociq engine serve")])
def test_engine_subcommands_reach_their_module(command, usage, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert usage in capsys.readouterr().out


def test_engine_help_lists_retrain(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "retrain" in out and "serve" in out and "import" in out

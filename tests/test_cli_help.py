"""The command line as a newcomer reads it: every option of every subcommand has plain-text help, and
an option with a default says it; error hints are written as options, not as Python."""
import argparse

import pytest

from torchmover.cli import build_parser, cli_syntax, main


def subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [parser, *action.choices.values()]


@pytest.mark.parametrize("parser", subcommands(), ids=lambda p: p.prog)
def test_every_option_has_plain_help_with_its_default(parser):
    assert "``" not in parser.format_help()
    for action in parser._actions:
        if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        assert action.help, f"{parser.prog} {action.option_strings[0]} has no help"
        if action.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in action.help, f"{parser.prog} {action.option_strings[0]}: its default is not said"


def test_python_hints_are_rewritten_as_options():
    message = "device='cuda' but CUDA is not available on this machine; use device='cpu' or device='auto'"
    assert cli_syntax(message) == ("--device cuda but CUDA is not available on this machine; "
                                   "use --device cpu or --device auto")
    assert cli_syntax("n_iter=0 is not a positive int") == "--n-iter 0 is not a positive int"
    assert cli_syntax("shape=(2, 3)") == "shape=(2, 3)"  # not an option: left as it is


def test_an_unavailable_device_is_refused_in_cli_syntax(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    with pytest.raises(SystemExit):
        main(["score", "--hyp", "a", "--ref", "b", "--device", "cuda"])
    err = capsys.readouterr().err
    assert "use --device cpu or --device auto" in err and "device='cpu'" not in err

"""Errors print on one line whatever they quote."""

from longboat.utils.logging import error, printable


def test_printable_escapes_control_characters_only():
    assert printable("data/été.jsonl: not found") == "data/été.jsonl: not found"
    assert printable("a\nb\tc\x1b[31m") == "a\\nb\\tc\\x1b[31m"


def test_an_error_quoting_a_newline_is_one_line(capsys):
    error("runs/a\nb: not a run directory [data.paths=[x]]")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs/a\\nb: not a run directory [data.paths=[x]]" in err

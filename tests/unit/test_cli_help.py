"""Every command, option and argument of the CLI says what it is in --help."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from proxy.cli import build_parser


def _undocumented(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
    # argparse has no public way to list a parser's actions; its `_actions` and the
    # subparsers' `_choices_actions` have kept their names since Python 3.2.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            described = {choice.dest for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if name not in described:
                    yield f"{path} {name}"
                yield from _undocumented(sub, f"{path} {name}")
        elif action.help is None and not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def test_every_command_and_option_has_help_text() -> None:
    assert list(_undocumented(build_parser(), "fenceproxy")) == []


def test_the_walk_sees_nested_options() -> None:
    # Pins the private names above: a parser with one undocumented nested option.
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers().add_parser("leases", help="leases")
    sub.add_argument("--config")
    assert list(_undocumented(parser, "p")) == ["p leases --config"]

"""``cli.main`` with its argument parser built once per process, for tables of many CLI calls.

``cli.main`` builds the whole ``fedjax-dp`` parser (every subcommand, ~17 ms of CPU) on each call;
a table of a thousand bad inputs spends most of its time there. The parser is the same object
every time (it reads no environment or folder while it is built, and ``parse_args`` keeps no
state between calls), so :func:`main` builds it once and runs everything else of ``cli.main``
(signal handling, parsing, the command, its one-line errors) as it is. Tests that walk or change
a parser take their own from ``cli.build_parser()``, which this leaves alone.
"""
from __future__ import annotations

import contextlib
import functools

from fedjax_dp.experiments import cli

_BUILD = cli.build_parser


@functools.lru_cache(maxsize=1)
def parser():
    """The one parser (built on first use by the real ``cli.build_parser``)."""
    return _BUILD()


@contextlib.contextmanager
def built_once():
    """Within: ``cli.build_parser`` returns :func:`parser` (restored after)."""
    saved = cli.build_parser
    cli.build_parser = parser
    try:
        yield
    finally:
        cli.build_parser = saved


def main(argv, **kwargs) -> int:
    """``cli.main(argv)`` with the parser built once."""
    with built_once():
        return cli.main(argv, **kwargs)

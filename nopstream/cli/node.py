"""The processes of a cluster job and the operator: `nopstream task`, `coordinator`, `operator`."""

from __future__ import annotations

import argparse

from nopstream import exits
from nopstream.cli import startup


def cmd_node(args: argparse.Namespace) -> int:
    """Run a task or coordinator process of a cluster job (`node.process`); exit 2 on bad settings, 3
    when it fails."""
    from nopstream.node import process

    return process.main(args.command, loaded=startup.loaded)


def cmd_operator(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped."""
    from nopstream_operator import handlers

    startup.loaded()
    handlers.run(liveness=args.liveness)
    return exits.OK

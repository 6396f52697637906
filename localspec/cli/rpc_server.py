"""``localspec rpc-server``: llama.cpp's rpc-server from localspec's own build, for ``--rpc`` on another machine."""

from __future__ import annotations

import ipaddress
import os
from typing import Annotated, Optional

import typer

from localspec.cli.console import err
from localspec.engine.llama.rpc import server_command


def rpc_server_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on; other machines need theirs.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port to listen on.")] = 50052,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads [default: as run's].")] = None,
) -> None:
    """Serve this machine's CPU to a localspec elsewhere (`--rpc HOST:PORT`), with the same exact kernels."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        # llama.cpp's RPC protocol has no authentication and trusts what clients send.
        err.prose(f"note: anyone who can reach {host}:{port} can use this server; keep it on a trusted network")
    command, env = server_command(host, port, threads=threads)
    # Replaced by the server itself, so a signal or `kill` reaches it and its exit status is ours.
    os.execve(command[0], command, env)

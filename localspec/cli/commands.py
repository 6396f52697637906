"""The list of commands; each module owns one command (or one command group)."""

from __future__ import annotations

import typer

from localspec.cli import bench, chat, check, doctor, history, profiles, pull, rpc_server, run


def register(app: typer.Typer) -> None:
    app.add_typer(profiles.app, name="profiles")
    app.add_typer(history.app, name="history")
    app.command("pull")(pull.pull_command)
    app.command("doctor")(doctor.doctor_command)
    app.command("check")(check.check_command)
    app.command("run")(run.run_command)
    app.command("chat")(chat.chat_command)
    app.command("bench")(bench.bench_command)
    app.command("rpc-server")(rpc_server.rpc_server_command)
    from localspec.cli import serve

    app.command("serve")(serve.serve_command)

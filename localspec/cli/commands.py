"""The list of commands; each module owns one command (or one command group)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from localspec.cli import doctor, profiles, pull

    app.add_typer(profiles.app, name="profiles")
    app.command("pull")(pull.pull_command)
    app.command("doctor")(doctor.doctor_command)
    from localspec.cli import check

    app.command("check")(check.check_command)
    from localspec.cli import run

    app.command("run")(run.run_command)
    from localspec.cli import chat

    app.command("chat")(chat.chat_command)
    from localspec.cli import bench

    app.command("bench")(bench.bench_command)
    from localspec.cli import serve

    app.command("serve")(serve.serve_command)

"""``localspec serve``: the pair behind OpenAI- and Anthropic-compatible HTTP APIs, for editors and coding agents."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Optional

import typer

from localspec import paths
from localspec.cli import options as o
from localspec.cli.console import err, out
from localspec.errors import UsageError
from localspec.prompt_cache import DEFAULT_DISK_MIB, DEFAULT_RAM_MIB, MIB, PromptCache
from localspec.server.app import LocalServer, make_app
from localspec.server.worker import DEFAULT_MAX_QUEUE, GenerationWorker

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
API_KEY_ENV = "LOCALSPEC_API_KEY"


@o.generation_options()
def serve_command(
    host: Annotated[str, typer.Option("--host", help="Interface to listen on; any but loopback needs --api-key.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0 picks a free one).")] = DEFAULT_PORT,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar=API_KEY_ENV, show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every request (the environment keeps it out of ps).",
    )] = None,
    cors: Annotated[Optional[str], typer.Option("--cors", help="Let this browser origin call the API, e.g. http://localhost:3000.")] = None,
    queue: Annotated[int, typer.Option("--queue", min=1, help="Requests that may wait behind the running one; more get HTTP 429.")] = DEFAULT_MAX_QUEUE,
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", "-n", min=1, help="Default answer limit when a request sets none [default: until the context is full].",
    )] = None,
    cache_ram: Annotated[int, typer.Option(
        "--cache-ram", min=0, help="MiB of memory for the states of earlier prompts, reused by later ones (0: off).",
    )] = DEFAULT_RAM_MIB,
    cache_disk: Annotated[int, typer.Option(
        "--cache-disk", min=0, help="MiB of disk under LOCALSPEC_HOME for those states, so a restart reuses them (0: off).",
    )] = DEFAULT_DISK_MIB,
    *,
    generation: o.GenerationOptions,
) -> None:
    """Serve the pair to editors and agents: OpenAI chat completions and Responses, Anthropic Messages."""
    if not _is_loopback(host) and not api_key:
        raise UsageError(
            f"--host {host} lets other machines connect; also pass --api-key KEY (or set {API_KEY_ENV})"
        )
    pair, decoder, sampling = generation.open()
    cache = None
    if cache_ram or cache_disk:
        cache = PromptCache(paths.prompt_cache_dir(), ram_bytes=cache_ram * MIB, disk_bytes=cache_disk * MIB)
        kept = len(cache.entries(decoder.target))  # reads the files' headers now, before the worker runs
    # Over RPC, a lost server's pair is loaded again once it is back (see GenerationWorker).
    reopen = (lambda: generation.open()[1]) if decoder.target.rpc is not None else None
    worker = GenerationWorker(decoder, sampling, max_tokens=max_tokens, max_queue=queue, prompt_cache=cache,
                              reopen=reopen)
    app = make_app(worker, model_name=pair.label, api_key=api_key, cors_origin=cors)

    def ready(base_url: str) -> None:
        out.print(f"localspec serve: {pair.label} at {base_url}", highlight=False)
        auth = "requests need the API key (Authorization: Bearer)" if api_key else "no API key"
        err.print(f"model id {pair.label!r}, method {decoder.controller.method}, {auth}; Ctrl-C stops", highlight=False)
        if cache is not None:
            err.print(f"prompt cache: {cache_ram} MiB of memory, {cache_disk} MiB of disk at {paths.prompt_cache_dir()} "
                      f"({kept} states of this model kept)", highlight=False)

    server = LocalServer(app, worker, host=host, port=port, on_ready=ready)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on; that is the normal way to stop
        pass
    except SystemExit:
        if server.started:
            raise
        # uvicorn has logged the reason (e.g. address already in use) and exits without a fix to offer.
        raise UsageError(f"could not listen on {host}:{port}; pick another --port (0 picks a free one)") from None
    err.print("localspec serve: stopped", highlight=False)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False

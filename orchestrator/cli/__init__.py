"""`thinkserve`: serve, ingest, ask, health, demo. Errors are one line naming the cause, never a traceback wall.

The command line is the top of the service: it starts the server (orchestrator.server) or calls one through the
client (orchestrator.client); run.py and settings.py are shared with the benchmarks' command, demo.py is `demo`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Optional


from .run import run_command
from .settings import settings_from_args


def _client(args):
    from ..client import ThinkServeClient

    return ThinkServeClient(_address(args), token=_token(args))


def _token(args) -> str:
    """--token, else the THINKSERVE_TOKEN environment variable (keeps the token out of shell history)."""
    return getattr(args, "token", None) or os.environ.get("THINKSERVE_TOKEN", "")


def _address(args) -> str:
    """--address, else the configured server's; one listening on every interface (a container's) is asked on
    loopback, which is how its HEALTHCHECK reaches it."""
    if args.address:
        return args.address
    server = settings_from_args(args).server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "[::]") else server.host
    return f"{host}:{server.port}"


def cmd_serve(args) -> int:
    from ..server.deployment import Deployment

    from ..observability.logs import configure_logging

    settings = settings_from_args(args)
    configure_logging(settings.observability.log_format, logging.DEBUG if args.verbose else logging.INFO)

    async def serve() -> None:
        deployment = Deployment(settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await deployment.start(progress=print)
        print("serving; Ctrl-C stops (in-flight requests are drained first)", flush=True)
        try:
            await stop.wait()
        finally:
            print("stopping ...", flush=True)
            await deployment.stop()

    asyncio.run(serve())
    return 0


def cmd_ingest(args) -> int:
    from ..errors import ConfigurationError
    from ..client.ingest_batch import ingest_paths

    ray = None
    if args.ray:
        from ..knowledge.ingest import mineru_options
        from ..client.ray_ingest import ray_options_or_exit

        ray = ray_options_or_exit(args.ray_address, args.ray_cpus, mineru_options(settings_from_args(args).ingest))
    elif args.ray_address or args.ray_cpus:
        raise ConfigurationError("--ray-address and --ray-cpus go with --ray")
    failures = asyncio.run(ingest_paths(_address(args), args.collection, args.paths, args.concurrency, _token(args), ray=ray))
    return 1 if failures else 0


def cmd_documents(args) -> int:
    with _client(args) as client:
        if args.delete:
            for name in args.delete:
                removed = client.delete_document(args.collection, name)
                print(f"deleted {removed.name} ({removed.chunks} chunks, {removed.units} units, {removed.pages} pages)")
            return 0
        for document in client.list_documents(args.collection):
            print(
                f"{document.name:<40} {document.pages:>5} pages {document.chunks:>5} chunks {document.units:>4} units "
                f"{document.entities:>5} entities  {document.parser}  {document.document_id}"
            )
    return 0


def cmd_ask(args) -> int:
    from ..client.presentation import print_query

    from ..pipeline.plan import QueryOptions

    options = {name: getattr(args, name) for name in QueryOptions.model_fields}
    with _client(args) as client:
        print_query(args.question, client.query(args.collection, args.question, **options))
    return 0


def add_query_options(command: argparse.ArgumentParser) -> None:
    """One flag per QueryOptions field (unset: the server's setting), its help from the field's description:
    a new option reaches the CLI without a list to keep in step."""
    from typing import get_args

    from ..pipeline.plan import OPTION_CHOICES, QueryOptions

    for name, field in QueryOptions.model_fields.items():
        kind = next(arg for arg in get_args(field.annotation) if arg is not type(None))
        flag, help = f"--{name.replace('_', '-')}", field.description
        if kind is bool:
            command.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=help)
        else:
            command.add_argument(flag, dest=name, type=kind, choices=OPTION_CHOICES.get(name), help=help)


def cmd_health(args) -> int:
    if args.probe:  # grpc.health.v1, no token: what a container healthcheck or a load balancer asks
        from ..api.standard_health import probe

        status = probe(_address(args), timeout_s=5.0)
        print(status)
        return 0 if status == "SERVING" else 1
    with _client(args) as client:
        health = client.health()
    print(f"serving: {health.serving}  version {health.version}  profile {health.profile}")
    for model in health.models:
        print(f"  {model.name:<20} {'ready' if model.ready else 'NOT READY: ' + model.detail}")
    return 0 if health.serving else 1


def cmd_token(args) -> int:
    from ..api.security import new_token

    token, digest = new_token()
    collections = ", ".join(f'"{name}"' for name in args.collections)
    print(f"token (give it to the client; it is not stored anywhere):\n  {token}\n")
    print("settings (add to the server's TOML file):")
    print(f'  [[auth.tokens]]\n  name = "{args.name}"\n  sha256 = "{digest}"\n  collections = [{collections}]')
    print(f"  write = {'true' if args.write else 'false'}\n  max_concurrent = {args.max_concurrent}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return asyncio.run(run_demo(settings_from_args(args), args.samples, args.questions))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thinkserve", description="Triton-served multimodal document QA.")
    parser.add_argument("--config", type=Path, help="settings file (TOML); see docs/configuration.md")
    parser.add_argument("--profile", help="model profile (default tiny): serves model_repository/<profile> unless configured")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs and tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="start Triton and the orchestrator, serve until Ctrl-C")
    serve.add_argument("--port", type=int, help="orchestrator gRPC port (0 = any free port)")
    serve.add_argument("--triton-url", help="use a running Triton (host:grpc_port) instead of starting one")
    serve.add_argument("--model-repository", type=Path, help="model repository (default: model_repository/tiny)")
    serve.add_argument("--read-only", action="store_true",
                       help="a read replica: serve queries over a data folder another serve writes, following it")
    serve.set_defaults(run=cmd_serve)

    for name, helptext, run in (
        ("ingest", "ingest documents (PDF, images, Markdown, text, MinerU output folders) into a collection", cmd_ingest),
        ("documents", "list a collection's documents, or delete some with --delete NAME", cmd_documents),
        ("ask", "ask a question over a collection; the answer streams", cmd_ask),
        ("health", "readiness of the orchestrator and every model", cmd_health),
    ):
        command = commands.add_parser(name, help=helptext)
        command.add_argument("--address", help="orchestrator address host:port (default: from settings)")
        command.add_argument("--token", help="bearer token (default: the THINKSERVE_TOKEN environment variable)")
        command.set_defaults(run=run)
        if name == "health":
            command.add_argument("--probe", action="store_true",
                                 help="ask the standard grpc.health.v1 service (no token): exit 0 when SERVING")
        if name == "ingest":
            command.add_argument("--collection", required=True)
            command.add_argument("paths", nargs="+", type=Path, help="files and folders (searched recursively)")
            command.add_argument(
                "--concurrency", type=int, default=2, help="documents in flight: parsing one overlaps model work on another"
            )
            command.add_argument(
                "--ray", action="store_true",
                help='parse PDFs and images with MinerU on a Ray cluster, then upload the results (pip install "thinkserve[ray]")',
            )
            command.add_argument(
                "--ray-address", help="an existing Ray cluster (default: RAY_ADDRESS, else a local one started for this run)"
            )
            command.add_argument("--ray-cpus", type=int, help="CPUs of the local Ray cluster (default: every core)")
        if name == "documents":
            command.add_argument("--collection", required=True)
            command.add_argument("--delete", nargs="+", metavar="NAME", help="document names to delete")
        if name == "ask":
            command.add_argument("--collection", required=True)
            command.add_argument("question")
            add_query_options(command)

    token = commands.add_parser("token", help="make a bearer token and the settings entry that grants it")
    token.add_argument("--name", required=True, help="who holds it (shown in logs and metrics)")
    token.add_argument("--collections", nargs="+", default=["*"], help="collections it may use (default: all)")
    token.add_argument("--write", action="store_true", help="may also ingest and delete")
    token.add_argument("--max-concurrent", type=int, default=8, help="its requests in flight at most")
    token.set_defaults(run=cmd_token)

    demo = commands.add_parser("demo", help="start everything, ingest the bundled sample, ask its questions, stop")
    demo.add_argument("--samples", type=Path, nargs="+", default=[Path("samples/northwind-2024-annual-report.md")])
    demo.add_argument("--questions", type=Path, default=Path("samples/questions.txt"))
    demo.set_defaults(run=cmd_demo)
    # The benchmarks are a command of their own, `thinkserve-bench` (benchmarks/thinkserve_bench/), which imports this
    # package; nothing here imports it.
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("thinkserve", args, args.run)

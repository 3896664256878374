"""The `bub-bot` command line: serve, chat, run, tapes, doctor."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .config import ConfigError, Settings, load_settings
from .hardening import no_dump
from .tape import TapeEntry, TapeStore, TapeStoreError, open_store, parse_database_url, tape_name

log = logging.getLogger("bub_bot")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bub-bot", description="A chat-channel bot server.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the configured channels, webhooks and health checks")
    chat = sub.add_parser("chat", help="talk to the bot in this terminal")
    chat.add_argument("--session", default="local", help="session name (default: local)")
    run = sub.add_parser("run", help="one turn: send a message, print the reply")
    run.add_argument("message")
    run.add_argument("--session", default="local")
    sub.add_parser("doctor", help="check settings, database, model and channels")
    tapes = sub.add_parser("tapes", help="inspect tapes")
    tsub = tapes.add_subparsers(dest="tapes_command", required=True)
    tlist = tsub.add_parser("list", help="live tapes")
    tlist.add_argument("--all", action="store_true", help="include sidecars and archives")
    show = tsub.add_parser("show", help="entries of a tape")
    show.add_argument("tape", help="tape name or session id (e.g. telegram:123)")
    group = show.add_mutually_exclusive_group()
    group.add_argument("--all", action="store_true", help="the whole tape")
    group.add_argument(
        "--since-anchor", action="store_true", help="after the last anchor (default)"
    )
    show.add_argument("--kinds", default=None, help="comma list of kinds")
    show.add_argument("--limit", type=int, default=None)
    export = tsub.add_parser("export", help="a tape as JSONL on stdout")
    export.add_argument("tape")
    copy = tsub.add_parser(
        "copy",
        help="copy every tape (sidecars, archives, dedupe keys) into another database",
        description="Copy every tape from one database to another, ids and dates as they"
        " are; a second run copies nothing. Stop bub-bot serve first.",
    )
    copy.add_argument(
        "--from",
        dest="source",
        type=_database_url,
        default=None,
        help="database URL or SQLite path to copy from (default: the configured database)",
    )
    copy.add_argument(
        "--to",
        dest="destination",
        type=_database_url,
        required=True,
        help="database URL to copy into, e.g. postgresql://user:password@host:5432/db",
    )
    usage = sub.add_parser(
        "usage",
        help="model usage per person, conversation or model (counters in the database)",
        description="Messages, tokens and cost (BUB_MODEL_PRICES) summed over calendar days"
        " in BUB_TIMEZONE.",
    )
    usage.add_argument("--since", type=_day, required=True, help="first day, YYYY-MM-DD")
    usage.add_argument("--until", type=_day, default=None, help="last day (default: today)")
    usage.add_argument("--by", choices=("user", "conversation", "model"), default="user")
    usage.add_argument("--format", choices=("table", "csv", "json"), default="table")
    return parser


def _day(value: str) -> str:
    from .budgets.export import day

    try:
        return day(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _database_url(value: str) -> str:
    """argparse type: a database URL that parses (the usage line says what is wrong)."""
    try:
        parse_database_url(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bub-bot` script."""
    args = _parser().parse_args(argv)
    # First: from here on no process of ours (stdio MCP servers, commands) running as our
    # user can read /proc/<this pid>/environ, where the tokens are.
    no_dump()
    needs_model = args.command in ("serve", "chat", "run")
    try:
        # `serve` with the web chat as its only channel starts without a model.
        settings = load_settings(
            require_model=needs_model, web_may_lack_model=args.command == "serve"
        )
    except ConfigError as exc:
        print(f"bub-bot: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        # Made up before logging is set up, so the log scrubs it like any configured secret.
        settings = settings.with_web_token()
    from .logs import configure

    configure(settings)
    if args.command in ("chat", "run"):
        # The terminal is the conversation: only warnings and errors go to stderr.
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return asyncio.run(_dispatch(args, settings))
    except TapeStoreError as exc:
        print(f"bub-bot: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:  # found at start (a forced BUB_SHELL_SANDBOX that cannot work)
        print(f"bub-bot: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "serve":
        from .server import serve

        return await serve(settings)
    if args.command == "chat":
        from .cli import chat

        return await chat(settings, args.session)
    if args.command == "run":
        from .cli import run_once

        return await run_once(settings, args.message, args.session)
    if args.command == "doctor":
        from .doctor import doctor

        return await doctor(settings)
    if args.command == "usage":
        from .budgets.export import render, usage_rows

        async with open_store(settings) as store:
            rows = await usage_rows(store, args.since, args.until, args.by)
        print(render(rows, args.by, args.format))
        return 0
    return await _tapes(args, settings)


async def _tapes(args: argparse.Namespace, settings: Settings) -> int:
    if args.tapes_command == "copy":
        return await _copy(args.source or settings.database, args.destination, settings)
    async with open_store(settings) as store:
        if args.tapes_command == "list":
            rows = await store.list_tapes(include_all=args.all)
            if not rows:
                print("no tapes yet")
                return 0
            print(f"{'TAPE':<34} {'SESSION':<32} {'ENTRIES':>8} {'ANCHORS':>7}  LAST ACTIVITY")
            for row in rows:
                session = (row.session_id or "-")[:32]
                print(
                    f"{row.name[:34]:<34} {session:<32} {row.entries:>8} {row.anchors:>7}"
                    f"  {row.updated[:19].replace('T', ' ')}"
                )
            return 0
        name = await _resolve_tape(store, args.tape, settings)
        if name is None:
            print(f"bub-bot: no tape or session named {args.tape!r}", file=sys.stderr)
            return 1
        if args.tapes_command == "export":
            after = 0
            while page := await store.query(name, after_id=after, limit=1000):
                sys.stdout.write("".join(_export_line(entry) for entry in page))
                after = page[-1].id
            return 0
        kinds = [k.strip() for k in args.kinds.split(",")] if args.kinds else None
        entries = await store.query(
            name, after_last_anchor=not args.all, kinds=kinds, limit=args.limit
        )
        for entry in entries:
            print(_show_line(entry))
        return 0


def _export_line(entry: TapeEntry) -> str:
    line = json.dumps(entry.to_json(), ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: escaped, as the store keeps them
        line = json.dumps(entry.to_json(), ensure_ascii=True)
    return line + "\n"


async def _copy(source_url: str, destination_url: str, settings: Settings) -> int:
    """`bub-bot tapes copy`: every tape, one progress line each; 1 if any tape failed."""
    source, destination = parse_database_url(source_url), parse_database_url(destination_url)
    if (source.kind, _same_place(source.target)) == (
        destination.kind,
        _same_place(destination.target),
    ):
        print("bub-bot: --from and --to name the same database", file=sys.stderr)
        return 2
    from .tape.copy import copy_tapes

    size = settings.database_pool_size
    async with (
        open_store(source_url, pool_size=size) as src,
        open_store(destination_url, pool_size=size) as dst,
    ):
        print(f"copying tapes from {src.location} to {dst.location}", flush=True)
        report = await copy_tapes(src, dst, progress=lambda line: print(line, flush=True))
    print(
        f"{report.tapes} tapes, {report.entries:,} entries and {report.dedupe_keys:,} dedupe"
        " keys copied; entry counts verified"
        + (f"; {report.usage_rows:,} usage counter rows copied" if report.usage_rows else "")
        + (f"; {len(report.failed)} tape(s) NOT copied" if report.failed else "")
    )
    if report.failed:
        print(
            f"bub-bot: not copied (the destination holds other data under these names):"
            f" {', '.join(report.failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


def _same_place(target: str) -> str:
    """A SQLite path resolved, a PostgreSQL URL as given: equal when they are one database."""
    if "://" in target:
        return target
    return str(Path(target).expanduser().resolve())


async def _resolve_tape(store: TapeStore, ref: str, settings: Settings) -> str | None:
    rows = await store.list_tapes(include_all=True)
    names = {r.name for r in rows}
    if ref in names:
        return ref
    for row in rows:
        if row.session_id == ref and "__" in row.name and row.name.count("__") == 1:
            return row.name
    candidate = tape_name(ref, settings.workspace)
    return candidate if candidate in names else None


def _show_line(entry) -> str:
    when = entry.date[11:19]
    payload = entry.payload
    if entry.kind == "message":
        content = payload.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        text = f"{payload.get('role')}: {content}"
    elif entry.kind == "anchor":
        text = f"⚓ {payload.get('name')} {json.dumps(payload.get('state'), ensure_ascii=False)}"
    elif entry.kind == "event":
        text = f"{payload.get('name')} {json.dumps(payload.get('data'), ensure_ascii=False)}"
    else:
        text = json.dumps(payload, ensure_ascii=False)
    text = text.replace("\n", " ⏎ ")
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{entry.id:>6} {when} {entry.kind:<11} {text}"


if __name__ == "__main__":
    sys.exit(main())

"""The `bub-bot` command line: serve, chat, run, tapes, doctor."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence

from .config import ConfigError, Settings, load_settings
from .tape import SQLiteTapeStore, TapeStoreError, tape_name

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bub-bot` script."""
    args = _parser().parse_args(argv)
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
    return await _tapes(args, settings)


async def _tapes(args: argparse.Namespace, settings: Settings) -> int:
    async with await SQLiteTapeStore.open(settings.database_path) as store:
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
            for entry in await store.query(name):
                sys.stdout.write(json.dumps(entry.to_json(), ensure_ascii=False) + "\n")
            return 0
        kinds = [k.strip() for k in args.kinds.split(",")] if args.kinds else None
        entries = await store.query(
            name, after_last_anchor=not args.all, kinds=kinds, limit=args.limit
        )
        for entry in entries:
            print(_show_line(entry))
        return 0


async def _resolve_tape(store: SQLiteTapeStore, ref: str, settings: Settings) -> str | None:
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

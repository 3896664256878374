"""Files in: the time a 10 MB document adds to a Telegram turn (download + save), and the
text extraction of a 1 MB PDF (prints figures, asserts nothing).

    .venv/bin/python bench/files_bench.py [--mb 10] [--pdf-kb 1024] [--runs 5]

Document: a `BotServer` with the real Telegram channel (aiogram) against FakeTelegram on
loopback and FakeOpenAI as the model, real SQLite. Timed from pushing the update to the
model's request, for a plain text message and for a message with a `--mb` MB document (the
getFile + streamed download into `inbox/` with fsync, the type sniffed, the head read for the
model); the difference is what the file adds.

PDF: `files.extract.pdf_text` (pypdf) on a PDF of about `--pdf-kb` KB of text pages, cut at
the default inline limit (20 000 characters) and uncut (every page read).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


async def turn_latency(mb: int, runs: int) -> tuple[list[float], list[float]]:
    from bub_bot.config import load_settings
    from bub_bot.server import Bot, BotServer
    from channels.telegram import TelegramChannel
    from tests.fakes.openai_server import FakeOpenAI
    from tests.fakes.telegram_api import FakeTelegram

    plain: list[float] = []
    files: list[float] = []
    data = (b"0123456789abcdef" * 64 + b"\n") * (mb * 1024 * 1024 // 1025)
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeTelegram(token="1:A", username="b") as tg, FakeOpenAI() as model:
            conf = load_settings(
                _env_file=None,
                telegram_token="1:A",
                telegram_api_base=tg.base_url,
                telegram_allow_users="*",
                openai_base_url=model.base_url,
                openai_api_key="sk",
                model="fake-model",
                home=Path(tmp) / "home",
                workspace=Path(tmp),
                stream=False,
                telegram_rate_chat="off",
            )
            bot = await Bot.open(conf, [TelegramChannel(conf, poll_timeout=1)])
            server = BotServer(bot, host="127.0.0.1", port=0)
            await server.start()
            try:
                for i in range(runs):
                    for kind, out in (("text", plain), ("file", files)):
                        user = 1000 + i * 2 + (kind == "file")
                        before = len(model.completion_requests())
                        if kind == "text":
                            update = tg.private_text(user, "hello")
                        else:
                            update = tg.file_message(user, "document", f"D{i}", data,
                                                     caption="hello", file_name="big.log")  # fmt: skip
                        started = time.perf_counter()
                        tg.push_update(update)
                        while len(model.completion_requests()) == before:  # noqa: ASYNC110
                            await asyncio.sleep(0.002)
                        out.append(time.perf_counter() - started)
                        while len(tg.sent_to(user)) < 1:  # noqa: ASYNC110
                            await asyncio.sleep(0.01)
            finally:
                await server.stop()
    return plain, files


def pdf_times(kb: int, runs: int) -> tuple[int, int, list[float], list[float]]:
    from bub_bot.files import extract
    from tests.files_data import make_pdf

    rng = random.Random(7)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    pages: list[str] = []
    pdf = b""
    while len(pdf) < kb * 1024:  # text that does not compress away: about kb KB of PDF
        pages.extend(" ".join(rng.choice(words) for _ in range(400)) for _ in range(20))
        pdf = make_pdf(pages)
    with tempfile.TemporaryDirectory() as tmp:
        box = Path(tmp) / "inbox"
        box.mkdir()
        (box / "f.pdf").write_bytes(pdf)
        cut, full = [], []
        for _ in range(runs):
            t = time.perf_counter()
            extract.pdf_text(Path(tmp), "inbox/f.pdf", len(pdf) + 1, 20_000)
            cut.append(time.perf_counter() - t)
            t = time.perf_counter()
            extract.pdf_text(Path(tmp), "inbox/f.pdf", len(pdf) + 1, 10**9)
            full.append(time.perf_counter() - t)
    return len(pdf), len(pages), cut, full


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=10)
    parser.add_argument("--pdf-kb", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    plain, files = asyncio.run(turn_latency(args.mb, args.runs))
    mp, mf = statistics.median(plain) * 1000, statistics.median(files) * 1000
    print(f"update -> model request, text message:        median {mp:7.1f} ms ({args.runs} runs)")
    print(f"update -> model request, {args.mb} MB document:     median {mf:7.1f} ms")
    print(f"added by the document (download + save + read): {mf - mp:7.1f} ms")
    size, pages, cut, full = pdf_times(args.pdf_kb, args.runs)
    print(f"PDF {size / 1024:.0f} KB, {pages} pages: text cut at 20 000 chars"
          f" median {statistics.median(cut) * 1000:.1f} ms,"
          f" every page median {statistics.median(full) * 1000:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()

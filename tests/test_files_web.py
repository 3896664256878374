"""Web chat uploads over HTTP: staged behind the token, size-capped while read, named by an id
only this server makes; a message may be only files; bad references are 4xx."""

from __future__ import annotations

from pathlib import Path

from tests import test_web
from tests.fakes.openai_server import FakeOpenAI
from tests.test_files_telegram import _inbox, _text

web = test_web.web  # the web harness's fixture
TOKEN = test_web.TOKEN


async def _upload(w, conversation: str, data: bytes, name: str, token: str = TOKEN):
    async with w.http.post(
        f"{w.url}/api/conversations/{conversation}/files",
        data=data,
        headers={"Authorization": f"Bearer {token}", "X-File-Name": name},
    ) as resp:
        return resp.status, await resp.json()


async def test_an_upload_reaches_the_model_and_bad_uploads_are_refused(
    web, fake_openai: FakeOpenAI, workspace: Path
) -> None:
    w = await web(attachment_max_bytes=4096)
    conversation = await w.chat.new_conversation()
    status, up = await _upload(w, conversation, b"x,y\n3,4\n", "..%2F..%2Fpoints.csv")
    assert status == 201 and up["name"] == "../../points.csv" and up["size"] == 8
    async with w.http.post(
        f"{w.url}/api/conversations/{conversation}/messages",
        json={"text": "", "client_id": "client-file-1", "files": [up]},
        headers=w.chat.headers,
    ) as resp:
        assert resp.status == 202
    await w.idle(conversation)
    assert "x,y\n3,4" in _text(fake_openai.last_messages()[-1])
    [saved] = _inbox(workspace)
    assert saved.name.endswith("-points.csv")
    # Over the cap: 413, nothing staged; without the token: 401; an id we never made: 400.
    status, body = await _upload(w, conversation, b"z" * 5000, "big.bin")
    assert status == 413 and "BUB_ATTACHMENT_MAX_BYTES" in body["error"]
    async with w.http.post(
        f"{w.url}/api/conversations/{conversation}/files", data=b"x", headers={"X-File-Name": "a"}
    ) as resp:
        assert resp.status == 401
    for files in ([{"id": "../../etc/passwd"}], [{"name": "x"}], "nope"):
        async with w.http.post(
            f"{w.url}/api/conversations/{conversation}/messages",
            json={"text": "hi", "client_id": "client-file-2", "files": files},
            headers=w.chat.headers,
        ) as resp:
            assert resp.status == 400
    staged = list((w.bot.settings.home.expanduser() / "web-uploads").iterdir())
    assert len(staged) == 1  # only the good upload

// The chat page: no framework, no build step. Messages and answers arrive as server-rendered
// HTML (Markdown with raw HTML disabled) over Server-Sent Events; see channels/web/chat.py.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const messages = $("messages");
  const working = $("working");
  const statusLine = $("status");
  const form = $("composer");
  const input = $("text");
  const list = $("conversations");
  const ID_RE = /^[A-Za-z0-9_-]{6,64}$/;

  let conversation = null;
  let source = null;
  let partial = null;
  const shown = new Map(); // tape entry id -> element
  const pending = new Map(); // client message id -> bubble not yet on the tape

  function randomId() {
    const bytes = new Uint8Array(12);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, { credentials: "same-origin", ...options, headers });
    if (res.status === 401) {
      location.reload(); // shows the login form
      throw new Error("not logged in");
    }
    return res;
  }

  function setStatus(text) {
    statusLine.textContent = text;
    statusLine.hidden = !text;
  }

  function scrollDown() {
    messages.scrollTop = messages.scrollHeight;
  }

  function atBottom() {
    return messages.scrollHeight - messages.scrollTop - messages.clientHeight < 40;
  }

  function removePartial() {
    if (partial) partial.remove();
    partial = null;
  }

  function itemElement(item) {
    const el = document.createElement("div");
    el.className = `item ${item.kind}`;
    el.dataset.id = String(item.id);
    // Rendered by the server from Markdown with raw HTML disabled; the page's CSP forbids
    // inline scripts and event handlers as a second line of defence.
    el.innerHTML = item.html;
    if (item.approval) el.appendChild(approvalButtons(item.approval));
    return el;
  }

  // Approve / Deny under a request, bound to its id and digest; the server stores the press
  // and the page shows the outcome (the request's settled note arrives as an item).
  function approvalButtons(approval) {
    const bar = document.createElement("div");
    bar.className = "approval-buttons";
    bar.dataset.request = approval.id;
    for (const [decision, label] of [["approve", "Approve"], ["deny", "Deny"]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = `approval-${decision}`;
      button.textContent = label;
      button.addEventListener("click", async () => {
        for (const b of bar.querySelectorAll("button")) b.disabled = true;
        try {
          const res = await api(`/api/conversations/${conversation}/approvals/${approval.id}`, {
            method: "POST",
            body: JSON.stringify({ decision, digest: approval.digest }),
          });
          const data = await res.json();
          if (res.status !== 202) {
            setStatus(data.note || data.error || "not decided");
            bar.remove();
          }
        } catch (err) {
          for (const b of bar.querySelectorAll("button")) b.disabled = false;
          setStatus("could not send the decision; try again");
        }
      });
      bar.appendChild(button);
    }
    return bar;
  }

  function closeApproval(id) {
    for (const bar of messages.querySelectorAll(".approval-buttons")) {
      if (bar.dataset.request === id) bar.remove();
    }
  }

  function addItem(item) {
    if (shown.has(item.id)) return;
    const el = itemElement(item);
    const bubble = item.client_id ? pending.get(item.client_id) : undefined;
    if (bubble) {
      bubble.replaceWith(el);
      pending.delete(item.client_id);
    } else {
      messages.appendChild(el);
    }
    shown.set(item.id, el);
    if (item.approval_closed) closeApproval(item.approval_closed);
    // The final answer (or a notice that ends the turn) replaces the partial one; a command's
    // result mid-turn (/status) does not.
    if (item.answer || item.kind === "notice") removePartial();
  }

  function replaceAll(items, truncated) {
    messages.textContent = "";
    shown.clear();
    removePartial();
    if (truncated) {
      const note = document.createElement("div");
      note.className = "item notice";
      note.textContent = "Older messages of this phase are in the tape viewer.";
      messages.appendChild(note);
    }
    items.forEach(addItem);
    for (const bubble of pending.values()) messages.appendChild(bubble);
    scrollDown();
  }

  // The answer while it is written: its text so far (server-rendered like every item), or
  // what the bot is doing ("using fs.read…", shown as text); both empty: none any more.
  function showPartial(data) {
    if (!data.html && !data.status) {
      removePartial();
      return;
    }
    const follow = atBottom(); // do not pull a reader who scrolled up back down
    if (!partial) {
      partial = document.createElement("div");
      partial.className = "item bot partial";
      // Not read out 10 times a second by screen readers: the final answer is.
      partial.setAttribute("aria-hidden", "true");
      messages.appendChild(partial);
    }
    if (data.html) {
      partial.innerHTML = data.html; // server-rendered, as above
    } else {
      const line = document.createElement("div");
      line.className = "tool-status";
      line.textContent = data.status;
      partial.replaceChildren(line);
    }
    if (follow) scrollDown();
  }

  function connect() {
    if (source) source.close();
    messages.textContent = "";
    shown.clear();
    pending.clear();
    partial = null;
    working.hidden = true;
    source = new EventSource(`/api/conversations/${conversation}/events`);
    source.addEventListener("sync", (e) => {
      const data = JSON.parse(e.data);
      replaceAll(data.items, data.truncated);
      // After a /reset the row's title changes with the next message: read it then.
      const current = list.querySelector("a.current");
      if (current) delete current.dataset.titled;
    });
    source.addEventListener("entries", (e) => {
      const data = JSON.parse(e.data);
      data.items.forEach(addItem);
      if (data.items.length) {
        scrollDown();
        touchCurrent(data.items[data.items.length - 1].date);
      }
    });
    source.addEventListener("working", (e) => {
      working.hidden = !JSON.parse(e.data).working;
      if (working.hidden) removePartial();
    });
    source.addEventListener("partial", (e) => showPartial(JSON.parse(e.data)));
    source.onopen = () => setStatus("");
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {
        setStatus("Disconnected. Reload the page (you may need to log in again).");
      } else {
        setStatus("Reconnecting…");
      }
    };
  }

  function pendingBubble(text, clientId) {
    const bubble = document.createElement("div");
    bubble.className = "item user pending";
    const body = document.createElement("div");
    body.className = "plain";
    body.textContent = text;
    bubble.appendChild(body);
    pending.set(clientId, bubble);
    messages.appendChild(bubble);
    scrollDown();
    return bubble;
  }

  async function uploadAll(files) {
    const out = [];
    for (const f of files) {
      const res = await fetch(`/api/conversations/${conversation}/files`, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          Accept: "application/json",
          "Content-Type": "application/octet-stream",
          "X-File-Name": encodeURIComponent(f.name),
        },
        body: f,
      });
      if (res.status === 401) {
        location.reload();
        throw new Error("not logged in");
      }
      const data = await res.json().catch(() => ({}));
      if (!res.ok) throw new Error(data.error || res.statusText);
      out.push({ id: data.id, name: data.name, size: data.size });
    }
    return out;
  }

  async function send(text, clientId, bubble, files = { local: [], uploaded: null }) {
    bubble.classList.remove("failed");
    bubble.querySelector("button.retry")?.remove();
    try {
      // Uploaded once: a retry sends the same upload ids with the same client id.
      if (files.uploaded === null) files.uploaded = await uploadAll(files.local);
      const body = { text, client_id: clientId };
      if (files.uploaded.length) body.files = files.uploaded;
      const res = await api(`/api/conversations/${conversation}/messages`, {
        method: "POST",
        body: JSON.stringify(body),
      });
      if (!res.ok) {
        const data = await res.json().catch(() => ({}));
        throw new Error(data.error || res.statusText);
      }
      bubble.classList.remove("pending");
    } catch (err) {
      bubble.classList.add("failed");
      const retry = document.createElement("button");
      retry.type = "button";
      retry.className = "retry";
      retry.textContent = `Not sent (${err.message}). Retry`;
      // The same client id: if the first try did reach the server, it is not stored twice.
      retry.addEventListener("click", () => send(text, clientId, bubble, files));
      bubble.appendChild(retry);
    }
  }

  function showRow(link, c) {
    link.href = `#${c.id}`;
    link.textContent = c.title;
    // A title from a user's message stays until a /reset (see touchCurrent).
    if (!c.title.startsWith("(")) link.dataset.titled = "1";
    link.title = `last activity ${c.updated.slice(0, 19).replace("T", " ")} UTC`;
  }

  // The whole list is read when a conversation is opened; after that, new entries change
  // one conversation only (this one): its row is read alone and moved to the top.
  async function refreshList() {
    const res = await api("/api/conversations");
    const data = await res.json();
    list.textContent = "";
    let listed = false;
    for (const c of data.conversations) {
      const link = document.createElement("a");
      showRow(link, c);
      if (c.id === conversation) {
        link.className = "current";
        listed = true;
      }
      list.appendChild(link);
    }
    if (conversation && !listed) {
      const link = document.createElement("a");
      link.href = `#${conversation}`;
      link.className = "current";
      link.textContent = "New conversation";
      list.prepend(link);
    }
    return data;
  }

  // New entries change this conversation's row only, and once it has its title only its
  // date: that is the newest item's, and the row moves to the top without a request. A row
  // without a title yet (a new conversation, or just /reset) is read from the server.
  function touchCurrent(date) {
    const link = list.querySelector("a.current");
    if (!link || !link.dataset.titled) {
      refreshCurrent();
      return;
    }
    link.title = `last activity ${date.slice(0, 19).replace("T", " ")} UTC`;
    list.prepend(link);
  }

  async function refreshCurrent() {
    const id = conversation;
    const res = await api(`/api/conversations/${id}`);
    if (!res.ok || id !== conversation) return; // nothing stored yet, or another one is open
    const c = await res.json();
    let link = list.querySelector("a.current");
    if (!link) {
      link = document.createElement("a");
      link.className = "current";
    }
    showRow(link, c);
    list.prepend(link);
  }

  function open(id) {
    conversation = id;
    if (location.hash !== `#${id}`) history.replaceState(null, "", `#${id}`);
    connect();
    refreshList();
    input.focus();
  }

  async function newConversation() {
    const res = await api("/api/conversations", { method: "POST", body: "{}" });
    return (await res.json()).id;
  }

  const fileInput = $("files");
  const attached = $("attached");
  let attaching = [];

  function showAttached() {
    attached.textContent = attaching.map((f) => `📎 ${f.name}`).join("  ");
    attached.hidden = !attaching.length;
  }

  fileInput.addEventListener("change", () => {
    attaching.push(...fileInput.files);
    fileInput.value = "";
    showAttached();
  });
  form.addEventListener("dragover", (e) => {
    e.preventDefault();
    form.classList.add("dropping");
  });
  form.addEventListener("dragleave", () => form.classList.remove("dropping"));
  form.addEventListener("drop", (e) => {
    e.preventDefault();
    form.classList.remove("dropping");
    attaching.push(...e.dataTransfer.files);
    showAttached();
  });

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const text = input.value;
    const local = attaching;
    if ((!text.trim() && !local.length) || !conversation) return;
    input.value = "";
    attaching = [];
    showAttached();
    const clientId = randomId();
    const shown = [text, ...local.map((f) => `📎 ${f.name}`)].filter(Boolean).join("\n");
    send(text, clientId, pendingBubble(shown, clientId), { local, uploaded: null });
  });

  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      form.requestSubmit();
    }
  });

  $("new-conversation").addEventListener("click", async () => {
    location.hash = await newConversation();
  });

  window.addEventListener("hashchange", () => {
    const id = location.hash.slice(1);
    if (ID_RE.test(id) && id !== conversation) open(id);
  });

  async function init() {
    let id = location.hash.slice(1);
    if (!ID_RE.test(id)) {
      const data = await refreshList();
      id = data.conversations.length ? data.conversations[0].id : await newConversation();
    }
    open(id);
  }

  init();
})();

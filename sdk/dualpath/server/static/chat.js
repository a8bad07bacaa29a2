// The chat page of `dualpath serve`: streams from this server's /v1/chat/completions.
// No build step, no external requests. Replies are shown as text (textContent), never
// as HTML, so nothing a model or a user writes can run here.
"use strict";

const $ = (id) => document.getElementById(id);
const messages = [];          // the conversation, OpenAI's shape
let controller = null;        // the AbortController of the reply being streamed
let conversation = 0;         // bumped by New chat: a reply of an older one changes nothing
let modelName = null;
let replyTokens = 512;        // a reply's limit: a quarter of the context, at most 1024
const attached = [];          // data: URLs of the images for the next message (a model that takes images)

function apiKey() { return sessionStorage.getItem("dualpath-api-key") || ""; }

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey()) h.Authorization = "Bearer " + apiKey();
  return h;
}

function thumbnail(url) {
  const img = document.createElement("img");
  img.className = "thumb";
  img.alt = "an attached image";
  img.src = url;
  return img;
}

function add(role, text, images) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  for (const url of (images || []).slice().reverse()) div.prepend(thumbnail(url));
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function status(text) { $("status").textContent = text; }

// A reply's thinking (delta.reasoning_content): a collapsible block above its answer,
// open while the model thinks, closed once the answer starts.
function thinkingBlock(out) {
  const details = document.createElement("details");
  details.className = "thinking";
  details.open = true;
  const summary = document.createElement("summary");
  summary.textContent = "Thinking…";
  const body = document.createElement("div");
  body.className = "thought";
  details.append(summary, body);
  out.prepend(details);
  return details;
}

async function connect() {
  let r;
  try {
    r = await fetch("v1/models", { headers: headers() });
  } catch (e) {
    status("cannot reach the server: " + e);
    return;
  }
  if (r.status === 401) {
    $("key-form").hidden = false;
    $("model").textContent = "(API key needed)";
    $("key").focus();
    return;
  }
  const body = await r.json();
  modelName = body.data[0].id;
  replyTokens = Math.max(16, Math.min(1024, Math.floor(body.data[0].context_length / 4)));
  $("key-form").hidden = true;
  $("model").textContent = modelName + " · context " + body.data[0].context_length + " tokens";
  $("attach").hidden = !(body.data[0].modalities && body.data[0].modalities.vision);
  $("input").focus();
}

// The images picked for the next message, read as data: URLs (the server takes no other).
function attach(files) {
  for (const file of files) {
    const reader = new FileReader();
    reader.onload = () => {
      attached.push(reader.result);
      $("attached").appendChild(thumbnail(reader.result));
    };
    reader.onerror = () => status("cannot read " + file.name);
    reader.readAsDataURL(file);
  }
}

async function send(text) {
  const mine = conversation;
  const images = attached.splice(0);
  $("attached").textContent = "";
  // With images, the content is OpenAI's parts: the images first, then the text.
  const content = images.length ? images.map((url) => ({ type: "image_url", image_url: { url } }))
    .concat(text ? [{ type: "text", text }] : []) : text;
  messages.push({ role: "user", content });
  add("user", text, images);
  const out = add("assistant", "");
  const answer = document.createElement("span");  // the answer's text, after any thinking block
  out.appendChild(answer);
  let thinking = null, thought = "";
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  let reply = "", chunks = 0, first = 0, usage = null;
  const t0 = performance.now();
  status("thinking…");
  try {
    let r;
    for (;;) {
      r = await fetch("v1/chat/completions", {
        method: "POST", headers: headers(), signal: controller.signal,
        body: JSON.stringify({ model: modelName, messages, max_tokens: replyTokens, stream: true,
                               stream_options: { include_usage: true } }),
      });
      if (r.ok) break;
      const err = await r.json().catch(() => ({}));
      // The conversation outgrew the context: the oldest turn goes, as in `dualpath chat`.
      if (err.error && err.error.code === "context_length_exceeded" && messages.length > 2) {
        messages.splice(0, 2);
        status("context full: dropped the oldest turn");
        continue;
      }
      throw new Error((err.error && err.error.message) || ("HTTP " + r.status));
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const event = JSON.parse(line.slice(6));
        if (event.error) throw new Error(event.error.message);
        if (event.usage) usage = event.usage;
        for (const c of event.choices || []) {
          const piece = (c.delta && c.delta.content) || "";
          const thinks = (c.delta && c.delta.reasoning_content) || "";
          if (!piece && !thinks) continue;
          if (!first) first = performance.now();
          chunks += 1;
          if (thinks) {
            if (!thinking) thinking = thinkingBlock(out);
            thought += thinks;
            thinking.lastChild.textContent = thought;
          }
          if (piece) {
            if (thinking && !reply) {
              thinking.open = false;
              thinking.firstChild.textContent = "Thoughts";
            }
            reply += piece;
            answer.textContent = reply;
          }
          $("log").scrollTop = $("log").scrollHeight;
          const secs = (performance.now() - first) / 1000;
          if (secs > 0) $("speed").textContent = (chunks / secs).toFixed(1) + " tok/s";
        }
      }
    }
    const tokens = usage ? usage.completion_tokens : chunks;
    const secs = first ? (performance.now() - first) / 1000 : 0;
    status(tokens + " tokens" + (secs > 0 ? ", " + (Math.max(tokens - 1, 0) / secs).toFixed(1) + " tok/s" : "") +
           ", first after " + ((first || performance.now()) - t0).toFixed(0) + " ms" +
           (usage ? ", " + usage.prompt_tokens_details.cached_tokens + " of " + usage.prompt_tokens +
                    " prompt tokens from the cache" : ""));
  } catch (e) {
    if (e.name === "AbortError") {
      status("stopped");
    } else {
      out.className = "msg error";
      out.textContent = (reply ? reply + "\n\n" : "") + "error: " + e.message;
      status("error");
    }
  } finally {
    if (thinking) thinking.firstChild.textContent = "Thoughts";
    if (mine === conversation) {
      if (reply) messages.push({ role: "assistant", content: reply });
      else messages.pop();  // nothing came back: the question is not part of the conversation
    }
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    $("input").focus();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("ask").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("input").value.trim();
    if ((!text && !attached.length) || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("ask").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("attach").addEventListener("click", () => $("image-file").click());
  $("image-file").addEventListener("change", () => {
    attach($("image-file").files);
    $("image-file").value = "";
  });
  $("new").addEventListener("click", () => {
    conversation += 1;
    if (controller) controller.abort();
    messages.length = 0;
    attached.length = 0;
    $("attached").textContent = "";
    $("log").textContent = "";
    $("speed").textContent = "";
    status("new conversation");
  });
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("dualpath-api-key", $("key").value);
    $("key").value = "";
    connect();
  });
  connect();
});

// dociq data engine UI: plain JS, no framework, no network beyond this server.
// Each click re-predicts with the previous mask as the mask prompt (the server keeps the
// session's last low-res logits); Enter accepts, Backspace rejects, Ctrl+Z undoes.
"use strict";

const params = new URLSearchParams(location.search);
const TOKEN = params.get("token");
const SESSION = "ui-" + Math.random().toString(36).slice(2, 10);
const OVERLAY_ACCEPTED = [63, 174, 90];

const state = {
  pages: [], index: 0, page: null, image: null, scale: 1,
  points: [], labels: [], box: null, clicks: 0, prediction: null, predictionImage: null,
  started: null, proposals: [], selected: -1, undoStack: [], acceptedLayer: null,
  predictRequests: 0, drag: null, busy: false,
};
window.dociqState = state;            // for tests and debugging

const $ = (id) => document.getElementById(id);
const canvas = $("canvas");
const ctx = canvas.getContext("2d");

function withToken(url) {
  if (!TOKEN) return url;
  return url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(TOKEN);
}

async function api(method, url, body) {
  const headers = {};
  if (TOKEN) headers["Authorization"] = "Bearer " + TOKEN;
  const init = { method, headers };
  if (body instanceof FormData) init.body = body;
  else if (body !== undefined) { headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  const res = await fetch(url, init);
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  if (!res.ok) {
    const msg = (data && data.error) || res.status + " " + res.statusText;
    throw new Error(msg);
  }
  return data;
}

function say(text, isError) {
  const el = $("message");
  el.textContent = text || "";
  el.className = isError ? "error" : "";
}

// ---- COCO compressed RLE -> mask (column-major runs, as pycocotools writes them)
function decodeRle(rle) {
  const s = rle.counts, counts = [];
  let p = 0;
  while (p < s.length) {
    let x = 0, k = 0, more = 1;
    while (more) {
      const c = s.charCodeAt(p) - 48;
      x |= (c & 0x1f) << (5 * k);
      more = c & 0x20; p++; k++;
      if (!more && (c & 0x10)) x |= -1 << (5 * k);
    }
    if (counts.length > 2) x += counts[counts.length - 2];
    counts.push(x);
  }
  const [h, w] = rle.size, mask = new Uint8Array(h * w);
  let i = 0, v = 0;
  for (const n of counts) {
    if (v) for (let j = i; j < i + n; j++) mask[(j % h) * w + Math.floor(j / h)] = 1;
    i += n; v = 1 - v;
  }
  return mask;   // row-major [h * w]
}

function maskCanvas(masks, w, h, colour, alpha) {
  const off = document.createElement("canvas");
  off.width = w; off.height = h;
  const octx = off.getContext("2d"), img = octx.createImageData(w, h);
  for (const m of masks) {
    for (let i = 0; i < m.length; i++) {
      if (!m[i]) continue;
      img.data[4 * i] = colour[0]; img.data[4 * i + 1] = colour[1];
      img.data[4 * i + 2] = colour[2]; img.data[4 * i + 3] = alpha;
    }
  }
  octx.putImageData(img, 0, 0);
  return off;
}

// ---- pages
async function loadPages(keepIndex) {
  const data = await api("GET", "api/pages");
  state.pages = data.pages;
  renderProgress(data.progress);
  renderPageList();
  if (!state.pages.length) { say("no pages yet: upload PNG/JPEG/PDF pages"); return; }
  if (!keepIndex) await openPage(Math.min(state.index, state.pages.length - 1));
}

function renderProgress(p) {
  const share = p.pages ? p.pages_with_accepted / p.pages : 0;
  $("progress-bar").style.width = (100 * share).toFixed(1) + "%";
  const clicks = p.mean_clicks_per_accepted == null ? "–" : p.mean_clicks_per_accepted.toFixed(1);
  $("progress-text").textContent =
    `${p.pages_with_accepted}/${p.pages} pages · ${p.accepted} accepted · ${p.rejected} rejected · ${clicks} clicks/mask`;
}

function renderPageList() {
  const nav = $("page-list");
  nav.innerHTML = "";
  const most = Math.max(1, ...state.pages.map((p) => p.num_accepted));
  state.pages.forEach((p, i) => {
    const div = document.createElement("div");
    div.className = "page" + (i === state.index ? " current" : "");
    div.dataset.id = p.id;
    div.innerHTML = `<div>${p.id} <span class="muted">${p.num_accepted} masks</span></div>` +
      `<div class="bar"><div style="width:${(100 * p.num_accepted / most).toFixed(0)}%"></div></div>`;
    div.title = p.source;
    div.onclick = () => openPage(i);
    nav.appendChild(div);
  });
}

async function openPage(i) {
  if (i < 0 || i >= state.pages.length) return;
  state.index = i;
  const id = state.pages[i].id;
  state.page = await api("GET", "api/pages/" + encodeURIComponent(id));
  state.image = await new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("the page image did not load"));
    img.src = withToken("api/pages/" + encodeURIComponent(id) + "/image");
  });
  $("page-name").textContent = `${id} (${i + 1}/${state.pages.length})`;
  state.proposals = []; state.selected = -1;
  resetPrompt();
  buildAcceptedLayer();
  renderPageList(); renderAnnotations(); renderProposals();
  fitCanvas(); draw();
}

function buildAcceptedLayer() {
  const p = state.page;
  const masks = p.annotations.filter((a) => a.status === "accepted").map((a) => decodeRle(a.rle));
  state.acceptedLayer = maskCanvas(masks, p.width, p.height, OVERLAY_ACCEPTED, 90);
}

function fitCanvas() {
  const wrap = $("canvas-wrap");
  const p = state.page;
  state.scale = Math.min(1.5, Math.max(0.1, (wrap.clientWidth - 4) / p.width));
  canvas.width = Math.round(p.width * state.scale);
  canvas.height = Math.round(p.height * state.scale);
}

function draw() {
  if (!state.page) return;
  const s = state.scale;
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.imageSmoothingEnabled = true;
  ctx.drawImage(state.image, 0, 0, canvas.width, canvas.height);
  if (state.acceptedLayer) ctx.drawImage(state.acceptedLayer, 0, 0, canvas.width, canvas.height);
  if ($("show-words").checked) {
    ctx.strokeStyle = "rgba(230, 126, 34, 0.8)"; ctx.lineWidth = 1;
    for (const w of state.page.words) {
      const [x0, y0, x1, y1] = w.box;
      ctx.strokeRect(x0 * s, y0 * s, (x1 - x0) * s, (y1 - y0) * s);
    }
  }
  if (state.predictionImage) {
    ctx.globalAlpha = 0.5;
    ctx.drawImage(state.predictionImage, 0, 0, canvas.width, canvas.height);
    ctx.globalAlpha = 1;
  }
  const box = state.drag && state.drag.moved ? dragBox(state.drag) : state.box;
  if (box) {
    ctx.strokeStyle = "#1e90ff"; ctx.lineWidth = 2;
    ctx.strokeRect(box[0] * s, box[1] * s, (box[2] - box[0]) * s, (box[3] - box[1]) * s);
  }
  state.points.forEach(([x, y], k) => {
    ctx.beginPath(); ctx.arc(x * s, y * s, 5, 0, 2 * Math.PI);
    ctx.fillStyle = state.labels[k] ? "#2ecc71" : "#e74c3c"; ctx.fill();
    ctx.strokeStyle = "#fff"; ctx.lineWidth = 1.5; ctx.stroke();
  });
}

// ---- prompting
function resetPrompt() {
  state.points = []; state.labels = []; state.box = null; state.clicks = 0;
  state.prediction = null; state.predictionImage = null; state.started = null;
  $("clicks").textContent = "0"; $("score").textContent = "–";
}

async function setPrediction(pred) {
  state.prediction = pred;
  if (!pred) { state.predictionImage = null; draw(); return; }
  const img = new Image();
  await new Promise((resolve) => { img.onload = resolve; img.onerror = resolve; img.src = "data:image/png;base64," + pred.mask_png; });
  state.predictionImage = img;
  $("score").textContent = pred.score.toFixed(3);
  if (pred.server_ms !== undefined) $("server-ms").textContent = pred.server_ms.toFixed(1);
  draw();
}

async function predict(fresh) {
  if (!state.page) return;
  const question = $("question").value.trim();
  const body = { session: SESSION, use_previous: !fresh && state.prediction !== null };
  if (question) body.question = question;
  if (state.points.length) { body.points = state.points; body.point_labels = state.labels; }
  if (state.box) body.box = state.box;
  if (!body.question && !body.points && !body.box) { say("type a question, click or drag a box"); return; }
  if (state.started === null) state.started = performance.now();
  state.predictRequests++;
  try {
    const pred = await api("POST", `api/pages/${encodeURIComponent(state.page.id)}/predict`, body);
    state.selected = -1; renderProposals();
    await setPrediction(pred);
    say(pred.area ? "" : "the model found nothing: click on the region");
  } catch (err) { say(err.message, true); }
}

function pagePoint(ev) {
  const r = canvas.getBoundingClientRect();
  return [(ev.clientX - r.left) / state.scale, (ev.clientY - r.top) / state.scale];
}

function dragBox(d) {
  return [Math.min(d.x0, d.x1), Math.min(d.y0, d.y1), Math.max(d.x0, d.x1), Math.max(d.y0, d.y1)];
}

canvas.addEventListener("contextmenu", (ev) => ev.preventDefault());
canvas.addEventListener("mousedown", (ev) => {
  if (!state.page) return;
  const [x, y] = pagePoint(ev);
  state.drag = { x0: x, y0: y, x1: x, y1: y, moved: false, negative: ev.shiftKey || ev.button === 2 };
});
canvas.addEventListener("mousemove", (ev) => {
  if (!state.drag) return;
  const [x, y] = pagePoint(ev);
  state.drag.x1 = x; state.drag.y1 = y;
  state.drag.moved = Math.hypot((x - state.drag.x0) * state.scale, (y - state.drag.y0) * state.scale) > 6;
  if (state.drag.moved) draw();
});
window.addEventListener("mouseup", (ev) => {
  const d = state.drag;
  state.drag = null;
  if (!d || ev.target !== canvas && !d.moved) return;
  if (d.moved) state.box = dragBox(d);
  else { state.points.push([d.x0, d.y0]); state.labels.push(d.negative ? 0 : 1); }
  state.clicks++;
  $("clicks").textContent = String(state.clicks);
  predict(false);
});

// ---- decisions
async function decide(status) {
  if (!state.page) return;
  const body = { session: SESSION, status, clicks: state.clicks, question: $("question").value.trim(),
                 category: $("category").value.trim() || null };
  if (state.selected >= 0) {
    const prop = state.proposals[state.selected];
    body.mask = prop.mask;
    if (!body.category) body.category = prop.category;
  } else if (state.prediction) {
    body.mask = state.prediction.mask;
  } else { say("nothing to " + (status === "accepted" ? "accept" : "reject") + ": predict a mask first"); return; }
  if (state.started !== null) body.seconds = (performance.now() - state.started) / 1000;
  try {
    const saved = await api("POST", `api/pages/${encodeURIComponent(state.page.id)}/annotations`, body);
    state.undoStack.push(saved.id);
    if (state.selected >= 0) { state.proposals[state.selected].decided = status; state.selected = -1; }
    say(`${status} #${saved.id}`);
    resetPrompt();
    await refreshPage();
  } catch (err) { say(err.message, true); }
}

async function undo() {
  const id = state.undoStack.pop();
  if (id === undefined) { say("nothing to undo"); return; }
  try { await api("POST", `api/annotations/${id}/undo`); say(`undid #${id}`); await refreshPage(); }
  catch (err) { say(err.message, true); }
}

async function refreshPage() {
  state.page = await api("GET", "api/pages/" + encodeURIComponent(state.page.id));
  buildAcceptedLayer();
  renderAnnotations(); renderProposals();
  await loadPages(true);
  draw();
}

function renderAnnotations() {
  const box = $("annotations");
  box.innerHTML = "";
  for (const a of state.page.annotations.slice().reverse()) {
    const div = document.createElement("div");
    div.className = "item" + (a.status === "rejected" ? " rejected" : "");
    div.innerHTML = `<div>#${a.id} ${a.status} · ${a.clicks} clicks</div><div class="muted"></div>` +
      `<div class="row"><input placeholder="category"><button type="button">relabel</button></div>`;
    div.querySelector(".muted").textContent = a.question || "";
    const input = div.querySelector("input");
    input.value = a.category || "";
    div.querySelector("button").onclick = async () => {
      try { await api("PATCH", `api/annotations/${a.id}`, { category: input.value.trim() || null }); say(`relabelled #${a.id}`); await refreshPage(); }
      catch (err) { say(err.message, true); }
    };
    box.appendChild(div);
  }
}

// ---- proposals (semi-automatic mode)
async function proposeAll() {
  if (!state.page || !state.image) { say("the page is still loading", true); return; }
  say("segmenting the page…");
  try {
    const data = await api("POST", `api/pages/${encodeURIComponent(state.page.id)}/proposals`, {});
    state.proposals = data.regions.map((r) => Object.assign({ decided: null }, r));
    $("server-ms").textContent = data.server_ms.toFixed(0);
    say(`${state.proposals.length} proposals`);
    renderProposals();
    if (state.proposals.length) await selectProposal(0);
  } catch (err) { say(err.message, true); }
}

async function selectProposal(i) {
  resetPrompt();
  state.selected = i;
  const p = state.proposals[i];
  await setPrediction({ mask: p.mask, mask_png: p.mask_png, score: p.score });
  state.prediction = null;      // a proposal is decided as it is, not refined from
  renderProposals();
}

function renderProposals() {
  const box = $("proposals");
  if (!state.proposals.length) { box.innerHTML = '<p class="muted">“propose all” segments the page automatically.</p>'; return; }
  box.innerHTML = "";
  state.proposals.forEach((p, i) => {
    const div = document.createElement("div");
    div.className = "item" + (i === state.selected ? " selected" : "");
    div.innerHTML = `<div>${p.category} · ${p.score.toFixed(2)} ${p.decided ? "· " + p.decided : ""}</div>` +
      '<div class="row"><button type="button" class="show">show</button>' +
      '<button type="button" class="ok">accept</button><button type="button" class="no">reject</button></div>';
    div.querySelector(".show").onclick = () => selectProposal(i);
    div.querySelector(".ok").onclick = async () => { await selectProposal(i); await decide("accepted"); };
    div.querySelector(".no").onclick = async () => { await selectProposal(i); await decide("rejected"); };
    box.appendChild(div);
  });
}

// ---- uploads, retrain
$("upload").addEventListener("change", async (ev) => {
  const form = new FormData();
  for (const f of ev.target.files) form.append("files", f, f.name);
  say("uploading…");
  try {
    const res = await api("POST", "api/uploads", form);
    say(`${res.pages.length} pages added` + (res.skipped.length ? `, ${res.skipped.length} skipped` : ""));
    await loadPages(true);
  } catch (err) { say(err.message, true); }
  ev.target.value = "";
});
$("retrain").onclick = async () => {
  try { await api("POST", "api/retrain", {}); say("retrain round started…"); }
  catch (err) { say(err.message, true); return; }
  const poll = setInterval(async () => {          // a round trains for minutes: report when it ends
    let st;
    try { st = await api("GET", "api/retrain"); } catch (err) { clearInterval(poll); say(err.message, true); return; }
    if (st.running) return;
    clearInterval(poll);
    if (st.error) say("retrain failed: " + st.error, true);
    else { say("retrain round: " + ((st.last && st.last.status) || "done")); await loadPages(false); }
  }, 3000);
};

// ---- controls and keys
$("ask").onclick = () => { state.points = []; state.labels = []; state.box = null; predict(true); };
$("accept").onclick = () => decide("accepted");
$("reject").onclick = () => decide("rejected");
$("undo").onclick = undo;
$("clear").onclick = () => { resetPrompt(); state.selected = -1; renderProposals(); draw(); };
$("propose").onclick = proposeAll;
$("prev").onclick = () => openPage(state.index - 1);
$("next").onclick = () => openPage(state.index + 1);
$("show-words").onchange = draw;
$("question").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter") { ev.preventDefault(); ev.stopPropagation(); $("ask").onclick(); }
});
window.addEventListener("resize", () => { if (state.page) { fitCanvas(); draw(); } });
document.addEventListener("keydown", (ev) => {
  const typing = ev.target instanceof HTMLInputElement && ev.target.type === "text";
  if ((ev.ctrlKey || ev.metaKey) && ev.key.toLowerCase() === "z" && !typing) { ev.preventDefault(); undo(); return; }
  if (typing) return;
  if (ev.key === "Enter") { ev.preventDefault(); decide("accepted"); }
  else if (ev.key === "Backspace" || ev.key === "Delete") { ev.preventDefault(); decide("rejected"); }
  else if (ev.key === "n" || ev.key === "N" || ev.key === "ArrowRight") openPage(state.index + 1);
  else if (ev.key === "p" || ev.key === "P" || ev.key === "ArrowLeft") openPage(state.index - 1);
  else if (ev.key === "Escape") $("clear").onclick();
});

loadPages(false).catch((err) => say(err.message, true));

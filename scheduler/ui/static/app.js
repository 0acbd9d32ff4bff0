// gpuplan dashboard: the few live parts. No framework, no build step; served from /ui/static
// under a Content-Security-Policy that allows only this file (no inline scripts).
"use strict";

// The job page's log tail: ask for the lines after the last one shown, append them as text
// (never as HTML), and stop once the server says the log is complete.
function followLog(pre) {
  const status = document.getElementById("log-status");
  let next = Number(pre.dataset.next || "0");
  const src = pre.dataset.src;
  async function tick() {
    let done = false;
    try {
      const sep = src.includes("?") ? "&" : "?";
      const resp = await fetch(src + sep + "since=" + next, {credentials: "same-origin", headers: {"Accept": "application/json"}});
      if (resp.status === 401 || resp.status === 404) {
        status.textContent = "Stopped following: " + (resp.status === 401 ? "signed out." : "job not found.");
        return;
      }
      if (resp.ok) {
        const body = await resp.json();
        if (body.lines.length) {
          const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          pre.append(document.createTextNode(body.lines.join("\n") + "\n"));
          if (atBottom) pre.scrollTop = pre.scrollHeight;
        }
        next = body.next;
        pre.dataset.next = String(next);
        showState(body.state, (pre.dataset.terminal || "").split(" "));
        done = body.complete;
        status.textContent = done ? "The log is complete (job " + body.state + ")." : "Following the log… (job " + body.state + ")";
      }
    } catch (err) {
      status.textContent = "Could not reach the server; retrying…";
    }
    if (!done) setTimeout(tick, 2000);
  }
  pre.scrollTop = pre.scrollHeight;
  setTimeout(tick, 1000);
}

// The job page's state badge and Cancel button follow the state each log poll reports, so the
// page never shows "running" (or offers Cancel) once the job has ended.
function showState(state, terminal) {
  const badge = document.getElementById("job-state");
  if (badge && state && badge.textContent !== state) {
    badge.textContent = state;
    badge.className = "state " + state;
  }
  const cancel = document.getElementById("cancel");
  if (cancel && terminal.includes(state)) cancel.remove();
}

// The plan page's upload: put the chosen file's text in the spec box (the form also uploads it).
function fillSpecFromFile(input) {
  input.addEventListener("change", () => {
    const file = input.files && input.files[0];
    const box = document.querySelector("textarea[name=spec]");
    if (!file || !box || file.size > 64000) return;
    file.text().then((text) => { box.value = text; });
  });
}

document.addEventListener("DOMContentLoaded", () => {
  // Plain HTTP away from loopback: the browser will drop the Secure session cookie, so say why
  // sign-in cannot work here before the user tries.
  const https = document.getElementById("needs-https");
  if (https && !window.isSecureContext) https.hidden = false;
  const pre = document.getElementById("log");
  if (pre && pre.dataset.complete !== "true") followLog(pre);
  const upload = document.querySelector("input[type=file][name=upload]");
  if (upload) fillSpecFromFile(upload);
  for (const select of document.querySelectorAll("select.autosubmit")) {
    select.addEventListener("change", () => select.form.submit());
  }
});

// The labelling queue: mark the answering passages, an outcome and the response's correctness
// with the keyboard alone, save through the gold API, and tag a miss's cause on the way.
// Requests carry the X-Requested-By header: with the login cookie the API refuses a change
// without it, which a form or script on another site cannot add.
"use strict";

(function () {
  const form = document.getElementById("label-form");
  if (!form) {
    return;
  }
  const status = document.getElementById("label-status");
  const causeStep = document.getElementById("cause-step");
  const missing = document.getElementById("missing");
  const boxes = Array.from(form.querySelectorAll('input[name="passage"]'));
  const outcomes = Array.from(form.querySelectorAll('input[name="outcome"]'));
  const verdicts = Array.from(form.querySelectorAll('input[name="correct"]'));
  const causes = Array.from(form.querySelectorAll('input[name="cause"]'));
  const k = Number.parseInt(form.dataset.k, 10);
  const OUTCOME_KEYS = { a: "answered", m: "not_retrieved", x: "not_in_corpus", q: "ambiguous" };
  const VERDICT_KEYS = { y: "true", w: "false", u: "" };
  let mode = "label"; // then "cause" after saving a miss
  let busy = false;

  function pick(radios, value) {
    const radio = radios.find((r) => r.value === value);
    if (radio) {
      radio.checked = true;
    }
    return radio;
  }

  function chosen(radios) {
    const radio = radios.find((r) => r.checked);
    return radio ? radio.value : null;
  }

  function headers() {
    const out = { "Content-Type": "application/json", Accept: "application/json" };
    out[form.dataset.header] = form.dataset.headerValue;
    return out;
  }

  function next() {
    window.location.assign(form.dataset.next);
  }

  function body() {
    const outcome = chosen(outcomes) || "answered";
    const out = { outcome: outcome };
    if (outcome === "answered") {
      out.passage_ids = boxes.filter((b) => b.checked).map((b) => b.value);
    } else if (outcome === "not_retrieved") {
      const given = missing.value.trim();
      // One word is the passage's id; anything with spaces is its text.
      out.missing_passage = /\s/.test(given) ? { text: given } : { id: given };
    }
    const verdict = chosen(verdicts);
    if (verdict === "true" || verdict === "false") {
      out.answer_correct = verdict === "true";
    }
    // Without API keys the "you are" name says who labels (with keys the key does).
    if (form.dataset.labeller) {
      out.labeller = form.dataset.labeller;
    }
    return out;
  }

  function isMiss(sent) {
    if (sent.outcome === "not_retrieved") {
      return true;
    }
    if (sent.outcome !== "answered") {
      return false; // not in the corpus, ambiguous: the service records the cause itself
    }
    const inPrompt = new Set(boxes.slice(0, k).map((b) => b.value));
    return !sent.passage_ids.some((id) => inPrompt.has(id));
  }

  async function send(url, method, payload) {
    const response = await fetch(url, {
      method: method,
      headers: headers(),
      credentials: "same-origin",
      body: JSON.stringify(payload),
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) {
      const detail = typeof answer.detail === "string" ? answer.detail : JSON.stringify(answer.detail);
      throw new Error(detail || "HTTP " + response.status);
    }
    return answer;
  }

  async function saveLabel() {
    const sent = body();
    if (sent.outcome === "answered" && sent.passage_ids.length === 0) {
      status.textContent = "Mark the answering passages (1–9, 0), or choose another outcome (m, x, q).";
      return;
    }
    if (sent.outcome === "not_retrieved" && !missing.value.trim()) {
      status.textContent = "Type the missed passage's id or paste its text.";
      missing.focus();
      return;
    }
    status.textContent = "Saving…";
    try {
      await send(form.dataset.url, "POST", sent);
    } catch (error) {
      status.textContent = "Not saved: " + error.message;
      return;
    }
    form.dataset.saved = "label";
    if (isMiss(sent)) {
      mode = "cause";
      causeStep.hidden = false;
      status.textContent = "Saved. A miss: choose its cause (1–" + causes.length + ") and Enter, or Escape to go on.";
      return;
    }
    status.textContent = "Saved.";
    next();
  }

  async function saveCause() {
    const cause = chosen(causes);
    if (!cause) {
      status.textContent = "Choose a cause (1–" + causes.length + "), or Escape to go on.";
      return;
    }
    try {
      await send(form.dataset.causeUrl, "PUT", { cause: cause, note: null });
    } catch (error) {
      status.textContent = "Cause not saved: " + error.message;
      return;
    }
    form.dataset.saved = "cause";
    next();
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (busy) {
      return;
    }
    busy = true;
    try {
      await (mode === "cause" ? saveCause() : saveLabel());
    } finally {
      busy = false;
    }
  });

  boxes.forEach((box) =>
    box.addEventListener("change", () => {
      if (box.checked) {
        pick(outcomes, "answered");
      }
    })
  );

  document.addEventListener("keydown", (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey || event.defaultPrevented) {
      return;
    }
    if (event.target.closest && event.target.closest("#labeller-form")) {
      return; // typing the "you are" name: keys are letters, Enter keeps the name
    }
    const typing = event.target === missing;
    if (typing) {
      if (event.key === "Escape") {
        missing.blur();
        event.preventDefault();
      } else if (event.key === "Enter" && !event.shiftKey) {
        form.requestSubmit();
        event.preventDefault();
      }
      return;
    }
    if (event.key === "Enter") {
      form.requestSubmit();
      event.preventDefault();
      return;
    }
    const digit = event.key === "0" ? 10 : Number.parseInt(event.key, 10);
    if (mode === "cause") {
      if (digit >= 1 && digit <= causes.length) {
        causes[digit - 1].checked = true;
        event.preventDefault();
      } else if (event.key === "Escape") {
        next();
        event.preventDefault();
      }
      return;
    }
    if (digit >= 1 && digit <= Math.min(boxes.length, 10)) {
      const box = boxes[digit - 1];
      box.checked = !box.checked;
      if (box.checked) {
        pick(outcomes, "answered");
      }
      event.preventDefault();
    } else if (event.key in OUTCOME_KEYS) {
      pick(outcomes, OUTCOME_KEYS[event.key]);
      if (event.key === "m") {
        missing.focus();
      }
      event.preventDefault();
    } else if (event.key in VERDICT_KEYS) {
      pick(verdicts, VERDICT_KEYS[event.key]);
      event.preventDefault();
    } else if (event.key === "s") {
      next();
      event.preventDefault();
    }
  });
})();

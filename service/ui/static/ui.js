// Records a miss's cause from the miss page, and the keyboard shortcuts that make triage quick.
// The request carries the X-Requested-By header: with the login cookie the API refuses a change
// without it, which a form or script on another site cannot add.
"use strict";

(function () {
  const form = document.getElementById("cause-form");
  if (!form) {
    return;
  }
  const status = document.getElementById("cause-status");
  // Single-key shortcuts can be turned off (they may clash with a screen reader's own keys).
  const shortcuts = document.getElementById("shortcuts");
  const SHORTCUTS_KEY = "rm-ui-shortcuts";
  shortcuts.checked = window.localStorage.getItem(SHORTCUTS_KEY) !== "off";
  shortcuts.addEventListener("change", () => {
    window.localStorage.setItem(SHORTCUTS_KEY, shortcuts.checked ? "on" : "off");
  });
  const radios = Array.from(form.querySelectorAll('input[name="cause"]'));

  function titleOf(value) {
    const radio = radios.find((r) => r.value === value);
    return radio ? radio.parentElement.textContent.replace(/^\s*\d+\s*/, "").trim() : value;
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const chosen = radios.find((r) => r.checked);
    if (!chosen) {
      status.textContent = "Choose a cause first.";
      radios[0].focus();
      return;
    }
    const note = form.elements.namedItem("note").value.trim();
    const headers = { "Content-Type": "application/json", Accept: "application/json" };
    headers[form.dataset.header] = form.dataset.headerValue;
    status.textContent = "Saving…";
    try {
      const response = await fetch(form.dataset.url, {
        method: "PUT",
        headers: headers,
        credentials: "same-origin",
        body: JSON.stringify({ cause: chosen.value, note: note || null }),
      });
      const body = await response.json().catch(() => ({}));
      if (response.ok) {
        status.textContent = "Saved: " + titleOf(body.cause) + ".";
        form.dataset.saved = body.cause;
      } else {
        const detail = typeof body.detail === "string" ? body.detail : "HTTP " + response.status;
        status.textContent = "Not saved: " + detail;
      }
    } catch (error) {
      status.textContent = "Not saved: " + error;
    }
  });

  document.addEventListener("keydown", (event) => {
    if (!shortcuts.checked || event.altKey || event.ctrlKey || event.metaKey || event.defaultPrevented) {
      return;
    }
    const target = event.target;
    if (target.closest && target.closest('textarea, select, input:not([type="radio"])')) {
      return;
    }
    const digit = Number.parseInt(event.key, 10);
    if (digit >= 1 && digit <= radios.length) {
      radios[digit - 1].checked = true;
      radios[digit - 1].focus();
      event.preventDefault();
    } else if (event.key === "s") {
      form.requestSubmit();
      event.preventDefault();
    } else if (event.key === "n") {
      const next = document.getElementById("next-miss");
      if (next) {
        next.click();
        event.preventDefault();
      }
    }
  });
})();

// The status page's script (proxy/ui): reads the admin API with the key this tab
// keeps in sessionStorage and renders what it reads. Every value from the API goes
// into the page through textContent or an attribute, never as markup, so a name such
// as "<script>" is shown as the text it is.
"use strict";

(function () {
  const API = "/_fence/v1";
  const KEY = "fenceproxy.key";
  const REFRESH_MS = 5000;
  const SVG = "http://www.w3.org/2000/svg";
  let timer = null;
  let latest = { inDoubt: [], blocked: [] };

  // --- small DOM helpers --------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function table(header, rows, cls) {
    const head = el("tr", {}, ...header.map((h) => el("th", {}, h)));
    const body = rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c))));
    return el("table", { class: cls || null }, el("thead", {}, head), el("tbody", {}, ...body));
  }

  function panel(id) {
    return document.querySelector(`#${id} .body`);
  }

  function fill(id, ...children) {
    panel(id).replaceChildren(...children);
  }

  function seconds(value) {
    if (value === null || value === undefined) return "–";
    const s = Math.abs(value);
    if (s < 120) return `${value.toFixed(1)} s`;
    if (s < 7200) return `${(value / 60).toFixed(1)} min`;
    return `${(value / 3600).toFixed(1)} h`;
  }

  function ago(at, now) {
    return at === null || at === undefined ? "never" : `${seconds(now - at)} ago`;
  }

  // --- the key and the API ------------------------------------------------------------

  class Refused extends Error {
    constructor(status, problem) {
      super((problem && problem.detail) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem;
    }
  }

  async function api(path, options) {
    const key = sessionStorage.getItem(KEY);
    const headers = { Authorization: `Bearer ${key}` };
    const init = { method: "GET", headers, cache: "no-store", credentials: "omit" };
    if (options && options.body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    const response = await fetch(API + path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (error) {
      data = null;
    }
    if (!response.ok) throw new Refused(response.status, data);
    return data;
  }

  function showLogin(message) {
    clearTimeout(timer);
    document.getElementById("board").hidden = true;
    document.getElementById("forget").hidden = true;
    document.getElementById("login").hidden = false;
    document.getElementById("login-error").textContent = message || "";
    document.title = "fenceproxy status";
  }

  async function login(event) {
    event.preventDefault();
    const input = document.getElementById("token");
    sessionStorage.setItem(KEY, input.value.trim());
    try {
      await api("/status");
    } catch (error) {
      sessionStorage.removeItem(KEY);
      showLogin(`Refused: ${error.message}`);
      return;
    }
    input.value = "";
    start();
  }

  function start() {
    document.getElementById("login").hidden = true;
    document.getElementById("board").hidden = false;
    document.getElementById("forget").hidden = false;
    refresh();
  }

  // --- refreshing ---------------------------------------------------------------------

  function formOpen() {
    return document.querySelector("form.action") !== null;
  }

  async function refresh() {
    clearTimeout(timer);
    if (!formOpen()) {
      const parts = [
        ["service", "/status", renderService],
        ["policies", "/status", renderPolicies],
        ["outstanding", "/reconcile", renderOutstanding],
        ["leases", "/leases/recent", renderLeases],
        ["refusals", "/rejections?limit=200", renderRefusals],
        ["advice", "/lease-advice", renderAdvice],
      ];
      const results = await Promise.allSettled(parts.map(([, path]) => api(path)));
      for (let i = 0; i < parts.length; i++) {
        const [id, , render] = parts[i];
        const result = results[i];
        if (result.status === "fulfilled") {
          render(result.value);
        } else if (result.reason instanceof Refused && result.reason.status === 401) {
          sessionStorage.removeItem(KEY);
          showLogin(`The key was refused: ${result.reason.message}`);
          return;
        } else {
          fill(id, el("p", { class: "error" }, `Cannot read this: ${result.reason.message}`));
        }
      }
      await renderDetail();
      const stamp = new Date().toLocaleTimeString();
      document.getElementById("refreshed").textContent = `refreshed ${stamp}`;
    } else {
      // Counted where a test (and a curious operator) can see it: the form is kept.
      const skipped = Number(document.body.dataset.refreshesPaused || 0) + 1;
      document.body.dataset.refreshesPaused = String(skipped);
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  // --- panels -------------------------------------------------------------------------

  function renderService(status) {
    const store = status.store;
    const now = store.now;
    const me = status.instance;
    const health = store.answers
      ? el("span", { class: "ok" }, "answers")
      : el("span", { class: "bad" }, `does not answer: ${store.problem}`);
    const facts = el(
      "dl",
      {},
      el("dt", {}, "instance"),
      el("dd", {}, me.instance_id),
      el("dt", {}, "version"),
      el("dd", {}, me.version),
      el("dt", {}, "uptime"),
      el("dd", {}, seconds(me.uptime_s)),
      el("dt", {}, "store"),
      el("dd", {}, `${store.backend}: `, health),
      el("dt", {}, "last sweep"),
      el("dd", {}, me.last_sweep_age_s === null ? "never" : `${seconds(me.last_sweep_age_s)} ago`),
      el("dt", {}, "last probe run"),
      el("dd", {}, me.last_probe_age_s === null ? "never" : `${seconds(me.last_probe_age_s)} ago`)
    );
    const replicas = status.replicas.map((r) => [
      r.instance_id,
      r.version,
      ago(r.seen_at, now),
      seconds(now - r.started_at),
      ago(r.last_sweep_at, now),
      ago(r.last_probe_at, now),
    ]);
    fill(
      "service",
      facts,
      el("h3", {}, `Replicas seen in the last ${seconds(status.replicas_window_s)}`),
      replicas.length
        ? table(["instance", "version", "seen", "up", "last sweep", "last probe"], replicas)
        : el("p", { class: "muted" }, "none has written its row yet")
    );
  }

  // Which policy file each replica serves (the sha256 of its bytes): more than one
  // means a replica was not reloaded or restarted after a change.
  function renderPolicies(status) {
    const digests = status.policy_digests || [];
    const mine = status.instance.policy_digest;
    const short = (d) => (d ? d.slice(0, 12) : "-");
    const verdict =
      digests.length > 1
        ? el(
            "p",
            { class: "bad policy-mismatch" },
            `The replicas serve ${digests.length} different policy files: reload or restart the ones behind.`
          )
        : el("p", { class: "ok" }, "Every replica that says serves the same policy file.");
    const rows = status.replicas.map((r) => [
      r.instance_id,
      short(r.policy_digest),
      mine && r.policy_digest && r.policy_digest !== mine ? "differs from this one" : "",
    ]);
    fill(
      "policies",
      el("p", {}, `This replica: ${short(mine)}`),
      verdict,
      rows.length ? table(["instance", "policy (sha256)", ""], rows) : el("p", { class: "muted" }, "no replica row yet")
    );
  }

  function renderOutstanding(report) {
    latest = { inDoubt: report.in_doubt, blocked: report.blocked_resources };
    const n = report.in_doubt.length;
    const b = report.blocked_resources.length;
    document.title = n || b ? `(${n} in doubt, ${b} blocked) fenceproxy status` : "fenceproxy status";
    if (!n && !b) {
      fill("outstanding", el("p", { class: "ok" }, "Nothing in doubt, no resource blocked."));
      return;
    }
    const blocked = el(
      "ul",
      { class: "blocked" },
      ...report.blocked_resources.map((r) => el("li", { class: "blocked-resource" }, r))
    );
    const cards = report.in_doubt.map((effect) => effectCard(effect));
    fill(
      "outstanding",
      el("h3", {}, `Blocked resources (${b})`),
      blocked,
      el("h3", {}, `Effects in doubt (${n}), oldest first`),
      ...cards
    );
  }

  function effectCard(effect) {
    const last = effect.last_event;
    const facts = table(
      ["state", "age", "route", "resource", "holder", "epoch", "idempotency key"],
      [
        [
          effect.state,
          seconds(effect.age_s),
          effect.route,
          effect.resource,
          effect.holder,
          effect.epoch,
          effect.idempotency_key || "–",
        ],
      ]
    );
    const lastText = last ? `last: ${last.kind} by ${last.actor}: ${last.conclusion} (${last.detail})` : "";
    // A route without a probe is said once: no schedule to show, and a "no_probe"
    // answer to an earlier "Probe now" would only repeat it.
    const probes = effect.has_probe
      ? el(
          "p",
          { class: "probes" },
          `probes: ${effect.probe_attempts}`,
          effect.next_probe_at ? `; next in ${seconds(effect.next_probe_at - Date.now() / 1000)}` : "; none scheduled",
          lastText ? `; ${lastText}` : ""
        )
      : el(
          "p",
          { class: "probes no-probe" },
          `Route ${effect.route} has no probe: an operator must resolve this effect.`,
          last && last.conclusion !== "no_probe" ? ` ${lastText[0].toUpperCase()}${lastText.slice(1)}` : ""
        );
    const link = el("a", { href: `#effect=${encodeURIComponent(effect.id)}`, class: "detail-link" }, "history");
    return el(
      "article",
      { class: `effect state-${effect.state}`, "data-effect-id": effect.id },
      el("h4", {}, `${effect.method} ${effect.path} `, link),
      facts,
      probes,
      actions(effect)
    );
  }

  function renderLeases(leases) {
    const live = leases.live.map((l) => [l.resource, l.holder, l.epoch, seconds(l.ttl_left_s), l.client || "–"]);
    const ended = leases.recently_ended.map((l) => {
      const mark = l.came_back_at !== null
        ? el("span", { class: "false-expiry" }, `came back ${seconds(l.came_back_at - l.expires_at)} after expiry (false expiry)`)
        : "";
      const endedAt = l.ended_at !== null && l.ended_at < l.expires_at ? l.ended_at : l.expires_at;
      return [l.resource, l.holder, l.epoch, ago(endedAt, leases.now), l.end_reason || "expired", mark];
    });
    fill(
      "leases",
      el("h3", {}, `Live (${live.length})`),
      live.length ? table(["resource", "holder", "epoch", "time left", "client"], live, "live-leases") : el("p", { class: "muted" }, "none"),
      el("h3", {}, `Expired or ended in the last ${seconds(leases.window_s)} (${ended.length})`),
      ended.length
        ? table(["resource", "holder", "epoch", "ended", "how", "holder came back"], ended, "ended-leases")
        : el("p", { class: "muted" }, "none")
    );
  }

  function renderRefusals(data) {
    const byCode = new Map();
    for (const r of data.rejections) {
      if (!byCode.has(r.code)) byCode.set(r.code, []);
      byCode.get(r.code).push(r);
    }
    if (!byCode.size) {
      fill("refusals", el("p", { class: "muted" }, "No refusal recorded lately."));
      return;
    }
    const groups = [...byCode.entries()].map(([code, rows]) =>
      el(
        "div",
        { class: "refusal-group", "data-code": code },
        el("h4", {}, `${code}: ${rows.reduce((sum, r) => sum + r.count, 0)} refused`),
        table(
          ["at", "request", "resource", "holder", "client", "count"],
          rows.slice(0, 3).map((r) => [
            new Date(r.at * 1000).toLocaleTimeString(),
            `${r.method} ${r.path}`,
            r.resource || "–",
            r.holder || "–",
            r.client || "–",
            r.count,
          ])
        )
      )
    );
    fill("refusals", el("p", { class: "muted" }, `The latest ${data.rejections.length}, by code, latest few of each.`), ...groups);
  }

  function renderAdvice(advice) {
    const groups = advice.groups.filter((g) => g.turns > 0 || g.false_expiry_curve.length);
    if (!groups.length) {
      // The server counts ended leases as the Leases panel lists them (leases_ended):
      // "no lease ended" only when none did, else why none of them measured a turn.
      const ended = advice.leases_ended;
      const why = ended
        ? `${ended} lease(s) ended, none released by its holder: a turn (grant to release) is measured only from a release.`
        : "no lease ended since records began.";
      fill("advice", el("p", { class: "muted", id: "advice-empty" }, `No lease-sizing data yet: ${why}`));
      return;
    }
    fill(
      "advice",
      ...groups.map((g) => {
        const delay = g.detection_delay_s;
        return el(
          "div",
          { class: "advice-group" },
          el("h3", {}, g.resource),
          el(
            "p",
            {},
            `suggested TTL ${seconds(g.suggested_ttl_s)}; ${g.turns} measured turns; ` +
              `${g.expired.total} expired, ${g.expired.holder_came_back} of them falsely (the holder came back)`,
            delay ? `; expected crash-detection delay ${seconds(delay.expected)}` : ""
          ),
          chart(g),
          ...g.warnings.map((w) => el("p", { class: "warn" }, w))
        );
      }),
      ...advice.problems.map((p) => el("p", { class: "error" }, p))
    );
  }

  // The false-expiry curve: the share of measured turns a lease of each length would
  // cut short, with the suggested TTL and the TTLs in use marked.
  function chart(group) {
    const W = 480, H = 200, L = 44, R = 12, T = 12, B = 32;
    const points = group.false_expiry_curve;
    const ttls = group.ttls_in_use_s || {};
    const marks = [["suggested", group.suggested_ttl_s, "suggested"]];
    if (ttls.p50 !== undefined) marks.push(["in use (median)", ttls.p50, "in-use"]);
    if (ttls.min !== undefined) marks.push(["in use (min)", ttls.min, "in-use"]);
    const xs = points.map((p) => p.lease_s).concat(marks.map((m) => m[1]).filter((v) => v !== null));
    const xmax = Math.max(1, ...xs) * 1.05;
    const x = (v) => L + ((W - L - R) * v) / xmax;
    const y = (share) => T + (H - T - B) * (1 - share);
    const root = svg("svg", { class: "curve", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
    root.append(svg("title", {}, `false-expiry curve for ${group.resource}`));
    root.append(svg("line", { x1: L, y1: y(0), x2: W - R, y2: y(0), class: "axis" }));
    root.append(svg("line", { x1: L, y1: y(0), x2: L, y2: y(1), class: "axis" }));
    for (const share of [0, 0.5, 1]) {
      root.append(svg("text", { x: L - 6, y: y(share) + 4, class: "tick", "text-anchor": "end" }, `${share * 100}%`));
    }
    root.append(svg("text", { x: W - R, y: H - 4, class: "tick", "text-anchor": "end" }, `lease (s), up to ${xmax.toFixed(1)}`));
    if (points.length) {
      const d = points.map((p, i) => `${i ? "L" : "M"}${x(p.lease_s).toFixed(1)},${y(p.share).toFixed(1)}`).join(" ");
      root.append(svg("path", { d, class: "line" }));
    }
    marks.forEach(([label, value, cls], i) => {
      if (value === null || value === undefined) return;
      const mark = svg("g", { class: `mark ${cls}`, "data-mark": label, "data-seconds": value });
      mark.append(svg("line", { x1: x(value), y1: y(0), x2: x(value), y2: y(1) }));
      // Labels past the middle go on the line's left, so none runs off the chart.
      const left = x(value) > W / 2;
      mark.append(svg("text", {
        x: x(value) + (left ? -3 : 3), y: y(1) + 10 + 12 * i, class: "tick", "text-anchor": left ? "end" : "start",
      }, `${label} ${seconds(value)}`));
      root.append(mark);
    });
    return root;
  }

  // --- the effect detail view ---------------------------------------------------------

  function detailId() {
    const match = /^#effect=(.+)$/.exec(location.hash);
    return match ? decodeURIComponent(match[1]) : null;
  }

  async function renderDetail() {
    const section = document.getElementById("effect-detail");
    const id = detailId();
    if (id === null) {
      section.hidden = true;
      return;
    }
    section.hidden = false;
    section.querySelector(".effect-id").textContent = id;
    let effect;
    try {
      effect = await api(`/effects/${encodeURIComponent(id)}`);
    } catch (error) {
      fill("effect-detail", el("p", { class: "error" }, `Cannot read it: ${error.message}`));
      return;
    }
    const facts = table(
      ["state", "route", "resource", "holder", "epoch", "key", "created", "settled by"],
      [[
        effect.state, effect.route, effect.resource, effect.holder, effect.epoch,
        effect.idempotency_key || "–", new Date(effect.created_at * 1000).toLocaleString(),
        effect.settled_by || "–",
      ]]
    );
    const events = table(
      ["at", "kind", "actor", "conclusion", "upstream status", "detail"],
      effect.events.map((e) => [
        new Date(e.at * 1000).toLocaleString(), e.kind, e.actor, e.conclusion,
        e.upstream_status === null ? "–" : e.upstream_status, e.detail,
      ]),
      "events"
    );
    const inDoubt = ["UNKNOWN", "CONFLICTING", "DISPATCHING"].includes(effect.state);
    // Whether its route has a probe comes with the in-doubt listing, not the receipt.
    const listed = (latest.inDoubt || []).find((e) => e.id === effect.id);
    effect = { ...effect, has_probe: listed ? listed.has_probe : false };
    fill(
      "effect-detail",
      el("p", {}, `${effect.method} ${effect.path}`),
      facts,
      el("h3", {}, `History (${effect.events.length} events)`),
      events,
      inDoubt ? actions(effect) : null
    );
  }

  // --- actions ------------------------------------------------------------------------

  function actions(effect) {
    const box = el("div", { class: "actions" });
    const result = el("p", { class: "result", role: "status" });
    const resolve = el("button", { type: "button", class: "resolve" }, "Resolve…");
    resolve.addEventListener("click", () => openForm(box, effect, "resolve", result));
    // "Probe now" only where there is a probe to run: elsewhere it can only say no_probe.
    if (effect.has_probe) {
      const probe = el("button", { type: "button", class: "probe" }, "Probe now");
      probe.addEventListener("click", () => openForm(box, effect, "probe", result));
      box.append(probe);
    }
    box.append(resolve, result);
    return box;
  }

  function field(label, name, type) {
    const input = el("input", { name, type: type || "text", required: "", maxlength: 500 });
    return [el("label", {}, label, input), input];
  }

  function openForm(box, effect, kind, result) {
    // One form at a time: the same button again keeps it, the other button replaces it.
    const open = box.querySelector("form");
    if (open && open.classList.contains(kind)) return;
    if (open) open.remove();
    const form = el("form", { class: `action ${kind}` });
    const [operatorLabel, operator] = field("Operator", "operator");
    const [reasonLabel, reason] = field("Reason", "reason");
    form.append(operatorLabel, reasonLabel);
    let outcome = null;
    if (kind === "resolve") {
      outcome = el(
        "select",
        { name: "outcome", required: "" },
        el("option", { value: "" }, "choose…"),
        el("option", { value: "committed" }, "committed: the upstream did it"),
        el("option", { value: "not_committed" }, "not committed: the upstream did not")
      );
      form.append(el("label", {}, "Outcome", outcome));
    }
    const confirmation = el("p", { class: "confirmation" });
    const review = el("button", { type: "submit", class: "review" }, "Review");
    const confirm = el("button", { type: "button", class: "confirm", hidden: "" }, "Confirm");
    const cancel = el("button", { type: "button", class: "cancel" }, "Cancel");
    form.append(confirmation, review, confirm, cancel);
    const close = () => {
      form.remove();
      refresh();
    };
    cancel.addEventListener("click", close);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (!form.reportValidity()) return;
      const what = kind === "probe"
        ? "Probe now"
        : `Resolve as ${outcome.value === "committed" ? "COMMITTED" : "NOT COMMITTED"}`;
      confirmation.textContent = `${what}: effect ${effect.id} on resource ${effect.resource}?`;
      review.hidden = true;
      confirm.hidden = false;
    });
    confirm.addEventListener("click", async () => {
      const body = { operator: operator.value.trim(), reason: reason.value.trim() };
      if (kind === "resolve") body.outcome = outcome.value;
      confirm.disabled = true;
      try {
        const answer = await api(`/effects/${encodeURIComponent(effect.id)}/${kind}`, { body });
        result.className = "result ok";
        result.textContent = kind === "probe"
          ? `Probe: ${answer.conclusion}: ${answer.detail}`
          : `Resolved: the effect is now ${answer.state}`;
      } catch (error) {
        result.className = "result error";
        result.textContent = `Refused: ${error.message}`;
      }
      form.remove();
      // What the action changed is shown at once, with its result kept in view.
      refreshKeepingResult(box, result);
    });
    box.insertBefore(form, result);
    operator.focus();
  }

  // A refresh replaces the panels: the action's result is carried over to the same
  // effect's new card (or stays in the detail view), so it is not lost at once.
  async function refreshKeepingResult(box, result) {
    const id = box.closest("[data-effect-id]")?.getAttribute("data-effect-id");
    await refresh();
    const card = id ? document.querySelector(`#outstanding [data-effect-id="${CSS.escape(id)}"] .actions`) : null;
    const target = card || document.querySelector("#effect-detail .actions") || panel("outstanding");
    const empty = target.querySelector(".result");
    if (empty) empty.replaceWith(result);
    else target.append(result);
  }

  // --- start --------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    if (document.body.dataset.adminApi !== "on") return;
    document.getElementById("login-form").addEventListener("submit", login);
    document.getElementById("forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      showLogin("");
    });
    document.querySelector("#effect-detail .close").addEventListener("click", (event) => {
      event.preventDefault();
      history.replaceState(null, "", location.pathname);
      renderDetail();
    });
    window.addEventListener("hashchange", () => renderDetail());
    if (sessionStorage.getItem(KEY)) start();
    else showLogin("");
  });
})();

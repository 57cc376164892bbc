// The pairmq console: polls the operator's JSON API of the server that serves this page
// every 2 s and renders it; the actions POST to the same API. No framework, nothing
// fetched from elsewhere. Text from the server (names, headers, bodies) is only ever set
// as textContent, never parsed as HTML.
"use strict";

(() => {
  const POLL_MS = 2000;
  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ formatting

  const DASH = "-";
  const known = (v) => v !== null && v !== undefined;

  function count(n) {
    return known(n) ? Number(n).toLocaleString("en-US") : DASH;
  }

  function messages(n) {
    return `${count(n)} message${n === 1 ? "" : "s"}`;
  }

  function rate(n) {
    if (!known(n)) return DASH;
    return n >= 100 ? Math.round(n).toLocaleString("en-US") : n.toFixed(1);
  }

  function bytes(n) {
    if (!known(n)) return DASH;
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = Number(n);
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
  }

  function seconds(s) {
    if (!known(s)) return DASH;
    if (s < 60) return `${s.toFixed(1)} s`;
    const whole = Math.round(s);
    if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
    if (whole < 86400) return `${Math.floor(whole / 3600)} h ${Math.floor((whole % 3600) / 60)} min`;
    return `${Math.floor(whole / 86400)} d ${Math.floor((whole % 86400) / 3600)} h`;
  }

  function millis(ms) {
    return known(ms) ? seconds(ms / 1000) : DASH;
  }

  function yesNo(v) {
    if (!known(v)) return DASH;
    return v ? "yes" : "no";
  }

  const pad = (n) => String(n).padStart(2, "0");

  function clock(date) {
    return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  function when(unixSeconds) {
    if (!known(unixSeconds)) return DASH;
    const d = new Date(unixSeconds * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(d)}`;
  }

  // ------------------------------------------------------------------ DOM helpers

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "text") node.textContent = value;
      else if (key === "className") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  // Rows keyed by a data attribute, updated in place (a button keeps its focus across
  // refreshes); rows whose key is gone are removed, new ones made by `make`.
  function syncRows(tbody, items, keyName, keyOf, make, update) {
    const existing = new Map();
    for (const row of Array.from(tbody.rows)) existing.set(row.dataset[keyName], row);
    let previous = null;
    for (const item of items) {
      const key = String(keyOf(item));
      let row = existing.get(key);
      if (row) {
        existing.delete(key);
      } else {
        row = make(item, key);
        row.dataset[keyName] = key;
      }
      update(row, item);
      const expected = previous ? previous.nextSibling : tbody.firstChild;
      if (row !== expected) tbody.insertBefore(row, expected);
      previous = row;
    }
    for (const row of existing.values()) row.remove();
  }

  // A row with one cell per field (data-field=NAME), the first a row header.
  function fieldRow(fields, numeric) {
    const row = el("tr");
    fields.forEach((field, i) => {
      const cell = el(i === 0 ? "th" : "td", { dataset: { field } });
      if (i === 0) cell.setAttribute("scope", "row");
      if (numeric.includes(field)) cell.className = "num";
      row.append(cell);
    });
    return row;
  }

  function cell(row, field) {
    return row.querySelector(`[data-field="${field}"]`);
  }

  function fill(row, values) {
    for (const [field, text] of Object.entries(values)) setText(cell(row, field), text);
  }

  function markState(node, state) {
    setText(node, state || DASH);
    node.dataset.state = state || "";
    node.classList.add("state");
  }

  // ------------------------------------------------------------------ the API

  class ApiError extends Error {
    constructor(status, message, data) {
      super(message);
      this.status = status;
      this.data = data;
    }
  }

  // Words for a refusal: the API's own `error`, and what it means for the user.
  function explain(status, data) {
    const said = data && typeof data.error === "string" ? data.error : `HTTP ${status}`;
    if (status === 403) {
      return "Refused: this needs the admin role; your user may only watch the views " +
        `(a monitor). The server said: ${said}`;
    }
    if (status === 401) {
      return `Not logged in, or the login was refused: ${said}. Reload the page to log in.`;
    }
    if (status === 409) return `Refused by this server: ${said}`;
    return `Failed (HTTP ${status}): ${said}`;
  }

  async function api(method, path, body) {
    const init = { method, cache: "no-store", credentials: "same-origin",
                   headers: { Accept: "application/json" } };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      // from the origin: a page opened as http://user:password@host/ would otherwise
      // resolve `path` to a URL with credentials, which fetch() refuses
      response = await fetch(new URL(path, window.location.origin), init);
    } catch (e) {
      throw new ApiError(0, `Cannot reach the server (${e.message}).`, null);
    }
    let data = null;
    try {
      data = await response.json();
    } catch (e) {
      data = null;
    }
    if (!response.ok) throw new ApiError(response.status, explain(response.status, data), data);
    return data;
  }

  // ------------------------------------------------------------------ notices

  function notify(kind, text) {
    const box = $("notice");
    box.dataset.kind = kind;
    box.setAttribute("aria-live", kind === "error" ? "assertive" : "polite");
    $("notice-text").textContent = text;
    box.hidden = false;
  }

  function failed(e) {
    notify("error", e instanceof ApiError ? e.message : `Failed: ${e}`);
  }

  // ------------------------------------------------------------------ the pair

  const SERVER_FIELDS = ["name", "state", "epoch", "appended_seq", "confirmed_seq",
                         "lag_records", "lag_bytes", "lag_seconds", "disk"];

  // Whether the server's journal completes writes (issue 35): known of this server only.
  function disk(d) {
    if (!known(d)) return DASH;
    if (d.state === "stalled") return `STALLED: a write pending for ${seconds(d.write_in_flight_s)}`;
    return `ok (longest write ${seconds(d.longest_write_s)}, ${count(d.stalls)} stalls)`;
  }
  let thisServer = null;
  let thisState = null;
  let thisStomp = null;

  const SERVING = ["ACTIVE", "STANDALONE"];

  // for screen readers: said once when it changes, not at every refresh
  function announce(text) {
    setText($("announce"), text);
  }

  function renderPair(p) {
    const servers = p.servers || [];
    const me = servers.find((s) => s.this) || servers[0];
    if (me) {
      if (thisState !== null && thisState !== me.state) {
        announce(`${me.name} switched from ${thisState} to ${me.state}.`);
      }
      thisServer = me.name;
      thisState = me.state;
      thisStomp = me.stomp || null;
      const peer = servers.find((s) => !s.this);
      const banner = $("not-serving");
      banner.hidden = SERVING.includes(me.state);
      if (!banner.hidden) {
        const active = peer && SERVING.includes(peer.state) ?
          ` The active server is ${peer.name} (STOMP ${peer.stomp || DASH}): open its ` +
          "console to act." : "";
        setText(banner, `${me.name} is ${me.state}: it serves no client and refuses ` +
          `changes.${active}`);
      }
      const served = $("served-by");
      served.dataset.server = me.name;
      served.dataset.state = me.state;
      setText(served, `This page is served by ${me.name} (STOMP ${me.stomp || DASH}), ` +
        `now ${me.state}.`);
      document.title = `pairmq console: ${me.name} (${me.state})`;
      for (const span of document.querySelectorAll(".this-name")) setText(span, me.name);
    }
    syncRows($("servers").tBodies[0], servers, "server", (s) => s.name,
      () => fieldRow(SERVER_FIELDS, ["appended_seq", "confirmed_seq", "lag_records",
                                     "lag_bytes", "lag_seconds"]),
      (row, s) => {
        row.dataset.this = s.this ? "true" : "false";
        const nameCell = cell(row, "name");
        setText(nameCell, s.this ? `${s.name} (this page)` : s.name);
        markState(cell(row, "state"), s.state);
        const lag = s.lag || {};
        fill(row, {
          epoch: count(s.epoch),
          appended_seq: count(s.appended_seq),
          confirmed_seq: count(s.confirmed_seq),
          lag_records: count(lag.records),
          lag_bytes: bytes(lag.bytes),
          lag_seconds: known(lag.seconds) ? seconds(lag.seconds) : DASH,
          disk: disk(s.disk),
        });
        cell(row, "disk").dataset.stalled = s.disk && s.disk.state === "stalled" ? "true" : "false";
      });

    const w = p.witness;
    const witness = $("witness");
    const members = w && w.members ? w.members : null;
    const facts = w ? {
      kind: w.address ? (w.kind === "etcd" ? `etcd (group ${w.group})` : "pairmq witness") : DASH,
      address: w.address || "none configured",
      reachable: yesNo(w.reachable),
      members: members ? `${members.filter((m) => m.reachable).length} of ${members.length}` +
        (w.leader ? `, leader ${w.leader}` : ", no leader seen") : DASH,
      problem: w.problem || DASH,
      holder: w.holder || (w.address ? "nobody" : DASH),
      holder_remaining: millis(w.holder_remaining_ms),
      lease_remaining: millis(p.lease_remaining_ms),
    } : { kind: DASH, address: "none (not a pair)", reachable: DASH, members: DASH,
          problem: DASH, holder: DASH, holder_remaining: DASH, lease_remaining: DASH };
    for (const [field, text] of Object.entries(facts)) {
      setText(witness.querySelector(`[data-field="${field}"]`), text);
    }
    witness.dataset.reachable = w && w.address ? String(Boolean(w.reachable)) : "";
    setText($("policy"), p.policy || DASH);
    setText($("failovers"), count(p.failovers));

    const changes = (p.changes || []).slice().reverse();  // newest first
    syncRows($("changes").tBodies[0], changes, "at", (c) => `${c.at}-${c.old}-${c.new}`,
      () => fieldRow(["at", "old", "new", "why"], []),
      (row, c) => {
        fill(row, { at: when(c.at), why: c.why || DASH });
        markState(cell(row, "old"), c.old);
        markState(cell(row, "new"), c.new);
      });
    $("no-changes").hidden = changes.length > 0;
    $("force-activation").disabled = p.policy === "none";
  }

  // ------------------------------------------------------------------ the cluster

  // The card shows only for a server that is a member of a cluster ([cluster] name set).
  const MEMBER_FIELDS = ["member", "url", "state", "server", "in_flight", "forwarded",
                         "waiting", "problem"];

  function discovery(d) {
    if (!known(d)) return DASH;
    if (d.kind === "etcd") {
      const registered = d.registered || [];
      return `etcd (${d.prefix}): ${registered.length ? registered.join(", ") : "none"} ` +
        "registered";
    }
    const listed = (d.members || []).length;
    return `listed in [cluster] members (${count(listed)} other${listed === 1 ? "" : "s"})`;
  }

  // `c`: GET /status' "cluster"; null: none (the card is hidden); undefined: not asked
  // this time (the card stays as it is).
  function renderCluster(c) {
    if (c === undefined) return;
    const card = $("cluster-card");
    card.hidden = !c;
    if (!c) return;
    const delay = known(c.redistribution_delay_ms) ?
      `, redistribution after ${millis(c.redistribution_delay_ms)}` : "";
    const facts = {
      name: c.name || DASH,
      member: c.member || DASH,
      url: c.url || DASH,
      discovery: discovery(c.discovery),
      load_balancing: c.load_balancing ? `${c.load_balancing}${delay}` : DASH,
      forwarded: known(c.forwarded) ? messages(c.forwarded) : DASH,
      forwarded_per_second: rate(c.forwarded_per_second),
    };
    const cluster = $("cluster");
    for (const [field, text] of Object.entries(facts)) {
      setText(cluster.querySelector(`[data-field="${field}"]`), text);
    }
    // a member scaling down (docs/cluster.md): its phase, target and what has left
    const sd = c.scale_down;
    $("scale-down").hidden = !sd;
    if (sd) {
      const where = sd.target ? ` to member ${sd.target}` : "";
      const why = sd.reason ? `: ${sd.reason}` : "";
      setText($("scale-down").querySelector('[data-field="scale_down"]'),
        `Scale-down${where}: ${sd.phase}, ${Math.round(100 * (sd.progress || 0))}% ` +
        `(${count(sd.waiting)} here, ${count(sd.moving)} moving)${why}`);
      $("scale-down-progress").value = sd.progress || 0;
    }
    renderColocated(c.colocated);
    const own = {
      this: true, member: c.member, url: c.url, state: c.serving ? "serving" : "not serving",
      server: thisStomp, in_flight: null, forwarded: c.forwarded, waiting: c.waiting,
      problem: c.discovery && c.discovery.problem, settings_differ: [],
    };
    const members = [own, ...(c.bridges || [])];
    // a bridge by its URL: its member's name is known only once the member answered
    syncRows($("cluster-members").tBodies[0], members, "row",
      (m) => (m.this ? "this" : `bridge ${m.url}`),
      () => fieldRow(MEMBER_FIELDS, ["in_flight", "forwarded", "waiting"]),
      (row, m) => {
        row.dataset.this = m.this ? "true" : "false";
        row.dataset.member = m.member || "";
        const differ = m.settings_differ || [];
        const problems = [m.problem, differ.length ? `settings differ: ${differ.join(", ")}` :
          null].filter((t) => t);
        fill(row, {
          member: m.this ? `${m.member} (this member)` : m.member || "(not identified yet)",
          url: m.url || DASH,
          server: m.server || DASH,
          in_flight: count(m.in_flight),
          forwarded: count(m.forwarded),
          waiting: count(m.waiting),
          problem: problems.join("; ") || DASH,
        });
        markState(cell(row, "state"), m.state);
        cell(row, "problem").dataset.problem = problems.length ? "true" : "false";
      });
  }

  // A colocated member (GET /status' cluster "colocated"; null: none, the part is hidden):
  // where this live's own backup runs, or why it runs nowhere, and the backups this member
  // hosts for other lives, one child process each.
  const HOSTED_FIELDS = ["live", "stomp", "ha", "pid", "state", "restarts"];

  function renderColocated(co) {
    const part = $("colocated");
    part.hidden = !co;
    if (!co) return;
    const backup = co.backup || {};
    const line = $("colocated-backup");
    markState(cell(line, "phase"), backup.phase);
    const tries = backup.tries || 0;
    const asked = tries && ["asking", "starting"].includes(backup.phase) ?
      ` (${count(tries)} ${tries === 1 ? "try" : "tries"})` : "";
    setText(cell(line, "where"), (backup.member ? ` on member ${backup.member}` : "") + asked);
    const problem = cell(line, "problem");
    setText(problem, backup.problem ? `: ${backup.problem}` : "");
    // red once it gave up asking, amber while it still asks
    problem.dataset.problem = !backup.problem ? "false" :
      backup.phase === "given_up" ? "true" : "warning";
    const hosted = co.hosted || [];
    setText(cell($("colocated-hosted"), "room"), known(co.max_backups) ?
      `(${count(hosted.length)} of at most ${count(co.max_backups)})` : "");
    $("colocated-hosted").hidden = hosted.length === 0;
    $("no-hosted").hidden = hosted.length > 0;
    syncRows($("colocated-hosted").tBodies[0], hosted, "live", (h) => h.live || h.name,
      () => fieldRow(HOSTED_FIELDS, ["pid", "restarts"]),
      (row, h) => {
        fill(row, {
          live: h.live || DASH,
          stomp: h.stomp || DASH,
          ha: h.ha || DASH,
          pid: known(h.pid) ? String(h.pid) : DASH,
          restarts: count(h.restarts),
        });
        row.title = h.data_dir ? `${h.name || h.live}: data in ${h.data_dir}` : "";
        markState(cell(row, "state"), h.state);
      });
  }

  // ------------------------------------------------------------------ destinations

  const DEST_FIELDS = ["name", "kind", "messages", "paged_messages", "unacknowledged",
                       "consumers", "rate_in", "rate_out", "first_message_age_s", "bytes",
                       "state", "actions"];

  function destinationRow(d, key) {
    const row = fieldRow(DEST_FIELDS, ["messages", "paged_messages", "unacknowledged",
                                       "consumers", "rate_in", "rate_out",
                                       "first_message_age_s", "bytes"]);
    if (d.kind === "queue") {
      const actions = cell(row, "actions");
      actions.append(
        el("button", { type: "button", text: "Browse", "data-action": "browse",
                       "aria-label": `Browse ${key}`, onclick: () => browseFrom(key) }),
        el("button", { type: "button", text: "Move…", "data-action": "move",
                       "aria-label": `Move messages of ${key}`, onclick: () => moveFrom(key) }),
        el("button", { type: "button", text: "Purge…", className: "danger",
                       "data-action": "purge", "aria-label": `Purge ${key}`,
                       onclick: () => purge(key) }));
    }
    return row;
  }

  let lastDestinations = new Map();

  function renderDestinations(d) {
    const streamInfo = d.streams || {};
    // a stream's messages are counted in its log, not in queues: its own figures
    const rows = (d.destinations || []).map((r) => (r.kind === "stream" && streamInfo[r.name] ?
      { ...r, messages: streamInfo[r.name].messages, bytes: streamInfo[r.name].bytes } : r));
    lastDestinations = new Map(rows.map((r) => [r.name, r]));
    syncRows($("destinations").tBodies[0], rows, "destination", (r) => r.name,
      destinationRow,
      (row, r) => {
        fill(row, {
          name: r.name,
          kind: r.kind,
          messages: count(r.messages),
          paged_messages: count(r.paged_messages),
          unacknowledged: count(r.unacknowledged),
          consumers: count(r.consumers),
          rate_in: rate(r.rate_in),
          rate_out: rate(r.rate_out),
          first_message_age_s: seconds(r.first_message_age_s),
          bytes: bytes(r.bytes),
        });
        const state = cell(row, "state");
        setText(state, r.state || DASH);
        state.title = `address full policy: ${r.address_full_policy || DASH}`;
      });
    $("no-destinations").hidden = rows.length > 0;
    const rateLater = rows.some((r) => !known(r.rate_in)) ?
      " Rates show from the second refresh." : "";
    const summary = (d.total > d.shown ? `Showing the first ${count(d.shown)} of ` +
      `${count(d.total)} destinations, by name.` : `${count(rows.length)} destination` +
      `${rows.length === 1 ? "" : "s"}.`) + rateLater;
    setText($("destinations-summary"), summary);

    const names = rows.filter((r) => r.kind === "queue").map((r) => r.name);
    const list = $("queue-names");
    if (list.dataset.names !== names.join("\n")) {
      list.dataset.names = names.join("\n");
      list.replaceChildren(...names.map((n) => el("option", { value: n })));
    }

    const streams = Object.entries(streamInfo).map(([name, s]) => ({ name, ...s }));
    syncRows($("streams").tBodies[0], streams, "stream", (s) => s.name,
      () => fieldRow(["name", "first_offset", "next_offset", "messages", "bytes", "readers",
                      "groups"], ["first_offset", "next_offset", "messages", "bytes",
                                  "readers"]),
      (row, s) => {
        const groups = Object.entries(s.groups || {})
          .map(([g, offset]) => `${g} @ ${count(offset)}`).join(", ");
        fill(row, {
          name: s.name,
          first_offset: count(s.first_offset),
          next_offset: count(s.next_offset),
          messages: count(s.messages),
          bytes: bytes(s.bytes),
          readers: count(s.readers),
          groups: groups || DASH,
        });
      });
    $("no-streams").hidden = streams.length > 0;
  }

  // ------------------------------------------------------------------ connections

  function renderConnections(c) {
    const rows = c.connections || [];
    syncRows($("connections").tBodies[0], rows, "connection", (r) => r.id,
      (r, key) => {
        const row = fieldRow(["id", "user", "address", "protocol", "version", "state",
                              "opened", "subscriptions", "actions"], ["id", "subscriptions"]);
        cell(row, "actions").append(
          el("button", { type: "button", text: "Close…", className: "danger",
                         "data-action": "close", "aria-label": `Close connection ${key}`,
                         onclick: () => closeConnection(key) }));
        return row;
      },
      (row, r) => {
        fill(row, {
          id: String(r.id),
          user: r.user || "(anonymous)",
          address: r.address || DASH,
          protocol: r.protocol || DASH,
          version: r.version || DASH,
          state: r.state || DASH,
          opened: when(r.opened),
          subscriptions: count(r.subscriptions),
        });
        row.dataset.user = r.user || "";
      });
    $("no-connections").hidden = rows.length > 0;
  }

  // ------------------------------------------------------------------ polling

  let timer = null;
  let polling = false;
  let again = false;  // asked for while a refresh ran (an action's): one more at once

  async function refresh() {
    if (polling) {
      again = true;
      return;
    }
    polling = true;
    clearTimeout(timer);
    try {
      await poll();
    } finally {
      polling = false;
      if (again) {
        again = false;
        refresh();
      } else {
        timer = setTimeout(refresh, POLL_MS);
      }
    }
  }

  async function poll() {
    const [pair, destinations, connections] = await Promise.allSettled([
      api("GET", "/api/pair"), api("GET", "/api/destinations"),
      api("GET", "/api/connections")]);
    const problems = [];
    for (const [result, render] of [[pair, renderPair], [destinations, renderDestinations],
                                     [connections, renderConnections]]) {
      if (result.status === "fulfilled") {
        try {
          render(result.value);
        } catch (e) {
          problems.push(`Cannot show the answer (${e}).`);
        }
      } else {
        problems.push(result.reason.message);
      }
    }
    if (pair.status === "fulfilled" && pair.value) {
      try {
        renderCluster(pair.value.cluster || null);  // /api/pair carries GET /status' cluster
      } catch (e) {
        problems.push(`Cannot show the cluster (${e}).`);
      }
    }
    const status = $("poll-status");
    const now = clock(new Date());
    const wasOk = status.dataset.ok;
    if (wasOk === "true" && problems.length > 0) announce("Lost contact with the server.");
    if (wasOk === "false" && problems.length === 0) announce("In contact with the server again.");
    document.body.classList.toggle("stale", problems.length > 0);
    if (problems.length === 0) {
      status.dataset.ok = "true";
      setText(status, `Updated at ${now}`);
    } else {
      status.dataset.ok = "false";
      const unique = Array.from(new Set(problems));
      setText(status, `Not updated at ${now}: ${unique.join(" ")} ` +
        "Showing what the server said last.");
    }
  }

  // ------------------------------------------------------------------ actions

  async function act(button, work) {
    if (button) button.disabled = true;
    try {
      await work();
    } catch (e) {
      failed(e);
    } finally {
      if (button) button.disabled = false;
      refresh();
    }
  }

  function purge(name) {
    const d = lastDestinations.get(name);
    const waiting = d ? ` Its ${count(d.messages)} waiting messages` : " Its waiting messages";
    if (!window.confirm(`Purge ${name}?${waiting} will be deleted for good ` +
                        "(messages delivered and not yet acknowledged stay).")) {
      return;
    }
    act(null, async () => {
      const done = await api("POST", "/api/purge", { destination: name });
      const left = done.paged_left ? `, ${count(done.paged_left)} still paged: purge again` : "";
      notify("ok", `Purged ${name}: ${messages(done.count)} deleted${left}.`);
    });
  }

  function closeConnection(id) {
    const row = document.querySelector(`#connections tr[data-connection="${id}"]`);
    const user = row && row.dataset.user ? ` of user ${row.dataset.user}` : "";
    if (!window.confirm(`Close connection ${id}${user}? The client gets an ERROR frame ` +
                        "saying an operator closed it.")) {
      return;
    }
    act(null, async () => {
      await api("POST", `/api/connections/${encodeURIComponent(id)}/close`, {});
      notify("ok", `Connection ${id} closed.`);
    });
  }

  function browseFrom(name) {
    $("browse-destination").value = name;
    $("browse").scrollIntoView();
    browse();
  }

  function moveFrom(name) {
    $("move-source").value = name;
    $("move").scrollIntoView();
    $("move-target").focus();
  }

  function renderMessage(m, index) {
    const headers = el("table", { className: "headers" },
      el("caption", { className: "visually-hidden", text: "Headers" }),
      el("tbody", null, ...Object.entries(m.headers || {}).map(([k, v]) =>
        el("tr", null, el("th", { scope: "row", text: k }), el("td", { text: v })))));
    const shown = (m.body || "").length;
    const cut = m.body_bytes > shown ? ` (the first part of ${bytes(m.body_bytes)})` :
      ` (${bytes(m.body_bytes)})`;
    return el("article", { className: "message", dataset: { messageId: m.message_id } },
      el("h3", { text: `${index + 1}. ${m.message_id}` }),
      el("p", { className: "hint",
                text: `${m.persistent ? "persistent" : "not persistent"}, priority ` +
                      `${m.priority}` }),
      headers,
      el("p", { className: "body-title", text: `Body${cut}` }),
      el("pre", { className: "body", tabindex: "0", text: m.body || "" }));
  }

  async function browse() {
    const destination = $("browse-destination").value.trim();
    const limit = Number($("browse-limit").value) || 10;
    if (!destination) return;
    const button = $("browse-submit");
    button.disabled = true;
    try {
      const path = `/api/messages?destination=${encodeURIComponent(destination)}` +
        `&limit=${encodeURIComponent(limit)}`;
      const answer = await api("GET", path);
      const found = answer.messages || [];
      $("browse-results").replaceChildren(...found.map(renderMessage));
      const results = $("browse-results");
      results.dataset.destination = destination;
      results.dataset.count = String(found.length);
      setText($("browse-summary"), found.length ?
        `The first ${messages(found.length)} waiting on ${destination}, at ` +
        `${clock(new Date())}.` : `No message waiting on ${destination}.`);
    } catch (e) {
      failed(e);
    } finally {
      button.disabled = false;
    }
  }

  function move() {
    const source = $("move-source").value.trim();
    const target = $("move-target").value.trim();
    const limit = Math.max(0, Math.floor(Number($("move-limit").value) || 0));
    if (!source) return;
    const how = limit ? `up to ${count(limit)}` : "all the";
    const where = target ? `to ${target}` : "back to its original destination, each";
    const question = target ?
      `Move ${how} messages waiting on ${source} ${where}?` :
      `Retry ${how} messages waiting on ${source}: each goes back to its original ` +
      "destination?";
    if (!window.confirm(question)) return;
    act($("move-submit"), async () => {
      const done = await api("POST", "/api/move",
                             { source, target: target || null, limit });
      const left = done.paged_left ? `, ${count(done.paged_left)} still paged` : "";
      notify("ok", `${done.done}: ${messages(done.count)} moved${left}.`);
    });
  }

  function forceActivation() {
    const name = thisServer || "this server";
    if (!window.confirm(`Force ${name} (now ${thisState || "in an unknown state"}) to ` +
                        "activate? Do this only when you know its peer is down: two active " +
                        "servers would each take messages the other never sees.")) {
      return;
    }
    act($("force-activation"), async () => {
      const answer = await api("POST", "/activate", {});
      notify("ok", answer.forced ? `${name} was forced to activate: now ${answer.state}.` :
        `${name} already serves (${answer.state}): nothing to force.`);
    });
  }

  // ------------------------------------------------------------------ start

  function start() {
    $("browse-form").addEventListener("submit", (e) => {
      e.preventDefault();
      browse();
    });
    $("move-form").addEventListener("submit", (e) => {
      e.preventDefault();
      move();
    });
    $("force-activation").addEventListener("click", forceActivation);
    $("notice-close").addEventListener("click", () => {
      $("notice").hidden = true;
    });
    refresh();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

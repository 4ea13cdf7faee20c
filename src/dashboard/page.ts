/**
 * The dashboard's page: plain HTML and a script that reads everything
 * through the JSON API with the token. Values are put in with textContent
 * only, never as HTML.
 */
export const DASHBOARD_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>mailroom</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  [hidden] { display: none !important; }
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0 1.5rem 2rem; color: #1d2330; }
  header { display: flex; gap: 1rem; align-items: baseline; border-bottom: 1px solid #ccd; }
  h1 { font-size: 1.3rem; } h2 { font-size: 1.05rem; margin-top: 1.6rem; }
  table { border-collapse: collapse; min-width: 40rem; }
  th, td { padding: .25rem .6rem; border-bottom: 1px solid #e3e6ee; text-align: right; }
  th:first-child, td:first-child, td.text { text-align: left; }
  .badge { background: #fde2b4; padding: .1rem .5rem; border-radius: .4rem; }
  .error { color: #a11; } .note { color: #555; }
  pre { background: #f5f6fa; padding: .6rem; overflow: auto; max-height: 24rem; }
  form { display: flex; gap: .5rem; flex-wrap: wrap; align-items: center; margin: .4rem 0; }
  input[type=text], input[type=number], input[type=password] { padding: .2rem .4rem; }
</style>
</head>
<body>
<header><h1>mailroom</h1><span id="where" class="note"></span><span id="readonly" class="badge" hidden>read-only</span><span id="status" class="error" role="alert"></span></header>

<form id="login" hidden><label>Token <input id="token" type="password" autocomplete="off"></label><button>Open</button></form>

<main id="main" hidden>
<h2>Queues</h2>
<table id="queues"><thead><tr><th>queue</th><th>available</th><th>scheduled</th><th>retrying</th><th>blocked</th><th>active</th><th>dead</th><th>oldest waiting</th><th>completed/s</th><th>failed/s</th></tr></thead><tbody></tbody></table>

<h2>Relay</h2>
<table id="relay"><thead><tr><th>target</th><th>unpublished</th><th>lag</th><th>held back by</th><th>parked</th></tr></thead><tbody></tbody></table>

<h2>Consumer groups</h2>
<table id="consumers"><thead><tr><th>group</th><th>source</th><th>lag</th><th>unfinished</th><th>dead</th><th>duplicates rejected</th></tr></thead><tbody></tbody></table>

<h2>Find a job</h2>
<form id="find"><input id="find-id" type="text" placeholder="job id or correlation id" size="40"><button>Find</button></form>
<pre id="found" hidden></pre>

<h2>Dead letters</h2>
<form id="dlq-filter">
  <input name="queue" type="text" placeholder="queue"><input name="type" type="text" placeholder="type">
  <input name="category" type="text" placeholder="category"><input name="since" type="text" placeholder="since (2h, 2026-12-01)">
  <input name="text" type="text" placeholder="error text"><button>Search</button>
</form>
<table id="dead"><thead><tr><th>died</th><th>queue</th><th>type</th><th>category</th><th>attempts</th><th>error</th><th>id</th><th></th></tr></thead><tbody></tbody></table>
<pre id="letter" hidden></pre>
<form id="dlq-actions">
  <label>rate/s <input id="rate" type="number" min="1" step="1" value="10"></label>
  <label><input id="dry-run" type="checkbox" checked> dry run</label>
  <button id="replay" type="button">Replay matching</button><button id="discard" type="button">Discard matching</button>
</form>
<p id="dlq-result" class="note"></p>
</main>

<script>
(() => {
  const $ = (id) => document.getElementById(id);
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get('token')) { sessionStorage.setItem('mailroom-token', hash.get('token')); history.replaceState(null, '', location.pathname); }
  let token = sessionStorage.getItem('mailroom-token');
  let readOnly = true;
  let filter = {};

  async function api(path, body) {
    const res = await fetch('/api/' + path, body === undefined
      ? { headers: { authorization: 'Bearer ' + token } }
      : { method: 'POST', headers: { authorization: 'Bearer ' + token, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const data = await res.json();
    if (res.status === 401) { sessionStorage.removeItem('mailroom-token'); showLogin('The token was refused.'); throw new Error('unauthorized'); }
    if (!res.ok) throw new Error(data.error || res.statusText);
    return data;
  }
  function showLogin(message) { $('main').hidden = true; $('login').hidden = false; $('status').textContent = message || ''; }
  function cell(row, value, text) { const td = row.insertCell(); td.textContent = value === null || value === undefined ? '' : String(value); if (text) td.className = 'text'; }
  function fill(id, rows, columns) {
    const body = $(id).tBodies[0];
    body.replaceChildren();
    for (const r of rows) { const tr = body.insertRow(); columns(r).forEach((v, i) => cell(tr, v, i === 0)); }
  }
  const age = (s) => s >= 3600 ? Math.floor(s / 3600) + 'h ' + Math.floor(s % 3600 / 60) + 'm' : s >= 60 ? Math.floor(s / 60) + 'm ' + Math.round(s % 60) + 's' : Math.round(s) + 's';
  const rate = (n) => n.toFixed(2);

  async function refresh() {
    try {
      const stats = await api('stats');
      fill('queues', Object.entries(stats.queues), ([q, s]) => [q, s.available, s.scheduled, s.retrying, s.blocked, s.active, s.dead, age(s.oldestAgeSeconds), rate(s.completedPerSecond), rate(s.failedPerSecond)]);
      fill('relay', Object.entries(stats.relay || {}), ([t, s]) => [t, s.unpublished, age(s.lagSeconds), s.heldBackBy ? (s.heldBackBy.pid ? 'pid ' + s.heldBackBy.pid + (s.heldBackBy.ageSeconds !== null ? ', open ' + age(s.heldBackBy.ageSeconds) : '') : 'transaction ' + s.heldBackBy.xid) : '', s.parked]);
      fill('consumers', Object.entries(stats.consumers || {}), ([g, s]) => [g, s.source, s.lag, s.unfinished, s.dead, s.duplicatesRejected]);
      $('status').textContent = '';
    } catch (error) { if (error.message !== 'unauthorized') $('status').textContent = error.message; }
  }
  async function searchDead() {
    try {
      const query = new URLSearchParams(Object.entries(filter).filter(([, v]) => v !== ''));
      const page = await api('dead-letters?' + query);
      fill('dead', page.items, (d) => [new Date(d.diedAt).toLocaleString(), d.queue, d.type, d.category, d.attempts, d.message, d.id]);
      [...$('dead').tBodies[0].rows].forEach((tr, i) => {
        const id = page.items[i].id;
        const td = tr.insertCell();
        const show = document.createElement('button');
        show.type = 'button'; show.textContent = 'Show'; show.className = 'show-letter';
        show.addEventListener('click', () => showLetter(id));
        td.append(show);
        if (!readOnly) {
          const again = document.createElement('button');
          again.type = 'button'; again.textContent = 'Replay'; again.className = 'replay-one';
          again.addEventListener('click', () => replayOne(id));
          td.append(' ', again);
        }
      });
    } catch (error) { $('status').textContent = error.message; }
  }
  async function showLetter(id) {
    try { $('letter').textContent = JSON.stringify(await api('dead-letters/' + encodeURIComponent(id)), null, 2); }
    catch (error) { $('letter').textContent = error.message; }
    $('letter').hidden = false;
  }
  async function replayOne(id) {
    if (!confirm('Replay dead letter ' + id + '?')) return;
    try {
      const result = await api('dead-letters/replay', { filter: { ids: [id] }, dryRun: false });
      $('dlq-result').textContent = 'replay ' + id + ': ' + result.replayed + ' replayed';
      await Promise.all([searchDead(), refresh()]);
    } catch (error) { $('dlq-result').textContent = error.message; }
  }
  async function act(kind) {
    const dryRun = $('dry-run').checked;
    if (!dryRun && !confirm(kind + ' every dead letter matching this filter?')) return;
    const body = { filter: Object.keys(filter).some((k) => filter[k]) ? filter : { all: true }, dryRun };
    if (kind === 'replay') body.ratePerSecond = Number($('rate').value) || undefined;
    try {
      const result = await api('dead-letters/' + kind, body);
      const done = kind === 'replay' ? result.replayed : result.discarded;
      $('dlq-result').textContent = (dryRun ? 'Dry run: ' : '') + kind + ': ' + result.matched + ' matched' + (dryRun ? '' : ', ' + done + ' ' + kind + 'ed');
      await Promise.all([searchDead(), refresh()]);
    } catch (error) { $('dlq-result').textContent = error.message; }
  }

  $('login').addEventListener('submit', (e) => { e.preventDefault(); token = $('token').value.trim(); sessionStorage.setItem('mailroom-token', token); start(); });
  $('find').addEventListener('submit', async (e) => {
    e.preventDefault();
    const id = $('find-id').value.trim();
    if (!id) return;
    const isUuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(id);
    try {
      const found = isUuid ? await api('jobs/' + encodeURIComponent(id)) : await api('correlation/' + encodeURIComponent(id));
      $('found').textContent = JSON.stringify(found, null, 2);
    } catch (error) { $('found').textContent = error.message; }
    $('found').hidden = false;
  });
  $('dlq-filter').addEventListener('submit', (e) => { e.preventDefault(); filter = Object.fromEntries(new FormData(e.target)); searchDead(); });
  $('replay').addEventListener('click', () => act('replay'));
  $('discard').addEventListener('click', () => act('discard'));

  async function start() {
    if (!token) return showLogin();
    try {
      const meta = await api('meta');
      readOnly = meta.readOnly;
      $('where').textContent = 'schema ' + meta.schema + ' on ' + meta.database;
      $('readonly').hidden = !readOnly;
      $('dlq-actions').hidden = readOnly;
      $('login').hidden = true; $('main').hidden = false;
      await Promise.all([refresh(), searchDead()]);
    } catch (error) { if (error.message !== 'unauthorized') $('status').textContent = error.message; }
  }
  setInterval(() => { if (!$('main').hidden) refresh(); }, 5000);
  start();
})();
</script>
</body>
</html>
`;

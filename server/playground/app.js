// The agentkit playground: sessions and their events, eval history and A/B
// figures, read from the /v1/ API of the server that serves this page.
// Plain DOM and inline SVG, no dependencies: the page works offline.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const REFRESH_MS = 5000;

const state = {
  token: sessionStorage.getItem('agentkit.token') || '',
  session: null, // the open session's id
  run: null, // the open eval run's id
  locked: false, // waiting for a token
};

// el builds an HTML element; children are nodes or text (never parsed as
// HTML, so data from the API cannot inject markup).
function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  setAttrs(n, attrs);
  append(n, children);
  return n;
}

// sv builds an SVG element.
function sv(tag, attrs, ...children) {
  const n = document.createElementNS(SVG, tag);
  setAttrs(n, attrs);
  append(n, children);
  return n;
}

function setAttrs(n, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'onclick') n.addEventListener('click', v);
    else n.setAttribute(k, v === true ? '' : String(v));
  }
}

function append(n, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    n.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

class AuthError extends Error {}

async function api(path) {
  const headers = { Accept: 'application/json' };
  if (state.token) headers.Authorization = 'Bearer ' + state.token;
  const res = await fetch(path, { headers });
  if (res.status === 401) {
    askToken(state.token ? 'The token was refused; check it and try again.' : '');
    throw new AuthError('unauthorized');
  }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error((body.error && body.error.message) || res.status + ' ' + res.statusText);
  return body;
}

function askToken(message) {
  state.locked = true;
  document.getElementById('auth').hidden = false;
  const err = document.getElementById('auth-error');
  err.textContent = message;
  err.hidden = !message;
}

document.getElementById('auth').addEventListener('submit', (ev) => {
  ev.preventDefault();
  state.token = document.getElementById('auth-token').value.trim();
  sessionStorage.setItem('agentkit.token', state.token);
  document.getElementById('auth').hidden = true;
  state.locked = false;
  refresh();
});

function showError(e) {
  if (e instanceof AuthError) return;
  const p = document.getElementById('error');
  p.textContent = String(e.message || e);
  p.hidden = false;
}

function clearError() {
  document.getElementById('error').hidden = true;
}

const pad = (n) => String(n).padStart(2, '0');

function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

const pct = (x) => (x * 100).toFixed(1) + '%';
const short = (id) => (id.length > 12 ? id.slice(0, 8) + '…' : id);
const clip = (s, n) => (s && s.length > n ? s.slice(0, n) + '…' : s || '');

function fill(tbody, rows, emptyNote) {
  tbody.replaceChildren(...rows);
  emptyNote.hidden = rows.length > 0;
}

// ---- info ----

async function loadInfo() {
  const info = await api('/v1/info');
  document.getElementById('agent-info').textContent =
    `agent ${info.agent} · model ${info.model} · store ${info.storage.name} · ${info.serving} serving · version ${info.version}`;
}

// ---- sessions ----

async function loadSessions() {
  const page = await api('/v1/sessions?limit=100');
  const section = document.getElementById('sessions');
  const rows = page.sessions.map((s) =>
    el('tr', {
      'data-session-id': s.id,
      class: s.id === state.session ? 'selected' : '',
      onclick: () => openSession(s.id),
    },
    el('td', { class: 'time' }, fmtTime(s.updatedAt)),
    el('td', { title: s.id }, el('code', {}, short(s.id))),
    el('td', {}, s.channelId),
    el('td', {}, s.title || ''),
    el('td', { class: 'num' }, s.turns),
    el('td', {}, el('span', { class: 'badge ' + (s.lastStatus || 'none') }, s.lastStatus || '—'))));
  fill(section.querySelector('tbody'), rows, section.querySelector('.empty'));
}

function openSession(id) {
  state.session = id;
  for (const tr of document.querySelectorAll('#session-list tr[data-session-id]')) {
    tr.classList.toggle('selected', tr.dataset.sessionId === id);
  }
  loadSession().catch(showError);
  document.getElementById('sessions').scrollIntoView({ block: 'start' });
}

function describeEvent(ev) {
  switch (ev.type) {
    case 'turn.started': {
      const exps = Object.entries(ev.experiments || {}).map(([e, v]) => `${e}=${v}`).join(', ');
      return [ev.message, exps ? el('span', { class: 'muted' }, ` (A/B: ${exps})`) : ''];
    }
    case 'model.call':
      if (ev.toolCalls && ev.toolCalls.length) return 'calls ' + ev.toolCalls.map((c) => c.name).join(', ');
      return ev.text;
    case 'tool.call':
      return `${ev.tool} ${clip(JSON.stringify(ev.arguments), 200)}`;
    case 'tool.result':
      return [ev.isError ? el('span', { class: 'badge failed' }, 'error') : '', ' ', clip(ev.output, 300)];
    case 'turn.finished': {
      const u = ev.usage || {};
      return [el('span', { class: 'badge ' + ev.status }, ev.status), ' ', clip(ev.result, 500),
        el('span', { class: 'muted' }, ` · ${ev.durationMs || 0} ms · ${u.inputTokens || 0}+${u.outputTokens || 0} tokens`)];
    }
  }
  return '';
}

async function loadSession() {
  const id = state.session;
  if (!id) return;
  const data = await api('/v1/sessions/' + encodeURIComponent(id) + '?limit=1000');
  if (id !== state.session) return;
  const s = data.session;
  const detail = document.getElementById('session-detail');
  detail.className = 'detail';
  detail.replaceChildren(
    el('h3', {}, 'Session ', el('code', {}, s.id)),
    el('p', { class: 'muted' }, `channel ${s.channelId} · ${s.turns} turn(s) · created ${fmtTime(s.createdAt)}`),
    el('ol', { class: 'events', 'data-events-of': s.id },
      data.events.map((ev) => el('li', { 'data-seq': ev.seq, 'data-type': ev.type },
        el('span', { class: 'type' }, ev.type), ' ',
        el('span', { class: 'muted' }, `#${ev.seq} turn ${ev.turn} ${fmtTime(ev.at)}`), ' ',
        el('span', { class: 'what' }, describeEvent(ev))))),
    data.more ? el('p', { class: 'muted' }, 'More events: GET /v1/sessions/{id}/events?after=' + data.next) : '');
}

// ---- evals ----

async function loadEvals() {
  const list = await api('/v1/evals');
  const section = document.getElementById('evals');
  const rows = list.runs.map((r) =>
    el('tr', {
      'data-run-id': r.runId,
      'data-pass-rate': r.passRate,
      class: r.runId === state.run ? 'selected' : '',
      onclick: () => openRun(r.runId),
    },
    el('td', { class: 'time' }, fmtTime(r.startedAt)),
    el('td', { title: r.runId }, r.name || short(r.runId)),
    el('td', {}, el('span', { class: 'badge ' + r.status, title: r.error || '' }, r.status)),
    el('td', { class: 'num' }, `${r.counts.passed}/${r.counts.total}`),
    el('td', { class: 'num' }, r.counts.failed),
    el('td', { class: 'num' }, r.counts.errored),
    el('td', { class: 'num' }, r.counts.done ? pct(r.passRate) : '—'),
    el('td', {}, r.model),
    el('td', { title: `machine ${r.host.name}, process ${r.host.pid}` }, r.host.id)));
  fill(section.querySelector('tbody'), rows, section.querySelector('.empty'));
  document.getElementById('pass-rate-chart').replaceChildren(passRateChart(list.runs.slice().reverse()));
}

// passRateChart draws the pass rate of each run over time (oldest left).
function passRateChart(runs) {
  runs = runs.filter((r) => r.counts.done > 0);
  const W = 640, H = 180, L = 44, R = 12, T = 12, B = 28;
  const chart = sv('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, 'data-chart': 'pass-rate', role: 'img', 'aria-label': 'pass rate of eval runs over time' });
  const y = (v) => T + (1 - v) * (H - T - B);
  for (const v of [0, 0.5, 1]) {
    chart.append(sv('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), class: 'grid' }),
      sv('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, pct(v).replace('.0', '')));
  }
  if (!runs.length) {
    chart.append(sv('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'axis' }, 'no finished cases yet'));
    return chart;
  }
  const step = runs.length > 1 ? (W - L - R - 20) / (runs.length - 1) : 0;
  const x = (i) => L + 10 + i * step;
  chart.append(sv('polyline', { class: 'line', points: runs.map((r, i) => `${x(i)},${y(r.passRate)}`).join(' ') }));
  runs.forEach((r, i) => {
    chart.append(sv('circle', {
      cx: x(i), cy: y(r.passRate), r: 5, class: 'point ' + r.status,
      'data-run-id': r.runId, 'data-value': (r.passRate * 100).toFixed(1),
      onclick: () => openRun(r.runId),
    }, sv('title', {}, `${r.name || r.runId}: ${pct(r.passRate)} (${r.counts.passed}/${r.counts.done}) · ${fmtTime(r.startedAt)}`)));
  });
  chart.append(sv('text', { x: L, y: H - 8, class: 'axis' }, fmtTime(runs[0].startedAt)),
    sv('text', { x: W - R, y: H - 8, 'text-anchor': 'end', class: 'axis' }, fmtTime(runs[runs.length - 1].startedAt)));
  return chart;
}

function openRun(id) {
  state.run = id;
  for (const tr of document.querySelectorAll('#eval-runs tr[data-run-id]')) {
    tr.classList.toggle('selected', tr.dataset.runId === id);
  }
  loadRun().catch(showError);
}

async function loadRun() {
  const id = state.run;
  if (!id) return;
  const r = await api('/v1/evals/' + encodeURIComponent(id));
  if (id !== state.run) return;
  const c = r.counts;
  document.getElementById('eval-detail').replaceChildren(
    el('h3', { 'data-run': r.runId }, `Run ${r.name || ''} `, el('code', {}, r.runId)),
    el('p', {},
      el('span', { class: 'badge ' + r.status }, r.status), ' ',
      `${c.passed} passed, ${c.failed} failed, ${c.errored} errored of ${c.total} · model ${r.model} · host ${r.host.id} · started ${fmtTime(r.startedAt)}`,
      r.finishedAt ? ` · finished ${fmtTime(r.finishedAt)}` : '',
      r.error ? el('span', { class: 'error' }, ' · ' + r.error) : ''),
    el('table', { class: 'cases' },
      el('thead', {}, el('tr', {}, ['case', 'status', 'answer', 'why', 'latency', 'tokens', 'tries', 'session'].map((h) => el('th', {}, h)))),
      el('tbody', {}, r.cases.map((k) => el('tr', { 'data-case': k.name, 'data-status': k.status },
        el('td', {}, k.name),
        el('td', {}, el('span', { class: 'badge ' + k.status }, k.status)),
        el('td', { class: 'answer' }, clip(k.answer, 300)),
        el('td', {}, k.error || (k.grade && k.grade.reason) || (k.grade ? k.grade.graders.join(', ') : '')),
        el('td', { class: 'num' }, k.status === 'pending' ? '' : k.latencyMs + ' ms'),
        el('td', { class: 'num' }, k.status === 'pending' ? '' : `${k.usage.inputTokens}+${k.usage.outputTokens}`),
        el('td', { class: 'num' }, k.attempts || ''),
        el('td', {}, k.sessionId ? el('a', { href: '#sessions', onclick: (ev) => { ev.preventDefault(); openSession(k.sessionId); } }, short(k.sessionId)) : ''))))));
}

// ---- A/B ----

async function loadABs() {
  const rep = await api('/v1/abs');
  const warn = document.getElementById('ab-warning');
  warn.textContent = rep.snapshotError || '';
  warn.hidden = !rep.snapshotError;
  document.getElementById('ab-hosts').textContent = rep.hosts.length
    ? 'hosts: ' + rep.hosts.map((h) => `${h.id}${h.self ? ' (this one)' : ''}: ${h.sessions} session(s), ${fmtTime(h.updatedAt)}`).join(' · ')
    : '';
  const box = document.getElementById('ab-experiments');
  box.replaceChildren(...rep.experiments.map(experimentView));
  document.querySelector('#abs .empty').hidden = rep.experiments.length > 0;
}

function experimentView(e) {
  const vs = e.variants;
  return el('article', { class: 'experiment', 'data-experiment': e.name },
    el('h3', {}, e.name, e.configured ? '' : el('span', { class: 'muted' }, ' (no longer configured)')),
    el('table', {},
      el('thead', {}, el('tr', {}, ['variant', 'weight', 'changes', 'sessions', 'turns', 'turn failure rate', 'sessions with a failure', 'tokens / turn', 'p50', 'p95'].map((h) => el('th', {}, h)))),
      el('tbody', {}, vs.map((v) => el('tr', { 'data-variant': v.name },
        el('td', {}, v.name),
        el('td', { class: 'num' }, v.weight || '—'),
        el('td', {}, v.changes.join(', ') || 'none (control)'),
        el('td', { class: 'num', 'data-metric': 'sessions' }, v.sessions),
        el('td', { class: 'num', 'data-metric': 'turns' }, v.turns),
        el('td', { class: 'num', 'data-metric': 'failureRate' }, pct(v.failureRate)),
        el('td', { class: 'num' }, `${v.failedSessions} (${pct(v.sessionFailureRate)})`),
        el('td', { class: 'num', 'data-metric': 'meanTokensPerTurn' }, v.meanTokensPerTurn.toFixed(1)),
        el('td', { class: 'num', 'data-metric': 'p50Ms' }, v.turns ? v.p50Ms + ' ms' : '—'),
        el('td', { class: 'num', 'data-metric': 'p95Ms' }, v.turns ? v.p95Ms + ' ms' : '—'))))),
    el('div', { class: 'charts' },
      barChart(e.name, 'latency', 'turn latency (ms)', vs, [['p50Ms', 'p50', (x) => x + ' ms'], ['p95Ms', 'p95', (x) => x + ' ms']]),
      barChart(e.name, 'failure-rate', 'turn failure rate', vs, [['failureRate', 'failed', pct]]),
      barChart(e.name, 'tokens', 'tokens per turn', vs, [['meanTokensPerTurn', 'tokens', (x) => x.toFixed(1)]]),
      intervalChart(e)));
}

// barChart draws horizontal bars: for each variant, one bar per metric.
function barChart(exp, id, title, variants, metrics) {
  const rowH = 18, gap = 10, L = 90, R = 90, W = 420, T = 24;
  const H = T + variants.length * (metrics.length * rowH + gap) + 4;
  const maxV = Math.max(1e-9, ...variants.flatMap((v) => metrics.map(([k]) => v[k])));
  const chart = sv('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, 'data-chart': id, 'data-experiment': exp, role: 'img', 'aria-label': title });
  chart.append(sv('text', { x: 0, y: 14, class: 'title' }, title));
  let y = T;
  variants.forEach((v) => {
    chart.append(sv('text', { x: 0, y: y + rowH - 5, class: 'label' }, clip(v.name, 12)));
    metrics.forEach(([key, label, fmt], j) => {
      const w = v.turns ? Math.max(1, (v[key] / maxV) * (W - L - R)) : 0;
      chart.append(
        sv('rect', { x: L, y: y + 2, width: w, height: rowH - 4, class: 'bar m' + j, 'data-variant': v.name, 'data-metric': key, 'data-value': v[key] },
          sv('title', {}, `${v.name} ${label}: ${fmt(v[key])}`)),
        sv('text', { x: L + w + 4, y: y + rowH - 5, class: 'value', 'data-variant': v.name, 'data-metric': key }, v.turns ? `${label} ${fmt(v[key])}` : 'no turns'));
      y += rowH;
    });
    y += gap;
  });
  return chart;
}

// intervalChart draws, for each variant against the control, the difference
// in session failure rate with its 95% interval (Newcombe), around zero.
function intervalChart(e) {
  const cs = e.comparisons;
  const W = 420, L = 90, R = 20, T = 24, rowH = 26;
  const H = T + Math.max(1, cs.length) * rowH + 20;
  const chart = sv('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, 'data-chart': 'failure-difference', 'data-experiment': e.name, role: 'img', 'aria-label': 'difference in session failure rate, 95% interval' });
  chart.append(sv('text', { x: 0, y: 14, class: 'title' }, 'sessions with a failure: difference from control, 95% interval'));
  const x = (d) => L + ((d + 1) / 2) * (W - L - R);
  chart.append(sv('line', { x1: x(0), x2: x(0), y1: T - 4, y2: H - 18, class: 'zero' }),
    sv('text', { x: x(-1), y: H - 4, class: 'axis' }, '−100 pp'),
    sv('text', { x: x(0), y: H - 4, 'text-anchor': 'middle', class: 'axis' }, '0'),
    sv('text', { x: x(1), y: H - 4, 'text-anchor': 'end', class: 'axis' }, '+100 pp'));
  cs.forEach((c, i) => {
    const y = T + i * rowH + rowH / 2;
    chart.append(sv('text', { x: 0, y: y + 4, class: 'label' }, clip(c.variant, 12)));
    if (!c.defined) {
      chart.append(sv('text', { x: x(0) + 6, y: y + 4, class: 'axis', 'data-variant': c.variant }, 'needs sessions on both sides'));
      return;
    }
    const pp = (d) => (d >= 0 ? '+' : '−') + Math.abs(d * 100).toFixed(1);
    chart.append(
      sv('line', { x1: x(c.low), x2: x(c.high), y1: y, y2: y, class: 'ci' + (c.significant ? ' significant' : '') }),
      sv('circle', { cx: x(c.difference), cy: y, r: 4, class: 'diff', 'data-variant': c.variant, 'data-difference': c.difference, 'data-low': c.low, 'data-high': c.high },
        sv('title', {}, `${c.variant} vs ${c.control}: ${pp(c.difference)} pp [${pp(c.low)}, ${pp(c.high)}] (${c.method}${c.significant ? ', significant' : ', could be noise'})`)));
  });
  if (!cs.length) chart.append(sv('text', { x: L, y: T + 12, class: 'axis' }, 'one variant: nothing to compare'));
  return chart;
}

// ---- refresh ----

let refreshing = false;

async function refresh() {
  if (state.locked || refreshing) return;
  refreshing = true;
  try {
    await loadInfo();
    const results = await Promise.allSettled([loadSessions(), loadEvals(), loadABs(), loadSession(), loadRun()]);
    const failed = results.find((r) => r.status === 'rejected' && !(r.reason instanceof AuthError));
    if (failed) showError(failed.reason);
    else clearError();
    document.body.dataset.loaded = 'true';
  } catch (e) {
    showError(e);
  } finally {
    refreshing = false;
  }
}

refresh();
setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);

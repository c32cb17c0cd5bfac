// The soak: a constant mixed load across many tenants, for a long time, so that what
// grows with time (tables, indexes, dead tuples, the relay's backlog, memory) shows.
//
//   k6 run -e ORDERD_JWT_HS256_SECRET=... -e DURATION=30m k6/soak.js
//
// Four constant-arrival-rate scenarios, each over TENANTS tenants (default 1000):
// - creates at CREATE_RATE/s (300), the i-th create keyed `soak-<run>-<i>` (padded);
// - replays at REPLAY_RATE/s (600): a create sent again, under the key of the create
//   made REPLAY_AGE seconds ago or less (default 60, inside the idempotency TTL the soak
//   runs with) but not within the last REPLAY_SETTLE (5), so that its answer is the
//   stored one;
// - cancels at CANCEL_RATE/s (30): a tenant's first page read (the list load), then
//   the cancel of an order on it, under a key of its own;
// - lists at LIST_RATE/s (30): a tenant's first page.
// `bench/soak` runs it and samples the server meanwhile. Nothing about time is a
// threshold; the run fails only on a 5xx or a failed check.
import http from 'k6/http';
import { check } from 'k6';
import exec from 'k6/execution';
import { Counter } from 'k6/metrics';
import { BASE_URL, envNumber, headers, token, uuid } from './lib/orderd.js';

const TENANTS = envNumber('TENANTS', 1000);
const CREATE_RATE = envNumber('CREATE_RATE', 300);
const REPLAY_RATE = envNumber('REPLAY_RATE', 600);
const CANCEL_RATE = envNumber('CANCEL_RATE', 30);
const LIST_RATE = envNumber('LIST_RATE', 30);
const REPLAY_AGE = envNumber('REPLAY_AGE', 60);
const REPLAY_SETTLE = envNumber('REPLAY_SETTLE', 5);
const DURATION = __ENV.DURATION || '1m';

const serverErrors = new Counter('server_errors');
const replayed = new Counter('replays_answered_from_store');

function scenario(rate, fn) {
  return {
    executor: 'constant-arrival-rate',
    rate,
    timeUnit: '1s',
    duration: DURATION,
    preAllocatedVUs: Math.max(8, Math.ceil(rate / 50)),
    maxVUs: Math.max(64, Math.ceil(rate / 5)),
    exec: fn,
  };
}

const scenarios = {};
for (const [name, rate] of [['create', CREATE_RATE], ['replay', REPLAY_RATE], ['cancel', CANCEL_RATE], ['list', LIST_RATE]]) {
  if (rate > 0) {
    scenarios[name] = scenario(rate, name);
  }
}

const thresholds = {
  server_errors: ['count==0'],
  checks: ['rate==1'],
};
// Named so that each kind's percentiles appear in the summary; never a bound.
for (const kind of ['create', 'replay', 'cancel', 'list']) {
  thresholds[`http_req_duration{kind:${kind}}`] = ['max>=0'];
}

export const options = {
  scenarios,
  thresholds,
  summaryTrendStats: ['p(50)', 'p(99)', 'max'],
  // Many short requests from few VUs: connections are reused.
  noConnectionReuse: false,
};

export function setup() {
  const tenants = [];
  for (let t = 0; t < TENANTS; t++) {
    tenants.push(token(uuid()));
  }
  return { tenants, run: uuid().slice(0, 8), started: Date.now() };
}

/** The body of the i-th create: what its replay must send again. */
function createBody(i) {
  return JSON.stringify({ sku: `SOAK-${i % 97}`, quantity: 1 + (i % 7) });
}

/** The i-th create's key: padded, since a key is 16 characters at least. */
function keyOf(data, i) {
  return `soak-${data.run}-${String(i).padStart(10, '0')}`;
}

function tenantOf(i) {
  return i % TENANTS;
}

function observe(response, kind) {
  if (response.status >= 500) {
    serverErrors.add(1, { kind });
  }
}

/** A check that, when it fails, says what came instead (in k6's log). */
function expect(response, kind, name, ok) {
  if (!check(response, { [name]: ok }, { kind })) {
    console.warn(`${kind}: ${response.status} ${response.error || ''} ${String(response.body || '').slice(0, 200)}`);
  }
}

export function create(data) {
  const i = exec.scenario.iterationInTest;
  const key = keyOf(data, i);
  const r = http.post(`${BASE_URL}/v1/orders`, createBody(i), {
    headers: headers(data.tenants[tenantOf(i)], key),
    tags: { kind: 'create' },
  });
  observe(r, 'create');
  expect(r, 'create', 'create answers 201', (x) => x.status === 201);
}

export function replay(data) {
  // The creates made so far, at their rate; pick one made up to REPLAY_AGE s ago.
  // Not the last REPLAY_SETTLE seconds' (default 5): those may still be in flight,
  // and a replay of one is the in-flight race, which k6/race.js covers.
  const elapsed = (Date.now() - data.started) / 1000 - REPLAY_SETTLE;
  const made = Math.floor(elapsed * CREATE_RATE);
  if (made < 1) {
    return;
  }
  const back = Math.floor(Math.random() * Math.min(made, REPLAY_AGE * CREATE_RATE));
  const i = Math.max(0, made - 1 - back);
  const r = http.post(`${BASE_URL}/v1/orders`, createBody(i), {
    headers: headers(data.tenants[tenantOf(i)], keyOf(data, i)),
    tags: { kind: 'replay' },
  });
  observe(r, 'replay');
  if (r.headers['Idempotent-Replayed'] === 'true') {
    replayed.add(1);
  }
  // 201 either way: a create k6 dropped under load is made now instead.
  expect(r, 'replay', 'replay answers 201', (x) => x.status === 201);
}

export function cancel(data) {
  const tenant = data.tenants[Math.floor(Math.random() * TENANTS)];
  const page = http.get(`${BASE_URL}/v1/orders?limit=5`, { headers: headers(tenant), tags: { kind: 'list' } });
  observe(page, 'list');
  expect(page, 'list', 'list answers 200', (x) => x.status === 200);
  const items = page.status === 200 ? page.json('items') : [];
  if (!items || items.length === 0) {
    return;
  }
  const order = items[Math.floor(Math.random() * items.length)];
  const r = http.post(`${BASE_URL}/v1/orders/${order.id}/cancel`, null, {
    headers: headers(tenant, `soak-cancel-${uuid()}`),
    // One name for every order's URL: k6 keeps a time series per name, and half an
    // hour of cancels made hundreds of thousands of them.
    tags: { kind: 'cancel', name: '/v1/orders/{id}/cancel' },
  });
  observe(r, 'cancel');
  // An order purged meanwhile is a 404; anything else is a cancel.
  expect(r, 'cancel', 'cancel answers 200 or 404', (x) => x.status === 200 || x.status === 404);
}

export function list(data) {
  const tenant = data.tenants[Math.floor(Math.random() * TENANTS)];
  const r = http.get(`${BASE_URL}/v1/orders?limit=20`, { headers: headers(tenant), tags: { kind: 'list' } });
  observe(r, 'list');
  expect(r, 'list', 'list answers 200', (x) => x.status === 200);
}

export function handleSummary(data) {
  const lines = ['soak:'];
  for (const kind of ['create', 'replay', 'cancel', 'list']) {
    const m = data.metrics[`http_req_duration{kind:${kind}}`];
    if (m) {
      lines.push(`  ${kind}: ${m.values['p(50)'].toFixed(1)} ms p50, ${m.values['p(99)'].toFixed(1)} ms p99, ${m.values.max.toFixed(1)} ms max`);
    }
  }
  const reqs = data.metrics.http_reqs.values;
  const dropped = data.metrics.dropped_iterations ? data.metrics.dropped_iterations.values.count : 0;
  const errors = data.metrics.server_errors ? data.metrics.server_errors.values.count : 0;
  const stored = data.metrics.replays_answered_from_store ? data.metrics.replays_answered_from_store.values.count : 0;
  lines.push(`  ${reqs.count} requests, ${reqs.rate.toFixed(0)}/s; ${errors} answered 5xx; ${dropped} iterations dropped; ${stored} replays answered from the store`);
  for (const c of data.root_group.checks || []) {
    if (c.fails > 0) {
      lines.push(`  check "${c.name}": ${c.fails} of ${c.passes + c.fails} failed`);
    }
  }
  for (const [metric, values] of Object.entries(data.metrics)) {
    for (const [rule, result] of Object.entries(values.thresholds || {})) {
      if (rule !== 'max>=0') {
        lines.push(`  threshold ${metric} ${rule}: ${result.ok ? 'ok' : 'FAILED'}`);
      }
    }
  }
  return { stdout: `${lines.join('\n')}\n` };
}

// Many cancels of one order, each with a key of its own: every one answers 200 with the
// order CANCELLED, and the order is cancelled once (one updated_at for all).
//
//   k6 run -e ORDERD_JWT_HS256_SECRET=... k6/cancel-race.js
//
// teardown() fails the run unless the order is CANCELLED and every answer carried the
// same updated_at as the order now has (a second cancel would have moved it).
// SELFTEST=recreate cancels a fresh order each time: that run must fail.
import http from 'k6/http';
import { check } from 'k6';
import { Counter } from 'k6/metrics';
import { BASE_URL, envNumber, headers, statusLine, token, uuid } from './lib/orderd.js';

const VUS = envNumber('VUS', 40);
const ITERATIONS = envNumber('ITERATIONS', 400);
const answers200 = new Counter('answers_200');
const violations = new Counter('invariant_violations');

export const options = {
  scenarios: {
    cancel: { executor: 'shared-iterations', vus: VUS, iterations: ITERATIONS, maxDuration: '2m' },
  },
  thresholds: {
    checks: ['rate==1'],
    invariant_violations: ['count==0'],
  },
};

function createOrder(tok) {
  const res = http.post(`${BASE_URL}/v1/orders`, JSON.stringify({ sku: 'CANCEL-1', quantity: 1 }), {
    headers: headers(tok, `k6-cancel-create-${uuid()}`),
  });
  if (res.status !== 201) {
    throw new Error(`setup create answered ${res.status}: ${res.body}`);
  }
  return res.json().id;
}

export function setup() {
  const tok = token(uuid());
  return { token: tok, id: createOrder(tok) };
}

export default function (data) {
  const id = __ENV.SELFTEST === 'recreate' ? createOrder(data.token) : data.id;
  const res = http.post(`${BASE_URL}/v1/orders/${id}/cancel`, null, {
    headers: headers(data.token, `k6-cancel-${uuid()}`),
    tags: { kind: 'cancel' },
  });
  if (res.status === 200) {
    answers200.add(1);
  }
  check(res, {
    'answer is 200 CANCELLED': (r) => r.status === 200 && r.json().status === 'CANCELLED',
  });
  // Whatever any cancel answered must still be the order's state: cancelled once.
  const now = http.get(`${BASE_URL}/v1/orders/${data.id}`, { headers: headers(data.token), tags: { kind: 'verify' } });
  if (res.status === 200 && !check(now, { 'the order was cancelled once': (r) => r.json().updated_at === res.json().updated_at })) {
    violations.add(1);
  }
}

export function teardown(data) {
  const order = http.get(`${BASE_URL}/v1/orders/${data.id}`, { headers: headers(data.token) }).json();
  if (!check(order, { 'the order is CANCELLED': (o) => o.status === 'CANCELLED' })) {
    violations.add(1);
  }
}

export function handleSummary(data) {
  return { stdout: `${statusLine(data, 'cancel-race')}\n` };
}

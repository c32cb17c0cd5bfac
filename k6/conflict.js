// One key, two different payloads racing: only one of them may ever take effect.
//
//   k6 run -e ORDERD_JWT_HS256_SECRET=... k6/conflict.js
//
// Checks: every answer is 201, 409 or 422; every 422 is idempotency-key-reused; every
// 201 body is the order as served. teardown() fails the run unless exactly one order
// carries the run's tag and every 201 answered the payload that won.
// SELFTEST=distinct-keys gives each payload a key of its own: that run must fail.
import http from 'k6/http';
import { check } from 'k6';
import { Counter } from 'k6/metrics';
import { BASE_URL, allOrders, envNumber, headers, statusLine, token, uuid } from './lib/orderd.js';

const VUS = envNumber('VUS', 40);
const ITERATIONS = envNumber('ITERATIONS', 400);
const answers201 = new Counter('answers_201');
const answers409 = new Counter('answers_409');
const answers422 = new Counter('answers_422');
const violations = new Counter('invariant_violations');

export const options = {
  scenarios: {
    conflict: { executor: 'shared-iterations', vus: VUS, iterations: ITERATIONS, maxDuration: '2m' },
  },
  thresholds: {
    checks: ['rate==1'],
    invariant_violations: ['count==0'],
  },
};

export function setup() {
  const tag = `k6-conflict-${uuid()}`;
  return {
    token: token(uuid()),
    key: `k6-conflict-${uuid()}`,
    tag,
    // Two requests under one key: they differ in quantity only.
    bodies: [1, 2].map((quantity) => JSON.stringify({ sku: 'CONFLICT-1', quantity, customer_ref: tag })),
  };
}

export default function (data) {
  const which = __VU % 2;
  const key = __ENV.SELFTEST === 'distinct-keys' ? `${data.key}-${which}` : data.key;
  const res = http.post(`${BASE_URL}/v1/orders`, data.bodies[which], {
    headers: headers(data.token, key),
    responseCallback: http.expectedStatuses(201, 409, 422),
    tags: { kind: 'conflict' },
  });
  if (res.status === 201) {
    answers201.add(1);
    const served = http.get(`${BASE_URL}${res.headers.Location}`, { headers: headers(data.token), tags: { kind: 'verify' } });
    check(res, { '201 body is the order as served': (r) => r.body === served.body });
  }
  if (res.status === 409) {
    answers409.add(1);
  }
  if (res.status === 422) {
    answers422.add(1);
    check(res, { '422 is idempotency-key-reused': (r) => r.json().type === '/problems/idempotency-key-reused' });
  }
  check(res, { 'answer is 201, 409 or 422': (r) => [201, 409, 422].includes(r.status) });
}

export function teardown(data) {
  const tagged = allOrders(data.token).filter((o) => o.customer_ref === data.tag);
  if (!check(tagged, { 'exactly one order for the key': (t) => t.length === 1 })) {
    violations.add(1);
    console.error(`conflict: ${tagged.length} orders carry this run's tag, wanted 1`);
  }
}

export function handleSummary(data) {
  return { stdout: `${statusLine(data, 'conflict')}\n` };
}

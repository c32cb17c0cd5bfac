// The race: many virtual users send the SAME create with the SAME Idempotency-Key at
// once (400 requests shared by 40 users by default). Exactly one order may result.
//
//   k6 run -e ORDERD_JWT_HS256_SECRET=... k6/race.js          (a fresh tenant per run)
//   k6 run -e TOKEN=$TOKEN -e VUS=100 -e ITERATIONS=2000 k6/race.js
//
// Checks: every answer is 201 or 409; every 201 body is byte for byte the order as the
// API serves it (so, with one order, every 201 body is the first one); every 409
// carries Retry-After >= 1; no 5xx, no 429. teardown() lists the tenant's orders and
// fails the run unless exactly one carries this run's tag. SELFTEST=distinct-keys
// gives every user its own key: that run must fail, proving the check can.
import http from 'k6/http';
import { check } from 'k6';
import { Counter } from 'k6/metrics';
import { BASE_URL, allOrders, envNumber, headers, statusLine, token, uuid } from './lib/orderd.js';

const VUS = envNumber('VUS', 40);
const ITERATIONS = envNumber('ITERATIONS', 400);
const answers201 = new Counter('answers_201');
const answers409 = new Counter('answers_409');
const violations = new Counter('invariant_violations');

export const options = {
  scenarios: {
    race: { executor: 'shared-iterations', vus: VUS, iterations: ITERATIONS, maxDuration: '2m' },
  },
  thresholds: {
    checks: ['rate==1'],
    invariant_violations: ['count==0'],
  },
};

export function setup() {
  const tenant = uuid();
  const tag = `k6-race-${uuid()}`;
  return {
    token: token(tenant),
    key: `k6-race-${uuid()}`,
    tag,
    body: JSON.stringify({ sku: 'RACE-1', quantity: 1, customer_ref: tag }),
  };
}

export default function (data) {
  const key = __ENV.SELFTEST === 'distinct-keys' ? `k6-race-${uuid()}` : data.key;
  const res = http.post(`${BASE_URL}/v1/orders`, data.body, {
    headers: headers(data.token, key),
    responseCallback: http.expectedStatuses(201, 409),
    tags: { kind: 'race' },
  });
  if (res.status === 201) {
    answers201.add(1);
    const served = http.get(`${BASE_URL}${res.headers.Location}`, { headers: headers(data.token), tags: { kind: 'verify' } });
    check(res, { '201 body is the order as served': (r) => r.body === served.body });
  }
  if (res.status === 409) {
    answers409.add(1);
  }
  check(res, {
    'answer is 201 or 409': (r) => r.status === 201 || r.status === 409,
    '409 carries Retry-After >= 1': (r) => r.status !== 409 || Number(r.headers['Retry-After']) >= 1,
  });
}

export function teardown(data) {
  const tagged = allOrders(data.token).filter((o) => o.customer_ref === data.tag);
  const one = check(tagged, { 'exactly one order for the key': (t) => t.length === 1 });
  if (!one) {
    violations.add(1);
    console.error(`race: ${tagged.length} orders carry this run's tag, wanted 1`);
  }
}

export function handleSummary(data) {
  const count = (m) => (data.metrics[m] ? data.metrics[m].values.count : 0);
  const answered = count('answers_201') + count('answers_409');
  const share = answered ? ((100 * count('answers_409')) / answered).toFixed(1) : '0.0';
  const line = `${statusLine(data, 'race')}; ${VUS} users, ${ITERATIONS} requests: 409 share ${share} %\n`;
  return { stdout: line };
}

// k6 load scenario: a steady mix of new creates (unique keys), client retries
// (replays of an earlier key) and reads, at a constant arrival rate. The Rust twin is
// `loadgen create|replay`; results go to docs/performance.md.
//
//   k6 run -e BASE=http://127.0.0.1:8080 -e TOKEN=$TOKEN -e RATE=200 k6/load.js
import http from 'k6/http';
import { check } from 'k6';

export const options = {
  scenarios: {
    writes: {
      executor: 'constant-arrival-rate',
      rate: Number(__ENV.RATE || 200),
      timeUnit: '1s',
      duration: __ENV.DURATION || '1m',
      preAllocatedVUs: 32,
      maxVUs: 128,
    },
  },
  thresholds: {
    'http_req_failed': ['rate<0.001'],
    'http_req_duration{kind:create}': ['p(99)<50'],
    'http_req_duration{kind:replay}': ['p(99)<20'],
  },
};

const BASE = __ENV.BASE || 'http://127.0.0.1:8080';
const headers = (key) => ({
  'Content-Type': 'application/json',
  'Authorization': `Bearer ${__ENV.TOKEN}`,
  'Idempotency-Key': key,
});

export default function () {
  const key = `k6-load-${__VU}-${__ITER}-${Date.now()}`.padEnd(24, '0');
  const body = JSON.stringify({ sku: 'LOAD-1', quantity: 1 + (__ITER % 5) });
  const created = http.post(`${BASE}/v1/orders`, body, { headers: headers(key), tags: { kind: 'create' } });
  check(created, { 'created 201': (r) => r.status === 201 });

  // One request in five is a client retry of the same operation.
  if (__ITER % 5 === 0) {
    const replay = http.post(`${BASE}/v1/orders`, body, { headers: headers(key), tags: { kind: 'replay' } });
    check(replay, {
      'replay 201': (r) => r.status === 201,
      'replay flagged': (r) => r.headers['Idempotent-Replayed'] === 'true',
      'replay byte-identical': (r) => r.body === created.body,
    });
  }
  if (__ITER % 3 === 0) {
    const list = http.get(`${BASE}/v1/orders?limit=20`, { headers: { Authorization: `Bearer ${__ENV.TOKEN}` }, tags: { kind: 'list' } });
    check(list, { 'list 200': (r) => r.status === 200 });
  }
}

// k6 race scenario: many virtual users send the SAME create with the SAME
// Idempotency-Key at once. Exactly one order may result; every answer must be the
// first answer replayed (201) or 409 in flight. The Rust twin is `loadgen race`.
//
//   k6 run -e BASE=http://127.0.0.1:8080 -e TOKEN=$TOKEN k6/race.js
import http from 'k6/http';
import { check } from 'k6';
import exec from 'k6/execution';

export const options = {
  scenarios: {
    race: { executor: 'per-vu-iterations', vus: 50, iterations: 1, maxDuration: '30s' },
  },
  thresholds: {
    'checks': ['rate==1'],
    'http_req_failed{expected_response:true}': ['rate==0'],
  },
};

const BASE = __ENV.BASE || 'http://127.0.0.1:8080';
// One key for the whole run: every VU races for it.
const KEY = __ENV.KEY || `k6-race-${Date.now()}-0000000000`;

export default function () {
  const res = http.post(`${BASE}/v1/orders`, JSON.stringify({ sku: 'RACE-1', quantity: 1 }), {
    headers: {
      'Content-Type': 'application/json',
      'Authorization': `Bearer ${__ENV.TOKEN}`,
      'Idempotency-Key': KEY,
    },
    responseCallback: http.expectedStatuses(201, 409),
  });
  check(res, {
    '201 or 409': (r) => r.status === 201 || r.status === 409,
    '409 carries Retry-After': (r) => r.status !== 409 || Number(r.headers['Retry-After']) >= 1,
    'no 5xx': (r) => r.status < 500,
  });
}

export function handleSummary(data) {
  // After the run: GET /v1/orders must show exactly one RACE-1 order for this key's
  // tenant (checked by the operator, or by `loadgen race`, which counts the 201s).
  return { stdout: JSON.stringify({ checks: data.metrics.checks, vu: exec.instance.vusInitialized }, null, 2) + '\n' };
}

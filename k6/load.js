// The steady load: new creates (a key each) at a constant arrival rate, client retries
// of some of them (replays, which must be byte for byte the first answer), and reads.
//
//   k6 run -e ORDERD_JWT_HS256_SECRET=... -e RATE=300 -e DURATION=2m k6/load.js
//   k6 run ... -e P99_MS=50 k6/load.js      (a full manual run may also hold p99 to a bound)
//   k6 run ... -e TENANTS=2000 k6/load.js   (the operations spread over that many tenants)
//
// SELFTEST=new-key-on-retry makes the "retries" new operations (a fresh key): they are
// not replays, and the run must fail.
// Thresholds: no failed request, every replay identical and flagged. Latency per kind
// (create, replay, list) is reported, and only becomes a threshold with P99_MS: on a
// shared CI machine time is not an invariant.
import http from 'k6/http';
import { check } from 'k6';
import { Counter } from 'k6/metrics';
import { BASE_URL, envNumber, headers, token, uuid } from './lib/orderd.js';

const answers201 = new Counter('answers_201');
const thresholds = {
  http_req_failed: ['rate==0'],
  'checks{kind:replay}': ['rate==1'],
  'checks{kind:create}': ['rate==1'],
};
if (__ENV.P99_MS) {
  for (const kind of ['create', 'replay', 'list']) {
    thresholds[`http_req_duration{kind:${kind}}`] = [`p(99)<${Number(__ENV.P99_MS)}`];
  }
}
// Named so that their percentiles appear in the summary.
for (const kind of ['create', 'replay', 'list']) {
  thresholds[`http_req_duration{kind:${kind}}`] = thresholds[`http_req_duration{kind:${kind}}`] || ['max>=0'];
}

export const options = {
  scenarios: {
    load: {
      executor: 'constant-arrival-rate',
      rate: envNumber('RATE', 200),
      timeUnit: '1s',
      duration: __ENV.DURATION || '1m',
      preAllocatedVUs: 32,
      maxVUs: 256,
    },
  },
  thresholds,
  summaryTrendStats: ['p(50)', 'p(99)', 'max'],
};

export function setup() {
  return { tokens: Array.from({ length: Math.max(1, envNumber('TENANTS', 1)) }, () => token(uuid())) };
}

export default function (data) {
  // Each operation on a tenant in turn; a retry on the same tenant as its create.
  const tenantToken = data.tokens[__ITER % data.tokens.length];
  const key = `k6-load-${uuid()}`;
  const body = JSON.stringify({ sku: 'LOAD-1', quantity: 1 + (__ITER % 5) });
  const created = http.post(`${BASE_URL}/v1/orders`, body, { headers: headers(tenantToken, key), tags: { kind: 'create' } });
  if (created.status === 201) {
    answers201.add(1);
  }
  check(created, { 'create answers 201': (r) => r.status === 201 }, { kind: 'create' });

  // One operation in five is retried by its client.
  if (__ITER % 5 === 0) {
    const retryKey = __ENV.SELFTEST === 'new-key-on-retry' ? `k6-load-${uuid()}` : key;
    const replay = http.post(`${BASE_URL}/v1/orders`, body, { headers: headers(tenantToken, retryKey), tags: { kind: 'replay' } });
    check(replay, {
      'replay answers 201': (r) => r.status === 201,
      'replay is flagged': (r) => r.headers['Idempotent-Replayed'] === 'true',
      'replay is byte for byte the first answer': (r) => r.body === created.body,
    }, { kind: 'replay' });
  }
  if (__ITER % 3 === 0) {
    const list = http.get(`${BASE_URL}/v1/orders?limit=20`, { headers: headers(tenantToken), tags: { kind: 'list' } });
    check(list, { 'list answers 200': (r) => r.status === 200 }, { kind: 'list' });
  }
}

export function handleSummary(data) {
  const lines = ['load:'];
  for (const kind of ['create', 'replay', 'list']) {
    const m = data.metrics[`http_req_duration{kind:${kind}}`];
    if (m) {
      lines.push(`  ${kind}: ${m.values['p(50)'].toFixed(1)} ms p50, ${m.values['p(99)'].toFixed(1)} ms p99, ${m.values.max.toFixed(1)} ms max`);
    }
  }
  const reqs = data.metrics.http_reqs.values;
  lines.push(`  ${reqs.count} requests, ${reqs.rate.toFixed(0)}/s; failed ${(100 * data.metrics.http_req_failed.values.rate).toFixed(2)} %`);
  for (const [metric, values] of Object.entries(data.metrics)) {
    for (const [rule, result] of Object.entries(values.thresholds || {})) {
      if (rule !== 'max>=0') {
        lines.push(`  threshold ${metric} ${rule}: ${result.ok ? 'ok' : 'FAILED'}`);
      }
    }
  }
  return { stdout: `${lines.join('\n')}\n` };
}

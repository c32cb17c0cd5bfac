// A server stopped while the load runs: creates at a constant rate (a new key each)
// against one orderd that is sent SIGTERM meanwhile. Every request is one of three:
// answered 201; refused at connect (the listener has closed: the client knows nothing
// was done and may go elsewhere); or anything else (a connection dropped after the
// request was sent, a 5xx), which breaks the promise that an accepted request is
// answered.
//
//   k6 run -e ORDERD_JWT_HS256_SECRET=... -e RATE=100 -e DURATION=10s k6/shutdown.js
//
// Thresholds: nothing else than 201 or a refused connection, some of each (REFUSED=0
// when the server is not stopped during the run). SUMMARY_JSON=path also writes the
// counts there, for the caller to compare with the database: one order per 201.
import http from 'k6/http';
import { Counter } from 'k6/metrics';
import { BASE_URL, envNumber, headers, token, uuid } from './lib/orderd.js';

const answered = new Counter('shutdown_answered');
const refused = new Counter('shutdown_refused');
const broken = new Counter('shutdown_broken');

const thresholds = {
  shutdown_answered: ['count>0'],
  shutdown_broken: ['count==0'],
};
if (__ENV.REFUSED !== '0') {
  thresholds.shutdown_refused = ['count>0'];
}

export const options = {
  scenarios: {
    shutdown: {
      executor: 'constant-arrival-rate',
      rate: envNumber('RATE', 100),
      timeUnit: '1s',
      duration: __ENV.DURATION || '10s',
      preAllocatedVUs: 16,
      maxVUs: 128,
    },
  },
  thresholds,
};

export function setup() {
  return { token: token(uuid()) };
}

export default function (data) {
  const key = `k6-shutdown-${uuid()}`;
  const body = JSON.stringify({ sku: 'STOP-1', quantity: 1 });
  const res = http.post(`${BASE_URL}/v1/orders`, body, { headers: headers(data.token, key) });
  if (res.status === 201) {
    answered.add(1);
  } else if (res.status === 0 && /connection refused/.test(res.error || '')) {
    refused.add(1);
  } else {
    broken.add(1);
    console.error(`broken: status ${res.status} ${res.error || ''} ${res.body || ''}`);
  }
}

export function handleSummary(data) {
  const count = (name) => (data.metrics[name] ? data.metrics[name].values.count : 0);
  const counts = {
    answered: count('shutdown_answered'),
    refused: count('shutdown_refused'),
    broken: count('shutdown_broken'),
  };
  const out = {
    stdout: `shutdown: ${counts.answered} answered 201, ${counts.refused} refused at connect, ${counts.broken} broken\n`,
  };
  if (__ENV.SUMMARY_JSON) {
    out[__ENV.SUMMARY_JSON] = JSON.stringify(counts);
  }
  return out;
}

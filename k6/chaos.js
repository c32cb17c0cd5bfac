// The load of the chaos run (bench/chaos): creates at a steady rate from many tenants,
// each retried with its key until it is answered, some replayed once more after their
// answer, some cancelled (a cancel retried the same way). Every answer is written to
// the history (console output, one JSON line per answer; run with `--log-format raw
// --console-output FILE`), which bench/chaos_check.py checks against the database and
// the bus once the faults are over. The script itself asserts nothing about the
// faults: a client sees 503s, 409s and refused connections during them, and retries.
//
//   k6 run --log-format raw --console-output history.jsonl \
//     -e ORDERD_JWT_HS256_SECRET=... -e RATE=200 -e DURATION=2m -e TENANTS=200 k6/chaos.js
import http from 'k6/http';
import crypto from 'k6/crypto';
import { sleep } from 'k6';
import { Counter } from 'k6/metrics';
import { BASE_URL, envNumber, headers, token, uuid } from './lib/orderd.js';

const RATE = envNumber('RATE', 200);
const TENANTS = envNumber('TENANTS', 200);
const REPLAY = envNumber('REPLAY', 0.2);
const CANCEL = envNumber('CANCEL', 0.25);
// A client gives up on a key after this long; the key may still have made its order
// (its last answer was lost), which the history check allows.
const GIVE_UP_MS = envNumber('GIVE_UP_MS', 60000);
const gaveUp = new Counter('gave_up');

export const options = {
  scenarios: {
    chaos: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: __ENV.DURATION || '2m',
      preAllocatedVUs: envNumber('VUS', RATE * 3),
      maxVUs: envNumber('MAX_VUS', RATE * 4),
    },
  },
};

export function setup() {
  return Array.from({ length: TENANTS }, () => {
    const tenant = uuid();
    return { tenant, token: token(tenant) };
  });
}

function record(entry) {
  console.log(JSON.stringify(entry));
}

// Sends one write with its key until it is answered for good (2xx, or a refusal that
// a retry cannot change), recording every answer. Returns the last answer.
function untilAnswered(op, tenant, key, url, body) {
  const started = Date.now();
  let pause = 0.1;
  for (let attempt = 1; ; attempt++) {
    const res = http.post(url, body, {
      headers: headers(tenant.token, key),
      timeout: '20s',
      responseCallback: http.expectedStatuses({ min: 200, max: 299 }, 409),
      // One name per kind: the cancel URLs hold order ids, one time series each otherwise.
      tags: { kind: op, name: op },
    });
    const ok = res.status >= 200 && res.status < 300;
    record({
      op,
      tenant: tenant.tenant,
      key,
      attempt,
      status: res.status,
      replayed: res.headers['Idempotent-Replayed'] === 'true',
      sha: ok ? crypto.sha256(res.body, 'hex') : null,
      id: ok ? res.json('id') : null,
      at: Date.now(),
    });
    // 4xx other than 409 (in flight) and 429 (slow down) is an answer a retry keeps.
    const final = ok || (res.status >= 400 && res.status < 500 && res.status !== 409 && res.status !== 429);
    if (final) {
      return res;
    }
    if (Date.now() - started > GIVE_UP_MS) {
      gaveUp.add(1);
      return res;
    }
    const after = Number(res.headers['Retry-After']);
    sleep(after > 0 ? Math.min(after, 2) : pause);
    pause = Math.min(pause * 2, 2);
  }
}

export default function (tenants) {
  const tenant = tenants[Math.floor(Math.random() * tenants.length)];
  const key = `chaos-${uuid()}`;
  // The key is the customer reference too, so that the check finds a key's orders even
  // when the key never got its answer.
  const body = JSON.stringify({ sku: 'CHAOS-1', quantity: 1 + Math.floor(Math.random() * 5), customer_ref: key });
  record({ op: 'intent', tenant: tenant.tenant, key });
  const created = untilAnswered('create', tenant, key, `${BASE_URL}/v1/orders`, body);
  if (created.status !== 201) {
    return;
  }
  if (Math.random() < REPLAY) {
    untilAnswered('create', tenant, key, `${BASE_URL}/v1/orders`, body);
  }
  if (Math.random() < CANCEL) {
    const id = created.json('id');
    untilAnswered('cancel', tenant, `${key}-cancel`, `${BASE_URL}/v1/orders/${id}/cancel`, null);
  }
}

export function handleSummary(data) {
  const count = (metric) => (data.metrics[metric] ? data.metrics[metric].values.count : 0);
  return {
    stdout: `chaos load: ${count('iterations')} keys, ${count('http_reqs')} requests, ` +
      `${count('dropped_iterations')} iterations dropped (no free VU), ${count('gave_up')} keys given up\n`,
  };
}

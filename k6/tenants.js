// Many tenants at once, one token each, each racing on keys of its own: every tenant
// sees exactly its own orders, one per key, and none of another tenant's.
//
//   k6 run -e ORDERD_JWT_HS256_SECRET=... -e TENANTS=20 -e KEYS=5 k6/tenants.js
//
// SELFTEST=shared-tenant gives every "tenant" the same token: then each sees the
// others' orders, and the run must fail. Needs ORDERD_JWT_HS256_SECRET (a token per
// tenant).
import http from 'k6/http';
import { check } from 'k6';
import { Counter } from 'k6/metrics';
import { BASE_URL, allOrders, envNumber, headers, statusLine, token, uuid } from './lib/orderd.js';

const TENANTS = envNumber('TENANTS', 20);
const KEYS = envNumber('KEYS', 5);
const VUS = envNumber('VUS', 40);
const ITERATIONS = envNumber('ITERATIONS', 400);
const answers201 = new Counter('answers_201');
const answers409 = new Counter('answers_409');
const violations = new Counter('invariant_violations');

export const options = {
  scenarios: {
    tenants: { executor: 'shared-iterations', vus: VUS, iterations: ITERATIONS, maxDuration: '2m' },
  },
  thresholds: {
    checks: ['rate==1'],
    invariant_violations: ['count==0'],
  },
};

export function setup() {
  const shared = token(uuid());
  const run = uuid();
  return Array.from({ length: TENANTS }, (_, t) => ({
    token: __ENV.SELFTEST === 'shared-tenant' ? shared : token(uuid()),
    tag: `k6-tenant-${run}-${t}`,
    keys: Array.from({ length: KEYS }, () => `k6-tenant-${uuid()}`),
  }));
}

export default function (tenants) {
  // Iterations walk tenants and keys so that every key of every tenant is raced.
  const n = __ITER * VUS + __VU;
  const tenant = tenants[n % TENANTS];
  const k = Math.floor(n / TENANTS) % KEYS;
  const body = JSON.stringify({ sku: 'TENANT-1', quantity: 1 + k, customer_ref: tenant.tag });
  const res = http.post(`${BASE_URL}/v1/orders`, body, {
    headers: headers(tenant.token, tenant.keys[k]),
    responseCallback: http.expectedStatuses(201, 409),
    tags: { kind: 'tenants' },
  });
  if (res.status === 201) {
    answers201.add(1);
  }
  if (res.status === 409) {
    answers409.add(1);
  }
  check(res, { 'answer is 201 or 409': (r) => r.status === 201 || r.status === 409 });
}

export function teardown(tenants) {
  for (const tenant of tenants) {
    const orders = allOrders(tenant.token);
    const own = orders.filter((o) => o.customer_ref === tenant.tag);
    const foreign = orders.filter((o) => o.customer_ref !== tenant.tag && `${o.customer_ref}`.startsWith('k6-tenant-'));
    const keysUsed = new Set(own.map((o) => o.quantity)).size;
    const ok = check(null, {
      'a tenant has one order per key': () => own.length === keysUsed && keysUsed <= KEYS,
      "a tenant sees none of another tenant's orders": () => foreign.length === 0,
    });
    if (!ok) {
      violations.add(1);
      console.error(`tenants: ${tenant.tag}: ${own.length} own orders for ${keysUsed} keys, ${foreign.length} foreign`);
    }
  }
}

export function handleSummary(data) {
  return { stdout: `${statusLine(data, 'tenants')}\n` };
}

// What every scenario shares: the base URL, tokens (minted here with k6's own crypto
// from ORDERD_JWT_HS256_SECRET, or taken from TOKEN), fresh keys and tags, and reading a
// tenant's orders back page by page, for the invariant checks of teardown().
import http from 'k6/http';
import crypto from 'k6/crypto';
import encoding from 'k6/encoding';

export const BASE_URL = __ENV.BASE_URL || 'http://127.0.0.1:8080';

/** A random UUID (v4). */
export function uuid() {
  const b = new Uint8Array(crypto.randomBytes(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** An HS256 token for `tenant`, or TOKEN when no secret is given. */
export function token(tenant, scope = 'orders:read orders:write') {
  // While a secret is rotated the variable lists several, the signing one first.
  const secret = (__ENV.ORDERD_JWT_HS256_SECRET || '').split(',')[0];
  if (!secret) {
    if (!__ENV.TOKEN) {
      throw new Error('set ORDERD_JWT_HS256_SECRET (to mint tokens) or TOKEN');
    }
    return __ENV.TOKEN;
  }
  const b64 = (text) => encoding.b64encode(text, 'rawurl');
  const header = b64(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  const now = Math.floor(Date.now() / 1000);
  const claims = b64(JSON.stringify({ tenant_id: tenant, sub: 'k6', scope, iat: now, exp: now + 3600 }));
  const signature = crypto.hmac('sha256', secret, `${header}.${claims}`, 'base64rawurl');
  return `${header}.${claims}.${signature}`;
}

export function headers(tok, key) {
  const h = { 'Content-Type': 'application/json', Authorization: `Bearer ${tok}` };
  if (key) {
    h['Idempotency-Key'] = key;
  }
  return h;
}

/** Every order of the token's tenant, newest first. */
export function allOrders(tok) {
  const orders = [];
  let after = '';
  for (;;) {
    const url = `${BASE_URL}/v1/orders?limit=100${after ? `&after=${after}` : ''}`;
    const page = http.get(url, { headers: headers(tok), tags: { kind: 'verify' } });
    if (page.status !== 200) {
      throw new Error(`listing orders answered ${page.status}: ${page.body}`);
    }
    const body = page.json();
    orders.push(...body.items);
    if (!body.next) {
      return orders;
    }
    after = body.next;
  }
}

/** A number from the environment, or `fallback`. */
export function envNumber(name, fallback) {
  return __ENV[name] ? Number(__ENV[name]) : fallback;
}

/** The summary line every scenario prints: what was sent and how it was answered. */
export function statusLine(data, name) {
  const count = (metric) => (data.metrics[metric] ? data.metrics[metric].values.count : 0);
  const total = count('http_reqs');
  const thresholds = [];
  for (const [metric, values] of Object.entries(data.metrics)) {
    for (const [rule, result] of Object.entries(values.thresholds || {})) {
      thresholds.push(`${metric} ${rule}: ${result.ok ? 'ok' : 'FAILED'}`);
    }
  }
  return `${name}: ${total} requests; 201 ${count('answers_201')}, 200 ${count('answers_200')}, ` +
    `409 ${count('answers_409')}, 422 ${count('answers_422')}; invariant violations ` +
    `${count('invariant_violations')}; thresholds: ${thresholds.join('; ')}`;
}

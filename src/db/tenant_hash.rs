//! A tenant id's place among the shards of a distributed database, computed here.
//!
//! Citus places a row by the hash PostgreSQL's hash operator class gives its
//! distribution column (for a uuid, `uuid_hash`: Bob Jenkins' lookup3 over the 16
//! bytes, as PostgreSQL's `hash_bytes` computes it) and gives each shard a contiguous
//! range of that signed 32-bit value. So tenants ordered by this hash are ordered by
//! shard: a relay that visits its known tenants in this order visits the tenants of one
//! shard together, and sends one statement for them, not one per tenant. The order is
//! all that is used here; which shard a tenant's rows are in is still asked of the
//! database, so a hash that disagreed would cost statements, never a wrong claim.
//!
//! No crate computes PostgreSQL's variant (its initial value, and the last word's
//! bytes added as PostgreSQL does), and it is small enough to keep here, checked
//! against the server's own `uuid_hash` by a test.

use uuid::Uuid;

/// PostgreSQL's `uuid_hash(tenant)`, the value Citus divides into shard ranges.
pub fn tenant_hash(tenant: Uuid) -> i32 {
    let bytes = tenant.as_bytes();
    let word = |i: usize| {
        u32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ])
    };
    // The key is 16 bytes: one full block of three words, then one word left.
    let start = 0x9e37_79b9u32.wrapping_add(16).wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (start, start, start);
    a = a.wrapping_add(word(0));
    b = b.wrapping_add(word(1));
    c = c.wrapping_add(word(2));
    mix(&mut a, &mut b, &mut c);
    a = a.wrapping_add(word(3));
    finish(&mut a, &mut b, &mut c);
    c as i32
}

/// lookup3's mix of one block into the state.
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

/// lookup3's final mixing, after the last block.
fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

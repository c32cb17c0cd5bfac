mod concurrency;
mod expiry;
mod keys;
mod replay_cache;
mod sealed;

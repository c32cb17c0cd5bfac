mod concurrency;
mod expiry;
mod keys;
mod operator;
mod replay_cache;
mod sealed;

mod concurrency;
mod keys;
mod replay_cache;
mod sealed;

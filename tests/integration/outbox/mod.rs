mod fairness;
mod forwarding;
mod kafka;
mod relay;
mod statistics;
mod trace_context;

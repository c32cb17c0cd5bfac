mod fairness;
mod forwarding;
mod kafka;
mod relay;
mod trace_context;

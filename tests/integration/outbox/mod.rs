mod forwarding;
mod relay;
mod trace_context;

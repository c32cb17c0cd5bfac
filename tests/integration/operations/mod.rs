mod cli;
mod observability;
mod reconcile;

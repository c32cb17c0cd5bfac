mod cli;
mod erasure;
mod key_rotation;
mod observability;
mod reconcile;
mod tenant_data;

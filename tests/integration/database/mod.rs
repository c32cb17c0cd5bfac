mod citus;
mod crash;
mod db_timeouts;
mod indexes;
mod pool;
mod purge;
mod routing;
mod scale_out;

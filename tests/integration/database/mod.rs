mod citus;
mod crash;
mod db_timeouts;
mod indexes;
mod pool;
mod purge;
mod scale_out;

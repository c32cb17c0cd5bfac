//! The `orderd` binary: parse the command line, start the runtime, dispatch.

use std::process::ExitCode;

use clap::Parser;
use orderd::cli::{self, Cli};

/// mimalloc instead of the system allocator: a request allocates and frees many small
/// objects (headers, JSON, SQL buffers) across worker threads, and glibc's malloc
/// showed up in a create's CPU profile (the figures are in docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // A missing .env is normal; the real environment always wins over it.
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    let workers = match orderd::app::worker_threads_from_env() {
        Ok(workers) => workers,
        Err(e) => {
            eprintln!("orderd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(workers) = workers {
        runtime.worker_threads(workers);
    }
    let runtime = match runtime.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("orderd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, naming what is wrong (configuration errors name the variable).
            eprintln!("orderd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

//! The `orderd` binary: parse the command line, start the runtime, dispatch.

use std::process::ExitCode;

use clap::Parser;
use orderd::cli::{self, Cli};

fn main() -> ExitCode {
    // A missing .env is normal; the real environment always wins over it.
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
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

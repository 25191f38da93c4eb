//! Runnable rverbs programs live in `src/bin`; this library holds only what several of them
//! say the same way: how a program ends.

use core::fmt::Display;
use std::process::ExitCode;

/// What a program's `run` returns: any error, printed when it ends the program.
pub type Res<T> = Result<T, Box<dyn core::error::Error>>;

/// The exit code of a program named `who` that ended with `result`; an error is printed on
/// stderr first, after the name.
pub fn exit_code<E: Display>(who: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{who}: {e}");
            ExitCode::FAILURE
        }
    }
}

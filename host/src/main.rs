//! The `host` command: a thin CLI over the library.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}

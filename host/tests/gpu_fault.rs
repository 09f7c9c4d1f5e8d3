//! A CUDA error raised while kernels run reaches the caller as a typed `softmax::Error` that
//! says what the library was doing, never as a panic.
//!
//! The fault is a device-side `trap`, which poisons the CUDA context for the rest of its
//! process, so that part runs in a child: this binary re-executes itself with
//! `SOFTMAX_FAULT_CHILD=1`. The child opens a `Softmax`, checks one correct run against the
//! reference, launches a one-instruction trapping kernel on the library's stream, and checks
//! that `synchronize` returns `Error::Cuda` naming the stream wait, that a later `run_host`
//! returns an error rather than numbers, and that dropping everything does not panic. It
//! prints one `check … ok`/`FAILED` line per check and exits 0 only if all held. The parent
//! (an ordinary test of the shared harness, so it is reported skipped without a GPU) echoes
//! the child's output and passes only if the child exited 0 having printed every check as ok.
//!
//! `SOFTMAX_TEST_SEED=N` replays a run.

mod common;

use std::io::Read;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use cust::launch;
use cust::module::Module;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softmax::reference::{deviation, softmax_f64};
use softmax::{Error, Shape, Softmax, Variant};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[("cuda_error_mid_run", cuda_error_mid_run)];

/// Set (to `1`) in the environment of the re-executed child.
const CHILD_ENV: &str = "SOFTMAX_FAULT_CHILD";

/// One kernel that traps at once: the smallest way to raise an error while a kernel runs.
/// (`ptxas -arch=sm_90` accepts it.)
const TRAP_PTX: &str = "\
.version 7.8
.target sm_90
.address_size 64

.visible .entry trap_now()
{
\ttrap;
\tret;
}
";

/// The child's checks, in order; the parent requires a `check NAME ... ok` line for each.
const CORRECT_BEFORE: &str = "a_correct_run_before_the_fault_matches_the_reference";
const TRAP_LAUNCHED: &str = "the_trapping_kernel_loads_and_launches_on_the_library_stream";
const SYNC_ERROR: &str = "synchronize_returns_error_cuda_naming_the_stream_wait";
const RUN_AFTER: &str = "run_host_after_the_fault_returns_an_error_not_numbers";
const DROP_AFTER: &str = "dropping_everything_after_the_fault_does_not_panic";
const CHECKS: [&str; 5] = [
    CORRECT_BEFORE,
    TRAP_LAUNCHED,
    SYNC_ERROR,
    RUN_AFTER,
    DROP_AFTER,
];

/// What `Softmax::synchronize` says it was doing when the stream reports an error.
const DURING_SYNC: &str = "waiting for the stream";

/// A trap is reported at once; anything near this long is a hang.
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

const TOLERANCE: f64 = 1e-5;

fn main() -> ExitCode {
    if std::env::var(CHILD_ENV).as_deref() == Ok("1") {
        return child();
    }
    common::run_harness(TESTS)
}

/// The parent: runs the child, echoes what it printed, and checks its exit and its lines.
fn cuda_error_mid_run(_softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this test binary: {e}"))?;
    let seed: u64 = rng.random();
    let mut child = Command::new(&exe)
        .env(CHILD_ENV, "1")
        .env("SOFTMAX_TEST_SEED", seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start {}: {e}", exe.display()))?;
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("piped")));
    let stderr = read_all(Box::new(child.stderr.take().expect("piped")));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if started.elapsed() > CHILD_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "the child ran past {CHILD_TIMEOUT:?} and was killed"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break Err(format!("waiting for the child: {e}")),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    // Prefixed, so that no child line reads as one of the harness's own lines.
    for line in stdout.lines() {
        println!("  child| {line}");
    }
    for line in stderr.lines() {
        println!("  child stderr| {line}");
    }
    let status = status?;
    if !status.success() {
        return Err(format!(
            "the child exited with {status} (its output is above)"
        ));
    }
    let missing: Vec<&str> = CHECKS
        .iter()
        .copied()
        .filter(|check| {
            let ok = format!("check {check} ... ok");
            !stdout.lines().any(|line| line.starts_with(&ok))
        })
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the child exited 0 but did not report these checks as ok: {}",
            missing.join(", ")
        ));
    }
    let reported = stdout
        .lines()
        .find_map(|line| line.strip_prefix(&format!("check {SYNC_ERROR} ... ok: ")))
        .unwrap_or_default();
    Ok(format!(
        "in a child process, all {} checks held; synchronize gave {reported}",
        CHECKS.len()
    ))
}

/// Runs one check, catching a panic as a failure, and prints its line.
fn check(name: &str, body: impl FnOnce() -> Outcome) -> bool {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        Err(format!(
            "panicked: {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or(panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        ))
    });
    match outcome {
        Ok(detail) => {
            println!("check {name} ... ok: {detail}");
            true
        }
        Err(why) => {
            println!("check {name} ... FAILED: {why}");
            false
        }
    }
}

/// The child: every check in order, stopping at the first that fails (each depends on the
/// ones before it). Exits 0 only if all held.
fn child() -> ExitCode {
    let seed = std::env::var("SOFTMAX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    println!("fault child: pid {}, seed {seed}", std::process::id());
    let mut softmax = match Softmax::new().and_then(|s| s.with_tune_cache(None)) {
        Ok(softmax) => softmax,
        Err(error) => {
            println!("opening the device failed: {error}");
            return ExitCode::FAILURE;
        }
    };
    let shape = Shape::new(64, 1000).expect("a small shape");
    let input = common::random_matrix(&mut StdRng::seed_from_u64(seed), shape, 10.0);

    let held = check(CORRECT_BEFORE, || {
        let expected = softmax_f64(&input, shape.rows(), shape.cols());
        let output = softmax
            .run_host(Variant::Auto, &input, shape)
            .map_err(|e| format!("run_host refused: {e}"))?;
        let deviation = deviation(&output, &expected, shape.cols());
        if deviation.within(TOLERANCE) {
            Ok(format!("auto on {shape}: {deviation:?}"))
        } else {
            Err(format!("auto on {shape} is wrong: {deviation:?}"))
        }
    });
    if !held {
        return ExitCode::FAILURE;
    }

    // Kept until after the synchronize: the launched kernel belongs to it.
    let mut module = None;
    let held = check(TRAP_LAUNCHED, || {
        let loaded = Module::from_ptx(TRAP_PTX, &[])
            .map_err(|e| format!("loading the trapping PTX: {e}"))?;
        let stream = softmax.stream();
        // SAFETY: `trap_now` takes no parameters and touches no memory; it only traps.
        unsafe { launch!(loaded.trap_now<<<1, 1, 0, stream>>>()) }
            .map_err(|e| format!("launching trap_now: {e}"))?;
        module = Some(loaded);
        Ok("trap_now<<<1, 1>>> enqueued on softmax.stream()".to_owned())
    });
    if !held {
        return ExitCode::FAILURE;
    }

    let held = check(SYNC_ERROR, || match softmax.synchronize() {
        Ok(()) => Err("synchronize returned Ok after a kernel trapped".to_owned()),
        Err(error) => {
            let Error::Cuda { during, source } = &error else {
                return Err(format!("expected Error::Cuda, got {error:?}"));
            };
            let shown = error.to_string();
            if *during != DURING_SYNC || !shown.contains(DURING_SYNC) {
                return Err(format!(
                    "expected the error to say \"{DURING_SYNC}\", got during = {during:?}, \
                     displayed as \"{shown}\""
                ));
            }
            if std::error::Error::source(&error).is_none() {
                return Err(format!(
                    "\"{shown}\" does not expose the CUDA error as its source"
                ));
            }
            Ok(format!(
                "Error::Cuda {{ during: {during:?}, source: {source:?} }}: \"{shown}\""
            ))
        }
    });
    if !held {
        return ExitCode::FAILURE;
    }

    let held = check(RUN_AFTER, || {
        match softmax.run_host(Variant::Auto, &input, shape) {
            Ok(output) => Err(format!(
                "run_host returned {} numbers from a context poisoned by the trap",
                output.len()
            )),
            Err(error @ (Error::Cuda { .. } | Error::CudaStatus { .. })) => {
                Ok(format!("{error:?}: \"{error}\""))
            }
            Err(error) => Err(format!("expected a CUDA error, got {error:?}: \"{error}\"")),
        }
    });
    if !held {
        return ExitCode::FAILURE;
    }

    let held = check(DROP_AFTER, move || {
        drop(module);
        drop(softmax);
        Ok("the trap's module and the Softmax dropped".to_owned())
    });
    if !held {
        return ExitCode::FAILURE;
    }
    println!("fault child: all {} checks held", CHECKS.len());
    ExitCode::SUCCESS
}

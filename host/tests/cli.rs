//! The `host` command line: parsing and refusals, which need no GPU.

use std::process::{Command, Output};

fn host(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .output()
        .expect("the host binary runs")
}

#[test]
fn bad_shapes_are_refused_with_a_clear_message() {
    for bad in ["0x10", "10x", "abc", "10x0", "3x1.5"] {
        let out = host(&["bench", "--shapes", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} was accepted");
        assert!(
            stderr.contains(&format!("`{bad}` is not a shape")),
            "{bad}: unclear message: {stderr}"
        );
    }
}

#[test]
fn bad_variants_and_thread_counts_are_refused() {
    for (bad, says) in [
        ("nope", "unknown variant"),
        ("block-smem:100", "power of two"),
        ("block-smem:2048", "power of two"),
    ] {
        let out = host(&["bench", "--variants", bad]);
        assert!(!out.status.success(), "{bad} was accepted");
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{bad}");
    }
}

#[test]
fn help_lists_every_option() {
    let out = host(&["bench", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for option in [
        "--shapes",
        "--variants",
        "--iters",
        "--warmup",
        "--out",
        "--quick",
        "--device",
        "--peers",
    ] {
        assert!(help.contains(option), "--help does not mention {option}");
    }
    for name in softmax::Variant::NAMES {
        assert!(
            help.contains(name),
            "--help does not name the variant {name}"
        );
    }
}

#[test]
fn quick_and_shapes_conflict_and_iters_must_be_positive() {
    assert!(
        !host(&["bench", "--quick", "--shapes", "2x2"])
            .status
            .success()
    );
    assert!(!host(&["bench", "--iters", "0"]).status.success());
}

#[test]
fn without_a_gpu_bench_names_the_cause() {
    let out = host(&[
        "bench",
        "--shapes",
        "4x4",
        "--out",
        env!("CARGO_TARGET_TMPDIR"),
    ]);
    if out.status.success() {
        return; // A machine with a GPU: the benchmark ran; nothing to check here.
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no CUDA device"),
        "unexpected failure: {stderr}"
    );
}

//! The `host` command line: parsing and refusals, which need no GPU.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use softmax::bench::{Outcome, Report, Timing};

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
        "--op",
        "--dtype",
        "--timing",
    ] {
        assert!(help.contains(option), "--help does not mention {option}");
    }
    for name in softmax::Variant::NAMES {
        assert!(
            help.contains(name),
            "--help does not name the variant {name}"
        );
    }
    for name in softmax::bench::BenchOp::NAMES
        .into_iter()
        .chain(["f32", "bf16", "f16"])
        .chain(softmax::bench::TimingModes::NAMES)
    {
        assert!(help.contains(name), "--help does not name {name}");
    }
}

#[test]
fn bad_ops_and_dtypes_are_refused_with_a_clear_message() {
    for (flag, bad, says) in [
        (
            "--op",
            "softmx",
            "unknown op `softmx`: expected softmax, log-softmax or backward",
        ),
        ("--op", "", "unknown op"),
        ("--op", "forward", "unknown op `forward`"),
        (
            "--dtype",
            "fp32",
            "unknown dtype `fp32`: expected f32, bf16 or f16",
        ),
        ("--dtype", "f64", "unknown dtype `f64`"),
        ("--dtype", "BF16", "unknown dtype `BF16`"),
        (
            "--timing",
            "cold",
            "unknown timing `cold`: expected isolated, back-to-back or both",
        ),
        ("--timing", "", "unknown timing"),
    ] {
        let out = host(&["bench", flag, bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {bad} was accepted");
        assert_eq!(out.status.code(), Some(2), "{flag} {bad}: {stderr}");
        assert!(
            stderr.contains(says),
            "{flag} {bad}: unclear message: {stderr}"
        );
    }
}

#[test]
fn ops_and_dtypes_parse() {
    assert_eq!(
        "log-softmax".parse::<softmax::bench::BenchOp>(),
        Ok(softmax::bench::BenchOp::LogSoftmax)
    );
    assert_eq!(
        softmax::bench::parse_dtype("bf16"),
        Ok(softmax::DType::Bf16)
    );
    for op in softmax::bench::BenchOp::NAMES {
        let parsed: softmax::bench::BenchOp = op.parse().expect("listed names parse");
        assert_eq!(parsed.name(), op);
    }
    // Every valid value gets past parsing: the run then stops only for want of a GPU.
    for (op, dtype, timing) in [
        ("softmax", "f32", "both"),
        ("log-softmax", "f16", "isolated"),
        ("backward", "bf16", "back-to-back"),
    ] {
        let out = host(&[
            "bench",
            "--op",
            op,
            "--dtype",
            dtype,
            "--timing",
            timing,
            "--shapes",
            "4x4",
            "--out",
            env!("CARGO_TARGET_TMPDIR"),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || stderr.contains("no CUDA device"),
            "--op {op} --dtype {dtype} --timing {timing}: {stderr}"
        );
    }
}

#[test]
fn variants_other_than_auto_need_f32_softmax() {
    for args in [
        ["--op", "backward", "--variants", "registers"],
        ["--dtype", "bf16", "--variants", "auto,unfused"],
    ] {
        let out = host(&[&["bench"], &args[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(
            stderr.contains("--variants applies to f32 softmax only"),
            "{args:?}: unclear message: {stderr}"
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

/// `bench/ab.sh` (the A/B of two builds on the GPU machine) reads the benchmark's own table:
/// given two builds whose `bench` prints a run's table, it reports auto's % of copy for every
/// shape, timing mode, build and round. The run is a saved (back-to-back) run with each
/// measurement repeated as isolated, one point higher.
#[test]
fn ab_script_reads_the_benchmark_table() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits in the workspace");
    let saved = workspace.join("host/tests/fixtures/bench-run-softmax-bf16.json");
    let mut report = Report::load(&saved).expect("a saved run");
    let isolated: Vec<_> = report
        .measurements
        .iter()
        .cloned()
        .map(|mut m| {
            m.timing = Timing::Isolated;
            if let Outcome::Timed { pct_of_copy, .. } = &mut m.outcome {
                *pct_of_copy += 1.0;
            }
            m
        })
        .collect();
    report.measurements.extend(isolated);
    let table = report.table();
    let dir = std::env::temp_dir().join(format!("softmax-ab-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join(".gpu/staging")).unwrap();
    fs::create_dir_all(dir.join("bench")).unwrap();
    for script in ["ab.sh", "unpack-bundle.sh", "bundle_images.py"] {
        fs::copy(
            workspace.join("bench").join(script),
            dir.join("bench").join(script),
        )
        .unwrap();
    }
    fs::write(dir.join("table.txt"), &table).unwrap();
    for build in ["host", "host-base"] {
        let path = dir.join(".gpu/staging").join(build);
        fs::write(&path, "#!/bin/sh\ncat table.txt\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let packed = Command::new("tar")
        .args(["czf", ".gpu/bundle.tar.gz", "-C", ".gpu/staging", "."])
        .current_dir(&dir)
        .status()
        .expect("tar runs");
    assert!(packed.success());
    let out = Command::new("bash")
        .args(["bench/ab.sh", "2", "--dtype", "bf16"])
        .current_dir(&dir)
        .env("OUT", dir.join("out"))
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every auto line of the table, as `shape mode pct`: each must come back twice per build.
    let (mut shape, mut mode) = ("", "");
    let mut expected = Vec::new();
    for line in table.lines() {
        if line.contains(" per tensor)") {
            shape = line.split_whitespace().next().unwrap();
        } else if let Some(name) = ["isolated", "back-to-back"]
            .into_iter()
            .find(|name| line.starts_with(&format!("  {name}: ")))
        {
            mode = name;
        } else if line.starts_with("  auto ") {
            let pct = line.split_whitespace().nth(3).unwrap().to_owned();
            expected.push((shape, mode, pct));
        }
    }
    assert!(
        expected.len() >= 20 && expected.iter().any(|e| e.1 == "isolated"),
        "the run has its shapes in both modes: {table}"
    );
    for (shape, mode, pct) in expected {
        for build in ["base", "new"] {
            let wanted: Vec<&str> = vec![shape, mode, build, &pct, &pct];
            assert!(
                stdout
                    .lines()
                    .any(|l| l.split_whitespace().take(5).eq(wanted.iter().copied())),
                "no `{}` line in:\n{stdout}",
                wanted.join(" ")
            );
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

/// `host chart` on a file that is not a usable report: JSON that does not parse, a run cut
/// short, and well-formed runs holding what no run writes (a shape no tensor has, a negative
/// or unboundedly large timing). Each is an error message and a failing exit, never a panic
/// or a hang.
#[test]
fn chart_refuses_malformed_and_truncated_reports() {
    let saved =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bench-run-softmax-bf16.json");
    let good = fs::read_to_string(&saved).expect("the saved run");
    let with_first = |field: &str, value: serde_json::Value| {
        let mut report: serde_json::Value =
            serde_json::from_str(&good).expect("the saved run parses");
        let first = &mut report["measurements"][0];
        match field {
            "rows" => first["rows"] = value,
            metric => first["outcome"]["timed"][metric] = value,
        }
        report.to_string()
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("malformed", "{\"device\": [1, 2,, }".to_owned()),
        ("not-json", "bench results\n".to_owned()),
        ("truncated", good[..good.len() / 2].to_owned()),
        ("empty", String::new()),
        ("impossible-shape", with_first("rows", (1u64 << 40).into())),
        ("negative-bandwidth", with_first("gbps", (-5.0).into())),
        (
            "overflowing-percentage",
            with_first("pct_of_copy", 1.7e308.into()),
        ),
    ];
    for (name, contents) in cases {
        let json = dir.join(format!("{name}.json"));
        fs::write(&json, contents).unwrap();
        let out = host_within(
            &[
                "chart",
                json.to_str().unwrap(),
                "--out",
                dir.to_str().unwrap(),
            ],
            Duration::from_secs(60),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.contains("host chart: "),
            "{name}: no error message: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Runs `host` with `args`, killing it (and failing) if it runs past `limit`.
fn host_within(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the host binary starts");
    let started = Instant::now();
    while child.try_wait().expect("waiting for host").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("host {args:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("host's output")
}

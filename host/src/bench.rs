//! Benchmark (filled by the benchmark issue).

//! `fornax bench table` at tiny sizes on the real model (CPU backend): what it prints and
//! draws, client timeouts, and the figures of a peer read back. Timings are not checked.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn model() -> String {
    let path = fornax_engine::store::ensure_default_model(&mut |s| eprintln!("{s}")).unwrap();
    path.to_string_lossy().into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fornax-table-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a tiny table (2 chats x 2 turns, 3..4 output tokens) with `extra` flags.
fn table(plots: &Path, extra: &[&str]) -> String {
    let model = model();
    let mut args = vec![
        "bench",
        "table",
        "--backend",
        "cpu",
        "--model",
        &model,
        "--conversations",
        "2",
        "--turns",
        "2",
        "--output-tokens",
        "3",
        "4",
        "--sweep",
        "0.5",
        "--plots",
        plots.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out: Output = Command::new(env!("CARGO_BIN_EXE_fornax"))
        .args(&args)
        .output()
        .expect("run fornax");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The cells of the table row that starts with `name` ("" for the header).
fn row<'a>(stdout: &'a str, name: &str) -> Vec<&'a str> {
    let start = match name {
        "" => "| | ".to_string(),
        _ => format!("| {name} |"),
    };
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no row {name:?} in\n{stdout}"));
    line.trim_matches('|').split('|').map(str::trim).collect()
}

#[test]
fn bench_table_prints_every_row_and_draws_both_plots() {
    let plots = scratch("plots");
    let out = table(&plots, &[]);
    // Header: before, after and the comparison; no peer column without --peer.
    let header = row(&out, "");
    assert_eq!(header[1..], ["before", "after", "after vs before"]);
    for name in [
        "throughput, tokens/min",
        "P99 end-to-end latency, s",
        "utilisation (busy share of wall time)",
        "TTFT P50, s",
        "TTFT P99, s",
        "peak KV memory, MB",
    ] {
        let cells = row(&out, name);
        for cell in &cells[1..3] {
            let v: f64 = cell.trim_end_matches('%').parse().unwrap();
            assert!(v > 0.0, "{name}: {cells:?}");
        }
    }
    // Every request completes with a 60 s timeout at this size.
    assert_eq!(
        row(&out, "error rate (requests not completed)")[1..3],
        ["0.0%", "0.0%"]
    );
    assert!(
        out.contains("- zero failed requests after: 0 failed, met"),
        "{out}"
    );
    // The sweep: the table's load and the one asked for, in order.
    let swept: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| 50% |") || l.starts_with("| 80% |"))
        .collect();
    assert_eq!(swept.len(), 2, "{out}");
    assert!(swept[0].starts_with("| 50% |"));

    let cdf = std::fs::read_to_string(plots.join("latency-cdf.svg")).unwrap();
    let load = std::fs::read_to_string(plots.join("throughput-vs-load.svg")).unwrap();
    for svg in [&cdf, &load] {
        assert!(svg.starts_with("<svg"));
        assert!(
            svg.contains(">\nbefore\n<") && svg.contains(">\nafter\n<"),
            "{svg}"
        );
    }
    assert!(load.contains(">\noffered\n<"));
    // One point per completed request in each CDF (4 requests): the longest polyline in
    // the series' colour (the legend's sample is a 2-point one).
    for colour in ["#C83C28", "#1E6EC8"] {
        let points = cdf
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains(&format!("stroke=\"{colour}\"")))
            .map(|l| {
                let points = l
                    .split("points=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                points.split_whitespace().count()
            })
            .max();
        assert_eq!(points, Some(4), "{colour}");
    }
}

#[test]
fn requests_past_the_client_timeout_fail_in_both_engines() {
    let plots = scratch("timeout");
    let out = table(&plots, &["--timeout-s", "0.000001"]);
    assert_eq!(
        row(&out, "error rate (requests not completed)")[1..3],
        ["100.0%", "100.0%"]
    );
    assert!(
        out.contains("- zero failed requests after: 4 failed, MISSED"),
        "{out}"
    );
}

/// A driver that answers like `llama-replay.mjs`, completing every other request, so the
/// peer's column must show what it read: half the requests failed.
#[test]
fn the_peer_column_shows_what_the_driver_answered() {
    let dir = scratch("peer");
    let driver = dir.join("driver.mjs");
    std::fs::write(
        &driver,
        r#"import { readFileSync } from "node:fs";
const w = JSON.parse(readFileSync(process.argv[4], "utf8"));
const requests = w.requests.map((r, i) => i % 2 === 0
    ? { ttft_s: 0.5, e2e_s: 1.0, tokens: r.max_tokens, completed: true }
    : { ttft_s: null, e2e_s: null, tokens: 0, completed: false });
console.log(JSON.stringify({ engine: "llama.cpp", adapter: `test driver, ${w.parallel} sequences`,
    kv_bytes: 1e6, makespan_s: 2.0, busy_s: 1.0, requests }));
"#,
    )
    .unwrap();
    let out = table(&dir, &["--peer", driver.to_str().unwrap()]);
    let header = row(&out, "");
    assert_eq!(
        header[1..],
        [
            "before",
            "after",
            "llama.cpp",
            "after vs before",
            "after vs llama.cpp"
        ]
    );
    assert_eq!(row(&out, "error rate (requests not completed)")[3], "50.0%");
    assert_eq!(
        row(&out, "utilisation (busy share of wall time)")[3],
        "50.0%"
    );
    assert_eq!(row(&out, "P99 end-to-end latency, s")[3], "1.00");
    assert_eq!(row(&out, "peak KV memory, MB")[3], "1.00");
    assert!(
        out.contains("peer: llama.cpp, test driver, 4 sequences"),
        "{out}"
    );
}

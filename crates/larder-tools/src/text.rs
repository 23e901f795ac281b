//! The readable text of reports, which the CLI prints as it is: the
//! benches' tables (`larder bench kernels`, `serve`, `cache` on stdout;
//! `decode`'s two summary lines on stderr), `larder trace stats`' tables,
//! `larder run`'s summary line and `--stats` lines and what `larder synth`
//! wrote and `larder verify`'s reports (stderr).

use std::fmt::Write;
use std::path::Path;

use larder_bench::cache::{CacheReport, BELADY, BELADY_SHARES, ONLINE_BOUND};
use larder_bench::kernels::KernelReport;
use larder_engine::Outcome;
use larder_router::RouteStats;
use larder_store::lazy::LazyVerifyReport;
use larder_store::VerifyReport;

use crate::synth::SynthReport;
use crate::trace::TraceStats;
use serde_json::Value;

/// The table of `bench kernels`.
pub fn kernels_table(report: &KernelReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "RAM read bandwidth (1 thread): {:.2} GB/s   kernel path: {}   threads: {}",
        report.ram_gbps,
        report.path.name(),
        report.threads
    );
    let _ = writeln!(out, "compute roofs (1 thread, everything in L1): {}", report.roofs_summary());
    let _ = writeln!(
        out,
        "{:<6} {:>5} {:>11} {:>5} {:>9} {:>7} {:>9} {:>9}",
        "dtype", "rows", "k x n", "cache", "GB/s", "of RAM", "candle", "vs 1-row"
    );
    let mut one_row = std::collections::HashMap::new();
    for r in &report.results {
        let key = (r.dtype.clone(), r.k, r.cold);
        if r.rows == 1 {
            one_row.insert(key.clone(), r.seconds);
        }
        let rel = one_row.get(&key).map_or(String::new(), |s| format!("{:.2}x", r.seconds / s));
        let candle = r.candle_gbps.map_or("-".into(), |g| format!("{g:.2}"));
        let _ = writeln!(
            out,
            "{:<6} {:>5} {:>11} {:>5} {:>9.2} {:>6.0}% {:>9} {:>9}",
            r.dtype,
            r.rows,
            format!("{}x{}", r.k, r.n),
            if r.cold { "cold" } else { "hot" },
            r.gbps,
            r.ratio_to_ram * 100.0,
            candle,
            rel
        );
    }
    out
}

/// The summary lines of `bench decode` (prefill, decode, and decode per MoE layer).
pub fn decode_lines(doc: &serde_json::Value) -> String {
    let mut out = String::new();
    let f = |k: &str| doc[k].as_f64().unwrap_or(0.0);
    let u = |k: &str| doc[k].as_u64().unwrap_or(0);
    let _ = writeln!(
        out,
        "[larder] prefill: {} tokens, {} rows per pass, read amplification {:.2} ({} read / {} routed), io wait {:.0}%",
        u("prompt_tokens"),
        u("prefill_rows_per_pass"),
        f("prefill_read_amplification"),
        larder_store::format_size(u("prefill_expert_bytes_read")),
        larder_store::format_size(u("prefill_routed_expert_bytes")),
        100.0 * f("prefill_io_wait_share"),
    );
    let _ = writeln!(
        out,
        "[larder] drive limit {:.2} GB/s ({}) | prefill {:.2} tok/s | first token {:.2}s | decode {:.3} tok/s | {} per token | hit {:.1}% | io wait {:.0}% | {:.0}% of the I/O bound ({:.3} tok/s) | overlap {:.3}",
        doc["limit"]["gbps"].as_f64().unwrap_or(0.0),
        doc["limit"]["backend"].as_str().unwrap_or(""),
        f("prefill_tok_per_s"),
        f("time_to_first_token_s"),
        f("decode_tok_per_s"),
        larder_store::format_size(f("miss_bytes_per_token") as u64),
        100.0 * f("hit_rate"),
        100.0 * f("io_wait_share"),
        100.0 * f("ratio_to_io_bound"),
        doc["io_bound_tok_per_s"].as_f64().unwrap_or(f64::INFINITY),
        f("routing_overlap")
    );
    let layer = &doc["per_moe_layer"];
    let lf = |k: &str| layer[k].as_f64().unwrap_or(f64::INFINITY);
    if layer.is_object() {
        let _ = writeln!(
            out,
            "[larder] per MoE layer ({} of them, top-{} of {} records): {:.2} ms per token ({:.2} tok/s) vs. {:.2} ms to read \
             top-k records at the drive limit ({:.2} tok/s): {:.0}% of the I/O bound; {} read per token",
            layer["moe_layers"].as_u64().unwrap_or(0),
            layer["top_k"].as_u64().unwrap_or(0),
            larder_store::format_size(layer["record_bytes"].as_u64().unwrap_or(0)),
            1e3 * lf("s_per_token"),
            lf("tok_per_s"),
            1e3 * lf("io_bound_s_per_token"),
            lf("io_bound_tok_per_s"),
            100.0 * layer["ratio_to_io_bound"].as_f64().unwrap_or(0.0),
            larder_store::format_size(layer["miss_bytes_per_token"].as_f64().unwrap_or(0.0) as u64),
        );
    }
    out
}

/// The table of `bench serve`: a row per client count, and the second client's TTFT.
pub fn serve_table(doc: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "clients  aggregate tok/s (min-max)  per-client tok/s (median)  TTFT ms (median / max)  expert bytes/token  \
         uniform reads/route"
    );
    for r in doc["runs"].as_array().into_iter().flatten() {
        let bytes = r["expert_bytes_per_token"]
            .as_f64()
            .map_or("- (in RAM)".to_string(), |b| crate::progress::human(b as u64));
        let union = r["uniform_reads_per_route"].as_f64().map_or("-".to_string(), |u| format!("{u:.2}"));
        let agg = |k: &str| r[k].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            out,
            "{:>7}  {:>8.1} ({:.1}-{:.1})  {:>25.1}  {:>11.0} / {:<8.0}  {bytes:>18}  {union}",
            r["clients"],
            agg("aggregate_tok_s"),
            agg("aggregate_tok_s_min"),
            agg("aggregate_tok_s_max"),
            r["per_client_tok_s_median"].as_f64().unwrap_or(0.0),
            r["ttft_ms_median"].as_f64().unwrap_or(0.0),
            r["ttft_ms_max"].as_f64().unwrap_or(0.0),
        );
    }
    let s = &doc["second_client"];
    let _ = writeln!(
        out,
        "second client's TTFT: {:.0} ms alone, {:.0} ms while a first client generates",
        s["ttft_alone_ms"].as_f64().unwrap_or(0.0),
        s["ttft_beside_ms"].as_f64().unwrap_or(0.0)
    );
    out
}

/// Hit rate and bytes per token of every policy at every budget, and how close the default comes to the bounds.
pub fn cache_table(report: &CacheReport) -> String {
    let mut out = String::new();
    let (curves, names, default) = (&report.curves, &report.policies, report.default_policy);
    let _ = writeln!(
        out,
        "{}: {} tokens, bank {}; hit rate (bytes read per token), default policy {default}",
        report.trace.display(),
        report.tokens,
        larder_engine::format_size(report.bank_bytes)
    );
    let _ = write!(out, "{:>10} {:>6}", "budget", "share");
    for n in names.iter() {
        let _ = write!(out, " {n:>20}");
    }
    out.push('\n');
    for c in curves {
        let _ = write!(out, "{:>10} {:>5.0}%", larder_engine::format_size(c.budget_bytes), 100.0 * c.share);
        for n in names.iter() {
            let Some(r) = c.policies.get(*n) else { continue };
            let cell = format!(
                "{:.1}% ({})",
                100.0 * r.hit_rate,
                larder_engine::format_size(r.bytes_read_per_token as u64)
            );
            let _ = write!(out, " {cell:>20}");
        }
        out.push('\n');
    }
    for (bound, what) in [
        (BELADY, "Belady's hit rate"),
        (BELADY_SHARES, "Belady's in fixed per-layer shares"),
        (ONLINE_BOUND, "the online bound's"),
    ] {
        let worst = curves
            .iter()
            .filter(|c| c.hit(bound) > 0.0)
            .map(|c| c.hit(default) / c.hit(bound))
            .fold(f64::INFINITY, f64::min);
        if worst.is_finite() {
            let _ = writeln!(
                out,
                "{default} reaches at least {:.0}% of {what} at every budget here",
                100.0 * worst
            );
        }
    }
    out
}

/// The header line, both phases' statistics and the hit-rate table.
pub fn trace_stats_text(stats: &TraceStats) -> String {
    let mut out = String::new();
    let (trace, all, decode) = (&stats.trace, &stats.all, &stats.decode);
    let h = &trace.header;
    let _ = writeln!(
        out,
        "{}: {} tokens ({} decode) in {} passes; {} MoE layers x {} experts, top-{}; lookahead {}",
        stats.path.display(),
        all.tokens,
        decode.tokens,
        trace.passes().len(),
        h.moe_layers.len(),
        h.experts,
        h.top_k,
        h.lookahead
    );
    for (name, s) in [("all tokens", all), ("decode", decode)] {
        out.push_str(&route_stats_text(name, s));
    }
    let _ = writeln!(
        out,
        "\ncache hit rate by budget (share of the bank, {}):",
        larder_engine::format_size(trace.bank_bytes())
    );
    let _ = writeln!(out, "  {:>7} {:>8} {:>8}", "budget", "lru", "belady");
    for c in &stats.curves {
        let _ = writeln!(
            out,
            "  {:>6.0}% {:>7.1}% {:>7.1}%",
            100.0 * c.share,
            100.0 * c.hit("lru"),
            100.0 * c.hit("belady")
        );
    }
    out
}

/// One phase's routing statistics (`larder trace stats`).
pub fn route_stats_text(name: &str, s: &RouteStats) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n{name}: {} tokens, {} routes", s.tokens, s.routes);
    let pop: Vec<String> = s
        .popularity
        .iter()
        .map(|(x, y)| format!("hottest {:.0}%: {:.1}%", 100.0 * x, 100.0 * y))
        .collect();
    let _ = writeln!(out, "  popularity (share of routes): {}", pop.join(", "));
    let reuse: Vec<String> = s
        .reuse_distance
        .iter()
        .map(|(b, y)| match b {
            Some(b) => format!("<={b}: {:.1}%", 100.0 * y),
            None => format!("longer: {:.1}%", 100.0 * y),
        })
        .collect();
    let _ = writeln!(
        out,
        "  reuse distance (tokens): {}, first use: {:.1}%",
        reuse.join(", "),
        100.0 * s.first_use
    );
    let _ = writeln!(out, "  consecutive-token overlap: {:.3}", s.consecutive_overlap);
    let recall: Vec<String> = s
        .lookahead_recall
        .iter()
        .map(|(d, r)| format!("depth {d}: {:.1}%", 100.0 * r))
        .collect();
    if !recall.is_empty() {
        let _ = writeln!(out, "  router lookahead recall: {}", recall.join(", "));
    }
    out
}

/// `--stats`: expert I/O per layer (when streaming) and the run's timings.
pub fn run_stats_text(s: &larder_engine::Stats) -> String {
    let mut out = String::new();
    if let Some(x) = &s.experts {
        let _ = writeln!(
            out,
            "[larder] experts: {} hits, {} misses, {} prefetch reads ({} used) | verify {:.3}s",
            x.cache_hits, x.cache_misses, x.prefetch_reads, x.prefetch_hits, x.verify_s
        );
        for l in &x.layers {
            let _ = writeln!(
                out,
                "[larder]   layer {:>3}: {:>6} hits {:>6} misses ({:.1}% hit) | prefetch {} reads, precision {:.0}%, recall {:.0}%",
                l.layer,
                l.hits,
                l.misses,
                100.0 * l.hit_rate,
                l.prefetch_reads,
                100.0 * l.prefetch_precision,
                100.0 * l.prefetch_recall
            );
        }
    }
    let _ = writeln!(
        out,
        "[larder] prefill {:.3}s | decode {:.3}s | time to first token {:.3}s",
        s.prefill_s, s.decode_s, s.time_to_first_token_s
    );
    out
}

/// The one-line summary of a run on stderr: tokens, speeds, and (when
/// experts stream) what streaming cost; the drafter's share when drafting.
pub fn run_summary(s: &larder_engine::Stats, outcome: &Outcome) -> String {
    let mut line = format!(
        "[larder] {} prompt + {} new tokens | prefill {:.1} tok/s | decode {:.2} tok/s (first token {:.3} s)",
        s.prompt_tokens, s.new_tokens, s.prefill_tok_per_s, s.decode_tok_per_s, s.time_to_first_token_s
    );
    match &s.experts {
        Some(x) => {
            let busy = s.prefill_s + s.decode_s;
            let wait = if busy > 0.0 { 100.0 * x.io_wait_s / busy } else { 0.0 };
            // Bytes count demand and prefetch reads alike, so the read count does too; the
            // rate is averaged over the whole run (reads overlap compute), not a drive limit.
            let gbps = if busy > 0.0 { x.expert_bytes_read as f64 / busy / 1e9 } else { 0.0 };
            line.push_str(&format!(
                " | experts streamed via {}: {} read in {} reads ({} prefetched), {:.1}% hit, disk {gbps:.2} GB/s \
                 over the run, io wait {wait:.0}%",
                x.io_backend,
                larder_engine::format_size(x.expert_bytes_read),
                x.expert_reads + x.prefetch_reads,
                x.prefetch_reads,
                100.0 * x.hit_rate,
            ));
        }
        None => line.push_str(" | experts in RAM"),
    }
    if let Some(sp) = &s.speculative {
        line.push_str(&format!(
            " | drafter {}: {:.0}% of {} accepted{}",
            sp.drafter,
            100.0 * sp.acceptance_rate,
            sp.drafted,
            if sp.disabled { ", switched off (not paying)" } else { "" }
        ));
    }
    let why = match (outcome.finish_reason, &outcome.stop_string) {
        (_, Some(stop)) => format!("the stop string {stop:?}"),
        (larder_engine::FinishReason::Stop, None) => "EOS".into(),
        (larder_engine::FinishReason::Length, None) => "the length limit".into(),
        (larder_engine::FinishReason::Cancelled, None) => "cancelled".into(),
    };
    line.push_str(&format!(" | stopped at {why}"));
    line
}
/// What `larder synth` wrote, and the routing measured (on stderr).
pub fn synth_text(report: &SynthReport, routing: &str) -> String {
    let mut out = String::new();
    let spec = &report.spec;
    let _ = writeln!(
        out,
        "[larder] wrote {} ({} layers x {} experts, {} of experts) in {:.1}s",
        report.out.display(),
        spec.layers,
        spec.experts,
        larder_store::format_size(spec.total_expert_bytes()),
        report.seconds
    );
    let Some(m) = &report.measured else {
        return out;
    };
    let k = spec.knobs();
    let s = &m.stats;
    let _ = writeln!(
        out,
        "[larder] routing {routing} (skew {}, locality {}, drift {}) over {} tokens:",
        k.skew, k.locality, k.drift, report.measure_tokens
    );
    let _ = writeln!(
        out,
        "[larder]   consecutive-token expert overlap {:.3} (uniform routing expects {:.3})",
        m.overlap,
        report.expected_overlap()
    );
    let _ = writeln!(
        out,
        "[larder]   routes in the hottest 10% / 30% of experts: {:.1}% / {:.1}%",
        100.0 * s.hot_10,
        100.0 * s.hot_30
    );
    let _ = writeln!(
        out,
        "[larder]   routes reusing an expert within 1 / 2 tokens: {:.1}% / {:.1}%",
        100.0 * s.reuse_within_1,
        100.0 * s.reuse_within_2
    );
    let recall: Vec<String> = s
        .lookahead_recall
        .iter()
        .map(|(d, r)| format!("depth {d} {:.1}%", 100.0 * r))
        .collect();
    let _ = writeln!(out, "[larder]   router lookahead recall: {}", recall.join(", "));
    let _ = writeln!(
        out,
        "[larder]   LRU hit rate with 40% of the bank cached: {:.1}%",
        100.0 * s.lru_hit_40
    );
    out
}

/// `larder verify STORE`'s report (stderr): what was checked, how fast
/// (`gbps`), every problem, and OK when there is none.
pub fn verify_text(report: &VerifyReport, gbps: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "[larder] {} files, {} spine tensors ({}), {} records ({}) and {} mirrored copies checked in {:.1}s ({gbps:.2} GB/s)",
        report.files,
        report.spine_tensors,
        larder_store::format_size(report.spine_bytes),
        report.records,
        larder_store::format_size(report.bytes),
        report.mirrored_records,
        report.seconds,
    );
    for b in &report.bad {
        let _ = writeln!(out, "[larder] BAD {b}");
    }
    if report.bad.is_empty() {
        let files: Vec<String> = report.source.iter().map(|f| format!("{} ({} bytes)", f.name, f.size)).collect();
        let _ = writeln!(
            out,
            "[larder] OK: store {} loads and is exactly the {} checkpoint it was packed from: {}",
            report.store_id,
            report.model_type,
            files.join(", ")
        );
    }
    out
}

/// Why `larder verify` fails on `store` (and the fix), if `report` found problems.
pub fn verify_problem(report: &VerifyReport, store: &Path) -> Option<String> {
    if report.bad.is_empty() {
        return None;
    }
    if report.bad.iter().all(|b| b.contains("it cannot run")) {
        return Some(format!(
            "{} problems found in {}: the checkpoint it was packed from contradicts its own config there; \
             pack a correct checkpoint",
            report.bad.len(),
            store.display()
        ));
    }
    let copies = report.bad.iter().filter(|b| b.contains("(a mirrored copy")).count();
    let fix = match (copies, report.bad.len() - copies) {
        (0, _) => format!("`larder pack --model CHECKPOINT --out {} --repair` rewrites them", store.display()),
        (_, 0) => format!("`larder mirror {} --size SIZE` writes the copies anew", store.display()),
        _ => format!(
            "`larder pack --model CHECKPOINT --out {0} --repair` rewrites the records and files, then \
             `larder mirror {0} --size SIZE` the copies",
            store.display()
        ),
    };
    Some(format!("{} problems found in {}; {fix}", report.bad.len(), store.display()))
}

/// `larder verify CACHE_DIR`'s report on a lazy cache (stderr).
pub fn lazy_verify_text(report: &LazyVerifyReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "[larder] lazy cache of {} ({} source check): spine {} tensors ({}), {} of {} expert records on the drive ({}), \
         {} with a source digest",
        report.source,
        report.source_check,
        report.spine_tensors,
        larder_store::format_size(report.spine_bytes),
        report.present,
        report.records,
        larder_store::format_size(report.present_bytes),
        report.known,
    );
    if report.missing > 0 {
        let layers: Vec<String> = report.missing_by_layer.iter().map(|(l, n)| format!("{l}: {n}")).collect();
        let _ = writeln!(
            out,
            "[larder] not fetched yet: {} records (by layer {})",
            report.missing,
            layers.join(", ")
        );
    }
    for f in &report.unverified_files {
        let _ = writeln!(out, "[larder] not checked against the source's sha256: {f}");
    }
    for b in &report.bad {
        let _ = writeln!(out, "[larder] BAD {b}");
    }
    if report.bad.is_empty() {
        let _ = writeln!(out, "[larder] OK: everything the cache holds is what it claims");
    }
    out
}

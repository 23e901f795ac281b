//! A trace's header is a claim, not an allocation size (issue 37, finding
//! 6): reading a trace whose header claims more experts (or bigger experts)
//! than any model larder loads is an error naming the field, and the
//! statistics of `larder trace stats` allocate by the routes a trace holds,
//! never by its claimed expert count. Before the fix `trace stats` aborted
//! on such a header (`vec![0; experts]` per MoE layer).

use std::path::PathBuf;

use larder_router::{Phase, Trace, TraceHeader, TraceToken, MAX_EXPERTS, MAX_EXPERT_BYTES, TRACE_VERSION};

/// A fresh file holding `lines` (a header, then tokens), one per line.
fn trace_file(name: &str, lines: &[String]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-trace-bounds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn header_line(experts: u64, expert_bytes: u64) -> String {
    format!(
        r#"{{"larder_trace":{TRACE_VERSION},"model":"m","experts":{experts},"top_k":2,"moe_layers":[1,2],"expert_bytes":[{expert_bytes},{expert_bytes}],"lookahead":0}}"#
    )
}

fn token_line(pos: usize, routes: [[usize; 2]; 2]) -> String {
    format!(
        r#"{{"seq":0,"pos":{pos},"phase":"decode","pass":{pos},"routes":[{:?},{:?}]}}"#,
        routes[0], routes[1]
    )
}

/// Three decode tokens over two MoE layers of `experts` experts.
fn in_memory(experts: usize) -> Trace {
    let header = TraceHeader {
        larder_trace: TRACE_VERSION,
        model: "m".into(),
        experts,
        top_k: 2,
        moe_layers: vec![1, 2],
        expert_bytes: vec![100, 100],
        lookahead: 0,
    };
    let tok = |pos: usize, a: [usize; 2], b: [usize; 2]| TraceToken {
        seq: 0,
        pos,
        phase: Phase::Decode,
        pass: pos,
        routes: vec![a.to_vec(), b.to_vec()],
        predicted: Vec::new(),
    };
    Trace {
        header,
        tokens: vec![tok(0, [0, 1], [2, 3]), tok(1, [1, 5], [3, 4]), tok(2, [0, 1], [2, 9])],
    }
}

#[test]
fn a_header_claiming_too_many_experts_is_an_error_naming_the_field() {
    let lines = [header_line(1 << 40, 100), token_line(0, [[0, 1], [2, 3]])];
    let path = trace_file("experts.jsonl", &lines);
    match Trace::read(&path) {
        // Before the fix: read, then `trace stats` aborted here.
        Ok(t) => panic!("read a trace claiming 2^40 experts; its stats: {:?}", t.route_stats(None)),
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("line 1") && e.contains("experts = 1099511627776") && e.contains(&MAX_EXPERTS.to_string()),
                "{e}"
            );
        }
    }
    let at_limit = [header_line(MAX_EXPERTS as u64, 100), token_line(0, [[0, 1], [2, 3]])];
    assert_eq!(
        Trace::read(&trace_file("limit.jsonl", &at_limit)).unwrap().header.experts,
        MAX_EXPERTS
    );
}

#[test]
fn a_header_claiming_huge_experts_is_an_error_naming_the_field() {
    let lines = [header_line(8, u64::MAX), token_line(0, [[0, 1], [2, 3]])];
    let e = Trace::read(&trace_file("bytes.jsonl", &lines)).unwrap_err().to_string();
    assert!(e.contains("expert_bytes") && e.contains(&MAX_EXPERT_BYTES.to_string()), "{e}");
}

#[test]
fn stats_allocate_by_the_routes_not_by_the_claimed_expert_count() {
    let small = in_memory(10).route_stats(None);
    // 2^40 experts per layer: before the fix, `vec![0u64; 2^40]` aborted.
    let huge = in_memory(1 << 40).route_stats(None);
    assert_eq!((huge.tokens, huge.routes), (small.tokens, small.routes));
    assert_eq!(huge.reuse_distance, small.reuse_distance);
    assert_eq!(huge.first_use, small.first_use);
    assert_eq!(huge.consecutive_overlap, small.consecutive_overlap);
    // The hottest 10% of 2^40 experts are more than the few used: every route.
    assert!(huge.popularity.iter().all(|&(_, share)| share == 1.0), "{:?}", huge.popularity);
    // The hottest 10% of 10 is one expert per layer: expert 1 (3 routes) and 2 or 3 (2) of 6 each.
    assert_eq!(small.popularity[0], (0.1, 5.0 / 12.0));
    let mut trace = in_memory(1 << 40);
    trace.header.expert_bytes = vec![1 << 40; 2];
    assert_eq!(trace.bank_bytes(), u64::MAX, "the bank's bytes saturate rather than overflow");
}

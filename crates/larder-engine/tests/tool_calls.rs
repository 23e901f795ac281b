//! Model outputs of each family (`fixtures/tool_outputs.json`) split into
//! reasoning, content and tool calls: whole, and streamed split at every
//! character boundary (and one character at a time), which must give the
//! same split; malformed and truncated calls come back as content with
//! `finish_reason` `stop`.

use larder_engine::reasoning::{output_parser, ReasoningFormat};
use larder_engine::tool_calls::{Delta, OutputParser, ParsedOutput, StreamParser, ToolFamily};
use serde_json::Value;

mod common;
use common::fixture;

fn parser(case: &Value) -> Box<dyn OutputParser> {
    let family = match case["family"].as_str().unwrap() {
        "hermes" => Some(ToolFamily::Hermes),
        "deepseek_v3" => Some(ToolFamily::DeepSeekV3),
        "kimi_k2" => Some(ToolFamily::KimiK2),
        "harmony" => Some(ToolFamily::Harmony),
        "none" => None,
        other => panic!("family {other}"),
    };
    let r = &case["reasoning"];
    let reasoning = if let Some(open) = r.get("think") {
        ReasoningFormat::Think {
            starts_open: open.as_bool().unwrap(),
        }
    } else if let Some(thinking) = r.get("kimi_k3") {
        ReasoningFormat::KimiK3 {
            thinking: thinking.as_bool().unwrap(),
        }
    } else {
        ReasoningFormat::None
    };
    output_parser(family, reasoning)
}

/// The split a stream of `pieces` gives, from its deltas.
fn streamed(parser: Box<dyn OutputParser>, pieces: &[&str]) -> ParsedOutput {
    let mut s = StreamParser::new(parser);
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.extend(s.push(p));
    }
    let (rest, whole) = s.finish();
    deltas.extend(rest);
    let mut out = ParsedOutput::default();
    for d in deltas {
        match d {
            Delta::Reasoning(t) => out.reasoning.push_str(&t),
            Delta::Content(t) => out.content.push_str(&t),
            Delta::ToolCall { index, call } => {
                assert_eq!(index, out.tool_calls.len());
                out.tool_calls.push(call);
            }
        }
    }
    assert_eq!(out, whole, "deltas joined equal the final split");
    out
}

#[test]
fn outputs_split_as_recorded_whole_and_streamed() {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(fixture("tool_outputs.json")).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 30);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let text = case["text"].as_str().unwrap();
        let want: ParsedOutput = serde_json::from_value(case["expected"].clone()).unwrap();
        let got = parser(case).parse(text);
        assert_eq!(got, want, "{name}");
        assert_eq!(got.finish_reason(), case["expected"]["finish_reason"].as_str().unwrap(), "{name}");
        for (k, _) in text.char_indices().skip(1) {
            let (a, b) = text.split_at(k);
            assert_eq!(streamed(parser(case), &[a, b]), want, "{name} split at {k}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(streamed(parser(case), &pieces), want, "{name} one char at a time");
    }
}

#[test]
fn streamed_content_comes_before_the_end() {
    // Content before a call section and reasoning stream as they arrive.
    let mut s = StreamParser::new(output_parser(
        Some(ToolFamily::Hermes),
        ReasoningFormat::Think { starts_open: false },
    ));
    assert!(s.push("<thi").is_empty());
    assert_eq!(s.push("nk>abc</th"), vec![Delta::Reasoning("abc".into())]);
    assert_eq!(s.push("ink>Hi <tool"), vec![Delta::Content("Hi ".into())]);
    assert!(s.push("_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>").is_empty());
    let (rest, whole) = s.finish();
    assert_eq!(rest.len(), 1);
    assert_eq!(whole.finish_reason(), "tool_calls");
}

#[test]
fn arbitrary_text_never_panics_and_streams_as_it_parses() {
    let markers = [
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>",
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<|tool_calls_section_end|>",
        "<|channel|>",
        "<|message|>",
        "<|start|>",
        "<|end|>",
        "<|call|>",
        " to=functions.",
        "{",
        "}",
        "\"",
        "\n",
        "é",
    ];
    let families = [
        Some(ToolFamily::Hermes),
        Some(ToolFamily::DeepSeekV3),
        Some(ToolFamily::KimiK2),
        Some(ToolFamily::Harmony),
        None,
    ];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..300 {
        let mut text = String::new();
        for _ in 0..12 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            text.push_str(markers[(x % markers.len() as u64) as usize]);
        }
        for f in families {
            for r in [
                ReasoningFormat::None,
                ReasoningFormat::Think {
                    starts_open: x.is_multiple_of(2),
                },
                ReasoningFormat::KimiK3 { thinking: true },
            ] {
                let whole = output_parser(f, r).parse(&text);
                let chars: Vec<String> = text.chars().map(String::from).collect();
                let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
                assert_eq!(streamed(output_parser(f, r), &pieces), whole, "{f:?} {r:?} {text:?}");
            }
        }
    }
}

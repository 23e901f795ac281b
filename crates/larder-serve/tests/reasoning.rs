//! Reasoning over HTTP on the Qwen3 tokenizer fixture (random weights):
//! `<think>` ... `</think>` is returned as `reasoning_content`, whole and
//! streamed alike, and `max_reasoning_tokens` forces the close once the
//! budget is spent (the model's tokens before it unchanged). A `logit_bias`
//! on `<think>` makes the random model open a thinking block at once.

use larder_engine::{DrafterChoice, TextTokenizer};
use serde_json::{json, Value};

mod common;
use common::*;

fn body(think: u32, budget: Option<usize>, stream: bool) -> Value {
    let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "Think first."}],
        "max_tokens": 24, "temperature": 0, "logit_bias": {think.to_string(): 100}, "stream": stream});
    if let Some(n) = budget {
        b["max_reasoning_tokens"] = json!(n);
    }
    b
}

/// The reasoning and content deltas of a stream, joined.
fn streamed(body: &str) -> (String, String) {
    let (mut reasoning, mut content) = (String::new(), String::new());
    for data in events(body).into_iter().filter(|d| d != "[DONE]") {
        let v: Value = serde_json::from_str(&data).unwrap();
        for c in v["choices"].as_array().unwrap() {
            reasoning.push_str(c["delta"]["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(c["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    (reasoning, content)
}

#[test]
fn reasoning_is_apart_and_a_budget_forces_its_close() {
    let srv = long_tok_server("reasoning", DrafterChoice::Off);
    let tok = TextTokenizer::from_dir(&fixture("qwen3_moe_tok")).unwrap().unwrap();
    let think = tok.token_to_id("<think>").unwrap();
    let free = post(srv.addr, "/v1/chat/completions", &body(think, None, false)).json();
    let free = &free["choices"][0]["message"];
    let free_reasoning = free["reasoning_content"].as_str().unwrap_or_else(|| panic!("{free}"));
    assert_eq!(free["content"], "", "never closed: all reasoning: {free}");

    let r = post(srv.addr, "/v1/chat/completions", &body(think, Some(5), false));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let budgeted = &v["choices"][0]["message"];
    let reasoning = budgeted["reasoning_content"].as_str().unwrap();
    assert!(
        !reasoning.is_empty() && free_reasoning.starts_with(reasoning),
        "{reasoning:?} vs {free_reasoning:?}"
    );
    assert!(reasoning.len() < free_reasoning.len());
    let content = budgeted["content"].as_str().unwrap();
    assert!(!content.is_empty(), "the model answers after the forced close: {budgeted}");

    let s = post(srv.addr, "/v1/chat/completions", &body(think, Some(5), true));
    assert_eq!(streamed(&s.body), (reasoning.to_string(), content.to_string()));

    let mut bad = body(think, Some(5), false);
    bad["response_format"] = json!({"type": "json_object"});
    let r = post(srv.addr, "/v1/chat/completions", &bad);
    assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some("max_reasoning_tokens")));
    bad = body(think, None, false);
    bad["max_reasoning_tokens"] = json!(0);
    assert_eq!(post(srv.addr, "/v1/chat/completions", &bad).status, 400);
}

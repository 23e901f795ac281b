//! Tool calling on `/v1/chat/completions` over HTTP, on a random-weights
//! model with Qwen3's tokenizer and chat template (qwen3_moe_tok, the
//! Hermes `<tool_call>` family):
//!
//! - `tool_choice: "required"` always yields one call whose arguments
//!   validate against the called tool's parameters (200 seeded choices),
//!   a named choice always calls that tool, and both end with
//!   `finish_reason: "tool_calls"`;
//! - streamed tool-call deltas assemble into the same call as the whole
//!   answer; the same greedy request gives the same ids alone, in a batch
//!   of 8 and with an n-gram drafter;
//! - tools reach the prompt through the template; assistant tool calls and
//!   tool results are rendered back;
//! - bad input is refused with a 400 naming the field before generation.
//!
//! The fixture's context (256) is too short for Qwen3's tools preamble, so
//! the tests serve a copy whose `max_position_embeddings` is 2048 (RoPE
//! positions past 256 compute as any other).

use std::thread;

use larder_engine::DrafterChoice;
use larder_serve::RunningServer;
use serde_json::{json, Value};

mod common;
use common::*;

/// A server with room for the tools preamble ([`long_tok_server`]).
fn server(tag: &str, drafter: DrafterChoice) -> RunningServer {
    long_tok_server(tag, drafter)
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "strict": true,
            "parameters": {"type": "object",
                "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

fn request(choice: Value, seed: u64, n: usize, temperature: f32) -> Value {
    json!({"model": "tiny", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
           "max_tokens": 120, "temperature": temperature, "seed": seed, "n": n, "tools": tools(), "tool_choice": choice})
}

/// Checks a call against the tools: known name, arguments valid.
fn check_call(call: &Value, label: &str) -> String {
    let name = call["function"]["name"].as_str().unwrap_or_else(|| panic!("{label}: {call}"));
    let tools = tools();
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("{label}: unknown tool {name}"));
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let validator = jsonschema::validator_for(&tool["function"]["parameters"]).unwrap();
    assert!(validator.is_valid(&args), "{label}: {args} is not valid for {name}");
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{label}: {call}");
    name.to_string()
}

#[test]
fn required_tool_choice_always_yields_a_valid_call() {
    let srv = server("required_tool_choice_alw", DrafterChoice::Off);
    let mut names = std::collections::BTreeSet::new();
    let mut checked = 0;
    for seed in 0..25 {
        let r = post(srv.addr, "/v1/chat/completions", &request(json!("required"), seed, 8, 1.0));
        assert_eq!(r.status, 200, "{}", r.body);
        for c in r.json()["choices"].as_array().unwrap() {
            let label = format!("seed {seed}");
            assert_eq!(c["finish_reason"], "tool_calls", "{label}: {c}");
            let calls = c["message"]["tool_calls"].as_array().unwrap();
            assert_eq!(calls.len(), 1, "{label}: {c}");
            names.insert(check_call(&calls[0], &label));
            checked += 1;
        }
    }
    assert_eq!(checked, 200);
    assert_eq!(names.len(), 2, "both tools get called by some seed: {names:?}");
}

#[test]
fn a_named_choice_calls_that_tool() {
    let srv = server("a_named_choice_calls_tha", DrafterChoice::Off);
    let named = json!({"type": "function", "function": {"name": "add"}});
    let r = post(srv.addr, "/v1/chat/completions", &request(named, 3, 8, 1.0));
    assert_eq!(r.status, 200, "{}", r.body);
    for c in r.json()["choices"].as_array().unwrap() {
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(check_call(call, "named"), "add");
        assert_eq!(c["message"]["content"], Value::Null, "{c}");
    }
}

/// The tool-call deltas of a stream, assembled per index.
fn streamed_calls(body: &str) -> (Vec<Value>, Vec<String>) {
    let mut calls: Vec<Value> = Vec::new();
    let mut finishes = Vec::new();
    for data in events(body) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        for c in v["choices"].as_array().unwrap() {
            if let Some(f) = c["finish_reason"].as_str() {
                finishes.push(f.to_string());
            }
            for d in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let i = d["index"].as_u64().unwrap() as usize;
                if calls.len() <= i {
                    calls.resize(i + 1, Value::Null);
                }
                calls[i] = json!({"name": d["function"]["name"], "arguments": d["function"]["arguments"]});
            }
        }
    }
    (calls, finishes)
}

#[test]
fn streamed_calls_equal_the_whole_answer() {
    let srv = server("streamed_calls_equal_the", DrafterChoice::Off);
    for seed in 0..4 {
        let whole = post(srv.addr, "/v1/chat/completions", &request(json!("required"), seed, 1, 1.0)).json();
        let call = &whole["choices"][0]["message"]["tool_calls"][0]["function"];
        let mut body = request(json!("required"), seed, 1, 1.0);
        body["stream"] = json!(true);
        let r = post(srv.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let (calls, finishes) = streamed_calls(&r.body);
        assert_eq!(
            calls,
            vec![json!({"name": call["name"], "arguments": call["arguments"]})],
            "seed {seed}"
        );
        assert_eq!(finishes, vec!["tool_calls".to_string()]);
    }
}

#[test]
fn greedy_calls_are_the_same_alone_in_a_batch_of_8_and_drafted() {
    let srv = server("greedy_calls_are_the_sam", DrafterChoice::Off);
    let alone = post(srv.addr, "/v1/chat/completions", &request(json!("required"), 0, 1, 0.0)).json();
    let expected = alone["choices"][0]["message"].clone();
    check_call(&expected["tool_calls"][0], "greedy");
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let addr = srv.addr;
            thread::spawn(move || post(addr, "/v1/chat/completions", &request(json!("required"), 0, 1, 0.0)).json())
        })
        .collect();
    for h in handles {
        assert_eq!(
            h.join().unwrap()["choices"][0]["message"]["tool_calls"][0]["function"],
            expected["tool_calls"][0]["function"]
        );
    }
    let drafted = server("tools-drafted", DrafterChoice::Ngram);
    let r = post(drafted.addr, "/v1/chat/completions", &request(json!("required"), 0, 1, 0.0)).json();
    assert_eq!(
        r["choices"][0]["message"]["tool_calls"][0]["function"],
        expected["tool_calls"][0]["function"]
    );
}

#[test]
fn tools_and_tool_turns_reach_the_template() {
    let srv = server("tools_and_tool_turns_rea", DrafterChoice::Off);
    let usage = |body: &Value| {
        post(srv.addr, "/v1/chat/completions", body).json()["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap()
    };
    let plain = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    let mut with_tools = plain.clone();
    with_tools["tools"] = tools();
    let mut none = with_tools.clone();
    none["tool_choice"] = json!("none");
    assert!(usage(&with_tools) > usage(&plain) + 50, "the tools are rendered");
    assert_eq!(usage(&none), usage(&plain), "tool_choice none renders no tools");
    let turns = json!({"model": "tiny", "max_tokens": 4, "tools": tools(), "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]});
    let r = post(srv.addr, "/v1/chat/completions", &turns);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["usage"]["prompt_tokens"].as_u64().unwrap() > usage(&with_tools));
}

#[test]
fn bad_tool_requests_are_refused_before_generation() {
    let srv = server("bad_tool_requests_are_re", DrafterChoice::Off);
    let refuse = |body: Value, param: &str| {
        let r = post(srv.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{}", r.body);
    };
    let unknown = json!({"type": "function", "function": {"name": "nope"}});
    refuse(request(unknown, 0, 1, 0.0), "tool_choice");
    let mut no_tools = request(json!("required"), 0, 1, 0.0);
    no_tools["tools"] = json!([]);
    refuse(no_tools, "tool_choice");
    let orphan = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_9", "content": "x"}]});
    refuse(orphan, "messages[1].tool_call_id");
    let big: serde_json::Map<String, Value> = (0..3000).map(|i| (format!("field_{i}"), json!({"type": "string"}))).collect();
    let mut oversized = request(json!("auto"), 0, 1, 0.0);
    oversized["tools"][0]["function"]["parameters"]["properties"] = Value::Object(big);
    refuse(oversized, "tools[0].function.parameters");
    let mut bad_name = request(json!("auto"), 0, 1, 0.0);
    bad_name["tools"][0]["function"]["name"] = json!("has space");
    refuse(bad_name, "tools[0].function.name");
    let mut uncompilable = request(json!("required"), 0, 1, 0.0);
    uncompilable["tools"][1]["function"]["parameters"] =
        json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["a"]});
    refuse(uncompilable, "tools");
    let mut both = request(json!("required"), 0, 1, 0.0);
    both["response_format"] = json!({"type": "json_object"});
    refuse(both, "response_format");
}

#[test]
fn malformed_calls_come_back_as_text() {
    let srv = server("tools-malformed", DrafterChoice::Off);
    let tok = larder_engine::TextTokenizer::from_dir(&fixture("qwen3_moe_tok")).unwrap().unwrap();
    let open = tok.token_to_id("<tool_call>").unwrap();
    // The bias makes the random model write `<tool_call>` over and over:
    // a section that never parses.
    let mut body = request(json!("auto"), 0, 1, 0.0);
    body["max_tokens"] = json!(12);
    body["logit_bias"] = json!({open.to_string(): 100});
    let r = post(srv.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let c = &r.json()["choices"][0];
    assert!(c["message"]["content"].as_str().unwrap().starts_with("<tool_call>"), "{c}");
    assert!(c["message"].get("tool_calls").is_none(), "{c}");
    assert_eq!(c["finish_reason"], "length");
    body["stream"] = json!(true);
    let s = post(srv.addr, "/v1/chat/completions", &body);
    assert_eq!(streamed_text(&s.body), c["message"]["content"].as_str().unwrap());
}

/// The agent APIs' tool answers over raw HTTP (the official clients check
/// the same in `.ci/run`): a forced call becomes a `tool_use` block or a
/// `function_call` item, whole and streamed alike.
#[test]
fn agent_apis_answer_with_tool_use_and_function_calls() {
    let srv = server("tools-agents", DrafterChoice::Off);
    let schema = tools()[0]["function"]["parameters"].clone();
    let messages = json!({"model": "tiny", "max_tokens": 120, "temperature": 0, "tool_choice": {"type": "any"},
        "tools": [{"name": "get_weather", "input_schema": schema}],
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let m = post(srv.addr, "/v1/messages", &messages).json();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let blocks = m["content"].as_array().unwrap();
    let used = blocks.iter().find(|b| b["type"] == "tool_use").unwrap_or_else(|| panic!("{m}"));
    assert_eq!(used["name"], "get_weather");
    assert!(jsonschema::validator_for(&schema).unwrap().is_valid(&used["input"]), "{used}");
    let mut streamed = messages.clone();
    streamed["stream"] = json!(true);
    let body = post(srv.addr, "/v1/messages", &streamed).body;
    let partial: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["delta"]["type"] == "input_json_delta")
        .map(|v| v["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), used["input"], "{body}");
    assert!(body.contains("\"stop_reason\":\"tool_use\""), "{body}");

    let responses = json!({"model": "tiny", "max_output_tokens": 120, "temperature": 0, "tool_choice": "required",
        "tools": [{"type": "function", "name": "get_weather", "parameters": schema}], "input": "Weather in Paris?"});
    let r = post(srv.addr, "/v1/responses", &responses).json();
    let call = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "function_call")
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, used["input"], "the same greedy call through both APIs");
    let follow = json!({"model": "tiny", "max_output_tokens": 2, "previous_response_id": r["id"], "tools": responses["tools"],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "21 C"}]});
    let f = post(srv.addr, "/v1/responses", &follow);
    assert_eq!(f.status, 200, "{}", f.body);
}

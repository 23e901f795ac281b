//! `response_format` over HTTP on a random-weights model (qwen3_moe_tok):
//! every seeded choice of a `json_schema` request parses and validates
//! against the schema (the `jsonschema` crate), `json_object` gives an
//! object, a greedy choice alone equals the same request's choices in a
//! batch, and schemas the grammar engine cannot take are refused with a
//! 400 naming `response_format` before anything is generated.

use larder_serve::RunningServer;
use serde_json::{json, Value};

mod common;
use common::*;

fn server() -> RunningServer {
    tiny_server()
}

/// A schema whose every value is bounded (a random model stops inside `max_tokens`).
fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {"zip": {"type": "integer", "minimum": 10000, "maximum": 99999}, "ok": {"type": "boolean"}},
                "required": ["zip", "ok"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "role", "tags", "address"],
        "additionalProperties": false
    })
}

fn chat(format: Value, seed: u64, n: usize, temperature: f32) -> Value {
    json!({"model": "tiny", "messages": [{"role": "user", "content": "Describe someone."}], "max_tokens": 160,
           "temperature": temperature, "seed": seed, "n": n, "response_format": format})
}

#[test]
fn every_seeded_choice_validates_against_its_schema() {
    let srv = server();
    let schema = person();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let format = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}});
    let mut checked = 0;
    for seed in 0..25 {
        let r = post(srv.addr, "/v1/chat/completions", &chat(format.clone(), seed, 8, 1.0));
        assert_eq!(r.status, 200, "{}", r.body);
        for c in r.json()["choices"].as_array().unwrap() {
            let text = c["message"]["content"].as_str().unwrap();
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
            assert!(validator.is_valid(&v), "seed {seed}: {text}");
            assert_eq!(c["finish_reason"], "stop", "seed {seed}: {text}");
            checked += 1;
        }
    }
    assert_eq!(checked, 200);
}

#[test]
fn json_object_gives_an_object_and_greedy_is_the_same_alone_and_batched() {
    let srv = server();
    let format = json!({"type": "json_object"});
    let alone = post(srv.addr, "/v1/chat/completions", &chat(format.clone(), 0, 1, 0.0)).json();
    let text = alone["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    if alone["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(&text).unwrap().is_object(), "{text}");
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
    let batch = post(srv.addr, "/v1/chat/completions", &chat(format, 0, 4, 0.0)).json();
    for c in batch["choices"].as_array().unwrap() {
        assert_eq!(c["message"]["content"].as_str().unwrap(), text);
    }
}

#[test]
fn schemas_the_engine_cannot_take_are_refused_before_generation() {
    let srv = server();
    for (format, want) in [
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}),
            "minimum",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "not-a-type"}}}),
            "not-a-type",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a".repeat(70_000)}}}),
            "limit",
        ),
        (json!({"type": "yaml"}), "response_format.type"),
        (json!({"type": "json_schema"}), "json_schema"),
    ] {
        let r = post(srv.addr, "/v1/chat/completions", &chat(format, 0, 1, 0.0));
        assert_eq!(r.status, 400, "{}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], "response_format", "{e}");
        assert!(e["message"].as_str().unwrap().contains(want), "{e}");
    }
}

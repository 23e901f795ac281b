//! Black-box tests of the agent-facing APIs on the real server: Anthropic
//! Messages (`/v1/messages`, `/v1/messages/count_tokens`) and OpenAI
//! Responses (`/v1/responses`, `GET /v1/responses/{id}`): answer shapes,
//! streaming event sequences, the same text as chat completions for the
//! same conversation (greedy), `previous_response_id` round trips, and
//! refusals in each API's shape before generation.

use std::net::SocketAddr;

use larder_engine::{ChatMessage, Engine};
use larder_serve::{start, RunningServer, ServerConfig};
use serde_json::{json, Value};

mod common;
use common::*;

fn server() -> RunningServer {
    tiny_server()
}

/// The greedy chat-completion text for `messages` (the reference).
fn chat_text(a: SocketAddr, messages: Value, max_tokens: u64) -> (String, Value) {
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    (v["choices"][0]["message"]["content"].as_str().unwrap().to_string(), v)
}

/// `(event name, data)` of each event of an SSE body with `event:` lines.
fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_else(|| panic!("{e}"));
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or_else(|| panic!("{e}"));
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

#[test]
fn messages_answers_in_anthropic_shapes_with_the_chat_completions_text() {
    let srv = server();
    let a = srv.addr;
    let chat = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]);
    let (expected, reference) = chat_text(a, chat, 6);
    let req = json!({"model": "tiny", "max_tokens": 6, "temperature": 0, "system": "Be brief.",
                     "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]});
    let r = send(
        a,
        "POST",
        "/v1/messages",
        &[("content-type", "application/json"), ("anthropic-version", "2023-06-01")],
        &req.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str(), m["model"].as_str()),
        (Some("message"), Some("assistant"), Some("tiny"))
    );
    assert_eq!(m["content"], json!([{"type": "text", "text": expected}]));
    assert_eq!(m["stop_reason"], "max_tokens");
    assert_eq!(m["stop_sequence"], Value::Null);
    assert_eq!(m["usage"]["input_tokens"], reference["usage"]["prompt_tokens"]);
    assert_eq!(m["usage"]["output_tokens"], 6);

    // Streamed: the documented event sequence, the same text.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let r = post(a, "/v1/messages", &streamed);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type").as_deref(), Some("text/event-stream"));
    let events = named_events(&r.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    // The text block opens with the first text (a ping may come anywhere).
    assert_eq!(&names[..3], ["message_start", "ping", "content_block_start"], "{names:?}");
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{names:?}"
    );
    assert!(names[3..names.len() - 3].iter().all(|n| *n == "content_block_delta"), "{names:?}");
    for (name, data) in &events {
        assert_eq!(data["type"].as_str(), Some(name.as_str()), "{data}");
    }
    assert_eq!(events[0].1["message"]["usage"]["input_tokens"], m["usage"]["input_tokens"]);
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, expected);
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 6);

    // A stop sequence the model writes ends it with stop_reason stop_sequence.
    // (A character early in the text, so it completes before the last token.)
    let early: Vec<char> = expected.chars().take(expected.chars().count() / 2).collect();
    let stop = early.iter().skip(1).find(|c| !c.is_whitespace()).map(|c| c.to_string());
    {
        let stop = stop.expect("the greedy text has a non-space character early on");
        let mut stopped = req.clone();
        stopped["stop_sequences"] = json!([stop]);
        let m = post(a, "/v1/messages", &stopped).json();
        assert_eq!(m["stop_reason"], "stop_sequence", "{m}");
        assert_eq!(m["stop_sequence"], stop.as_str());
        let before = &expected[..expected.find(stop.as_str()).unwrap()];
        assert_eq!(m["content"][0]["text"], before);
    }

    // count_tokens: the rendered prompt's length, as generation counts it.
    let count = json!({"model": "tiny", "system": "Be brief.", "messages": [{"role": "user", "content": "Hello there"}]});
    let r = post(a, "/v1/messages/count_tokens", &count);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!({"input_tokens": m["usage"]["input_tokens"]}));
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    let ids = engine
        .encode_chat(&[ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hello there")])
        .unwrap();
    assert_eq!(r.json()["input_tokens"], ids.len());
}

#[test]
fn messages_refusals_are_anthropic_shaped_and_before_generation() {
    let srv = server();
    let a = srv.addr;
    let base = json!({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let refused = |patch: Value, path: &str| {
        let mut body = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        let r = post(a, path, &body);
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        (
            r.status,
            v["error"]["type"].as_str().unwrap().to_string(),
            v["error"]["message"].as_str().unwrap().to_string(),
        )
    };
    let (s, t, msg) = refused(json!({"max_tokens": null}), "/v1/messages");
    assert_eq!((s, t.as_str()), (400, "invalid_request_error"));
    assert!(msg.contains("max_tokens"), "{msg}");
    let tool = json!([{"name": "get_weather", "description": "d", "input_schema": {"type": "object", "properties": {}}}]);
    let (s, _, msg) = refused(
        json!({"tools": tool, "tool_choice": {"type": "tool", "name": "nope"}}),
        "/v1/messages",
    );
    assert_eq!(s, 400);
    assert!(msg.contains("nope"), "{msg}");
    let (s, _, msg) = refused(json!({"tool_choice": {"type": "any"}}), "/v1/messages");
    assert_eq!(s, 400);
    assert!(msg.contains("no tools"), "{msg}");
    let orphan = json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "42"}]}]);
    let (s, _, msg) = refused(json!({"messages": orphan}), "/v1/messages");
    assert_eq!(s, 400);
    assert!(msg.contains("t9"), "{msg}");
    let (s, _, msg) = refused(json!({"thinking": {"type": "enabled", "budget_tokens": 10}}), "/v1/messages");
    assert_eq!(s, 400);
    assert!(msg.contains("budget_tokens"), "{msg}");
    let (s, t, _) = refused(json!({"model": "other"}), "/v1/messages");
    assert_eq!((s, t.as_str()), (404, "not_found_error"));
    let (s, _, _) = refused(
        json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
        "/v1/messages",
    );
    assert_eq!(s, 400);
    let r = send(a, "POST", "/v1/messages", &[], "{not json");
    assert_eq!((r.status, r.json()["error"]["type"].as_str()), (400, Some("invalid_request_error")));
    let r = send(a, "GET", "/v1/messages", &[], "");
    assert_eq!((r.status, r.json()["type"].as_str()), (405, Some("error")));
    assert_eq!(metric(a, "larder_completion_tokens_total"), 0, "a refused request generated");
}

#[test]
fn the_api_key_is_read_from_x_api_key_too() {
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    let config = ServerConfig {
        port: 0,
        served_name: "tiny".into(),
        api_key: Some("k3y".into()),
        ..ServerConfig::default()
    };
    let srv = start(engine, config).unwrap();
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let r = send(srv.addr, "POST", "/v1/messages/count_tokens", &[], &body);
    assert_eq!((r.status, r.json()["error"]["type"].as_str()), (401, Some("authentication_error")));
    let r = send(srv.addr, "POST", "/v1/messages/count_tokens", &[("x-api-key", "k3y")], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let r = send(srv.addr, "POST", "/v1/messages/count_tokens", &[("x-api-key", "nope")], &body);
    assert_eq!(r.status, 401);
}

#[test]
fn responses_answer_in_openai_shapes_and_continue_stored_conversations() {
    let srv = server();
    let a = srv.addr;
    let (expected, reference) = chat_text(
        a,
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]),
        5,
    );
    let req = json!({"model": "tiny", "input": "Hello there", "instructions": "Be brief.", "max_output_tokens": 5, "temperature": 0});
    let r = post(a, "/v1/responses", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let id = v["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_"), "{v}");
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str(), v["model"].as_str()),
        (Some("response"), Some("incomplete"), Some("tiny"))
    );
    assert_eq!(v["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(v["instructions"], "Be brief.");
    let item = &v["output"][0];
    assert_eq!((item["type"].as_str(), item["role"].as_str()), (Some("message"), Some("assistant")));
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["text"], expected.as_str());
    assert_eq!(item["content"][0]["annotations"], json!([]));
    assert_eq!(v["usage"]["input_tokens"], reference["usage"]["prompt_tokens"]);
    assert_eq!(v["usage"]["output_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], v["usage"]["input_tokens"].as_u64().unwrap() + 5);
    assert_eq!(send(a, "GET", &format!("/v1/responses/{id}"), &[], "").json(), v);

    // previous_response_id: the stored turns come first; the same text as
    // a chat completion of the whole conversation.
    let (expected2, reference2) = chat_text(
        a,
        json!([{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": expected},
               {"role": "user", "content": "And then?"}]),
        5,
    );
    let next = json!({"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_text", "text": "And then?"}]}],
                      "previous_response_id": id, "max_output_tokens": 5, "temperature": 0});
    let v2 = post(a, "/v1/responses", &next).json();
    assert_eq!(v2["output"][0]["content"][0]["text"], expected2.as_str(), "{v2}");
    assert_eq!(v2["usage"]["input_tokens"], reference2["usage"]["prompt_tokens"]);
    assert_eq!(v2["previous_response_id"], id.as_str());

    // Unknown ids: 400 naming previous_response_id; GET answers 404.
    let mut unknown = next.clone();
    unknown["previous_response_id"] = json!("resp_nope");
    let r = post(a, "/v1/responses", &unknown);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "previous_response_id");
    assert_eq!(send(a, "GET", "/v1/responses/resp_nope", &[], "").status, 404);
    // store: false keeps nothing.
    let mut unstored = req.clone();
    unstored["store"] = json!(false);
    let v3 = post(a, "/v1/responses", &unstored).json();
    assert_eq!(
        send(a, "GET", &format!("/v1/responses/{}", v3["id"].as_str().unwrap()), &[], "").status,
        404
    );

    // Streamed: numbered events in OpenAI's order, the same text.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let r = post(a, "/v1/responses", &streamed);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = named_events(&r.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let head = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    let tail = [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ];
    assert_eq!(&names[..4], head, "{names:?}");
    assert_eq!(&names[names.len() - 4..], tail, "{names:?}");
    assert!(
        names[4..names.len() - 4].iter().all(|n| *n == "response.output_text.delta"),
        "{names:?}"
    );
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(
            (data["type"].as_str(), data["sequence_number"].as_u64()),
            (Some(name.as_str()), Some(i as u64))
        );
    }
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, expected);
    let last = &events.last().unwrap().1["response"];
    assert_eq!(last["output"][0]["content"][0]["text"], expected.as_str());
    let streamed_id = last["id"].as_str().unwrap();
    assert_eq!(
        send(a, "GET", &format!("/v1/responses/{streamed_id}"), &[], "").json()["id"],
        streamed_id
    );
}

#[test]
fn responses_refusals_are_openai_shaped_and_before_generation() {
    let srv = server();
    let a = srv.addr;
    let refused = |body: Value| {
        let r = post(a, "/v1/responses", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        let v = r.json();
        (
            v["error"]["param"].as_str().unwrap_or("").to_string(),
            v["error"]["message"].as_str().unwrap().to_string(),
        )
    };
    let tool = json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]);
    let (param, msg) = refused(json!({"model": "tiny", "input": "hi", "tools": tool, "tool_choice": {"type": "function", "name": "nope"}}));
    assert_eq!(param, "tool_choice");
    assert!(msg.contains("nope"), "{msg}");
    let orphan = json!([{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "c9", "output": "42"}]);
    assert_eq!(refused(json!({"model": "tiny", "input": orphan})).0, "input");
    assert_eq!(
        refused(json!({"model": "tiny", "input": "hi", "reasoning": {"effort": "extreme"}})).0,
        "reasoning.effort"
    );
    assert_eq!(refused(json!({"model": "tiny"})).0, "input");
    assert_eq!(refused(json!({"model": "tiny", "input": "hi", "seed": 1})).0, "seed");
    assert_eq!(metric(a, "larder_completion_tokens_total"), 0, "a refused request generated");
}

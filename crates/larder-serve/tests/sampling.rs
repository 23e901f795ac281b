//! The sampling controls over HTTP: `logprobs` in OpenAI's shapes (chat's
//! `content` entries, completions' `tokens`/`token_logprobs`/`top_logprobs`/
//! `text_offset`), whole and streamed, equal to the log-softmax of the
//! model's logits; `n` choices decoded together (greedy: identical; seeded:
//! choice `i` is the request alone with seed + `i`), streamed chunks tagged
//! by index; `logit_bias` steering greedy output; and the validation errors
//! naming `param`.

use larder_engine::{log_softmax, ChatMessage, Engine};
use larder_serve::RunningServer;
use serde_json::{json, Value};

mod common;
use common::*;

fn server() -> RunningServer {
    tiny_server()
}

fn chunks(body: &str) -> Vec<Value> {
    let ev = events(body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{body}");
    ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect()
}

#[test]
fn chat_logprobs_are_the_model_s_log_softmax() {
    let srv = server();
    let a = srv.addr;
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    let prompt = engine.encode_chat(&[ChatMessage::new("user", "Hello there")]).unwrap();
    let req = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6,
                     "temperature": 0, "logprobs": true, "top_logprobs": 3, "ignore_eos": true});
    let r = post(a, "/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 6);
    assert_eq!(v["choices"][0]["logprobs"]["refusal"], Value::Null);
    // The ids greedy chose, spelled back: each entry's token is the argmax, so top_logprobs[0].
    let mut ids = prompt.clone();
    let tok = engine.tokenizer().unwrap();
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
        let token = e["token"].as_str().unwrap();
        assert_eq!(e["bytes"], json!(token.as_bytes()));
        let logits = engine.forward(&ids).unwrap();
        let row = log_softmax(logits.row(ids.len() - 1));
        let best = (0..row.len()).max_by(|&x, &y| row[x].total_cmp(&row[y]).then(y.cmp(&x))).unwrap();
        assert_eq!(tok.decode(&[best as u32], false).unwrap(), token);
        assert_eq!(e["logprob"].as_f64().unwrap() as f32, row[best], "exact: f32 in, f32 out");
        ids.push(best as u32);
    }

    // Streamed: the same entries, one token per chunk.
    let mut s = req.clone();
    s["stream"] = json!(true);
    let streamed: Vec<Value> = chunks(&post(a, "/v1/chat/completions", &s).body)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed, content);

    // Without logprobs the field is null.
    let mut plain = req.clone();
    plain.as_object_mut().unwrap().retain(|k, _| k != "logprobs" && k != "top_logprobs");
    assert_eq!(
        post(a, "/v1/chat/completions", &plain).json()["choices"][0]["logprobs"],
        Value::Null
    );
}

#[test]
fn completion_logprobs_have_the_legacy_shape() {
    let srv = server();
    let a = srv.addr;
    let req = json!({"model": "tiny", "prompt": "Once upon", "max_tokens": 5, "temperature": 0, "logprobs": 2, "ignore_eos": true});
    let v = post(a, "/v1/completions", &req).json();
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    let mut at = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(lp["text_offset"][i], at);
        at += t.chars().count();
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 2, "{top:?}");
        assert!(top.contains_key(*t), "greedy: the chosen token is among the best: {top:?}");
    }
    let mut s = req.clone();
    s["stream"] = json!(true);
    let cs = chunks(&post(a, "/v1/completions", &s).body);
    let streamed: Vec<Value> = cs
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed, lp["tokens"].as_array().unwrap().clone());
    let offsets: Vec<Value> = cs
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["text_offset"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(offsets, lp["text_offset"].as_array().unwrap().clone());
}

#[test]
fn n_choices_decode_together() {
    let srv = server();
    let a = srv.addr;
    let base = json!({"model": "tiny", "messages": [{"role": "user", "content": "Tell me"}], "max_tokens": 8, "ignore_eos": true});
    let with = |fields: Value| {
        let mut b = base.clone();
        b.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        b
    };
    let text = |v: &Value, i: usize| v["choices"][i]["message"]["content"].as_str().unwrap().to_string();

    let greedy = post(a, "/v1/chat/completions", &with(json!({"n": 3, "temperature": 0}))).json();
    assert_eq!(greedy["choices"].as_array().unwrap().len(), 3);
    for i in 0..3 {
        assert_eq!(greedy["choices"][i]["index"], i);
        assert_eq!(text(&greedy, i), text(&greedy, 0));
    }
    assert_eq!(greedy["usage"]["completion_tokens"], 24);

    // Seeded: choice i is the request alone with seed + i.
    let sampled = post(a, "/v1/chat/completions", &with(json!({"n": 3, "temperature": 1.0, "seed": 40}))).json();
    for i in 0..3u64 {
        let alone = post(a, "/v1/chat/completions", &with(json!({"temperature": 1.0, "seed": 40 + i}))).json();
        assert_eq!(text(&sampled, i as usize), text(&alone, 0), "choice {i}");
    }

    // Streamed: chunks tagged by index, each choice's text as unstreamed.
    let body = post(
        a,
        "/v1/chat/completions",
        &with(json!({"n": 3, "temperature": 1.0, "seed": 40, "stream": true})),
    )
    .body;
    let mut streamed = vec![String::new(); 3];
    let mut finished = 0;
    for c in chunks(&body) {
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        streamed[i].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        finished += usize::from(choice["finish_reason"].is_string());
    }
    assert_eq!(finished, 3);
    for (i, s) in streamed.iter().enumerate() {
        assert_eq!(*s, text(&sampled, i));
    }
}

#[test]
fn logit_bias_steers_greedy_output() {
    let srv = server();
    let a = srv.addr;
    let engine = Engine::load(&fixture("qwen3_moe_tok")).unwrap();
    let forced = 1234u32;
    let req = json!({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": true,
                     "logit_bias": {forced.to_string(): 100}});
    let r = post(a, "/v1/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], engine.decode(&[forced; 4]).unwrap());
    // Penalties are accepted in range.
    let p = json!({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4, "frequency_penalty": 1.5, "presence_penalty": -2});
    assert_eq!(post(a, "/v1/completions", &p).status, 200);
}

#[test]
fn invalid_sampling_fields_are_400s_naming_the_param() {
    let srv = server();
    let a = srv.addr;
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let completion = json!({"model": "tiny", "prompt": "hi", "max_tokens": 2});
    let cases = [
        ("/v1/chat/completions", &chat, "top_logprobs", json!(2), "top_logprobs"),
        ("/v1/chat/completions", &chat, "logprobs", json!(3), "logprobs"),
        ("/v1/chat/completions", &chat, "n", json!(0), "n"),
        ("/v1/chat/completions", &chat, "n", json!(17), "n"),
        ("/v1/chat/completions", &chat, "frequency_penalty", json!(-2.5), "frequency_penalty"),
        ("/v1/chat/completions", &chat, "presence_penalty", json!("a"), "presence_penalty"),
        ("/v1/chat/completions", &chat, "logit_bias", json!({"1": -101}), "logit_bias"),
        ("/v1/chat/completions", &chat, "logit_bias", json!({"99999999": 1}), "logit_bias"),
        ("/v1/completions", &completion, "logprobs", json!(6), "logprobs"),
        ("/v1/completions", &completion, "logprobs", json!(true), "logprobs"),
    ];
    for (path, base, k, v, param) in cases {
        let mut b = base.clone();
        b[k] = v.clone();
        let r = post(a, path, &b);
        assert_eq!(r.status, 400, "{k} = {v}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{k} = {v}: {}", r.body);
    }
    let mut b = chat.clone();
    b["top_logprobs"] = json!(21);
    b["logprobs"] = json!(true);
    assert_eq!(post(a, "/v1/chat/completions", &b).json()["error"]["param"], "top_logprobs");
}

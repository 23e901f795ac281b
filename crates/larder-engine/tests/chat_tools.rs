//! Chats with tools, tool calls, tool results and thinking switches, rendered
//! by larder through the fixtures' chat templates (Qwen3, DeepSeek-V3,
//! gpt-oss harmony), must equal transformers 5.24.0's
//! `apply_chat_template(messages, tools=..., **kwargs)`
//! (`fixtures/chat_tools.json`, written by `scripts/fixtures_chat_tools.py`);
//! a conversation transformers refuses, larder refuses too.

use larder_engine::{ChatMessage, ChatTemplate, RenderOptions};
use serde_json::Value;

mod common;
use common::fixture;

fn expected() -> Value {
    let path = fixture("chat_tools.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn renders_with_tools_equal_transformers() {
    let r = expected();
    let fixed_now = r["fixed_now_unix"].as_i64().unwrap();
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 27);
    let (mut rendered, mut refused) = (0, 0);
    for case in cases {
        let dir = case["template"].as_str().unwrap();
        let name = case["name"].as_str().unwrap();
        let template = ChatTemplate::from_dir(&fixture(dir)).unwrap().unwrap().with_fixed_time(fixed_now);
        // The request's messages, in OpenAI's form, as the server reads them.
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let options = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: case["tools"].as_array().cloned(),
            kwargs: case["kwargs"].as_object().unwrap().clone(),
        };
        let got = template.render_with(&messages, &options);
        match (case.get("rendered").and_then(Value::as_str), got) {
            (Some(want), Ok(got)) => {
                assert_eq!(got, want, "{dir} {name}");
                rendered += 1;
            }
            (None, Err(_)) => refused += 1,
            (Some(_), Err(e)) => panic!("{dir} {name}: larder refused what transformers rendered: {e}"),
            (None, Ok(got)) => panic!("{dir} {name}: transformers refused ({}), larder rendered {got:?}", case["error"]),
        }
    }
    assert!(rendered >= 20 && refused >= 1, "{rendered} rendered, {refused} refused");
}

#[test]
fn tool_results_must_answer_a_call() {
    let template = ChatTemplate::from_dir(&fixture("qwen3_moe_tok")).unwrap().unwrap();
    let orphan = [ChatMessage::new("user", "hi"), ChatMessage::tool_result("call_9", None, "42")];
    let e = template.render_with(&orphan, &RenderOptions::generation()).unwrap_err();
    assert!(e.to_string().contains("call_9"), "{e}");
    let unnamed = [
        ChatMessage::new("user", "hi"),
        ChatMessage {
            tool_call_id: None,
            ..ChatMessage::tool_result("x", None, "42")
        },
    ];
    assert!(template.render_with(&unnamed, &RenderOptions::generation()).is_err());
}

#[test]
fn reserved_kwargs_are_refused() {
    let template = ChatTemplate::from_dir(&fixture("qwen3_moe_tok")).unwrap().unwrap();
    let mut options = RenderOptions::generation();
    options.kwargs.insert("messages".into(), Value::Null);
    let e = template.render_with(&[ChatMessage::new("user", "hi")], &options).unwrap_err();
    assert!(e.to_string().contains("chat_template_kwargs"), "{e}");
}

#[test]
fn output_parsers_follow_the_template() {
    let qwen = ChatTemplate::from_dir(&fixture("qwen3_moe_tok")).unwrap().unwrap();
    let prompt = qwen.render(&[ChatMessage::new("user", "hi")], true).unwrap();
    let out = qwen
        .output_parser(&prompt)
        .parse("<think>\nhm\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>");
    assert_eq!(out.reasoning, "\nhm\n");
    assert_eq!(out.tool_calls[0].arguments, r#"{"a": 1}"#);
    let gptoss = ChatTemplate::from_dir(&fixture("tokenizer_gptoss")).unwrap().unwrap();
    let out = gptoss
        .output_parser("")
        .parse("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y");
    assert_eq!((out.reasoning.as_str(), out.content.as_str()), ("x", "y"));
    let deepseek = ChatTemplate::from_dir(&fixture("deepseek_v3_tok")).unwrap().unwrap();
    let out = deepseek.output_parser("").parse(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    );
    assert_eq!(out.finish_reason(), "tool_calls");
}

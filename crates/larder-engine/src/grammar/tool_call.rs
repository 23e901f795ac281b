//! The grammar of one tool call written in a family's own syntax, for
//! `tool_choice: "required"` or a named function: the model must write a
//! call the family's parser ([`crate::tool_calls`]) reads back, to one of
//! the given tools, with arguments that validate against that tool's
//! parameters.
//!
//! A family's call is its opening markers, one branch per tool (the name as
//! the family spells it, then the arguments as `%json` of the tool's
//! parameters, written compactly), and its closing markers:
//!
//! - Hermes (Qwen3): `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`
//! - DeepSeek-V3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>`
//! - Kimi-K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|><|tool_calls_section_end|>`
//! - gpt-oss: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS`
//!   (an EOS such as `<|call|>` then ends it)
//! - Kimi K3: (`<|close|>think<|sep|><|open|>response<|sep|>` when the
//!   prompt opened its think tag) `<|close|>response<|sep|><|open|>tools<|sep|>`
//!   `<|open|>call tool="NAME" index="1"<|sep|>ARGS<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>`,
//!   ARGS one typed `argument` tag per property as the release writes them
//!   ([`super::k3_arguments`]), or, for a schema that form cannot state,
//!   one `<|open|>json type="object"<|sep|>...<|close|>json<|sep|>` tag
//!   (the release's form for arguments it cannot type); no reasoning and no
//!   text before the call
//!
//! A marker that is one special token of the tokenizer is named by its id
//! (`<[ID]>`, llguidance's syntax: grammar text never matches a special
//! token); any other marker is text. One call, however many the model might
//! have made: a forced call always ends.

use serde_json::Value as Json;

use super::{quoted, with_options, GrammarError, GrammarSpec, ToolSchema};
use crate::tool_calls::{deepseek_v3, hermes, kimi_k2, ToolFamily};

/// One piece of a call's syntax.
enum Piece {
    /// A marker: a special token's id when it is one, else its text.
    Marker(&'static str),
    Text(String),
    /// Kimi-K2's call index (a number).
    Index,
    /// The arguments (`%json` of the tool's parameters).
    Arguments,
    /// Kimi K3's arguments: typed `argument` tags when the schema allows
    /// ([`super::k3_arguments`]), else one `json` tag holding `%json`.
    K3Arguments,
}

/// The pieces of `family`'s call to `name`: opening, the call, closing
/// (`opened_think`: Kimi K3's prompt opened its think tag).
fn call_pieces(family: ToolFamily, name: &str, opened_think: bool) -> Vec<Piece> {
    use crate::kimi_k3_chat::{CLOSE, OPEN, SEP};
    use Piece::*;
    match family {
        ToolFamily::KimiK3 => {
            let name = name.replace('&', "&amp;").replace('"', "&quot;");
            let mut pieces = Vec::new();
            let mut tag = |marker: &'static str, text: String| {
                pieces.push(Marker(marker));
                pieces.push(Text(text));
                pieces.push(Marker(SEP));
            };
            if opened_think {
                tag(CLOSE, "think".into());
                tag(OPEN, "response".into());
            }
            tag(CLOSE, "response".into());
            tag(OPEN, "tools".into());
            tag(OPEN, format!("call tool=\"{name}\" index=\"1\""));
            pieces.push(K3Arguments);
            for closing in ["call", "tools", "message"] {
                pieces.push(Marker(CLOSE));
                pieces.push(Text(closing.into()));
                pieces.push(Marker(SEP));
            }
            pieces
        }
        ToolFamily::Hermes => vec![
            Marker(hermes::START),
            Text(format!("\n{{\"name\": {}, \"arguments\": ", Json::from(name))),
            Arguments,
            Text("}\n".into()),
            Marker(hermes::END),
        ],
        ToolFamily::DeepSeekV3 => vec![
            Marker(deepseek_v3::CALLS_BEGIN),
            Marker(deepseek_v3::CALL_BEGIN),
            Text("function".into()),
            Marker(deepseek_v3::SEP),
            Text(format!("{name}\n```json\n")),
            Arguments,
            Text("\n```".into()),
            Marker(deepseek_v3::CALL_END),
            Marker(deepseek_v3::CALLS_END),
        ],
        ToolFamily::KimiK2 => vec![
            Marker(kimi_k2::SECTION_BEGIN),
            Marker(kimi_k2::CALL_BEGIN),
            Text(format!("functions.{name}:")),
            Index,
            Marker(kimi_k2::ARGUMENT_BEGIN),
            Arguments,
            Marker(kimi_k2::CALL_END),
            Marker(kimi_k2::SECTION_END),
        ],
        ToolFamily::Harmony => vec![
            Marker("<|channel|>"),
            Text(format!("commentary to=functions.{name} ")),
            Marker("<|constrain|>"),
            Text("json".into()),
            Marker("<|message|>"),
            Arguments,
        ],
    }
}

impl GrammarSpec {
    /// One call, in `family`'s syntax, to one of `tools` (see the module
    /// docs). `special_id(marker)` is the id of the special token `marker`
    /// is, if it is one. `strict` as for a JSON schema. `opened_think`
    /// (Kimi K3 only): the prompt opened its think tag.
    pub fn family_tool_call(
        family: ToolFamily,
        tools: &[ToolSchema],
        strict: bool,
        special_id: &dyn Fn(&str) -> Option<u32>,
        opened_think: bool,
    ) -> Result<GrammarSpec, GrammarError> {
        if tools.is_empty() {
            return Err(GrammarError::Malformed("a tool call needs at least one tool".into()));
        }
        let mut lark = String::from("start: ");
        let branches: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
        lark.push_str(&branches.join(" | "));
        lark.push('\n');
        let marker = |m: &str| match special_id(m) {
            Some(id) => format!("<[{id}]>"),
            None => quoted(m),
        };
        for (i, tool) in tools.iter().enumerate() {
            let parameters = tool.parameters.clone().unwrap_or_else(|| serde_json::json!({"type": "object"}));
            let mut rule = format!("call_{i}:");
            let mut json_arguments = false;
            for piece in call_pieces(family, &tool.name, opened_think) {
                rule.push(' ');
                match piece {
                    Piece::Marker(m) => rule.push_str(&marker(m)),
                    Piece::Text(t) => rule.push_str(&quoted(&t)),
                    Piece::Index => rule.push_str("/[0-9]{1,4}/"),
                    Piece::Arguments => {
                        rule.push_str(&format!("args_{i}"));
                        json_arguments = true;
                    }
                    Piece::K3Arguments => match super::k3_arguments::typed_arguments(i, &parameters, strict, &marker)? {
                        Some((expression, rules)) => {
                            rule.push_str(&expression);
                            lark.push_str(&rules);
                        }
                        None => {
                            use crate::kimi_k3_chat::{CLOSE, OPEN, SEP};
                            let (open, close, sep) = (marker(OPEN), marker(CLOSE), marker(SEP));
                            let tag = quoted("json type=\"object\"");
                            rule.push_str(&format!("{open} {tag} {sep} args_{i} {close} \"json\" {sep}"));
                            json_arguments = true;
                        }
                    },
                }
            }
            lark.push_str(&format!("{rule}\n"));
            if json_arguments {
                lark.push_str(&format!("args_{i}: %json {}\n", with_options(parameters, strict)?));
            }
        }
        Ok(GrammarSpec::Lark(lark))
    }
}

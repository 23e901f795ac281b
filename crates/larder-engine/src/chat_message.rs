//! One chat message as clients send it (OpenAI's message shape: text,
//! an assistant's tool calls, a tool result, reasoning): what chat templates,
//! Kimi K3's encoder and the output parsers all take, below them all.

use serde::{Deserialize, Serialize};

/// One chat message, with what OpenAI messages carry besides text: an
/// assistant's `tool_calls`, a tool result's `tool_call_id` and `name`, and
/// reasoning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// The text; `None` is JSON `null` (an assistant message that only calls
    /// tools). As transformers does, a `None` content is left out of the
    /// template's message (undefined there, not `none`).
    #[serde(default)]
    pub content: Option<String>,
    /// An assistant message's reasoning (`reasoning_content`), for formats
    /// that render it (Kimi K3's `think` tag; templates that read it: Qwen3
    /// reads `reasoning_content`, gpt-oss `thinking`, and the template
    /// context carries both). Left out of the context when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant message's tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function's name (some clients send it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One tool call of an assistant message, as OpenAI writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    /// Always `function` today.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The function a [`ToolCall`] calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's form).
    pub arguments: String,
}

fn function_kind() -> String {
    "function".into()
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: Some(content.to_string()),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// An assistant message calling tools, with `content` (often `None`).
    pub fn assistant_tool_calls(content: Option<&str>, tool_calls: Vec<ToolCall>) -> Self {
        ChatMessage {
            content: content.map(str::to_string),
            tool_calls,
            ..ChatMessage::new("assistant", "")
        }
    }

    /// A tool result answering call `tool_call_id`.
    pub fn tool_result(tool_call_id: &str, name: Option<&str>, content: &str) -> Self {
        ChatMessage {
            tool_call_id: Some(tool_call_id.to_string()),
            name: name.map(str::to_string),
            ..ChatMessage::new("tool", content)
        }
    }

    /// The text, `""` for `None`.
    pub fn text(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }
}

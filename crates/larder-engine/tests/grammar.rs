//! Structured output ([`GrammarEngine`]): seeded random walks under the
//! mask always end in valid output.
//!
//! A walk draws random logits for the whole vocabulary at each step (seeded),
//! keeps the ids the constraint allows, and takes the argmax (even seeds) or
//! a seeded softmax sample (odd seeds), then commits it, until the
//! constraint is done or EOS is chosen. After [`FREE_STEPS`] steps it
//! prefers EOS, `"`, `}`, `]`, `,` and `1` when allowed (as a model under a
//! token budget would close up); otherwise it stays random. The decoded text
//! must parse and validate against the schema (the `jsonschema` crate).
//! Walks run over Kimi's small fixture vocabulary (200 per schema) and
//! Qwen3's 151,669-token vocabulary (60 per schema, for test time).

use std::path::{Path, PathBuf};
use std::time::Instant;

use larder_engine::{EngineError, GrammarEngine, GrammarError, GrammarSpec, TextTokenizer, TokenConstraint, ToolSchema, MAX_GRAMMAR_BYTES};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

/// Random steps before a walk prefers closing tokens.
const FREE_STEPS: usize = 24;
/// Most steps a walk may take before it must be done.
const MAX_STEPS: usize = 600;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// A tokenizer, its grammar engine and the ids a closing walk prefers.
struct Setup {
    tok: TextTokenizer,
    engine: GrammarEngine,
    eos: Vec<u32>,
    closers: Vec<u32>,
}

fn setup(name: &str, eos_names: &[&str]) -> Setup {
    let tok = TextTokenizer::from_dir(&fixture(name)).unwrap().unwrap();
    let eos: Vec<u32> = eos_names.iter().map(|n| tok.token_to_id(n).unwrap()).collect();
    let engine = GrammarEngine::new(&tok, &eos, tok.vocab_size()).unwrap();
    let mut closers = eos.clone();
    closers.extend(["\"", "}", "]", ",", "1"].iter().map(|t| tok.token_to_id(t).unwrap()));
    Setup { tok, engine, eos, closers }
}

fn kimi() -> Setup {
    setup("tiktoken_kimi", &["[EOS]", "<|im_end|>"])
}

fn qwen() -> Setup {
    setup("qwen3_moe_tok", &["<|im_end|>", "<|endoftext|>"])
}

/// One seeded walk: the ids chosen (EOS included when chosen), and the
/// number of masks computed.
fn walk(s: &Setup, spec: &GrammarSpec, seed: u64) -> (Vec<u32>, usize) {
    let mut c = s.engine.compile(spec).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let vocab = s.engine.vocab_size();
    let mut allowed = vec![false; vocab];
    let mut logits = vec![0f32; vocab];
    let mut ids = Vec::new();
    for step in 0..MAX_STEPS {
        if c.is_done() {
            return (ids, step);
        }
        allowed.fill(false);
        c.allowed(&mut allowed).unwrap();
        for l in logits.iter_mut() {
            *l = rng.random_range(-4.0..4.0);
        }
        let choice = s.closers.iter().copied().find(|&t| step >= FREE_STEPS && allowed[t as usize]);
        let id = choice.unwrap_or_else(|| pick(&allowed, &logits, seed % 2 == 1, &mut rng));
        c.commit(id).unwrap();
        ids.push(id);
        if s.eos.contains(&id) {
            assert!(c.is_done(), "EOS committed but the constraint is not done");
            return (ids, step + 1);
        }
    }
    panic!("seed {seed}: not done after {MAX_STEPS} steps: {:?}", s.tok.decode(&ids, false));
}

/// The argmax of `logits` over allowed ids, or a softmax sample among them.
fn pick(allowed: &[bool], logits: &[f32], sample: bool, rng: &mut ChaCha8Rng) -> u32 {
    let candidates: Vec<usize> = (0..allowed.len()).filter(|&i| allowed[i]).collect();
    assert!(!candidates.is_empty(), "the mask allows nothing");
    if !sample {
        let best = candidates.iter().copied().max_by(|&a, &b| logits[a].total_cmp(&logits[b]));
        return best.unwrap() as u32;
    }
    let weights: Vec<f64> = candidates.iter().map(|&i| f64::from(logits[i]).exp()).collect();
    let mut r = rng.random_range(0.0..weights.iter().sum::<f64>());
    for (&i, w) in candidates.iter().zip(&weights) {
        if r < *w {
            return i as u32;
        }
        r -= w;
    }
    *candidates.last().unwrap() as u32
}

/// The JSON a walk wrote (EOS and other special tokens dropped).
fn text_of(s: &Setup, ids: &[u32]) -> String {
    s.tok.decode(ids, true).unwrap()
}

fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "nested objects",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string"},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                            "geo": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}
                        },
                        "required": ["city", "geo"]
                    }
                },
                "required": ["name", "age", "address"]
            }),
        ),
        (
            "enums and arrays",
            json!({
                "type": "object",
                "properties": {
                    "color": {"enum": ["red", "green", "blue", 3, null]},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 4},
                    "flags": {"type": "array", "items": {"type": "boolean"}},
                    "kind": {"type": "string", "enum": ["a", "b"]}
                },
                "required": ["color", "tags", "kind"],
                "additionalProperties": false
            }),
        ),
        (
            "numbers",
            json!({
                "type": "object",
                "properties": {
                    "x": {"type": "number", "minimum": -1.5, "maximum": 2.5},
                    "n": {"type": "integer", "minimum": 10, "maximum": 20},
                    "p": {"type": "number", "exclusiveMinimum": 0},
                    "k": {"type": "integer"}
                },
                "required": ["x", "n", "p", "k"],
                "additionalProperties": false
            }),
        ),
        (
            "array of unions",
            json!({
                "type": "array",
                "items": {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5}, {"type": "null"}, {"type": "string", "maxLength": 3}]},
                "minItems": 2,
                "maxItems": 5
            }),
        ),
    ]
}

/// `walks` seeded walks per schema (and `json_object`), each validated.
fn walks_validate(s: &Setup, walks: u64) -> (usize, f64) {
    let mut masks = 0;
    let t = Instant::now();
    for (what, schema) in schemas() {
        let validator = jsonschema::validator_for(&schema).unwrap();
        let spec = GrammarSpec::JsonSchema {
            schema: schema.clone(),
            strict: true,
        };
        for seed in 0..walks {
            let (ids, n) = walk(s, &spec, seed);
            masks += n;
            let text = text_of(s, &ids);
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}, seed {seed}: {e}: {text:?}"));
            if let Err(e) = validator.validate(&value) {
                panic!("{what}, seed {seed}: {text} does not validate: {e}");
            }
        }
    }
    for seed in 0..walks {
        let (ids, n) = walk(s, &GrammarSpec::JsonObject, seed);
        masks += n;
        let text = text_of(s, &ids);
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("json_object, seed {seed}: {e}: {text:?}"));
        assert!(value.is_object(), "json_object, seed {seed}: {text}");
    }
    (masks, t.elapsed().as_secs_f64())
}

#[test]
fn seeded_walks_over_kimis_vocabulary_always_validate() {
    let (masks, secs) = walks_validate(&kimi(), 200);
    eprintln!(
        "kimi fixture: 1000 walks, {masks} masks in {secs:.2} s ({:.0} us/mask)",
        secs * 1e6 / masks as f64
    );
}

#[test]
fn seeded_walks_over_qwen3s_vocabulary_always_validate() {
    let s = qwen();
    let (masks, secs) = walks_validate(&s, 60);
    eprintln!(
        "qwen3: 300 walks, {masks} masks in {secs:.2} s ({:.0} us/mask incl. random logits)",
        secs * 1e6 / masks as f64
    );
}

fn tools() -> Vec<ToolSchema> {
    vec![
        ToolSchema {
            name: "get_weather".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": false
            })),
        },
        ToolSchema {
            name: "add".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "minimum": 0}},
                "required": ["a", "b"]
            })),
        },
        ToolSchema {
            name: "noop".into(),
            parameters: None,
        },
    ]
}

/// The call's arguments validate against the named tool's parameters.
fn check_call(call: &Value, tools: &[ToolSchema], seed: u64) {
    let name = call["name"].as_str().unwrap_or_else(|| panic!("seed {seed}: no name in {call}"));
    let tool = tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("seed {seed}: unknown tool {name}"));
    let params = tool.parameters.clone().unwrap_or_else(|| json!({"type": "object"}));
    let validator = jsonschema::validator_for(&params).unwrap();
    if let Err(e) = validator.validate(&call["arguments"]) {
        panic!("seed {seed}: {call} does not validate: {e}");
    }
}

#[test]
fn required_tool_calls_always_validate() {
    let s = kimi();
    let tools = tools();
    let spec = GrammarSpec::tool_call(&tools, None, true).unwrap();
    let mut names = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let (ids, _) = walk(&s, &spec, seed);
        let call: Value = serde_json::from_str(&text_of(&s, &ids)).unwrap();
        check_call(&call, &tools, seed);
        names.insert(call["name"].as_str().unwrap().to_string());
    }
    assert_eq!(names.len(), tools.len(), "every tool gets called by some seed: {names:?}");
}

#[test]
fn tool_calls_between_text_markers() {
    let s = qwen();
    let tools = tools();
    let spec = GrammarSpec::tool_call(&tools, Some(("<tool_call>\n", "\n</tool_call>")), false).unwrap();
    for seed in 0..20 {
        let (ids, _) = walk(&s, &spec, seed);
        let text = text_of(&s, &ids);
        let body = text
            .strip_prefix("<tool_call>\n")
            .and_then(|t| t.strip_suffix("\n</tool_call>"))
            .unwrap_or_else(|| panic!("seed {seed}: {text:?}"));
        check_call(&serde_json::from_str(body).unwrap(), &tools, seed);
    }
}

#[test]
fn same_seed_same_ids() {
    let s = qwen();
    let spec = GrammarSpec::JsonSchema {
        schema: schemas()[0].1.clone(),
        strict: true,
    };
    let runs: Vec<Vec<u32>> = (0..4).map(|seed| walk(&s, &spec, seed).0).collect();
    for seed in 0..4 {
        assert_eq!(walk(&s, &spec, seed).0, runs[seed as usize], "seed {seed}");
    }
    assert_ne!(runs[0], runs[2], "different seeds, different outputs");
    // A compiled constraint cloned before use walks the same way.
    let c = s.engine.compile(&spec).unwrap();
    let mut a = c.clone();
    let mut b = c;
    let mut ma = vec![false; s.engine.vocab_size()];
    let mut mb = ma.clone();
    a.allowed(&mut ma).unwrap();
    b.allowed(&mut mb).unwrap();
    assert_eq!(ma, mb);
}

#[test]
fn mask_time_with_qwen3s_vocabulary() {
    let t = Instant::now();
    let s = qwen();
    eprintln!("qwen3: tokenizer and grammar engine built in {:.2} s", t.elapsed().as_secs_f64());
    let spec = GrammarSpec::JsonSchema {
        schema: schemas()[0].1.clone(),
        strict: true,
    };
    let mut c = s.engine.compile(&spec).unwrap();
    let mut allowed = vec![false; s.engine.vocab_size()];
    let text = r#"{"name": "Ada", "age": 36, "address": {"city": "London", "geo": {"lat": 51.5}}}"#;
    let ids = s.tok.encode(text, false).unwrap();
    let t = Instant::now();
    for &id in &ids {
        allowed.fill(false);
        c.allowed(&mut allowed).unwrap();
        assert!(allowed[id as usize], "{:?} allowed", s.tok.decode(&[id], false));
        c.commit(id).unwrap();
    }
    let per = t.elapsed().as_secs_f64() * 1e6 / ids.len() as f64;
    // A complete document: nothing may follow, so generation stops without EOS.
    assert!(c.is_done());
    eprintln!("qwen3: {} tokens of a valid document, {per:.0} us per mask + commit", ids.len());
}

#[test]
fn oversized_schemas_are_refused_before_compiling() {
    let s = kimi();
    let properties: serde_json::Map<String, Value> = (0..4000).map(|i| (format!("field_{i}"), json!({"type": "string"}))).collect();
    let schema = json!({"type": "object", "properties": properties});
    let spec = GrammarSpec::JsonSchema { schema, strict: true };
    let Err(e) = s.engine.compile(&spec) else { panic!("compiled") };
    assert!(
        matches!(
            e,
            GrammarError::TooLarge {
                limit: MAX_GRAMMAR_BYTES,
                ..
            }
        ),
        "{e}"
    );
    let message = EngineError::from(e).to_string();
    assert!(message.starts_with("invalid response_format: the JSON schema is "), "{message}");
    assert!(message.ends_with("over the limit of 65536 bytes"), "{message}");
    let lark = GrammarSpec::Lark(format!("start: \"{}\"", "a".repeat(MAX_GRAMMAR_BYTES)));
    assert!(matches!(s.engine.compile(&lark), Err(GrammarError::TooLarge { .. })));
}

#[test]
fn uncompilable_schemas_say_why() {
    let s = kimi();
    let cases = [
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
        json!({"type": "not-a-type"}),
    ];
    for schema in cases {
        let spec = GrammarSpec::JsonSchema {
            schema: schema.clone(),
            strict: true,
        };
        match s.engine.compile(&spec) {
            Err(e @ GrammarError::Compile(_)) => {
                let message = EngineError::from(e).to_string();
                assert!(
                    message.starts_with("invalid response_format: the grammar engine cannot compile it: "),
                    "{message}"
                );
                eprintln!("{schema}: {message}");
            }
            Err(e) => panic!("{schema}: {e:?}"),
            Ok(_) => panic!("{schema} compiled"),
        }
    }
    let not_schema = GrammarSpec::JsonSchema {
        schema: json!([1, 2]),
        strict: true,
    };
    assert!(matches!(s.engine.compile(&not_schema), Err(GrammarError::Malformed(_))));
    assert!(matches!(GrammarSpec::tool_call(&[], None, true), Err(GrammarError::Malformed(_))));
    let bad_lark = GrammarSpec::Lark("start: (".into());
    assert!(matches!(s.engine.compile(&bad_lark), Err(GrammarError::Compile(_))));
}

#[test]
/// `strict: true` refuses keywords llguidance does not enforce ("Unimplemented
/// keys", "Unknown format"); `strict: false` ignores them.
fn strict_refuses_what_lenient_ignores() {
    let s = kimi();
    for schema in [
        json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true}),
        json!({"not": {"type": "string"}}),
        json!({"type": "string", "format": "no-such-format"}),
        json!({"type": "object", "dependentRequired": {"a": ["b"]}}),
        json!({"type": "array", "contains": {"type": "integer"}}),
        json!({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}),
    ] {
        let strict = s.engine.compile(&GrammarSpec::JsonSchema {
            schema: schema.clone(),
            strict: true,
        });
        let lenient = s.engine.compile(&GrammarSpec::JsonSchema {
            schema: schema.clone(),
            strict: false,
        });
        let Err(GrammarError::Compile(message)) = strict else {
            panic!("{schema}: strict compiled")
        };
        assert!(message.starts_with("Un"), "{schema}: {message}");
        assert!(lenient.is_ok(), "{schema}: {:?}", lenient.err());
    }
}

/// Where the grammar may end or go on, the mask allows EOS and the next
/// text; EOS then completes the output. EOS before that is refused.
#[test]
fn eos_ends_an_accepting_grammar_and_only_then() {
    let s = kimi();
    let spec = GrammarSpec::Lark("start: \"a\" \"b\"?".into());
    let (a, b) = (s.tok.token_to_id("a").unwrap(), s.tok.token_to_id("b").unwrap());
    let mut c = s.engine.compile(&spec).unwrap();
    let mut allowed = vec![false; s.engine.vocab_size()];
    c.allowed(&mut allowed).unwrap();
    assert!(allowed[a as usize] && !allowed[b as usize] && !allowed[s.eos[0] as usize]);
    assert!(c.clone().commit(s.eos[0]).is_err(), "EOS before the grammar may end");
    c.commit(a).unwrap();
    assert!(!c.is_done());
    allowed.fill(false);
    c.allowed(&mut allowed).unwrap();
    assert!(allowed[b as usize], "b may follow");
    assert!(s.eos.iter().all(|&e| allowed[e as usize]), "every EOS id may end it");
    let special_text = s.tok.token_to_id("<|im_user|>").unwrap();
    assert!(!allowed[special_text as usize]);
    let mut ended = c.clone();
    ended.commit(s.eos[1]).unwrap();
    assert!(ended.is_done());
    c.commit(b).unwrap();
    assert!(c.is_done(), "nothing may follow \"ab\"");
}

/// The engine is shared by the engine thread's requests; constraints move
/// into the scheduler.
#[test]
fn engine_and_constraints_cross_threads() {
    fn shared<T: Send + Sync>() {}
    fn sent<T: Send>() {}
    shared::<GrammarEngine>();
    sent::<larder_engine::GrammarConstraint>();
}

/// A forced call in each family's own syntax (`tool_choice: "required"`):
/// every walk's text, special tokens spelled, reads back through the
/// family's parser as exactly one call whose arguments validate.
#[test]
fn family_tool_calls_read_back_as_one_valid_call() {
    use larder_engine::tool_calls::ToolFamily;
    let cases = [
        (ToolFamily::Hermes, qwen()),
        (ToolFamily::KimiK2, kimi()),
        (ToolFamily::Harmony, setup("tokenizer_gptoss", &["<|return|>", "<|call|>"])),
        (ToolFamily::DeepSeekV3, setup("deepseek_v3_tok", &["<｜end▁of▁sentence｜>"])),
    ];
    let tools = tools();
    for (family, s) in cases {
        let special = |m: &str| {
            let id = s.tok.token_to_id(m)?;
            s.tok.decode(&[id], true).unwrap().is_empty().then_some(id)
        };
        let spec = GrammarSpec::family_tool_call(family, &tools, true, &special, false).unwrap();
        let parser = family.parser();
        for seed in 0..12 {
            let (mut ids, _) = walk(&s, &spec, seed);
            ids.retain(|id| !s.eos.contains(id));
            let text = s.tok.decode(&ids, false).unwrap();
            let out = parser.parse(&text);
            assert_eq!(out.tool_calls.len(), 1, "{family:?} seed {seed}: {text:?} read as {out:?}");
            assert_eq!(out.content.trim(), "", "{family:?} seed {seed}: {text:?}");
            let call = &out.tool_calls[0];
            let args: Value = serde_json::from_str(&call.arguments).unwrap();
            check_call(&json!({"name": call.name, "arguments": args}), &tools, seed);
        }
    }
}

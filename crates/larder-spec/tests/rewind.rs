//! Going back to the kept prefix after speculative tokens: both ways back
//! (roll back, and restore + run the kept tokens again, the way a recurrent
//! layer will take) leave a state whose next logits are bit-identical to a
//! state that only ever saw the kept tokens; lengths that disagree are an
//! error that changes nothing; a draft model's guesses after a partial
//! rejection are what a fresh drafter guesses.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_model::{load_model, DecoderModel, ModelError, SequenceState};
use larder_spec::{refeed, rewind, Drafter, ModelDrafter};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

const PROMPT: &[u32] = &[262, 406, 39, 423, 313];
/// The verification pass: pending, then three drafts.
const ROWS: &[u32] = &[87, 465, 12, 99];
const NEXT: u32 = 7;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The logits of `NEXT` after `state`.
fn next_logits(model: &DecoderModel, state: &mut SequenceState) -> Vec<u32> {
    bits(&model.forward_last(&[NEXT], state, None).unwrap())
}

fn run_again(model: &DecoderModel) -> impl FnOnce(&[u32], &mut SequenceState) -> Result<(), ModelError> + '_ {
    move |ids, state| model.forward_last(ids, state, None).map(drop)
}

#[test]
fn both_ways_back_equal_a_state_that_saw_only_the_kept_tokens() {
    for name in ["qwen3_moe_tiny", "deepseek_v3_tiny"] {
        let model = load_model(&fixture(name), None).unwrap();
        for kept in 0..=ROWS.len() {
            let mut fresh = model.new_state();
            model.forward(&[PROMPT, &ROWS[..kept]].concat(), &mut fresh, None).unwrap();
            let want = next_logits(&model, &mut fresh);

            let mut rolled = model.new_state();
            model.forward(PROMPT, &mut rolled, None).unwrap();
            let snap = rolled.snapshot();
            model.forward(ROWS, &mut rolled, None).unwrap();
            let mut refed = rolled.clone();

            rewind(&mut rolled, &snap, ROWS, PROMPT.len() + kept, run_again(&model)).unwrap();
            assert_eq!(rolled.len(), PROMPT.len() + kept, "{name}: kept {kept}");
            assert_eq!(next_logits(&model, &mut rolled), want, "{name}: rolled back, kept {kept}");

            refeed(&mut refed, &snap, &ROWS[..kept], run_again(&model)).unwrap();
            assert_eq!(refed.len(), PROMPT.len() + kept, "{name}: kept {kept}");
            assert_eq!(next_logits(&model, &mut refed), want, "{name}: restored and re-run, kept {kept}");
        }
    }
}

#[test]
fn lengths_that_disagree_are_an_error_and_change_nothing() {
    let model = load_model(&fixture("qwen3_moe_tiny"), None).unwrap();
    let mut state = model.new_state();
    model.forward(PROMPT, &mut state, None).unwrap();
    let snap = state.snapshot();
    model.forward(ROWS, &mut state, None).unwrap();
    let held = PROMPT.len() + ROWS.len();
    for (fed, keep) in [(ROWS, PROMPT.len() - 1), (ROWS, held + 1), (&ROWS[..2], PROMPT.len())] {
        let e = rewind(&mut state, &snap, fed, keep, run_again(&model)).unwrap_err();
        assert!(matches!(e, ModelError::State(_)), "{e}");
        assert!(e.to_string().contains(&format!("rewind to {keep} positions")), "{e}");
        assert_eq!(state.len(), held);
    }
}

#[test]
fn a_draft_model_after_a_partial_rejection_guesses_what_a_fresh_one_guesses() {
    let model = Arc::new(load_model(&fixture("qwen3_moe_tiny"), None).unwrap());
    let vocab = model.spec().vocab_size;
    let mut drafter = ModelDrafter::new(model.clone(), vocab).unwrap();
    let guesses = drafter.propose(PROMPT, 4).unwrap();
    assert_eq!(guesses.len(), 4);
    // The target kept the first guess, then chose a token of its own.
    let context = [PROMPT, &guesses[..1], &[NEXT]].concat();
    let again = drafter.propose(&context, 4).unwrap();
    let fresh = ModelDrafter::new(model, vocab).unwrap().propose(&context, 4).unwrap();
    assert_eq!(again, fresh);
}

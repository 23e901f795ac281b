//! Embedding larder: open a model with the automatic RAM budget, run two
//! concurrent requests with n-gram drafting through the engine handle, and
//! print a plan of what the model does on this machine.
//!
//! cargo run --release -p larder-engine --example embed -- MODEL [DRIVE_GBPS]

use larder_engine::open::{open, OpenOptions, OpenProgress, RamBudget};
use larder_engine::planner::{plan_model, MachinePlan, PlanInput, Routing};
use larder_engine::{DrafterChoice, EngineHandle, HandleConfig, Job, Machine};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = std::path::PathBuf::from(args.next().ok_or("usage: embed MODEL [DRIVE_GBPS]")?);
    let drive_gbps: f64 = args.next().map_or(Ok(2.0), |s| s.parse())?;

    // One options value owns the budget, prefill, warm-up and memory watcher.
    let opened = open(&model, &OpenOptions::new().ram_budget(RamBudget::Auto), OpenProgress::default())?;
    opened.notes.iter().for_each(|note| eprintln!("{note:?}"));
    let drafting = opened.engine.drafting(&DrafterChoice::Ngram)?;
    let handle = EngineHandle::start(opened.engine, HandleConfig::default())?;

    // Two requests at once: the scheduler batches them, drafts verified in the same steps.
    let mut running = Vec::new();
    for text in ["The capital of France is", "One, two, three, four, five,"] {
        let job = Job::new(handle.engine().encode_prompt(text)?).drafter(drafting.drafter()?);
        running.push((text, handle.submit(job)?));
    }
    for (prompt, events) in running {
        let outcome = events.wait()?;
        let accepted = outcome.stats.speculative.as_ref().map_or(0, |s| s.accepted);
        println!("{prompt:?} -> {:?} ({accepted} drafted tokens accepted)", outcome.text);
    }
    println!("engine: {:?}", handle.metrics());
    handle.stop()?;

    // The planner: this machine's RAM and cores, one drive at DRIVE_GBPS, uniform routing.
    let here = Machine::inspect();
    let machine = MachinePlan::new(here.ram_available, vec![drive_gbps], here.cores, here.ram_gbps, 17.0);
    let report = larder_engine::sizing::inspect(&model)?;
    let spec = larder_model::arch::read_spec(&report.folder)?;
    let routing = Routing::Preset {
        name: "uniform".into(),
        tokens: 500,
    };
    match plan_model(&PlanInput::new(report, spec, machine, routing)) {
        Ok(plan) => println!(
            "plan: {:.2} tok/s, bound by {}",
            plan.forecast.decode_tok_per_s, plan.forecast.binding
        ),
        Err(e) => println!("plan: {e}"),
    }
    Ok(())
}

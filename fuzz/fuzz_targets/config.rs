//! Fuzzes `config.json` -> [`larder_model::ModelSpec`]
//! (`larder_model::arch::read_spec`) for every architecture: any input is a
//! spec or an error naming the field, never a panic or a huge allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = larder_fuzz::scratch_dir("config");
    larder_fuzz::write(dir, "config.json", data);
    let _ = larder_model::arch::read_spec(dir);
});

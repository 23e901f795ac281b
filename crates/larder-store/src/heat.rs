//! Expert heat: how often each routed expert was demanded, and how often it
//! was read from a drive, kept next to a packed store (`heat.json`) across
//! runs, so a later run can warm its cache with the hottest experts
//! ([`ExpertStore::warm`](crate::ExpertStore::warm)), heat-aware policies
//! can pin them, and `larder mirror` can copy the most read ones onto a fast drive.
//!
//! The file is `{"larder_heat": 1, "layers": {"L": [[expert, count], ...]},
//! "reads": {"L": [[expert, count], ...]}}` (`reads` optional),
//! written atomically (`heat.json.partial`, then renamed) and merged with
//! what is already there. It decides nothing the model computes, so a
//! missing, unreadable or damaged file is ignored rather than an error:
//! warming then simply has nothing to go on. Reading it checks every id
//! against the store's index, so a heat file from another store warms
//! nothing it does not hold.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cache::Key;

/// The file name next to a store's manifest.
pub const HEAT_FILE: &str = "heat.json";
/// The format version.
pub(crate) const HEAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeatFile {
    larder_heat: u32,
    /// Demands per layer: `[[expert, count], ...]`.
    layers: BTreeMap<usize, Vec<(usize, u64)>>,
    /// Reads from the drives per layer (demand misses, prefetches, warming),
    /// where the runs recorded them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    reads: BTreeMap<usize, Vec<(usize, u64)>>,
}

/// Counts per (layer, expert).
pub type Heat = HashMap<Key, u64>;

/// What a store's heat file holds: how often each expert was demanded, and
/// how often it was read from a drive (what the drives served, under the
/// RAM budgets of the runs that recorded it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeatProfile {
    pub demands: Heat,
    pub reads: Heat,
}

fn flatten(layers: BTreeMap<usize, Vec<(usize, u64)>>) -> Heat {
    layers
        .into_iter()
        .flat_map(|(l, v)| v.into_iter().map(move |(e, n)| ((l, e), n)))
        .collect()
}

fn nest(heat: &Heat) -> BTreeMap<usize, Vec<(usize, u64)>> {
    let mut layers: BTreeMap<usize, Vec<(usize, u64)>> = BTreeMap::new();
    for (&(l, e), &n) in heat {
        layers.entry(l).or_default().push((e, n));
    }
    for v in layers.values_mut() {
        v.sort_unstable();
    }
    layers
}

fn parse(text: &str) -> Result<HeatProfile, String> {
    let f: HeatFile = serde_json::from_str(text).map_err(|e| format!("not a larder heat file ({e})"))?;
    if f.larder_heat != HEAT_VERSION {
        return Err(format!("heat format {}, this larder reads {HEAT_VERSION}", f.larder_heat));
    }
    Ok(HeatProfile {
        demands: flatten(f.layers),
        reads: flatten(f.reads),
    })
}

/// The demand heat saved in `dir` (empty when there is none or it cannot be read).
pub fn load(dir: &Path) -> Heat {
    load_profile(dir).demands
}

/// Everything saved in `dir` (empty when there is none or it cannot be read).
pub(crate) fn load_profile(dir: &Path) -> HeatProfile {
    std::fs::read_to_string(dir.join(HEAT_FILE))
        .ok()
        .and_then(|t| parse(&t).ok())
        .unwrap_or_default()
}

/// The heat saved in `dir`: `Ok(None)` when there is none yet, an error
/// naming the file when it is there but damaged (commands that need heat
/// say so rather than "no heat yet"; the next streamed run replaces it).
pub fn read_saved(dir: &Path) -> Result<Option<HeatProfile>, String> {
    let path = dir.join(HEAT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text).map(Some).map_err(|e| {
            format!(
                "{}: damaged ({e}); the next streamed run of the store replaces it, or remove it",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The heat in the file at `path`, strictly: a file a user named must be
/// readable heat, so an error names it and what is wrong.
pub fn load_file(path: &Path) -> Result<HeatProfile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Adds `demands` and `reads` to what `dir` holds and writes it back atomically.
pub fn save(dir: &Path, demands: &Heat, reads: &Heat) -> std::io::Result<()> {
    if demands.is_empty() && reads.is_empty() {
        return Ok(());
    }
    let mut all = load_profile(dir);
    for (k, n) in demands {
        *all.demands.entry(*k).or_insert(0) += n;
    }
    for (k, n) in reads {
        *all.reads.entry(*k).or_insert(0) += n;
    }
    let body = serde_json::to_vec(&HeatFile {
        larder_heat: HEAT_VERSION,
        layers: nest(&all.demands),
        reads: nest(&all.reads),
    })
    .map_err(std::io::Error::other)?;
    let partial = dir.join(format!("{HEAT_FILE}.partial"));
    std::fs::write(&partial, body)?;
    std::fs::rename(&partial, dir.join(HEAT_FILE))
}

/// The keys of `heat`, hottest first (ties: lower layer, then lower expert).
pub fn hottest(heat: &Heat) -> Vec<Key> {
    let mut keys: Vec<(Key, u64)> = heat.iter().map(|(k, n)| (*k, *n)).collect();
    keys.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    keys.into_iter().map(|(k, _)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_heat_file_is_an_error_naming_it_not_no_heat() {
        let dir = std::env::temp_dir().join(format!("larder-heat-damaged-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_saved(&dir), Ok(None));
        std::fs::write(dir.join(HEAT_FILE), b"{\"larder_heat\": 1, \"layers\": {\"0\": [[1, ").unwrap();
        let e = read_saved(&dir).unwrap_err();
        assert!(e.contains("heat.json") && e.contains("damaged"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn saves_merge_and_damage_is_ignored() {
        let dir = std::env::temp_dir().join(format!("larder-heat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(load(&dir).is_empty());
        save(&dir, &Heat::from([((1, 2), 5), ((0, 7), 1)]), &Heat::new()).unwrap();
        save(&dir, &Heat::from([((1, 2), 1), ((3, 0), 9)]), &Heat::from([((3, 0), 2)])).unwrap();
        let h = load(&dir);
        assert_eq!(h, Heat::from([((1, 2), 6), ((0, 7), 1), ((3, 0), 9)]));
        assert_eq!(load_profile(&dir).reads, Heat::from([((3, 0), 2)]));
        assert_eq!(load_file(&dir.join(HEAT_FILE)).unwrap().demands, h);
        // A file without reads (written before they were recorded) still reads.
        std::fs::write(dir.join(HEAT_FILE), r#"{"larder_heat": 1, "layers": {"0": [[3, 4]]}}"#).unwrap();
        assert_eq!(
            load_profile(&dir),
            HeatProfile {
                demands: Heat::from([((0, 3), 4)]),
                reads: Heat::new()
            }
        );
        assert_eq!(hottest(&h), vec![(3, 0), (1, 2), (0, 7)]);
        std::fs::write(dir.join(HEAT_FILE), "{\"larder_heat\": 1, \"layers\": ").unwrap();
        assert!(load(&dir).is_empty());
        assert!(load_file(&dir.join(HEAT_FILE)).unwrap_err().contains("not a larder heat file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

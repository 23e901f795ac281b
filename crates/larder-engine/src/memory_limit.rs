//! The memory this process may use: `MemAvailable` (/proc/meminfo) and the
//! limit of its memory cgroup, v2 (`memory.max`, `memory.current`) or v1
//! (`memory.limit_in_bytes`, `memory.usage_in_bytes`, and memory.stat's
//! `hierarchical_memory_limit`), whichever leaves less ([`available`]). Every
//! memory default (expert cache, prefill memory, KV budget) and the memory
//! watcher ([`crate::memory_watch`]) are shares of it; [`check_fit`] says
//! whether a run's memory fits under the limit before the model loads.
//!
//! The cgroup is found through /proc/self/cgroup and /proc/self/mountinfo
//! (no mount point is assumed). The tightest limit of the cgroup and its
//! ancestors up to the mount's root counts, a parent's limit binding its
//! children; v1's `hierarchical_memory_limit` also covers ancestors above
//! the mount. Page cache the kernel reclaims before it kills (`inactive_file`;
//! v1 `total_inactive_file`) counts as room, as kubelet's working set does,
//! so buffered reads of expert files do not shrink the budget for nothing.
//!
//! [`limit_from`] is a pure function of those files' contents (unit tests
//! feed it samples); [`cgroup_limit`] reads them for this process.

use std::fmt;
use std::path::{Path, PathBuf};

use larder_store::format_size;

/// A v1 limit at or above this is "no limit" (v1 writes a page-rounded `i64::MAX`).
pub(crate) const V1_UNLIMITED: u64 = 1 << 62;

/// Which cgroup interface a limit came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }
}

/// The memory limit of one cgroup level and what is charged to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupLimit {
    pub version: CgroupVersion,
    /// Where the limit was read, e.g. `/sys/fs/cgroup/memory/a/memory.limit_in_bytes`
    /// or `hierarchical_memory_limit in /sys/fs/cgroup/memory/a/memory.stat`.
    pub origin: String,
    /// Bytes the cgroup may hold.
    pub limit: u64,
    /// Bytes charged to it now, page cache included.
    pub usage: u64,
    /// Of `usage`, inactive page cache (reclaimed before anything is killed).
    pub inactive_file: u64,
}

impl CgroupLimit {
    /// What the cgroup holds that the kernel will not simply drop.
    pub(crate) fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }

    /// Bytes that may still be allocated before the kernel kills.
    pub(crate) fn room(&self) -> u64 {
        self.limit.saturating_sub(self.working_set())
    }
}

impl fmt::Display for CgroupLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cgroup {} memory limit {} ({})",
            self.version.name(),
            format_size(self.limit),
            self.origin
        )
    }
}

/// Memory available to this process now: `MemAvailable`, or the room its
/// cgroup's limit leaves ([`CgroupLimit::room`]) when that is lower.
pub(crate) fn available() -> Option<u64> {
    let system = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| meminfo_available(&m));
    match (system, cgroup_limit().map(|l| l.room())) {
        (Some(s), Some(c)) => Some(s.min(c)),
        (s, c) => s.or(c),
    }
}

/// `MemAvailable` of a /proc/meminfo, in bytes.
pub(crate) fn meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().next()?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// This process's tightest cgroup memory limit (v1 or v2), if it has one.
pub(crate) fn cgroup_limit() -> Option<CgroupLimit> {
    let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    limit_from(&proc_cgroup, &mountinfo, &|path| std::fs::read_to_string(path).ok())
}

/// The tightest limit (least [`CgroupLimit::room`]) over the memory cgroups
/// that /proc/self/cgroup's `proc_cgroup` names, found under the mounts of
/// `mountinfo`, and their ancestors up to each mount's root; files are read
/// with `read`. `None`: no level has a limit.
pub(crate) fn limit_from(proc_cgroup: &str, mountinfo: &str, read: &dyn Fn(&Path) -> Option<String>) -> Option<CgroupLimit> {
    let mounts = cgroup_mounts(mountinfo);
    memberships(proc_cgroup)
        .iter()
        .filter_map(|m| cgroup_dir(m, &mounts))
        .flat_map(|(version, leaf, mount)| levels(&leaf, &mount).into_iter().map(move |dir| (version, dir)))
        .filter_map(|(version, dir)| read_level(version, &dir, read))
        .min_by_key(CgroupLimit::room)
}

/// A memory hierarchy this process belongs to: its version and the path
/// /proc/self/cgroup gives.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Membership {
    version: CgroupVersion,
    path: String,
}

/// The memory hierarchies of /proc/self/cgroup: v1 lines whose controllers
/// include `memory` (`4:memory:/a`, `7:cpu,memory:/a`), the v2 line `0::/a`.
fn memberships(proc_cgroup: &str) -> Vec<Membership> {
    proc_cgroup
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let version = if controllers.split(',').any(|c| c == "memory") {
                CgroupVersion::V1
            } else if id == "0" && controllers.is_empty() {
                CgroupVersion::V2
            } else {
                return None;
            };
            Some(Membership {
                version,
                path: path.to_string(),
            })
        })
        .collect()
}

/// A cgroup filesystem mount: its version, the cgroup path of its root and
/// where it is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupMount {
    version: CgroupVersion,
    root: String,
    mount_point: PathBuf,
}

/// The memory cgroup mounts of a /proc/self/mountinfo: `cgroup` mounts with
/// the `memory` option (v1) and `cgroup2` mounts.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            // "36 25 0:32 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory"
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let (fstype, _source, options) = (right.next()?, right.next()?, right.next().unwrap_or(""));
            let version = match fstype {
                "cgroup" if options.split(',').any(|o| o == "memory") => CgroupVersion::V1,
                "cgroup2" => CgroupVersion::V2,
                _ => return None,
            };
            Some(CgroupMount {
                version,
                root: unescape_mount_field(left.get(3)?),
                mount_point: PathBuf::from(unescape_mount_field(left.get(4)?)),
            })
        })
        .collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of `membership`'s cgroup and the mount point it lies
/// under: the mount of its version whose root is the longest prefix of its
/// path (a mount whose root is not a prefix, as under a cgroup namespace,
/// when no other matches).
fn cgroup_dir(membership: &Membership, mounts: &[CgroupMount]) -> Option<(CgroupVersion, PathBuf, PathBuf)> {
    let path = Path::new(&membership.path);
    let candidates = mounts.iter().filter(|m| m.version == membership.version);
    let best = candidates
        .clone()
        .filter(|m| path.starts_with(&m.root))
        .max_by_key(|m| m.root.len())
        .or_else(|| candidates.clone().next())?;
    let relative = path.strip_prefix(&best.root).unwrap_or(path);
    let relative = relative.strip_prefix("/").unwrap_or(relative);
    Some((membership.version, best.mount_point.join(relative), best.mount_point.clone()))
}

/// `leaf` and each parent up to `mount` (inclusive), leaf first.
fn levels(leaf: &Path, mount: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![leaf.to_path_buf()];
    let mut dir = leaf;
    while dir != mount {
        match dir.parent() {
            Some(parent) if parent.starts_with(mount) => {
                dirs.push(parent.to_path_buf());
                dir = parent;
            }
            _ => break,
        }
    }
    dirs
}

/// The limit of the cgroup at `dir`, if it has one.
fn read_level(version: CgroupVersion, dir: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Option<CgroupLimit> {
    let number = |name: &str| read(&dir.join(name)).and_then(|s| s.trim().parse::<u64>().ok());
    let stat = read(&dir.join("memory.stat")).unwrap_or_default();
    match version {
        CgroupVersion::V2 => Some(CgroupLimit {
            version,
            origin: dir.join("memory.max").display().to_string(),
            // "max": no limit (does not parse).
            limit: number("memory.max")?,
            usage: number("memory.current").unwrap_or(0),
            inactive_file: stat_value(&stat, "inactive_file").unwrap_or(0),
        }),
        CgroupVersion::V1 => {
            let own = number("memory.limit_in_bytes").filter(|&l| l < V1_UNLIMITED);
            let hierarchical = stat_value(&stat, "hierarchical_memory_limit").filter(|&l| l < V1_UNLIMITED);
            let (limit, origin) = match (own, hierarchical) {
                (Some(o), Some(h)) if h < o => (h, format!("hierarchical_memory_limit in {}", dir.join("memory.stat").display())),
                (Some(o), _) => (o, dir.join("memory.limit_in_bytes").display().to_string()),
                (None, Some(h)) => (h, format!("hierarchical_memory_limit in {}", dir.join("memory.stat").display())),
                (None, None) => return None,
            };
            Some(CgroupLimit {
                version,
                origin,
                limit,
                usage: number("memory.usage_in_bytes").unwrap_or(0),
                inactive_file: stat_value(&stat, "total_inactive_file")
                    .or_else(|| stat_value(&stat, "inactive_file"))
                    .unwrap_or(0),
            })
        }
    }
}

/// The value of `key` in a memory.stat (`key value` lines).
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// What a run holds in memory, by part, for [`check_fit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryNeeds {
    /// Weights that are not routed experts (always in RAM).
    pub spine: u64,
    /// Routed experts the run cannot do without: one layer step's when
    /// they stream, all of them when they are loaded into RAM.
    pub experts_least: u64,
    /// Routed experts it may hold: the cache budget (at most all of them).
    pub experts_most: u64,
    /// Activation memory a prefill pass may hold.
    pub prefill: u64,
}

impl MemoryNeeds {
    /// Bytes without which the run cannot go: the spine and the least experts.
    pub(crate) fn least(&self) -> u64 {
        self.spine.saturating_add(self.experts_least)
    }

    /// Bytes the run may come to hold: spine, experts and a prefill pass.
    pub(crate) fn most(&self) -> u64 {
        self.spine.saturating_add(self.experts_most).saturating_add(self.prefill)
    }
}

/// How a run's memory compares with its cgroup's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitFit {
    /// All it may hold fits in the room left.
    Fits,
    /// What it cannot do without fits under the limit, but all it may hold
    /// does not fit in the room left now: it may be killed.
    MayExceed,
    /// What it cannot do without is over the limit itself: it will be killed.
    CannotFit,
}

/// Whether `needs` fits under `limit` (see [`LimitFit`]).
pub(crate) fn check_fit(needs: &MemoryNeeds, limit: &CgroupLimit) -> LimitFit {
    if needs.least() > limit.limit {
        LimitFit::CannotFit
    } else if needs.most() > limit.room() || needs.least() > limit.room() {
        LimitFit::MayExceed
    } else {
        LimitFit::Fits
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const MIB: u64 = 1 << 20;

    /// A `read` over `files` (path, contents).
    fn files(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = files.iter().map(|(p, c)| (PathBuf::from(p), c.to_string())).collect();
        move |p: &Path| map.get(p).cloned()
    }

    const V1_CGROUP: &str = "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n";
    const V1_MOUNTS: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
    const V1_UNLIMITED_TEXT: &str = "9223372036854771712\n";

    #[test]
    fn v1_limit_of_the_process_cgroup_with_page_cache_as_room() {
        let d = "/sys/fs/cgroup/memory/process_api/abc";
        let read = files(&[
            (&format!("{d}/memory.limit_in_bytes"), "671088640\n"),
            (&format!("{d}/memory.usage_in_bytes"), "104857600\n"),
            (
                &format!("{d}/memory.stat"),
                "cache 5\ninactive_file 1\nhierarchical_memory_limit 671088640\ntotal_inactive_file 41943040\n",
            ),
            ("/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", V1_UNLIMITED_TEXT),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", V1_UNLIMITED_TEXT),
        ]);
        let l = limit_from(V1_CGROUP, V1_MOUNTS, &read).expect("a v1 limit");
        assert_eq!(l.version, CgroupVersion::V1);
        assert_eq!(l.origin, format!("{d}/memory.limit_in_bytes"));
        assert_eq!((l.limit, l.usage, l.inactive_file), (640 * MIB, 100 * MIB, 40 * MIB));
        assert_eq!(l.room(), 640 * MIB - 60 * MIB, "inactive page cache counts as room");
        assert_eq!(
            l.to_string(),
            format!("cgroup v1 memory limit 640.00 MiB ({d}/memory.limit_in_bytes)")
        );
    }

    #[test]
    fn unlimited_v1_and_v2_are_no_limit() {
        let d = "/sys/fs/cgroup/memory/process_api/abc";
        let read = files(&[
            (&format!("{d}/memory.limit_in_bytes"), V1_UNLIMITED_TEXT),
            (&format!("{d}/memory.usage_in_bytes"), "1000\n"),
            (&format!("{d}/memory.stat"), "hierarchical_memory_limit 9223372036854771712\n"),
            ("/sys/fs/cgroup/unified/memory.max", "max\n"),
        ]);
        assert_eq!(limit_from(V1_CGROUP, V1_MOUNTS, &read), None);
    }

    #[test]
    fn a_parent_limit_binds_and_the_tightest_room_wins() {
        // The child allows 2 GiB; its parent allows 1 GiB and holds 900 MiB
        // (siblings included): 124 MiB of room, less than the child's.
        let read = files(&[
            ("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "2147483648"),
            ("/sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes", "104857600"),
            ("/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "1073741824"),
            ("/sys/fs/cgroup/memory/process_api/memory.usage_in_bytes", "943718400"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", V1_UNLIMITED_TEXT),
        ]);
        let l = limit_from(V1_CGROUP, V1_MOUNTS, &read).expect("a limit");
        assert_eq!(l.origin, "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes");
        assert_eq!(l.room(), 124 * MIB);
    }

    #[test]
    fn v1_hierarchical_limit_covers_ancestors_above_the_mount() {
        // A container sees its own cgroup as the mount root; the host's
        // limit on an ancestor shows only in memory.stat.
        let cgroup = "5:memory,hugetlb:/docker/c1\n";
        let mounts = "40 30 0:40 /docker/c1 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,hugetlb,memory\n";
        let read = files(&[
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", V1_UNLIMITED_TEXT),
            ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "10485760"),
            (
                "/sys/fs/cgroup/memory/memory.stat",
                "hierarchical_memory_limit 536870912\ntotal_inactive_file 0\n",
            ),
        ]);
        let l = limit_from(cgroup, mounts, &read).expect("a hierarchical limit");
        assert_eq!((l.limit, l.room()), (512 * MIB, 502 * MIB));
        assert_eq!(l.origin, "hierarchical_memory_limit in /sys/fs/cgroup/memory/memory.stat");
    }

    #[test]
    fn v2_limit_with_inactive_file_as_room() {
        let cgroup = "0::/user.slice/run-1.scope\n";
        let mounts = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        let d = "/sys/fs/cgroup/user.slice/run-1.scope";
        let read = files(&[
            (&format!("{d}/memory.max"), "3382706176\n"),
            (&format!("{d}/memory.current"), "1073741824\n"),
            (
                &format!("{d}/memory.stat"),
                "anon 1\nfile 2\nactive_file 3\ninactive_file 536870912\n",
            ),
            ("/sys/fs/cgroup/user.slice/memory.max", "max\n"),
        ]);
        let l = limit_from(cgroup, mounts, &read).expect("a v2 limit");
        assert_eq!(l.version, CgroupVersion::V2);
        assert_eq!(l.origin, format!("{d}/memory.max"));
        assert_eq!(l.room(), 3382706176 - 512 * MIB);
    }

    #[test]
    fn missing_files_and_foreign_lines_mean_no_limit_or_zero_usage() {
        assert_eq!(limit_from("", "", &files(&[])), None);
        assert_eq!(limit_from(V1_CGROUP, V1_MOUNTS, &files(&[])), None, "no files at all");
        assert_eq!(limit_from("garbage\n3:cpu:/x\n", V1_MOUNTS, &files(&[])), None);
        // No memory mount: the limit cannot be found.
        let read = files(&[("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "1048576")]);
        assert_eq!(limit_from(V1_CGROUP, "", &read), None);
        // A limit without usage or stat: all of it is room.
        let l = limit_from(V1_CGROUP, V1_MOUNTS, &read).expect("a limit");
        assert_eq!((l.limit, l.room()), (MIB, MIB));
        // A limit that does not parse is no limit.
        let read = files(&[("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "lots")]);
        assert_eq!(limit_from(V1_CGROUP, V1_MOUNTS, &read), None);
    }

    #[test]
    fn mount_points_with_escapes_and_namespaced_paths() {
        assert_eq!(unescape_mount_field(r"/mnt/my\040cgroups"), "/mnt/my cgroups");
        assert_eq!(
            unescape_mount_field(r"/a\\b"),
            r"/a\\b",
            "a backslash not followed by 3 octal digits stays"
        );
        let mounts = "50 1 0:50 / /mnt/my\\040cgroups rw - cgroup cgroup rw,memory\n";
        let read = files(&[("/mnt/my cgroups/job/memory.limit_in_bytes", "1048576")]);
        let l = limit_from("4:memory:/job\n", mounts, &read).expect("a limit");
        assert_eq!(l.origin, "/mnt/my cgroups/job/memory.limit_in_bytes");
    }

    #[test]
    fn meminfo_available_is_in_bytes() {
        assert_eq!(meminfo_available("MemTotal: 100 kB\nMemAvailable:    2048 kB\n"), Some(2 * MIB));
        assert_eq!(meminfo_available("MemTotal: 100 kB\n"), None);
    }

    #[test]
    fn fit_cannot_when_the_least_is_over_the_limit_may_exceed_when_the_most_is_over_the_room() {
        let limit = CgroupLimit {
            version: CgroupVersion::V1,
            origin: "x".into(),
            limit: 1000 * MIB,
            usage: 300 * MIB,
            inactive_file: 100 * MIB,
        };
        let needs = |spine, least, most, prefill| MemoryNeeds {
            spine: spine * MIB,
            experts_least: least * MIB,
            experts_most: most * MIB,
            prefill: prefill * MIB,
        };
        assert_eq!(check_fit(&needs(400, 10, 300, 100), &limit), LimitFit::Fits);
        assert_eq!(
            check_fit(&needs(400, 10, 300, 200), &limit),
            LimitFit::MayExceed,
            "900 MiB in 800 MiB of room"
        );
        assert_eq!(
            check_fit(&needs(795, 10, 10, 0), &limit),
            LimitFit::MayExceed,
            "the least fits the limit, not the room"
        );
        assert_eq!(check_fit(&needs(995, 10, 10, 0), &limit), LimitFit::CannotFit);
    }
}

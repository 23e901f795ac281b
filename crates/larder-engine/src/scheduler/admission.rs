//! Which sequences run in the next pass, and what they hold: retiring
//! cancelled ones, admitting queued ones while the batch and the KV budget
//! allow (with the prefix cache and the disk tier), making room before a
//! pass (evicting, dropping snapshots, preempting), the snapshots a pass
//! takes, and ending a sequence into the prefix cache. See the scheduler's
//! module docs for the rules.

use larder_model::SequenceState;

use super::disk_tier::DiskHit;
use super::prefix_cache::Hit;
use super::sequence::{finish, Seq};
use super::{Scheduler, StepReport};
use crate::engine::FinishReason;
use crate::return_points::ReturnPoints;

impl<'e> Scheduler<'e> {
    /// Ends every sequence, running or queued, that was cancelled.
    pub(super) fn retire_cancelled(&mut self, report: &mut StepReport) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled() {
                let s = self.running.remove(i);
                report.finished.push(s.id);
                self.end(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let queued = std::mem::take(&mut self.queue);
        for s in queued {
            if s.cancelled() {
                report.finished.push(s.id);
                self.end(s, FinishReason::Cancelled);
            } else {
                self.queue.push_back(s);
            }
        }
    }

    /// Bytes the running sequences will hold after this step's forward pass
    /// (their snapshots included, and a verification pass's own snapshot of
    /// a state that cannot roll back).
    pub(super) fn step_bytes(&self) -> usize {
        let chunk = self.config.prefill_chunk;
        let positions: usize = self.running.iter().map(|s| s.state.len() + s.rows(chunk)).sum();
        let snapshots: usize = self.running.iter().map(|s| s.points.bytes()).sum();
        let verifying = self
            .running
            .iter()
            .filter(|s| !s.state.can_rollback() && s.spec.as_ref().is_some_and(|d| !d.drafts().is_empty()))
            .count();
        let fixed = self.costs.bytes_per_sequence;
        self.running.len() * fixed + positions * self.costs.bytes_per_token + snapshots + verifying * fixed / 2
    }

    /// Asks each running sequence whose next pass crosses its return point
    /// to snapshot it there, inside the pass (see the module docs), when the
    /// snapshot fits the KV budget with everything else; and each one about
    /// to verify drafts to snapshot its state before the pass.
    pub(super) fn take_snapshots(&mut self) {
        let chunk = self.config.prefill_chunk;
        for i in 0..self.running.len() {
            let s = &mut self.running[i];
            if let Some(spec) = &mut s.spec {
                spec.snapshot_before(&s.state);
            }
            let Some(mark) = self.running[i].snapshot_mark(self.running[i].rows(chunk)) else {
                continue;
            };
            let size = self.running[i].state.snapshot().bytes();
            let fits = self
                .config
                .kv_budget
                .is_none_or(|b| self.step_bytes() + self.cache.bytes() + size <= b);
            if fits {
                self.running[i].state.mark_after(mark);
            }
        }
    }

    /// Bytes `s` holds after its first forward pass when it reuses `reuse` positions.
    fn first_pass_bytes(&self, s: &Seq<'_>, reuse: usize) -> usize {
        let rows = self.config.prefill_chunk.min(s.feed.len() - reuse);
        self.costs.bytes_per_sequence + (reuse + rows) * self.costs.bytes_per_token
    }

    /// Moves queued sequences into the batch, in order, while the batch and
    /// the KV budget allow (see the module docs); evicts prefix-cache
    /// entries for the room, never preempts.
    pub(super) fn admit(&mut self) {
        while self.running.len() < self.config.max_batch {
            let Some(front) = self.queue.front() else { break };
            let hit = self.cache.lookup(&front.feed);
            let ram = hit.map_or(0, |h| h.reuse);
            let disk = self.disk.as_ref().and_then(|d| d.lookup(&front.feed)).filter(|d| d.reuse > ram);
            if let Some(budget) = self.config.kv_budget {
                let running = self.step_bytes();
                if running + self.first_pass_bytes(front, 0) > budget {
                    break; // it waits for room
                }
                let (own, carried, moved) = match disk {
                    Some(d) => (d.reuse, d.snapshots * self.costs.bytes_per_sequence / 2, 0),
                    None => (
                        ram,
                        hit.map_or(0, |h| h.carried_bytes),
                        hit.filter(|h| h.whole).map_or(0, |h| h.entry_bytes),
                    ),
                };
                let kept = self.cache.bytes() - moved;
                if running + self.first_pass_bytes(front, own) + carried + kept > budget {
                    if self.cache.evict_lru() {
                        continue;
                    }
                    break;
                }
            }
            let Some(mut s) = self.queue.pop_front() else { break };
            self.start(&mut s, hit, disk);
            self.running.push(s);
        }
    }

    /// Admits `s`: its place in the admission order, and the prefix it reuses.
    fn start(&mut self, s: &mut Seq<'_>, hit: Option<Hit>, disk: Option<DiskHit>) {
        s.admitted = self.admissions;
        self.admissions += 1;
        if s.store_before.is_none() {
            s.store_before = self.engine.store().map(|store| store.stats());
        }
        let reused = if let Some((state, points, reuse)) = self.load_from_disk(disk) {
            Some((state, points, reuse))
        } else {
            hit.and_then(|hit| self.cache.take(hit).map(|(state, points)| (state, points, hit.reuse)))
        };
        match reused {
            Some((state, points, reuse)) => {
                s.state = state;
                s.points = points;
                s.fed = reuse;
                if !s.resumed() {
                    s.stats.cached_tokens = reuse;
                }
            }
            None => s.state = self.engine.model().new_state(),
        }
    }

    /// The state `disk` names, loaded (with the positions it reuses); counts
    /// a miss when the disk tier had nothing longer than RAM or failed.
    fn load_from_disk(&mut self, disk: Option<DiskHit>) -> Option<(SequenceState, ReturnPoints, usize)> {
        let tier = self.disk.as_mut()?;
        let loaded = disk.and_then(|d| tier.load(d, self.engine.model()).map(|(s, p)| (s, p, d.reuse)));
        if loaded.is_none() {
            tier.miss();
        }
        loaded
    }

    /// Before a forward pass: while the step's need and the prefix cache
    /// exceed the KV budget, evicts the least recently used cached
    /// conversation, else drops a running sequence's snapshots (the most
    /// recently admitted one's first), else preempts the most recently
    /// admitted running sequence (never the last one, which fits alone).
    pub(super) fn make_room(&mut self, report: &mut StepReport) {
        let Some(budget) = self.config.kv_budget else { return };
        while self.step_bytes() + self.cache.bytes() > budget {
            if self.cache.evict_lru() {
                continue;
            }
            let with_snapshots = (0..self.running.len())
                .filter(|&i| !self.running[i].points.is_empty())
                .max_by_key(|&i| self.running[i].admitted);
            if let Some(i) = with_snapshots {
                self.running[i].points.clear();
                continue;
            }
            if self.running.len() <= 1 {
                break;
            }
            let youngest = (0..self.running.len()).max_by_key(|&i| self.running[i].admitted);
            let Some(youngest) = youngest else { break };
            let mut s = self.running.remove(youngest);
            s.preempt(SequenceState::default());
            self.preemptions += 1;
            report.preempted.push(s.id);
            self.queue.push_front(s);
        }
    }

    /// Ends `s` (see [`finish`]) and keeps its conversation for prefix reuse
    /// (in RAM, and on disk when there is a disk tier).
    pub(super) fn end(&mut self, s: Seq<'e>, reason: FinishReason) {
        let (tokens, state, points) = finish(self.engine, s, reason);
        if let Some(disk) = &mut self.disk {
            disk.save(&tokens, &state, &points);
        }
        self.cache.insert(tokens, state, points);
    }
}

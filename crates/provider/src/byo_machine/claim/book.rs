//! What one provider process remembers about the claims it makes, between reconciles.
//!
//! None of this is needed for correctness — the two guarded writes of the claim protocol are —
//! but each piece saves requests or time:
//! - **waiting**: the machines that found no free host, oldest first, so a host that becomes
//!   claimable wakes one machine that can take it instead of every waiting machine;
//! - **written**: the newest `resourceVersion` of each ByoMachine that this process's own writes
//!   returned, so a reconcile of an older copy from the store (its watch event is on the way) is
//!   skipped rather than repeating writes that would conflict;
//! - **claiming**: the hosts a reconcile in this process started claiming in the last
//!   [`CLAIM_MEMORY`], so concurrent reconciles pick other hosts rather than lose races to each
//!   other.
//!
//! Everything here is lost on restart, and that is fine: the next reconciles rebuild it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

/// How long a host whose claim started in this process is skipped by the other reconciles of
/// this process: long enough for the pool index to see the claim.
pub const CLAIM_MEMORY: Duration = Duration::from_secs(10);

/// An object's `resourceVersion` as a number (what etcd-backed API servers use).
fn revision<K: kube::Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

/// The machines waiting for a host, in the order they started waiting.
#[derive(Default, Debug)]
struct Waiting {
    next: u64,
    by_machine: HashMap<ObjectRef<ByoMachine>, u64>,
    by_order: BTreeMap<u64, ObjectRef<ByoMachine>>,
}

impl Waiting {
    /// Adds a machine (keeping its place when it already waits).
    fn insert(&mut self, machine: ObjectRef<ByoMachine>) {
        if self.by_machine.contains_key(&machine) {
            return;
        }
        self.next += 1;
        self.by_order.insert(self.next, machine.clone());
        self.by_machine.insert(machine, self.next);
    }

    /// Removes a machine.
    fn remove(&mut self, machine: &ObjectRef<ByoMachine>) {
        if let Some(seq) = self.by_machine.remove(machine) {
            self.by_order.remove(&seq);
        }
    }

    /// Removes and returns the longest-waiting machine for which `fits` holds.
    fn take_first(
        &mut self,
        mut fits: impl FnMut(&ObjectRef<ByoMachine>) -> bool,
    ) -> Option<ObjectRef<ByoMachine>> {
        let seq = self.by_order.iter().find(|(_, m)| fits(m)).map(|(seq, _)| *seq)?;
        let m = self.by_order.remove(&seq)?;
        self.by_machine.remove(&m);
        Some(m)
    }
}

/// The claim bookkeeping of one provider process (see the module docs).
#[derive(Default, Debug)]
pub struct Book {
    waiting: Mutex<Waiting>,
    written: Mutex<HashMap<String, u64>>,
    claiming: Mutex<HashMap<ObjectRef<ByoHost>, Instant>>,
}

impl Book {
    /// Marks a machine as waiting for a host (or not). A machine that already waits keeps its
    /// place.
    pub fn set_waiting(&self, machine: ObjectRef<ByoMachine>, waiting: bool) {
        if let Ok(mut w) = self.waiting.lock() {
            if waiting {
                w.insert(machine);
            } else {
                w.remove(&machine);
            }
        }
    }

    /// How many machines wait for a host.
    pub fn waiting(&self) -> usize {
        self.waiting.lock().map_or(0, |w| w.by_machine.len())
    }

    /// Takes the longest-waiting machine for which `fits` holds: it no longer waits.
    pub fn take_waiting(
        &self,
        fits: impl FnMut(&ObjectRef<ByoMachine>) -> bool,
    ) -> Option<ObjectRef<ByoMachine>> {
        self.waiting.lock().ok()?.take_first(fits)
    }

    /// Remembers the version of a ByoMachine that one of this process's writes returned.
    pub fn note_written(&self, bm: &ByoMachine) {
        let (Some(uid), Some(rv)) = (bm.uid(), revision(bm)) else {
            return;
        };
        if let Ok(mut w) = self.written.lock() {
            let e = w.entry(uid).or_insert(rv);
            *e = (*e).max(rv);
        }
    }

    /// Whether `bm` is older than a version this process wrote itself. Its watch event is on
    /// the way and will reconcile the machine again; acting on the old copy would only repeat
    /// writes. Versions that are not numbers are never called stale. A copy as new as the newest
    /// write ends the memory of that write.
    pub fn is_stale(&self, bm: &ByoMachine) -> bool {
        let (Some(uid), Some(rv)) = (bm.uid(), revision(bm)) else {
            return false;
        };
        let Ok(mut w) = self.written.lock() else {
            return false;
        };
        match w.get(&uid) {
            Some(&newest) if rv < newest => true,
            Some(_) => {
                w.remove(&uid);
                false
            }
            None => false,
        }
    }

    /// Marks `host` as being claimed by this process. `false` when a claim of it started here
    /// less than [`CLAIM_MEMORY`] ago.
    pub fn start_claim(&self, host: &ByoHost) -> bool {
        self.start_claim_at(host, Instant::now())
    }

    fn start_claim_at(&self, host: &ByoHost, now: Instant) -> bool {
        let Ok(mut c) = self.claiming.lock() else {
            return true;
        };
        c.retain(|_, t| now.saturating_duration_since(*t) < CLAIM_MEMORY);
        let key = ObjectRef::from_obj(host);
        if c.contains_key(&key) {
            return false;
        }
        c.insert(key, now);
        true
    }

    /// Whether a claim of `host` started in this process less than [`CLAIM_MEMORY`] ago.
    pub fn is_being_claimed(&self, host: &ByoHost) -> bool {
        self.is_being_claimed_at(host, Instant::now())
    }

    fn is_being_claimed_at(&self, host: &ByoHost, now: Instant) -> bool {
        self.claiming.lock().is_ok_and(|c| {
            c.get(&ObjectRef::from_obj(host))
                .is_some_and(|t| now.saturating_duration_since(*t) < CLAIM_MEMORY)
        })
    }

    /// Forgets a claim that failed for a reason other than a lost race.
    pub fn forget_claim(&self, host: &ByoHost) {
        if let Ok(mut c) = self.claiming.lock() {
            c.remove(&ObjectRef::from_obj(host));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootsman_api::v1beta1::{ByoHostSpec, ByoMachineSpec};

    fn machine(name: &str) -> ObjectRef<ByoMachine> {
        ObjectRef::new(name).within("team")
    }

    fn host(name: &str) -> ByoHost {
        let mut h = ByoHost::new(name, ByoHostSpec::default());
        h.metadata.namespace = Some("pool".into());
        h
    }

    fn byomachine(uid: &str, rv: &str) -> ByoMachine {
        let mut bm = ByoMachine::new("m", ByoMachineSpec::default());
        bm.metadata.namespace = Some("team".into());
        bm.metadata.uid = Some(uid.into());
        bm.metadata.resource_version = Some(rv.into());
        bm
    }

    #[test]
    fn waiting_machines_are_woken_oldest_first_and_only_when_they_fit() {
        let book = Book::default();
        assert_eq!(book.take_waiting(|_| true), None);
        book.set_waiting(machine("a"), true);
        book.set_waiting(machine("b"), true);
        book.set_waiting(machine("c"), true);
        // Waiting again keeps the place in the queue.
        book.set_waiting(machine("a"), true);
        assert_eq!(book.waiting(), 3);

        // The oldest that fits, not the oldest.
        assert_eq!(book.take_waiting(|m| m.name != "a"), Some(machine("b")));
        assert_eq!(book.take_waiting(|_| false), None);
        assert_eq!(book.take_waiting(|_| true), Some(machine("a")));
        // A machine that stopped waiting is never woken.
        book.set_waiting(machine("c"), false);
        assert_eq!(book.take_waiting(|_| true), None);
        assert_eq!(book.waiting(), 0);

        // A machine that waits again goes to the back.
        book.set_waiting(machine("d"), true);
        book.set_waiting(machine("a"), true);
        assert_eq!(book.take_waiting(|_| true), Some(machine("d")));
    }

    #[test]
    fn a_copy_older_than_our_own_write_is_stale_until_the_store_catches_up() {
        let book = Book::default();
        // Nothing written: nothing is stale.
        assert!(!book.is_stale(&byomachine("u1", "10")));

        book.note_written(&byomachine("u1", "12"));
        // An older write never lowers the mark.
        book.note_written(&byomachine("u1", "11"));
        assert!(book.is_stale(&byomachine("u1", "10")));
        assert!(book.is_stale(&byomachine("u1", "11")));
        // Another machine is not affected.
        assert!(!book.is_stale(&byomachine("u2", "3")));
        // The store caught up: not stale, and the memory of the write ends.
        assert!(!book.is_stale(&byomachine("u1", "12")));
        assert!(!book.is_stale(&byomachine("u1", "11")));

        // Versions that are not numbers are never stale.
        book.note_written(&byomachine("u3", "99"));
        assert!(!book.is_stale(&byomachine("u3", "opaque")));
        let mut no_uid = byomachine("u4", "1");
        no_uid.metadata.uid = None;
        book.note_written(&no_uid);
        assert!(!book.is_stale(&no_uid));
    }

    #[test]
    fn a_host_being_claimed_is_skipped_for_the_claim_memory_only() {
        let book = Book::default();
        let h1 = host("h1");
        let t0 = Instant::now();
        assert!(!book.is_being_claimed_at(&h1, t0));
        assert!(book.start_claim_at(&h1, t0));
        assert!(!book.start_claim_at(&h1, t0 + Duration::from_secs(1)));
        assert!(book.is_being_claimed_at(&h1, t0 + CLAIM_MEMORY - Duration::from_millis(1)));
        assert!(!book.is_being_claimed_at(&host("h2"), t0));
        // After the claim memory the host may be claimed again.
        assert!(!book.is_being_claimed_at(&h1, t0 + CLAIM_MEMORY));
        assert!(book.start_claim_at(&h1, t0 + CLAIM_MEMORY));

        // A failed claim is forgotten at once.
        book.forget_claim(&h1);
        assert!(!book.is_being_claimed_at(&h1, t0 + CLAIM_MEMORY));
        assert!(book.start_claim_at(&h1, t0 + CLAIM_MEMORY));
    }
}

//! Counters: one set per role, plus the loop's own.
//!
//! Each role declares its counters with [`counters!`](crate::counters) — an atomic struct only
//! its worker writes and a plain snapshot with field-wise arithmetic — so serve has no
//! `tx_full`, blast no `gro_receives`, and a name means one thing. The runtime keeps the loop's
//! counters ([`LoopStats`]: rounds, full rounds, busy rounds, sleeps) beside them for every
//! role, in one cache-line-aligned [`WorkerCounters`] per worker.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A role's atomic counters (written by one worker, read by any thread).
pub trait Counters: Default + Send + Sync + 'static {
    /// The plain copy.
    type Snapshot: Snapshot;
    /// Reads every counter.
    fn snapshot(&self) -> Self::Snapshot;
}

/// A plain copy of a role's counters.
pub trait Snapshot: Copy + Default + fmt::Debug + Send + Sync + 'static {
    /// Field-wise `self - earlier` (saturating).
    fn since(&self, earlier: &Self) -> Self;
    /// Field-wise sum.
    fn plus(&self, other: &Self) -> Self;
    /// Every counter by name, in declaration order (for exporters).
    fn fields(&self) -> Vec<(&'static str, u64)>;
}

/// Declares a role's counters once: `counters! { /// doc  pub struct Atomic => Plain { /// doc
/// name, … } }` makes the atomic struct (implementing [`Counters`]), its plain copy
/// (implementing [`Snapshot`]), so a new counter is one line.
#[macro_export]
macro_rules! counters {
    ($(#[$sdoc:meta])* $vis:vis struct $atomic:ident => $plain:ident {
        $($(#[$doc:meta])* $name:ident,)*
    }) => {
        $(#[$sdoc])*
        #[derive(Debug, Default)]
        $vis struct $atomic {
            $($(#[$doc])* pub $name: ::std::sync::atomic::AtomicU64,)*
        }

        #[doc = concat!("A plain copy of [`", stringify!($atomic), "`].")]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        $vis struct $plain {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl $crate::counters::Counters for $atomic {
            type Snapshot = $plain;
            fn snapshot(&self) -> $plain {
                $plain { $($name: self.$name.load(::std::sync::atomic::Ordering::Relaxed),)* }
            }
        }

        impl $crate::counters::Snapshot for $plain {
            fn since(&self, e: &$plain) -> $plain {
                $plain { $($name: self.$name.saturating_sub(e.$name),)* }
            }
            fn plus(&self, o: &$plain) -> $plain {
                $plain { $($name: self.$name.wrapping_add(o.$name),)* }
            }
            fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }
    };
}

counters! {
    /// The poll loop's counters, kept by the runtime for every role.
    pub struct LoopStats => LoopSnapshot {
        /// Poll rounds.
        rounds,
        /// Rounds that used the whole budget.
        full_rounds,
        /// Rounds that handled at least one packet.
        busy_rounds,
        /// Times the worker slept on readiness.
        sleeps,
        /// Short rounds followed by another poll instead of a sleep (busy polling).
        spins,
        /// CPU time the worker's thread used in its loop, user and system, nanoseconds (read
        /// every 1024 rounds, every 64th sleep and at the end: up to a few milliseconds behind
        /// during a run, exact in the final counters).
        cpu_ns,
        /// CPU cycles in the worker's loop (hardware counter; 0 without a PMU), read with
        /// `cpu_ns`.
        pmu_cycles,
        /// Instructions retired in the loop (hardware counter).
        pmu_instructions,
        /// Last-level cache misses in the loop (hardware counter).
        pmu_llc_misses,
    }
}

/// One worker's counters: the loop's and its role's. Aligned to a cache line so two workers'
/// counters never share one.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct WorkerCounters<S> {
    /// Kept by the runtime's loop.
    pub looped: LoopStats,
    /// Kept by the role's poller.
    pub role: S,
}

/// A plain copy of [`WorkerCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerSnapshot<T> {
    /// The loop's counters.
    pub looped: LoopSnapshot,
    /// The role's counters.
    pub role: T,
}

impl<S: Counters> WorkerCounters<S> {
    /// Reads every counter.
    pub fn snapshot(&self) -> WorkerSnapshot<S::Snapshot> {
        WorkerSnapshot {
            looped: self.looped.snapshot(),
            role: self.role.snapshot(),
        }
    }
}

impl<T: Snapshot> Snapshot for WorkerSnapshot<T> {
    fn since(&self, e: &Self) -> Self {
        WorkerSnapshot {
            looped: self.looped.since(&e.looped),
            role: self.role.since(&e.role),
        }
    }
    fn plus(&self, o: &Self) -> Self {
        WorkerSnapshot {
            looped: self.looped.plus(&o.looped),
            role: self.role.plus(&o.role),
        }
    }
    fn fields(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.looped.fields();
        v.extend(self.role.fields());
        v
    }
}

/// Sums snapshots (all workers' counters).
pub fn sum<'a, T: Snapshot>(all: impl IntoIterator<Item = &'a T>) -> T {
    all.into_iter().fold(T::default(), |t, s| t.plus(s))
}

/// Adds to a counter that only the calling worker writes (plain load + store, no locked RMW).
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Sets a counter that only the calling worker writes.
#[inline]
pub fn set(c: &AtomicU64, v: u64) {
    c.store(v, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    counters! {
        /// Two counters for the test.
        struct Two => TwoSnap {
            /// a
            a,
            /// b
            b,
        }
    }

    #[test]
    fn snapshots_subtract_saturating_and_add() {
        let w = WorkerCounters::<Two>::default();
        bump(&w.role.a, 5);
        bump(&w.looped.rounds, 2);
        let first = w.snapshot();
        bump(&w.role.a, 3);
        set(&w.role.b, 7);
        let second = w.snapshot();
        let d = second.since(&first);
        assert_eq!((d.role.a, d.role.b, d.looped.rounds), (3, 7, 0));
        assert_eq!(first.since(&second).role.a, 0, "saturates");
        let s = sum([&first, &second]);
        assert_eq!((s.role.a, s.looped.rounds), (13, 4));
        assert_eq!(std::mem::align_of::<WorkerCounters<Two>>(), 64);
    }
}

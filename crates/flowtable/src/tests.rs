//! The table against a reference model (a map with explicit times): random operations,
//! clock jumps both ways, and a full table whose evictions the model follows.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use proptest::prelude::*;

use crate::{Class, Config, FlowKey, FlowTable, TableKey, V4Key, TCP, UDP};

/// Timeouts in ticks of 1 ns: UDP 10, TCP 30, closing 5, other 7.
fn config(capacity: usize) -> Config {
    Config {
        capacity,
        tick_ns: 1,
        timeouts_ns: [10, 30, 5, 7],
        seed: 42,
    }
}

fn timeout(c: Class) -> u64 {
    [10, 30, 5, 7][c as usize]
}

/// Key `i` of a pool: UDP, TCP and ICMP, IPv4 and IPv6.
fn key(i: u16) -> FlowKey {
    let proto = [UDP, TCP, 1][usize::from(i % 3)];
    if i % 4 == 3 {
        FlowKey::v6(
            format!("2001:2::{i:x}").parse().expect("v6"),
            "2001:2:0:1::2".parse().expect("v6"),
            1000 + i,
            9,
            proto,
        )
    } else {
        FlowKey::v4(
            Ipv4Addr::new(198, 18, (i >> 8) as u8, i as u8),
            Ipv4Addr::new(198, 19, 0, 1),
            1000 + i,
            9,
            proto,
        )
    }
}

/// Key `i` of a pool of IPv4 keys for the 16-byte-key table: UDP, TCP and ICMP, on two
/// interfaces.
fn key4(i: u16) -> V4Key {
    let proto = [UDP, TCP, 1][usize::from(i % 3)];
    V4Key::new(
        Ipv4Addr::new(198, 18, (i >> 8) as u8, i as u8),
        Ipv4Addr::new(198, 19, 0, 1),
        1000 + i / 2,
        9,
        proto,
    )
    .on(i % 2)
}

#[derive(Debug, Clone)]
enum Op {
    Upsert(u16),
    Lookup(u16),
    Close(u16),
    Remove(u16),
    Expire,
    /// The clock moves by this much (negative: it steps back).
    Clock(i64),
}

fn op(keys: u16) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..keys).prop_map(Op::Upsert),
        2 => (0..keys).prop_map(Op::Lookup),
        1 => (0..keys).prop_map(Op::Close),
        1 => (0..keys).prop_map(Op::Remove),
        2 => Just(Op::Expire),
        3 => (-20i64..40).prop_map(Op::Clock),
        1 => (100i64..2000).prop_map(Op::Clock),
    ]
}

/// The model: value, last seen (ticks), class; time held at its largest.
struct Model<K> {
    flows: HashMap<K, (u64, u64, Class)>,
    now: u64,
}

/// Runs `ops` on a table of `capacity` and the model side by side, key `i` being `key(i)`.
fn run<K: TableKey + std::hash::Hash + Ord>(
    capacity: usize,
    keys: u16,
    ops: &[Op],
    key: impl Fn(u16) -> K,
) -> Result<(), TestCaseError> {
    let t = FlowTable::new(&config(capacity)).expect("table");
    run_on(t, capacity, keys, ops, key)
}

/// The same on table `t`.
fn run_on<K: TableKey + std::hash::Hash + Ord>(
    mut t: FlowTable<u64, K>,
    capacity: usize,
    keys: u16,
    ops: &[Op],
    key: impl Fn(u16) -> K,
) -> Result<(), TestCaseError> {
    let mut m = Model {
        flows: HashMap::new(),
        now: 0,
    };
    // Wall-clock time in ns (ticks of 1 ns), starting well above 0 so it can step back.
    let mut clock: i64 = 1_000_000;
    let base = clock as u64;
    // The table's first time is its base: the same as the model's.
    t.expire(base, |_, _, _| {});
    for op in ops {
        let at = |clock: i64| clock as u64;
        // The table knows the times it is given: every operation but Remove gives one.
        if !matches!(op, Op::Clock(_) | Op::Remove(_)) {
            m.now = m.now.max((clock as u64).saturating_sub(base));
        }
        match *op {
            Op::Clock(d) => {
                clock = (clock + d).max(0);
            }
            Op::Upsert(i) => {
                let k = key(i);
                let u = t.upsert(&k, at(clock));
                *u.value += 1;
                let (new, got, evicted) = (u.new, *u.value, u.evicted);
                if let Some((ek, ev)) = evicted {
                    let was = m.flows.remove(&ek);
                    prop_assert_eq!(was.map(|x| x.0), Some(ev), "evicted {:?}", ek);
                    prop_assert!(m.flows.len() < capacity);
                }
                let now = m.now;
                let e = m
                    .flows
                    .entry(k)
                    .or_insert((0, now, Class::of(k.protocol())));
                prop_assert_eq!(new, e.0 == 0);
                e.0 += 1;
                e.1 = e.1.max(now);
                prop_assert_eq!(got, e.0);
            }
            Op::Lookup(i) => {
                let k = key(i);
                let got = t.lookup(&k, at(clock)).map(|v| *v);
                let now = m.now;
                let want = m.flows.get_mut(&k).map(|e| {
                    e.1 = e.1.max(now);
                    e.0
                });
                prop_assert_eq!(got, want);
            }
            Op::Close(i) => {
                let k = key(i);
                let found = t.close(&k, at(clock));
                let now = m.now;
                let want = m.flows.get_mut(&k).map(|e| {
                    e.1 = e.1.max(now);
                    e.2 = Class::Closing;
                });
                prop_assert_eq!(found, want.is_some());
            }
            Op::Remove(i) => {
                let k = key(i);
                prop_assert_eq!(t.remove(&k), m.flows.remove(&k).map(|e| e.0));
            }
            Op::Expire => {
                let mut got = Vec::new();
                t.expire(at(clock), |k, v, c| got.push((*k, v, c)));
                let now = m.now;
                let mut want: Vec<(K, u64, Class)> = m
                    .flows
                    .iter()
                    .filter(|(_, e)| e.1 + timeout(e.2) <= now)
                    .map(|(k, e)| (*k, e.0, e.2))
                    .collect();
                m.flows.retain(|_, e| e.1 + timeout(e.2) > now);
                got.sort_by_key(|x| x.0);
                want.sort_by_key(|x| x.0);
                prop_assert_eq!(got, want);
            }
        }
        prop_assert_eq!(t.len(), m.flows.len());
        prop_assert!(t.len() <= capacity);
    }
    // Every key, after all: the same values, and the batched lookup finds the same flows.
    let all: Vec<K> = (0..keys).map(key).collect();
    let mut found = vec![None; all.len()];
    t.get_batch(&all, &mut found);
    for (k, f) in all.iter().zip(&found) {
        prop_assert_eq!(t.get(k).copied(), m.flows.get(k).map(|e| e.0));
        prop_assert_eq!(f.is_some(), m.flows.contains_key(k));
    }
    t.check();
    let s = t.stats();
    prop_assert_eq!(
        s.inserts,
        s.live + s.expired_total() + s.removed + s.evicted_full + s.evicted_no_room
    );
    prop_assert_eq!(s.lookups, s.hits + s.misses);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Room for every key: nothing is evicted, and the table is the model.
    #[test]
    fn the_table_is_the_model(ops in proptest::collection::vec(op(48), 1..400)) {
        run(1000, 48, &ops, key)?;
    }

    /// The same with 16-byte IPv4 keys.
    #[test]
    fn the_v4_table_is_the_model(ops in proptest::collection::vec(op(48), 1..400)) {
        run(1000, 48, &ops, key4)?;
    }

    /// A full table: 200 keys through 16 records; every eviction is handed back with its
    /// value, and apart from those the table is still the model.
    #[test]
    fn a_full_table_evicts_and_says_what(ops in proptest::collection::vec(op(200), 1..600)) {
        run(16, 200, &ops, key)?;
    }

    /// The same with 16-byte IPv4 keys.
    #[test]
    fn a_full_v4_table_evicts_and_says_what(ops in proptest::collection::vec(op(200), 1..600)) {
        run(16, 200, &ops, key4)?;
    }

    /// Two buckets (60 slots) for up to 100 flows of 200 keys: buckets fill before the
    /// records run out, so the cuckoo walk runs out of room, comes back to the new flow, and
    /// evicts (`evicted_no_room`); every eviction is handed back with its value.
    #[test]
    fn full_buckets_evict_and_say_what(ops in proptest::collection::vec(op(200), 1..600)) {
        let t = FlowTable::with_buckets(&config(100), 2).expect("table");
        run_on(t, 100, 200, &ops, key)?;
        let t = FlowTable::with_buckets(&config(100), 2).expect("table");
        run_on(t, 100, 200, &ops, key4)?;
    }
}

#[test]
fn expiry_is_exact_to_the_tick_and_touches_move_deadlines() {
    let mut t: FlowTable<u32> = FlowTable::new(&config(100)).expect("table");
    let (u, tc) = (key(0), key(1)); // UDP 10 ticks, TCP 30
    t.upsert(&u, 100);
    t.upsert(&tc, 100);
    let mut gone = Vec::new();
    t.expire(109, |k, _, c| gone.push((*k, c)));
    assert!(gone.is_empty());
    // Seen at 112: now due at 122, not 110. (A time before the last one given is held at
    // it: the table's clock never goes back.)
    t.lookup(&u, 112);
    t.expire(121, |k, _, c| gone.push((*k, c)));
    assert!(gone.is_empty());
    t.expire(122, |k, _, c| gone.push((*k, c)));
    assert_eq!(gone, vec![(u, Class::Udp)]);
    // A FIN: TCP's 30 becomes closing's 5 from then.
    assert!(t.close(&tc, 126));
    t.expire(130, |k, _, c| gone.push((*k, c)));
    assert_eq!(gone.len(), 1);
    t.expire(131, |k, _, c| gone.push((*k, c)));
    assert_eq!(gone[1], (tc, Class::Closing));
    let s = t.stats();
    assert_eq!((s.expired[0], s.expired[2], s.closed, s.live), (1, 1, 1, 0));
    // A jump far ahead visits the wheel once, not once per tick.
    t.upsert(&u, 200);
    let ticks = t.stats().gc_ticks;
    t.expire(1_000_000_000, |_, _, _| {});
    assert!(t.stats().gc_ticks - ticks <= 32, "{:?}", t.stats());
    assert!(t.is_empty());
}

#[test]
fn when_full_the_least_recently_seen_of_the_buckets_goes_a_closing_one_first() {
    // One record: each new flow evicts the one there, and hands it back.
    let mut t: FlowTable<u32> = FlowTable::new(&config(1)).expect("table");
    *t.upsert(&key(0), 10).value = 7;
    let u = t.upsert(&key(3), 11);
    assert!(u.new);
    assert_eq!(u.evicted, Some((key(0), 7)));
    assert_eq!(t.stats().evicted_full, 1);
    // Two records in one pair of buckets: the older goes, unless the newer is closing.
    let mut t: FlowTable<u32> = FlowTable::new(&config(2)).expect("table");
    t.upsert(&key(1), 10);
    t.upsert(&key(4), 20);
    assert_eq!(t.upsert(&key(7), 30).evicted.map(|e| e.0), Some(key(1)));
    let mut t: FlowTable<u32> = FlowTable::new(&config(2)).expect("table");
    t.upsert(&key(1), 10);
    t.upsert(&key(4), 20);
    t.close(&key(4), 21);
    assert_eq!(t.upsert(&key(7), 30).evicted.map(|e| e.0), Some(key(4)));
}

#[test]
fn bad_shapes_are_refused_and_memory_is_bounded() {
    assert!(FlowTable::<u8>::new(&config(0)).is_err());
    let mut c = config(10);
    c.tick_ns = 0;
    assert!(FlowTable::<u8>::new(&c).is_err());
    let mut c = config(10);
    c.timeouts_ns[0] = 0;
    assert!(FlowTable::<u8>::new(&c).is_err());
    // A million flows: the table's own bytes per flow (no value), wheel included.
    let t: FlowTable<()> = FlowTable::new(&Config::new(1_000_000)).expect("table");
    let per_flow = t.memory_bytes() as f64 / 1e6;
    assert!(per_flow <= 64.0, "{per_flow} B a flow");
    // Keyed on 16 bytes with a 4-byte value: records of 32 bytes (BENCHMARKS.md: 39 a flow).
    let t: FlowTable<u32, V4Key> = FlowTable::new(&Config::new(1_000_000)).expect("table");
    let per_flow = t.memory_bytes() as f64 / 1e6;
    assert!(per_flow <= 40.0, "{per_flow} B a flow");
}

#[test]
fn a_table_filled_to_capacity_and_churned_keeps_every_flow_findable() {
    let ip = |i: u32| Ipv4Addr::from(i.wrapping_mul(2_654_435_761));
    let dst = Ipv4Addr::new(198, 19, 0, 1);
    churn(|i| FlowKey::v4(ip(i), dst, i as u16, 9, UDP));
    churn(|i| V4Key::new(ip(i), dst, i as u16, 9, UDP));
}

/// 20 000 records, filled, then half removed and as many new ones added, three times: the
/// cuckoo walk and the spill filters are exercised at 100 % of the records.
fn churn<K: TableKey>(k: impl Fn(u32) -> K) {
    let n = 20_000u32;
    let mut t: FlowTable<u32, K> = FlowTable::new(&config(n as usize)).expect("table");
    let mut held: Vec<u32> = (0..n).collect();
    for &i in &held {
        let u = t.upsert(&k(i), 0);
        assert!(u.new);
        *u.value = i;
    }
    t.check();
    assert_eq!(t.len(), n as usize);
    let mut next = n;
    for round in 0..3 {
        let mut kept = Vec::new();
        for (j, &i) in held.iter().enumerate() {
            if (j + round) % 2 == 0 {
                assert_eq!(t.remove(&k(i)), Some(i));
            } else {
                kept.push(i);
            }
        }
        while kept.len() < n as usize {
            let u = t.upsert(&k(next), 0);
            *u.value = next;
            // Records are free again, so nothing is evicted for want of one; a failed
            // cuckoo walk may evict, and says whom.
            if let Some((ek, _)) = u.evicted {
                kept.retain(|&i| k(i) != ek);
            }
            kept.push(next);
            next += 1;
        }
        held = kept;
        t.check();
        let keys: Vec<K> = held.iter().map(|&i| k(i)).collect();
        let mut found = vec![None; keys.len()];
        t.get_batch(&keys, &mut found);
        for ((&i, key), f) in held.iter().zip(&keys).zip(&found) {
            assert_eq!(t.get(key), Some(&i));
            assert!(f.is_some());
        }
    }
    assert_eq!(t.stats().evicted_full, 0);
    // Held and never-held keys mixed, in calls of every size the batch treats apart (up to
    // 32 at once, up to 64, more): each finds what `get` finds, at the same record whatever
    // the call's size.
    let mixed: Vec<K> = (0..next + 500).step_by(3).map(&k).collect();
    let mut whole = vec![None; mixed.len()];
    t.get_batch(&mixed, &mut whole);
    for (key, w) in mixed.iter().zip(&whole) {
        assert_eq!(w.is_some(), t.get(key).is_some());
    }
    for size in [1, 5, 31, 32, 33, 63, 64, 65, 200] {
        let mut found = vec![None; mixed.len()];
        for (q, o) in mixed.chunks(size).zip(found.chunks_mut(size)) {
            t.get_batch(q, o);
        }
        assert_eq!(found, whole, "calls of {size}");
    }
}

#[test]
#[should_panic(expected = "get_batch: 3 keys, 2 result slots")]
fn a_batch_with_fewer_result_slots_than_keys_is_refused() {
    let t: FlowTable<u32> = FlowTable::new(&config(16)).expect("table");
    let k = |i: u8| {
        FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, i),
            Ipv4Addr::new(198, 19, 0, 1),
            1,
            9,
            UDP,
        )
    };
    t.get_batch(&[k(1), k(2), k(3)], &mut [None; 2]);
}

#[test]
fn a_walk_out_of_room_evicts_one_flow_and_keeps_the_others() {
    // Two buckets, 60 slots, room in the records for 100: from the 61st flow on, every new
    // flow's walk runs out of moves (both buckets full) and one flow leaves, handed back.
    let mut t: FlowTable<u32, V4Key> = FlowTable::with_buckets(&config(100), 2).expect("table");
    let mut held = HashMap::new();
    for i in 0..100u16 {
        let k = key4(i);
        let u = t.upsert(&k, 10 + u64::from(i));
        assert!(u.new);
        *u.value = u32::from(i);
        if let Some((ek, ev)) = u.evicted {
            assert_eq!(held.remove(&ek), Some(ev), "evicted {ek:?}");
        }
        held.insert(k, u32::from(i));
        t.check();
    }
    assert_eq!((t.len(), held.len()), (60, 60));
    let s = t.stats();
    assert_eq!((s.evicted_no_room, s.evicted_full), (40, 0));
    assert_eq!(s.kicks, 40 * crate::MAX_KICKS as u64);
    for (k, v) in &held {
        assert_eq!(t.get(k), Some(v));
    }
    // The flows moved by the walks are still on the wheel, at their own deadlines.
    let mut gone = 0;
    t.expire(1_000, |_, _, _| gone += 1);
    assert_eq!((gone, t.len()), (60, 0));
    t.check();
}

//! The snapshot's shape, read back with serde-pickle.

use super::*;
use crate::timeline::MemoryEvent;
use serde_pickle::{DeOptions, HashableValue, Value};

fn load(bytes: &[u8]) -> Value {
    serde_pickle::value_from_slice(bytes, DeOptions::new()).unwrap()
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    match v {
        Value::Dict(d) => d
            .get(&HashableValue::String(key.into()))
            .unwrap_or_else(|| panic!("no key {key} in {v:?}")),
        _ => panic!("not a dict: {v:?}"),
    }
}

fn list(v: &Value) -> &[Value] {
    match v {
        Value::List(l) => l,
        _ => panic!("not a list: {v:?}"),
    }
}

fn int_of(v: &Value) -> i64 {
    match v {
        Value::I64(i) => *i,
        _ => panic!("not an int: {v:?}"),
    }
}

fn str_of(v: &Value) -> &str {
    match v {
        Value::String(s) => s,
        _ => panic!("not a str: {v:?}"),
    }
}

const SEG: u64 = 0x7f00_0000_0000;
const MIB: u64 = 1 << 20;

fn scripted() -> Timeline {
    let events = vec![
        MemoryEvent::at(0.0, Action::SegmentAlloc, SEG, 64 * MIB),
        MemoryEvent::at(0.001, Action::Alloc, SEG, MIB),
        MemoryEvent::at(0.002, Action::Alloc, SEG + 2 * MIB, 4 * MIB),
        MemoryEvent::at(0.003, Action::FreeCompleted, SEG, MIB),
        MemoryEvent::at(0.004, Action::Oom, 0, 1 << 40),
        MemoryEvent::at(0.005, Action::SegmentAlloc, SEG + 64 * MIB, 2 * MIB),
        MemoryEvent::at(0.006, Action::Alloc, SEG + 64 * MIB, 512),
        MemoryEvent::at(0.007, Action::SegmentFree, 0x1234, MIB),
    ];
    Timeline {
        title: "scripted".into(),
        devices: vec![DeviceTimeline {
            device: 1,
            total_memory: Some(1 << 30),
            samples: Vec::new(),
            events,
        }],
        marks: Vec::new(),
    }
}

#[test]
fn round_trip_keys_actions_and_segments() {
    let bytes = torch_snapshot_bytes(&scripted()).unwrap();
    // Protocol 3, as Python 3 and the viewer's unpickler read.
    assert_eq!(&bytes[..2], b"\x80\x03");
    let v = load(&bytes);
    let traces = list(get(&v, "device_traces"));
    assert_eq!(traces.len(), 2, "one list per device 0..=1");
    assert!(list(&traces[0]).is_empty());
    let trace = list(&traces[1]);
    let got: Vec<&str> = trace.iter().map(|e| str_of(get(e, "action"))).collect();
    assert_eq!(
        got,
        [
            "segment_alloc",
            "alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "oom",
            "segment_alloc",
            "alloc"
        ]
    );
    for e in trace {
        for key in ["addr", "size", "stream", "time_us"] {
            int_of(get(e, key));
        }
        assert!(list(get(e, "frames")).is_empty());
    }
    assert_eq!(int_of(get(&trace[1], "addr")), SEG as i64);
    assert_eq!(int_of(get(&trace[2], "time_us")), 2000);
    let oom = &trace[5];
    assert_eq!(int_of(get(oom, "size")), 1 << 40);
    assert_eq!(int_of(get(oom, "device_free")), (1 << 30) - 64 * MIB as i64);

    let segments = list(get(&v, "segments"));
    assert_eq!(segments.len(), 2);
    let large = &segments[0];
    assert_eq!(int_of(get(large, "device")), 1);
    assert_eq!(int_of(get(large, "address")), SEG as i64);
    assert_eq!(int_of(get(large, "total_size")), 64 * MIB as i64);
    assert_eq!(int_of(get(large, "allocated_size")), 4 * MIB as i64);
    assert_eq!(str_of(get(large, "segment_type")), "large");
    assert_eq!(get(large, "is_expandable"), &Value::Bool(false));
    assert_eq!(
        get(large, "segment_pool_id"),
        &Value::Tuple(vec![Value::I64(0), Value::I64(0)])
    );
    let blocks = list(get(large, "blocks"));
    let shape: Vec<(i64, i64, &str)> = blocks
        .iter()
        .map(|b| {
            (
                int_of(get(b, "address")),
                int_of(get(b, "size")),
                str_of(get(b, "state")),
            )
        })
        .collect();
    let s = SEG as i64;
    let m = MIB as i64;
    assert_eq!(
        shape,
        [
            (s, 2 * m, "inactive"),
            (s + 2 * m, 4 * m, "active_allocated"),
            (s + 6 * m, 58 * m, "inactive"),
        ]
    );
    let small = &segments[1];
    assert_eq!(str_of(get(small, "segment_type")), "small");
    let blocks = list(get(small, "blocks"));
    assert_eq!(blocks.len(), 2);
    assert_eq!(int_of(get(&blocks[0], "size")), 512);
    assert_eq!(int_of(get(&blocks[0], "requested_size")), 512);
    assert_eq!(str_of(get(&blocks[1], "state")), "inactive");
    // Blocks tile each segment (the viewer adds up their sizes).
    for seg in segments {
        let total: i64 = list(get(seg, "blocks"))
            .iter()
            .map(|b| int_of(get(b, "size")))
            .sum();
        assert_eq!(total, int_of(get(seg, "total_size")));
    }
}

#[test]
fn blocks_outside_recorded_segments_get_one() {
    let t = Timeline {
        title: String::new(),
        devices: vec![DeviceTimeline {
            device: 0,
            total_memory: None,
            samples: Vec::new(),
            events: vec![
                MemoryEvent::at(0.0, Action::Alloc, 0x1000, 0x100),
                MemoryEvent::at(0.1, Action::Alloc, 0x1100, 0x100),
                MemoryEvent::at(0.2, Action::FreeCompleted, 0x9000, 0x100),
                MemoryEvent::at(0.3, Action::FreeCompleted, 0x1000, 0x100),
            ],
        }],
        marks: Vec::new(),
    };
    let v = load(&torch_snapshot_bytes(&t).unwrap());
    let segments = list(get(&v, "segments"));
    let addrs: Vec<(i64, i64)> = segments
        .iter()
        .map(|s| (int_of(get(s, "address")), int_of(get(s, "total_size"))))
        .collect();
    assert_eq!(addrs, [(0x1000, 0x200), (0x9000, 0x100)]);
    let blocks = list(get(&segments[0], "blocks"));
    let states: Vec<&str> = blocks.iter().map(|b| str_of(get(b, "state"))).collect();
    assert_eq!(states, ["inactive", "active_allocated"]);
}

/// (action, addr, size) of each entry of device `d`'s trace.
fn trace_of(v: &Value, d: usize) -> Vec<(String, i64, i64)> {
    list(&list(get(v, "device_traces"))[d])
        .iter()
        .map(|e| {
            (
                str_of(get(e, "action")).to_string(),
                int_of(get(e, "addr")),
                int_of(get(e, "size")),
            )
        })
        .collect()
}

#[test]
fn a_ring_keeps_the_last_entries_whole_frees_and_the_final_segments() {
    // A segment, blocks in it and outside it, churned; then an out-of-memory error.
    let mut events = vec![MemoryEvent::at(0.0, Action::SegmentAlloc, SEG, 64 * MIB)];
    for i in 0..500u64 {
        let inside = SEG + (i % 8) * MIB;
        let outside = 0x1000 + (i % 4) * 0x100;
        events.push(MemoryEvent::at(i as f64, Action::Alloc, inside, MIB));
        events.push(MemoryEvent::at(i as f64, Action::Alloc, outside, 0x100));
        if i % 8 == 7 {
            for j in 0..8 {
                events.push(MemoryEvent::at(
                    i as f64,
                    Action::FreeCompleted,
                    SEG + j * MIB,
                    MIB,
                ));
            }
        }
        if i % 4 == 3 {
            for j in 0..4 {
                events.push(MemoryEvent::at(
                    i as f64,
                    Action::FreeCompleted,
                    0x1000 + j * 0x100,
                    0,
                ));
            }
        }
    }
    // A free of a block allocated before the trace, outside every segment.
    events.push(MemoryEvent::at(600.0, Action::FreeCompleted, 0x9000, 0x100));
    events.push(MemoryEvent::at(601.0, Action::Oom, 0, 1 << 40));
    let mut all = TorchTrace::new(0, Some(1 << 30), None);
    all.expect_segments();
    for e in &events {
        all.push(e);
    }
    let whole = load(&torch_snapshot_of(&[all]).unwrap());
    let full = trace_of(&whole, 0);
    for max in [1, 2, 3, 50, 999, full.len(), full.len() + 10] {
        let mut ring = TorchTrace::new(0, Some(1 << 30), Some(max));
        for e in &events {
            ring.push(e);
        }
        assert!(ring.entries() <= max, "{max}");
        assert!(
            ring.entries() + 1 >= max.min(full.len()),
            "{max}: a free is kept whole"
        );
        assert_eq!(
            ring.entries() as u64 + ring.dropped_entries(),
            full.len() as u64
        );
        let v = load(&torch_snapshot_of(&[ring]).unwrap());
        let tail = trace_of(&v, 0);
        assert_eq!(tail[..], full[full.len() - tail.len()..], "{max}");
        assert_ne!(tail.first().map(|e| e.0.as_str()), Some("free_completed"));
        // The out-of-memory entry counts the segment as reserved, in any case.
        let oom = list(&list(get(&v, "device_traces"))[0])
            .last()
            .cloned()
            .unwrap();
        assert_eq!(
            int_of(get(&oom, "device_free")),
            (1 << 30) - 64 * MIB as i64
        );
        // The segments live at the end: the recorded one; the synthetic ones cover the
        // blocks outside it that the kept entries name.
        let segments = list(get(&v, "segments"));
        assert!(
            segments
                .iter()
                .any(|s| int_of(get(s, "address")) == SEG as i64)
        );
        let synthetic: Vec<(i64, i64)> = segments
            .iter()
            .map(|s| (int_of(get(s, "address")), int_of(get(s, "total_size"))))
            .filter(|&(a, _)| a != SEG as i64)
            .collect();
        let named = |addr: i64| tail.iter().any(|e| e.1 == addr && e.0 != "oom");
        if named(0x9000) {
            assert!(synthetic.contains(&(0x9000, 0x100)), "{max}: {synthetic:?}");
        } else {
            assert!(!synthetic.iter().any(|&(a, _)| a == 0x9000), "{max}");
        }
        if max >= 50 {
            assert_eq!(synthetic, [(0x1000, 0x400), (0x9000, 0x100)], "{max}");
        }
    }
}

#[test]
fn empty_timeline_and_write_errors() {
    let v = load(&torch_snapshot_bytes(&Timeline::default()).unwrap());
    assert!(list(get(&v, "segments")).is_empty());
    assert!(list(get(&v, "device_traces")).is_empty());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("t.pickle");
    let e = write_torch_snapshot(&scripted(), &path).unwrap_err();
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    let ok = dir.path().join("t.pickle");
    write_torch_snapshot(&scripted(), &ok).unwrap();
    load(&std::fs::read(ok).unwrap());
}

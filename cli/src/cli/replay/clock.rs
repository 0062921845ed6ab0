//! The replay's timeline on the log's own clock: the bytes in use are the log's (its
//! allocations and frees at the times it recorded them); the bytes the pool reserved come
//! from the pool's segment events during the replay, moved onto the log's clock by the
//! allocation each came before (the n-th allocation the pool served is the log's n-th).
//! A log without times keeps the replay's clock.

use rmm::allocator::adaptor::{EventLog, LogAction, ReplayReport};
use rmm_cli::timeline::{
    Action, DeviceTimeline, Mark, MarkKind, MemoryEvent, Timeline, samples_from_events,
};
use rmm_cli::units::bytes;

/// Seconds of each log event since the first timed one (untimed events take the time before
/// them; a log that crosses midnight keeps counting).
pub fn log_times(log: &EventLog) -> Vec<f64> {
    const DAY_US: u64 = 86_400_000_000;
    let mut first = None;
    let (mut last, mut wrap, mut t) = (0u64, 0u64, 0.0);
    log.events
        .iter()
        .map(|e| {
            if let Some(us) = e.time_us {
                let start = *first.get_or_insert(us);
                if us < last {
                    wrap += DAY_US;
                }
                last = us;
                t = (us + wrap).saturating_sub(start) as f64 / 1e6;
            }
            t
        })
        .collect()
}

/// The log's own events as allocator events: allocations, frees of allocations the log made
/// (others are skipped, as the replay skips them) and logged failures as out-of-memory.
pub fn log_events(log: &EventLog, times: &[f64]) -> Vec<MemoryEvent> {
    log.events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let (action, addr, size) = match (e.action, log.freed_allocation[i]) {
                (LogAction::Allocate, _) if e.ptr != 0 && e.size != 0 => {
                    (Action::Alloc, e.ptr, e.size)
                }
                (LogAction::Free, Some(a)) => (Action::FreeCompleted, e.ptr, log.events[a].size),
                (LogAction::AllocateFailure, _) => (Action::Oom, 0, e.size),
                _ => return None,
            };
            Some(MemoryEvent {
                t: times[i],
                action,
                addr,
                size: size as u64,
                stream: e.stream,
            })
        })
        .collect()
}

/// `recorded`'s segment events moved onto the log's clock: each at the log time of the
/// allocation the pool served next (or the log's last time, after the last one).
pub fn segments_on_log_clock(recorded: &[MemoryEvent], logged: &[MemoryEvent]) -> Vec<MemoryEvent> {
    let served: Vec<f64> = recorded
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.t)
        .collect();
    let log_allocs: Vec<f64> = logged
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.t)
        .collect();
    let end = logged.iter().map(|e| e.t).fold(0.0, f64::max);
    recorded
        .iter()
        .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree))
        .map(|e| {
            let next = served.partition_point(|&t| t < e.t);
            MemoryEvent {
                t: log_allocs.get(next).copied().unwrap_or(end),
                ..*e
            }
        })
        .collect()
}

/// The timeline `--plot` draws (see the module documentation), with a few words on where its
/// events came from.
pub fn plot_timeline(
    log: &EventLog,
    name: &str,
    device: u32,
    total: u64,
    report: &ReplayReport,
    recorded: &[MemoryEvent],
) -> (Timeline, &'static str) {
    let times = log_times(log);
    let logged = log_events(log, &times);
    let timed = times.iter().any(|&t| t > 0.0);
    let from_hooks = recorded.iter().any(|e| e.action == Action::Alloc);
    let (mut events, source) = match (timed, from_hooks) {
        (true, true) => {
            let mut events = segments_on_log_clock(recorded, &logged);
            events.extend(logged.iter().copied());
            (
                events,
                "on the log's clock; reserved from the pool's events",
            )
        }
        (true, false) => (logged, "on the log's clock, from its events"),
        (false, true) => (
            recorded.to_vec(),
            "on the replay's clock (the log has no times), from the pool's events",
        ),
        (false, false) => (logged, "from the log's events (the log has no times)"),
    };
    // In time order; at one moment the pool grows before it serves and shrinks after.
    let rank = |a: Action| match a {
        Action::SegmentAlloc => 0,
        Action::SegmentFree => 2,
        _ => 1,
    };
    events.sort_by(|a, b| {
        a.t.total_cmp(&b.t)
            .then(rank(a.action).cmp(&rank(b.action)))
    });
    let oom_t = report.failure.as_ref().map(|f| {
        if timed || !from_hooks {
            log.events
                .iter()
                .position(|e| e.line == f.line)
                .map_or(0.0, |i| times[i])
        } else {
            let ooms = || recorded.iter().filter(|e| e.action == Action::Oom);
            ooms()
                .find(|e| e.size == f.bytes as u64)
                .or_else(|| ooms().next_back())
                .or(recorded.last())
                .map_or(0.0, |e| e.t)
        }
    });
    let marks = match (&report.failure, oom_t) {
        (Some(f), Some(t)) => vec![Mark {
            t,
            device: Some(device),
            kind: MarkKind::OutOfMemory,
            label: format!("out of memory: {} (line {})", bytes(f.bytes as u64), f.line),
        }],
        _ => Vec::new(),
    };
    let timeline = Timeline {
        title: format!("rmm replay {name}: {}", report.resource),
        devices: vec![DeviceTimeline {
            device,
            total_memory: Some(total),
            samples: samples_from_events(&events),
            events,
        }],
        marks,
    };
    (timeline, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_times_are_seconds_since_the_first_and_cross_midnight() {
        let text = "Thread,Time,Action,Pointer,Size,Stream\n\
                    1,23:59:59.500000,allocate,0x100,256,0x0\n\
                    1,23:59:59.750000,allocate failure,0x0,512,0x0\n\
                    1,00:00:00.250000,free,0x100,256,0x0\n";
        let log = EventLog::parse(text, "t.csv").unwrap();
        let times = log_times(&log);
        assert_eq!(times, vec![0.0, 0.25, 0.75]);
        let events = log_events(&log, &times);
        let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [Action::Alloc, Action::Oom, Action::FreeCompleted]);
        assert_eq!(events[2].size, 256);
        assert_eq!(events[1].size, 512);
    }

    #[test]
    fn segments_move_to_the_time_of_the_allocation_they_came_before() {
        let e = |t, action, size| MemoryEvent {
            t,
            action,
            addr: 0x100,
            size,
            stream: 0,
        };
        // The replay's clock: a segment, two allocations, another segment, a third.
        let recorded = [
            e(0.001, Action::SegmentAlloc, 1 << 30),
            e(0.002, Action::Alloc, 256),
            e(0.003, Action::Alloc, 256),
            e(0.004, Action::SegmentAlloc, 1 << 30),
            e(0.005, Action::Alloc, 256),
            e(0.009, Action::SegmentFree, 1 << 30),
        ];
        // The log's clock.
        let logged = [
            e(1.0, Action::Alloc, 256),
            e(2.0, Action::Alloc, 256),
            e(3.0, Action::Alloc, 256),
            e(4.0, Action::FreeCompleted, 256),
        ];
        let moved = segments_on_log_clock(&recorded, &logged);
        let times: Vec<f64> = moved.iter().map(|e| e.t).collect();
        assert_eq!(times, [1.0, 3.0, 4.0]);
        assert_eq!(moved[0].action, Action::SegmentAlloc);
        assert_eq!(moved[2].action, Action::SegmentFree);
    }
}
